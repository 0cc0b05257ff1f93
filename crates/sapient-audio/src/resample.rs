//! Sample-rate conversion with rubato's synchronous FFT resampler (band-limited, exact
//! rational ratio, delay removed). One-shot [`resample`] and the streaming [`Resampler`]
//! share the same code, so chunked output equals all-at-once output.

use crate::error::{check_finite, check_rate, Error, Result};
use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Indexing, WindowFunction};

/// Input frames per internal chunk.
const CHUNK: usize = 1024;

/// Resamples mono audio from `from` Hz to `to` Hz. The output has
/// `ceil(len * to / from)` samples and is aligned with the input (the filter delay is
/// removed).
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>> {
    let mut r = Resampler::new(from, to)?;
    let mut out = r.process(samples)?;
    out.extend(r.finish()?);
    Ok(out)
}

/// A streaming resampler: feed chunks of any size with [`Resampler::process`], then call
/// [`Resampler::finish`] once for the tail. The concatenated output equals [`resample`] of the
/// concatenated input.
pub struct Resampler {
    from: u32,
    to: u32,
    inner: Option<Box<dyn rubato::Resampler<f32>>>,
    pending: Vec<f32>,
    scratch: Vec<f32>,
    to_trim: usize,
    total_in: u64,
    total_out: u64,
    finished: bool,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler").field("from", &self.from).field("to", &self.to).finish()
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Resampler {
    pub fn new(from: u32, to: u32) -> Result<Self> {
        check_rate(from)?;
        check_rate(to)?;
        let inner: Option<Box<dyn rubato::Resampler<f32>>> = if from == to {
            None
        } else {
            let g = gcd(from as usize, to as usize);
            let err = |e: rubato::ResamplerConstructionError| Error::Resample { from, to, detail: e.to_string() };
            let m = from as usize / g;
            // One FFT block of about CHUNK input frames (a multiple of `from / gcd`): a long
            // filter with a sharp cut-off near Nyquist. The block count is even so that both
            // FFT sizes are even: rubato trims `fft_size_out / 2` frames of delay, which is
            // half a sample off when the sizes are odd. Rates with a large reduced ratio
            // (44101 -> 16000) get larger blocks, hence more latency, but stay exact.
            let k = CHUNK.div_ceil(m).next_multiple_of(2);
            Some(Box::new(
                Fft::<f32>::new_custom(from as usize, to as usize, k * m, 1, 1, WindowFunction::BlackmanHarris2, FixedSync::Input)
                    .map_err(err)?,
            ))
        };
        let to_trim = inner.as_ref().map(|r| r.output_delay()).unwrap_or(0);
        let scratch = vec![0.0; inner.as_ref().map(|r| r.output_frames_max()).unwrap_or(0)];
        Ok(Self { from, to, inner, pending: Vec::new(), scratch, to_trim, total_in: 0, total_out: 0, finished: false })
    }

    pub fn from_rate(&self) -> u32 {
        self.from
    }

    pub fn to_rate(&self) -> u32 {
        self.to
    }

    /// Output samples owed for `n` input samples: `ceil(n * to / from)`.
    pub fn output_len_for(&self, n: u64) -> u64 {
        (n * self.to as u64).div_ceil(self.from as u64)
    }

    /// Feeds samples; returns the output that is ready.
    pub fn process(&mut self, input: &[f32]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.output_len_for(input.len() as u64) as usize + CHUNK);
        self.process_into(input, &mut out)?;
        Ok(out)
    }

    /// Feeds samples, appending the ready output to `out`.
    pub fn process_into(&mut self, input: &[f32], out: &mut Vec<f32>) -> Result<()> {
        if self.finished {
            return Err(Error::InvalidInput("Resampler::process after finish (call reset)".into()));
        }
        check_finite("resampler input", input)?;
        self.total_in += input.len() as u64;
        let Some(inner) = self.inner.as_mut() else {
            out.extend_from_slice(input);
            self.total_out += input.len() as u64;
            return Ok(());
        };
        self.pending.extend_from_slice(input);
        let mut start = 0;
        loop {
            let need = inner.input_frames_next();
            if self.pending.len() - start < need {
                break;
            }
            let chunk = &self.pending[start..start + need];
            let n = Self::run(inner.as_mut(), chunk, None, &mut self.scratch, self.from, self.to)?;
            start += need;
            Self::emit(&self.scratch[..n], &mut self.to_trim, &mut self.total_out, out);
        }
        self.pending.drain(..start);
        Ok(())
    }

    /// Flushes the tail: afterwards exactly `ceil(total_in * to / from)` samples have been
    /// produced in all.
    pub fn finish(&mut self) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        if self.finished {
            return Ok(out);
        }
        self.finished = true;
        let expected = self.output_len_for(self.total_in);
        let Some(inner) = self.inner.as_mut() else {
            return Ok(out);
        };
        let need = inner.input_frames_next();
        let mut buf = std::mem::take(&mut self.pending);
        let partial = buf.len();
        buf.resize(need.max(partial), 0.0);
        let n = Self::run(inner.as_mut(), &buf, Some(partial), &mut self.scratch, self.from, self.to)?;
        Self::emit(&self.scratch[..n], &mut self.to_trim, &mut self.total_out, &mut out);
        // Pump silence through until the filter delay has been drained.
        let zeros = vec![0.0f32; inner.input_frames_max()];
        let mut guard = 0;
        while self.total_out < expected {
            let need = inner.input_frames_next();
            let n = Self::run(inner.as_mut(), &zeros[..need], Some(0), &mut self.scratch, self.from, self.to)?;
            Self::emit(&self.scratch[..n], &mut self.to_trim, &mut self.total_out, &mut out);
            guard += 1;
            if guard > 10_000 {
                return Err(Error::Resample { from: self.from, to: self.to, detail: "flush did not converge".into() });
            }
        }
        let extra = (self.total_out - expected) as usize;
        out.truncate(out.len() - extra.min(out.len()));
        self.total_out = expected;
        Ok(out)
    }

    /// Back to the initial state, ready for a new stream.
    pub fn reset(&mut self) {
        if let Some(r) = self.inner.as_mut() {
            r.reset();
        }
        self.to_trim = self.inner.as_ref().map(|r| r.output_delay()).unwrap_or(0);
        self.pending.clear();
        self.total_in = 0;
        self.total_out = 0;
        self.finished = false;
    }

    fn run(
        inner: &mut dyn rubato::Resampler<f32>,
        chunk: &[f32],
        partial: Option<usize>,
        scratch: &mut Vec<f32>,
        from: u32,
        to: u32,
    ) -> Result<usize> {
        let err = |e: String| Error::Resample { from, to, detail: e };
        let out_frames = inner.output_frames_next();
        if scratch.len() < out_frames {
            scratch.resize(out_frames, 0.0);
        }
        let input = InterleavedSlice::new(chunk, 1, chunk.len()).map_err(|e| err(e.to_string()))?;
        let len = scratch.len();
        let mut output = InterleavedSlice::new_mut(&mut scratch[..], 1, len).map_err(|e| err(e.to_string()))?;
        let indexing = partial.map(|p| Indexing::new().partial_len(p));
        let (_, n) = inner.process_into_buffer(&input, &mut output, indexing.as_ref()).map_err(|e| err(e.to_string()))?;
        Ok(n)
    }

    fn emit(frames: &[f32], to_trim: &mut usize, total_out: &mut u64, out: &mut Vec<f32>) {
        let skip = (*to_trim).min(frames.len());
        *to_trim -= skip;
        out.extend_from_slice(&frames[skip..]);
        *total_out += (frames.len() - skip) as u64;
    }
}
