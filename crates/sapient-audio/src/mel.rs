//! Whisper's log-mel spectrogram, computed as OpenAI's `whisper/audio.py` does:
//! STFT with a periodic Hann window (n_fft 400, hop 160, centred with reflect padding),
//! power spectrum without the last frame, the mel filter bank of `mel_filters.npz`
//! (librosa's Slaney mel scale, computed identically here or read from the file),
//! `log10(max(x, 1e-10))`, clamped to `max - 8`, then `(x + 4) / 4`.
//!
//! The FFT plan, window and (sparse) filters are built once; frames are computed in parallel
//! with one scratch set per block of frames (no per-frame allocation) in f64, so results match
//! the reference to ~1e-6.

use crate::error::{check_finite, Error, Result};
use sapient_tensor::kernels::pool::pool;
use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};
use std::path::Path;
use std::sync::Arc;

/// Whisper's sample rate.
pub const SAMPLE_RATE: u32 = 16_000;
/// FFT size (25 ms).
pub const N_FFT: usize = 400;
/// Hop (10 ms).
pub const HOP_LENGTH: usize = 160;
/// Frequency bins of one frame.
pub const N_FREQS: usize = N_FFT / 2 + 1;
/// Samples in Whisper's 30 s window.
pub const N_SAMPLES: usize = 30 * SAMPLE_RATE as usize;
/// Frames in Whisper's 30 s window.
pub const N_FRAMES: usize = N_SAMPLES / HOP_LENGTH;

const PAD: usize = N_FFT / 2;
const FRAMES_PER_TASK: usize = 128;

/// A mel filter bank, `n_mels` rows of [`N_FREQS`] weights.
#[derive(Debug, Clone, PartialEq)]
pub struct MelFilters {
    n_mels: usize,
    data: Vec<f32>,
}

fn hz_to_mel(f: f64) -> f64 {
    // librosa, htk=False (Slaney): linear below 1 kHz, logarithmic above.
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if f >= min_log_hz {
        min_log_mel + (f / min_log_hz).ln() / logstep
    } else {
        f / f_sp
    }
}

fn mel_to_hz(m: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if m >= min_log_mel {
        min_log_hz * (logstep * (m - min_log_mel)).exp()
    } else {
        f_sp * m
    }
}

impl MelFilters {
    /// The filter bank Whisper ships (`librosa.filters.mel(sr=16000, n_fft=400, n_mels)`,
    /// Slaney scale and normalisation), computed the way librosa does (f64, stored as f32).
    pub fn whisper(n_mels: usize) -> Result<Self> {
        if !(1..=512).contains(&n_mels) {
            return Err(Error::MelFilters(format!("n_mels {n_mels} is outside 1..=512")));
        }
        let sr = SAMPLE_RATE as f64;
        let fft_freqs: Vec<f64> = (0..N_FREQS).map(|i| i as f64 * (sr / 2.0) / (N_FREQS - 1) as f64).collect();
        let (min_mel, max_mel) = (hz_to_mel(0.0), hz_to_mel(sr / 2.0));
        let n_pts = n_mels + 2;
        let mel_f: Vec<f64> = (0..n_pts)
            .map(|i| mel_to_hz(min_mel + (max_mel - min_mel) * i as f64 / (n_pts - 1) as f64))
            .collect();
        let mut data = vec![0f32; n_mels * N_FREQS];
        for m in 0..n_mels {
            let (lo, mid, hi) = (mel_f[m], mel_f[m + 1], mel_f[m + 2]);
            let enorm = 2.0 / (hi - lo);
            for (k, &f) in fft_freqs.iter().enumerate() {
                let lower = -(lo - f) / (mid - lo);
                let upper = (hi - f) / (hi - mid);
                let w = lower.min(upper).max(0.0);
                // librosa stores the triangle in float32, then scales in place (f64 math).
                data[m * N_FREQS + k] = ((w as f32) as f64 * enorm) as f32;
            }
        }
        Ok(Self { n_mels, data })
    }

    /// Reads `mel_{n_mels}` from Whisper's `mel_filters.npz`.
    pub fn from_npz(path: impl AsRef<Path>, n_mels: usize) -> Result<Self> {
        let path = path.as_ref();
        let arr = sapient_tensor::npy::Npz::open(path)
            .and_then(|z| z.get(&format!("mel_{n_mels}")))
            .map_err(|e| Error::MelFilters(e.to_string()))?;
        if arr.shape != [n_mels, N_FREQS] {
            return Err(Error::MelFilters(format!("{}: mel_{n_mels} has shape {:?}, expected [{n_mels}, {N_FREQS}]", path.display(), arr.shape)));
        }
        Self::from_vec(n_mels, arr.to_f32().map_err(|e| Error::MelFilters(e.to_string()))?)
    }

    /// A filter bank from row-major `[n_mels, 201]` weights.
    pub fn from_vec(n_mels: usize, data: Vec<f32>) -> Result<Self> {
        if n_mels == 0 || data.len() != n_mels * N_FREQS {
            return Err(Error::MelFilters(format!("{} weights for {n_mels} mels (need n_mels * {N_FREQS})", data.len())));
        }
        if data.iter().any(|w| !w.is_finite()) {
            return Err(Error::MelFilters("non-finite weight".into()));
        }
        Ok(Self { n_mels, data })
    }

    pub fn n_mels(&self) -> usize {
        self.n_mels
    }

    /// Row-major `[n_mels, 201]` weights.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }
}

/// A log-mel spectrogram, row-major `[n_mels, n_frames]` like Whisper's tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Mel {
    pub n_mels: usize,
    pub n_frames: usize,
    pub data: Vec<f32>,
}

impl Mel {
    /// Value of mel bin `m` at frame `t`.
    pub fn get(&self, m: usize, t: usize) -> f32 {
        self.data[m * self.n_frames + t]
    }

    /// All frames of mel bin `m`.
    pub fn row(&self, m: usize) -> &[f32] {
        &self.data[m * self.n_frames..(m + 1) * self.n_frames]
    }

    /// As a `[n_mels, n_frames]` f32 tensor.
    pub fn to_tensor(&self, device: &candle_core::Device) -> Result<candle_core::Tensor> {
        Ok(candle_core::Tensor::from_slice(&self.data, (self.n_mels, self.n_frames), device)?)
    }
}

struct Sparse {
    start: usize,
    weights: Vec<f64>,
}

struct Inner {
    filters: MelFilters,
    sparse: Vec<Sparse>,
    window: Vec<f64>,
    fft: Arc<dyn RealToComplex<f64>>,
}

/// Whisper's log-mel front end. Cheap to clone (shared plan and filters).
#[derive(Clone)]
pub struct LogMel {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LogMel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogMel").field("n_mels", &self.n_mels()).finish()
    }
}

/// Per-task scratch: one set per block of frames, never per frame.
struct Worker {
    frame: Vec<f64>,
    spectrum: Vec<Complex<f64>>,
    scratch: Vec<Complex<f64>>,
    power: Vec<f64>,
}

impl LogMel {
    /// Whisper's front end with `n_mels` bins (80 for most models, 128 for large-v3).
    pub fn new(n_mels: usize) -> Result<Self> {
        Self::with_filters(MelFilters::whisper(n_mels)?)
    }

    /// A front end with a given filter bank (e.g. [`MelFilters::from_npz`]).
    pub fn with_filters(filters: MelFilters) -> Result<Self> {
        let sparse = (0..filters.n_mels)
            .map(|m| {
                let row = &filters.data[m * N_FREQS..(m + 1) * N_FREQS];
                let start = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let end = row.iter().rposition(|&w| w != 0.0).map(|e| e + 1).unwrap_or(start);
                Sparse { start, weights: row[start..end].iter().map(|&w| w as f64).collect() }
            })
            .collect();
        // torch.hann_window(400): periodic.
        let window = (0..N_FFT)
            .map(|n| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / N_FFT as f64).cos())
            .collect();
        let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
        Ok(Self { inner: Arc::new(Inner { filters, sparse, window, fft }) })
    }

    pub fn n_mels(&self) -> usize {
        self.inner.filters.n_mels
    }

    pub fn filters(&self) -> &MelFilters {
        &self.inner.filters
    }

    fn worker(&self) -> Worker {
        Worker {
            frame: self.inner.fft.make_input_vec(),
            spectrum: self.inner.fft.make_output_vec(),
            scratch: self.inner.fft.make_scratch_vec(),
            power: vec![0.0; N_FREQS],
        }
    }

    /// log10 mel energies of the frame held (windowing not yet applied) in `w.frame`.
    fn frame_log10(&self, w: &mut Worker, out: &mut [f32]) {
        for (x, win) in w.frame.iter_mut().zip(&self.inner.window) {
            *x *= win;
        }
        // Lengths are fixed by construction: the FFT cannot fail.
        let _ = self.inner.fft.process_with_scratch(&mut w.frame, &mut w.spectrum, &mut w.scratch);
        for (p, c) in w.power.iter_mut().zip(&w.spectrum) {
            *p = c.re * c.re + c.im * c.im;
        }
        for (o, s) in out.iter_mut().zip(&self.inner.sparse) {
            let e: f64 = s.weights.iter().zip(&w.power[s.start..]).map(|(a, b)| a * b).sum();
            *o = (e.max(1e-10) as f32).log10();
        }
    }

    /// The log-mel spectrogram of 16 kHz mono audio, as `whisper.log_mel_spectrogram(audio)`:
    /// `len / 160` frames.
    pub fn log_mel(&self, samples: &[f32]) -> Result<Mel> {
        self.log_mel_padded(samples, 0)
    }

    /// As `whisper.log_mel_spectrogram(audio, padding=padding)`: `padding` zeros are appended
    /// before the STFT (Whisper's transcribe pads 30 s, [`N_SAMPLES`]).
    pub fn log_mel_padded(&self, samples: &[f32], padding: usize) -> Result<Mel> {
        let log10 = self.log10_frames(samples, padding)?;
        Ok(normalize(&log10, self.n_mels()))
    }

    /// Frame-major `[n_frames, n_mels]` log10 mel energies, before Whisper's normalisation.
    pub fn log10_frames(&self, samples: &[f32], padding: usize) -> Result<Vec<f32>> {
        if samples.is_empty() {
            return Err(Error::ZeroLength { what: "log-mel input".into() });
        }
        check_finite("log-mel input", samples)?;
        let total = samples.len() + padding;
        let n_frames = total / HOP_LENGTH;
        if n_frames == 0 {
            return Err(Error::TooShort { what: "log-mel input", got: total, need: HOP_LENGTH });
        }
        let n_mels = self.n_mels();
        let mut out = vec![0f32; n_frames * n_mels];
        pool().for_each_chunk_mut(&mut out, FRAMES_PER_TASK * n_mels, |block, chunk| {
            let mut w = self.worker();
            for (i, dst) in chunk.chunks_exact_mut(n_mels).enumerate() {
                let t = block * FRAMES_PER_TASK + i;
                fill_frame(&mut w.frame, samples, 0, total, t);
                self.frame_log10(&mut w, dst);
            }
        });
        Ok(out)
    }

    /// An incremental spectrogram fed chunk by chunk.
    pub fn stream(&self) -> MelStream {
        MelStream {
            mel: self.clone(),
            worker: self.worker(),
            buf: Vec::new(),
            buf_start: 0,
            received: 0,
            next_frame: 0,
            frames: Vec::new(),
            finished: false,
        }
    }
}

/// Copies the (not yet windowed) samples of frame `t` into `frame`. `buf` holds the samples
/// from global index `buf_start`; the signal has `total` samples, of which those at or past
/// `buf_start + buf.len()` are zeros (Whisper's right padding). Indices outside
/// `[0, total)` are reflected as `torch.stft(center=True, pad_mode="reflect")` does (repeatedly,
/// as numpy does, when the signal is shorter than the padding).
fn fill_frame(frame: &mut [f64], buf: &[f32], buf_start: usize, total: usize, t: usize) {
    let first = (t * HOP_LENGTH) as isize - PAD as isize;
    let buf_end = buf_start + buf.len();
    if first >= buf_start as isize && first as usize + N_FFT <= buf_end {
        let s = first as usize - buf_start;
        for (d, &x) in frame.iter_mut().zip(&buf[s..s + N_FFT]) {
            *d = x as f64;
        }
        return;
    }
    for (j, d) in frame.iter_mut().enumerate() {
        let idx = reflect(first + j as isize, total);
        *d = if idx >= buf_start && idx < buf_end { buf[idx - buf_start] as f64 } else { 0.0 };
    }
}

fn reflect(mut i: isize, total: usize) -> usize {
    let n = total as isize;
    if n == 1 {
        return 0;
    }
    loop {
        if i < 0 {
            i = -i;
        } else if i >= n {
            i = 2 * (n - 1) - i;
        } else {
            return i as usize;
        }
    }
}

/// Whisper's normalisation of frame-major log10 energies into a `[n_mels, n_frames]` [`Mel`].
pub fn normalize(log10_frames: &[f32], n_mels: usize) -> Mel {
    let n_frames = log10_frames.len() / n_mels.max(1);
    let max = log10_frames.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let floor = max - 8.0;
    let mut data = vec![0f32; n_mels * n_frames];
    // Transposing frame-major to mel-major: each task owns 16 mel rows, so it reads one
    // 64-byte line per frame instead of every task reading every line.
    const ROWS: usize = 16;
    pool().for_each_chunk_mut(&mut data, ROWS * n_frames.max(1), |g, rows| {
        let m0 = g * ROWS;
        let k = rows.len() / n_frames.max(1);
        for t in 0..n_frames {
            let src = &log10_frames[t * n_mels + m0..t * n_mels + m0 + k];
            for (r, &v) in src.iter().enumerate() {
                rows[r * n_frames + t] = (v.max(floor) + 4.0) / 4.0;
            }
        }
    });
    Mel { n_mels, n_frames, data }
}

/// Incremental log-mel: [`MelStream::push`] appends the frames whose window is complete;
/// [`MelStream::finish`] adds the last ones (reflect-padded at the end). Frames equal those
/// of [`LogMel::log_mel`] over the whole audio; [`MelStream::mel`] normalises over all frames
/// so far, so after `finish` it equals the one-shot result.
pub struct MelStream {
    mel: LogMel,
    worker: Worker,
    buf: Vec<f32>,
    buf_start: usize,
    received: usize,
    next_frame: usize,
    frames: Vec<f32>,
    finished: bool,
}

impl std::fmt::Debug for MelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MelStream").field("received", &self.received).field("frames", &self.next_frame).finish()
    }
}

impl MelStream {
    /// Appends 16 kHz samples; returns how many new frames became available.
    pub fn push(&mut self, samples: &[f32]) -> Result<usize> {
        if self.finished {
            return Err(Error::InvalidInput("MelStream::push after finish".into()));
        }
        check_finite("log-mel input", samples)?;
        self.buf.extend_from_slice(samples);
        self.received += samples.len();
        let before = self.next_frame;
        let n_mels = self.mel.n_mels();
        // Frame t needs samples up to t*160 + 200 (exclusive).
        while self.next_frame * HOP_LENGTH + PAD <= self.received {
            let t = self.next_frame;
            fill_frame(&mut self.worker.frame, &self.buf, self.buf_start, isize::MAX as usize, t);
            let at = self.frames.len();
            self.frames.resize(at + n_mels, 0.0);
            self.mel.frame_log10(&mut self.worker, &mut self.frames[at..]);
            self.next_frame += 1;
        }
        // Keep only what later frames (and the end reflection) can still read.
        let keep_from = (self.next_frame * HOP_LENGTH).saturating_sub(PAD);
        if keep_from > self.buf_start + 16 * 1024 {
            self.buf.drain(..keep_from - self.buf_start);
            self.buf_start = keep_from;
        }
        Ok(self.next_frame - before)
    }

    /// Ends the stream: computes the last frames with reflect padding at the end. Returns how
    /// many frames it added.
    pub fn finish(&mut self) -> Result<usize> {
        if self.finished {
            return Ok(0);
        }
        if self.received == 0 {
            return Err(Error::ZeroLength { what: "log-mel stream".into() });
        }
        self.finished = true;
        let total_frames = self.received / HOP_LENGTH;
        let before = self.next_frame;
        let n_mels = self.mel.n_mels();
        while self.next_frame < total_frames {
            let t = self.next_frame;
            fill_frame(&mut self.worker.frame, &self.buf, self.buf_start, self.received, t);
            let at = self.frames.len();
            self.frames.resize(at + n_mels, 0.0);
            self.mel.frame_log10(&mut self.worker, &mut self.frames[at..]);
            self.next_frame += 1;
        }
        Ok(self.next_frame - before)
    }

    /// Frames available so far.
    pub fn n_frames(&self) -> usize {
        self.next_frame
    }

    /// Samples received so far.
    pub fn samples_received(&self) -> usize {
        self.received
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// log10 mel energies of frame `t`, before normalisation.
    pub fn log10_frame(&self, t: usize) -> Option<&[f32]> {
        let n = self.mel.n_mels();
        self.frames.get(t * n..(t + 1) * n)
    }

    /// Whisper-normalised spectrogram of all frames so far.
    pub fn mel(&self) -> Result<Mel> {
        if self.next_frame == 0 {
            return Err(Error::TooShort { what: "log-mel stream", got: self.received, need: HOP_LENGTH + PAD });
        }
        Ok(normalize(&self.frames, self.mel.n_mels()))
    }
}
