//! Decoding: WAV (PCM 8/16/24/32-bit, float 32/64, A-law, µ-law), FLAC, MP3 and Ogg/Vorbis
//! through symphonia, raw PCM with a stated rate, and mono mixdown.

use crate::error::{check_rate, Error, Result};
use std::path::Path;
use symphonia::core::codecs::audio::{AudioDecoder, AudioDecoderOptions};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream};
use symphonia::core::meta::MetadataOptions;

/// Decoded audio: mono samples in [-1, 1] at `sample_rate`.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// Mono samples (the mean of the source channels).
    pub samples: Vec<f32>,
    /// Samples per second.
    pub sample_rate: u32,
    /// Channel count of the source before the mono mixdown.
    pub channels_original: u16,
}

impl Audio {
    /// Mono audio from samples; checks the rate and that every sample is finite.
    pub fn new(samples: Vec<f32>, sample_rate: u32) -> Result<Self> {
        check_rate(sample_rate)?;
        crate::error::check_finite("audio", &samples)?;
        Ok(Self { samples, sample_rate, channels_original: 1 })
    }

    /// Duration in seconds.
    pub fn duration_s(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate as f64
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The same audio at another rate (see [`crate::resample`]).
    pub fn resample(&self, to: u32) -> Result<Audio> {
        Ok(Audio {
            samples: crate::resample::resample(&self.samples, self.sample_rate, to)?,
            sample_rate: to,
            channels_original: self.channels_original,
        })
    }

    /// The same audio at 16 kHz, the rate Whisper and Silero VAD expect (no copy when it
    /// already is).
    pub fn into_16k(self) -> Result<Audio> {
        if self.sample_rate == 16_000 {
            Ok(self)
        } else {
            self.resample(16_000)
        }
    }
}

/// Decodes a whole file (format found from its content, the extension is a hint).
pub fn decode_file(path: impl AsRef<Path>) -> Result<Audio> {
    Decoder::open(path)?.decode_all()
}

/// Decodes a whole in-memory file (WAV, FLAC, MP3, Ogg/Vorbis).
pub fn decode_bytes(bytes: impl Into<Vec<u8>>) -> Result<Audio> {
    Decoder::from_bytes(bytes.into())?.decode_all()
}

/// Sample encodings for [`decode_raw_pcm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcmFormat {
    /// Unsigned 8-bit (128 is silence).
    U8,
    /// Signed 16-bit little-endian.
    S16Le,
    /// Signed 16-bit big-endian.
    S16Be,
    /// Signed 24-bit little-endian, packed in 3 bytes.
    S24Le,
    /// Signed 32-bit little-endian.
    S32Le,
    /// IEEE float 32-bit little-endian.
    F32Le,
    /// IEEE float 64-bit little-endian.
    F64Le,
}

impl PcmFormat {
    /// Bytes per sample.
    pub fn bytes(self) -> usize {
        match self {
            PcmFormat::U8 => 1,
            PcmFormat::S16Le | PcmFormat::S16Be => 2,
            PcmFormat::S24Le => 3,
            PcmFormat::S32Le | PcmFormat::F32Le => 4,
            PcmFormat::F64Le => 8,
        }
    }

    fn sample(self, b: &[u8]) -> f32 {
        match self {
            PcmFormat::U8 => (b[0] as f32 - 128.0) / 128.0,
            PcmFormat::S16Le => i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0,
            PcmFormat::S16Be => i16::from_be_bytes([b[0], b[1]]) as f32 / 32768.0,
            PcmFormat::S24Le => (i32::from_le_bytes([0, b[0], b[1], b[2]]) >> 8) as f32 / 8_388_608.0,
            PcmFormat::S32Le => (i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64 / 2_147_483_648.0) as f32,
            PcmFormat::F32Le => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            PcmFormat::F64Le => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32,
        }
    }
}

/// Decodes headerless mono PCM (e.g. the 16 kHz `.raw` files of pocketsphinx).
pub fn decode_raw_pcm(bytes: &[u8], sample_rate: u32, format: PcmFormat) -> Result<Audio> {
    decode_raw_pcm_interleaved(bytes, sample_rate, 1, format)
}

/// Decodes headerless interleaved PCM with `channels` channels, mixed down to mono.
pub fn decode_raw_pcm_interleaved(bytes: &[u8], sample_rate: u32, channels: u16, format: PcmFormat) -> Result<Audio> {
    check_rate(sample_rate)?;
    if channels == 0 || channels > 64 {
        return Err(Error::InvalidChannels { channels: channels as usize });
    }
    if bytes.is_empty() {
        return Err(Error::EmptyInput { what: "raw PCM".into() });
    }
    let frame_bytes = format.bytes() * channels as usize;
    if !bytes.len().is_multiple_of(frame_bytes) {
        return Err(Error::RawPcmLength { len: bytes.len(), frame_bytes });
    }
    let ch = channels as usize;
    let samples: Vec<f32> = bytes
        .chunks_exact(frame_bytes)
        .map(|frame| {
            let sum: f32 = frame.chunks_exact(format.bytes()).map(|b| format.sample(b)).sum();
            sum / ch as f32
        })
        .collect();
    if let Some(index) = samples.iter().position(|s| !s.is_finite()) {
        return Err(Error::NonFinite { what: "raw PCM", index, value: samples[index] });
    }
    Ok(Audio { samples, sample_rate, channels_original: channels })
}

/// Default of [`Decoder::with_max_duration`]: 4 hours. Compressed formats expand (a FLAC
/// file of constant blocks takes a few bytes per 4096 samples), so the decoded length, not the
/// file's, bounds the memory a decode takes.
pub const DEFAULT_MAX_DURATION_S: f64 = 4.0 * 3600.0;

/// A lazy decoder: packets are decoded and mixed down to mono on demand, so long files stream
/// in bounded memory (see [`crate::stream::FileStream`]).
pub struct Decoder {
    what: String,
    format: Box<dyn FormatReader>,
    decoder: Box<dyn AudioDecoder>,
    track_id: u32,
    sample_rate: u32,
    channels: u16,
    interleaved: Vec<f32>,
    decoded_any: bool,
    finished: bool,
    frames: u64,
    max_duration_s: f64,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("source", &self.what)
            .field("sample_rate", &self.sample_rate)
            .field("channels", &self.channels)
            .finish()
    }
}

impl Decoder {
    /// Opens a file and reads its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        let len = file.metadata().map_err(|source| Error::Io { path: path.to_path_buf(), source })?.len();
        let what = path.display().to_string();
        if len == 0 {
            return Err(Error::EmptyInput { what });
        }
        let mut hint = Hint::new();
        if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
            hint.with_extension(ext);
        }
        Self::from_source(Box::new(file), hint, what)
    }

    /// Reads the header of an in-memory file.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let what = format!("<{} bytes in memory>", bytes.len());
        if bytes.is_empty() {
            return Err(Error::EmptyInput { what: "<in-memory audio>".into() });
        }
        Self::from_source(Box::new(std::io::Cursor::new(bytes)), Hint::new(), what)
    }

    fn from_source(source: Box<dyn MediaSource>, hint: Hint, what: String) -> Result<Self> {
        let mss = MediaSourceStream::new(source, Default::default());
        // symphonia's header parsers multiply header fields unchecked (a panic where overflow
        // checks are on, e.g. a WAV with 20000 channels): a corrupt file, not a crash.
        let probed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            symphonia::default::get_probe().probe(&hint, mss, FormatOptions::default(), MetadataOptions::default())
        }))
        .map_err(|_| Error::Corrupt { what: what.clone(), detail: "malformed header (the parser panicked)".into() })?;
        let format = probed
            .map_err(|e| match e {
                SymError::Unsupported(d) => Error::UnsupportedFormat { what: what.clone(), detail: d.to_string() },
                other => sym_err(&what, other),
            })?;
        let track = format
            .default_track(TrackType::Audio)
            .ok_or_else(|| Error::UnsupportedFormat { what: what.clone(), detail: "no audio track".into() })?;
        let track_id = track.id;
        let params = track
            .codec_params
            .as_ref()
            .and_then(|p| p.audio())
            .ok_or_else(|| Error::Corrupt { what: what.clone(), detail: "no audio codec parameters".into() })?
            .clone();
        let rate = params
            .sample_rate
            .ok_or_else(|| Error::Corrupt { what: what.clone(), detail: "no sample rate in the header".into() })?;
        check_rate(rate)?;
        let channels = params.channels.as_ref().map(|c| c.count()).unwrap_or(0);
        if channels == 0 || channels > 64 {
            return Err(Error::InvalidChannels { channels });
        }
        let decoder = symphonia::default::get_codecs()
            .make_audio_decoder(&params, &AudioDecoderOptions::default())
            .map_err(|e| match e {
                SymError::Unsupported(d) => {
                    Error::UnsupportedCodec { what: what.clone(), detail: format!("{d} (codec {})", params.codec) }
                }
                other => sym_err(&what, other),
            })?;
        tracing::debug!(source = %what, rate, channels, codec = %params.codec, "opened audio");
        Ok(Self {
            what,
            format,
            decoder,
            track_id,
            sample_rate: rate,
            channels: channels as u16,
            interleaved: Vec::new(),
            decoded_any: false,
            finished: false,
            frames: 0,
            max_duration_s: DEFAULT_MAX_DURATION_S,
        })
    }

    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    /// Stop with [`Error::TooLong`] once more than `seconds` of audio have been decoded
    /// (default [`DEFAULT_MAX_DURATION_S`]).
    pub fn with_max_duration(mut self, seconds: f64) -> Self {
        self.max_duration_s = seconds;
        self
    }

    /// Channel count of the source (chunks are mono).
    pub fn channels(&self) -> u16 {
        self.channels
    }

    /// The next decoded packet, mixed down to mono; `None` at the end of the stream.
    pub fn next_chunk(&mut self) -> Option<Result<Vec<f32>>> {
        while !self.finished {
            let packet = match self.format.next_packet() {
                Ok(Some(p)) => p,
                Ok(None) => {
                    self.finished = true;
                    break;
                }
                // Truncated files end on an unexpected EOF: what was decoded is kept.
                Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof && self.decoded_any => {
                    tracing::warn!(source = %self.what, "truncated stream: stopping at the last whole packet");
                    self.finished = true;
                    break;
                }
                Err(e) => {
                    self.finished = true;
                    return Some(Err(sym_err(&self.what, e)));
                }
            };
            if packet.track_id != self.track_id {
                continue;
            }
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.decoder.decode(&packet).map(|b| {
                let frames = b.frames();
                let ch = b.spec().channels().count().max(1);
                b.copy_to_vec_interleaved(&mut self.interleaved);
                (frames, ch)
            })));
            let Ok(decoded) = decoded else {
                self.finished = true;
                return Some(Err(Error::Corrupt { what: self.what.clone(), detail: "malformed packet (the decoder panicked)".into() }));
            };
            let (frames, ch) = match decoded {
                Ok(b) => b,
                Err(SymError::DecodeError(d)) => {
                    // One bad packet in a long stream is skipped, as players do.
                    tracing::warn!(source = %self.what, "skipping an undecodable packet: {d}");
                    continue;
                }
                Err(e) => {
                    self.finished = true;
                    return Some(Err(sym_err(&self.what, e)));
                }
            };
            if frames == 0 {
                continue;
            }
            self.frames += frames as u64;
            if self.frames as f64 > self.max_duration_s * self.sample_rate as f64 {
                self.finished = true;
                return Some(Err(Error::TooLong { what: self.what.clone(), limit_s: self.max_duration_s }));
            }
            let mono: Vec<f32> = if ch == 1 {
                self.interleaved[..frames].to_vec()
            } else {
                let inv = 1.0 / ch as f32;
                self.interleaved.chunks_exact(ch).take(frames).map(|f| f.iter().sum::<f32>() * inv).collect()
            };
            self.decoded_any = true;
            return Some(Ok(mono));
        }
        None
    }

    /// Decodes everything that is left.
    pub fn decode_all(mut self) -> Result<Audio> {
        let mut samples = Vec::new();
        while let Some(chunk) = self.next_chunk() {
            samples.extend_from_slice(&chunk?);
        }
        if samples.is_empty() {
            return Err(Error::ZeroLength { what: self.what });
        }
        if let Some(index) = samples.iter().position(|s| !s.is_finite()) {
            return Err(Error::NonFinite { what: "decoded audio", index, value: samples[index] });
        }
        Ok(Audio { samples, sample_rate: self.sample_rate, channels_original: self.channels })
    }
}

fn sym_err(what: &str, e: SymError) -> Error {
    match e {
        SymError::Unsupported(d) => Error::UnsupportedCodec { what: what.to_string(), detail: d.to_string() },
        SymError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            Error::Corrupt { what: what.to_string(), detail: "unexpected end of data (truncated header?)".into() }
        }
        SymError::IoError(io) => Error::Corrupt { what: what.to_string(), detail: io.to_string() },
        SymError::DecodeError(d) => Error::Corrupt { what: what.to_string(), detail: d.to_string() },
        SymError::LimitError(d) => Error::Corrupt { what: what.to_string(), detail: format!("limit exceeded: {d}") },
        other => Error::Corrupt { what: what.to_string(), detail: other.to_string() },
    }
}

/// Sample encodings for [`write_wav`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WavFormat {
    /// 16-bit PCM (samples clamped to [-1, 1]).
    #[default]
    Pcm16,
    /// 32-bit IEEE float (no clamping).
    Float32,
}

/// A mono WAV file in memory.
pub fn encode_wav(samples: &[f32], sample_rate: u32, format: WavFormat) -> Result<Vec<u8>> {
    crate::error::check_finite("WAV output", samples)?;
    let mut out = wav_header(sample_rate, format, Some(samples.len()))?;
    match format {
        WavFormat::Pcm16 => out.extend_from_slice(&encode_pcm16(samples)),
        WavFormat::Float32 => {
            for &s in samples {
                out.extend_from_slice(&s.to_le_bytes());
            }
        }
    }
    Ok(out)
}

/// The header of a mono WAV file of `samples` samples; `None` for a stream whose length is not
/// known yet: the RIFF and data sizes (and float's sample count) are then 0xFFFFFFFF, as
/// streaming servers write them and decoders read them (up to the end of the stream). The
/// samples follow as [`encode_pcm16`] (or little-endian f32) writes them.
pub fn wav_header(sample_rate: u32, format: WavFormat, samples: Option<usize>) -> Result<Vec<u8>> {
    check_rate(sample_rate)?;
    let (tag, bits): (u16, u16) = match format {
        WavFormat::Pcm16 => (1, 16),
        WavFormat::Float32 => (3, 32),
    };
    let block = bits / 8;
    let extra = if format == WavFormat::Float32 { 14 } else { 0 };
    let (riff_len, data_len, frames) = match samples {
        Some(n) => {
            let data_len = n as u64 * block as u64;
            // RIFF sizes are u32: 4 GiB of audio is the format's own limit.
            let riff_len = 36 + data_len + extra;
            if riff_len >= u32::MAX as u64 {
                return Err(Error::InvalidInput(format!("{n} samples do not fit in a WAV file")));
            }
            (riff_len as u32, data_len as u32, n as u32)
        }
        None => (u32::MAX, u32::MAX, u32::MAX),
    };
    let mut out = Vec::with_capacity(44 + extra as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&riff_len.to_le_bytes());
    out.extend_from_slice(b"WAVE");
    out.extend_from_slice(b"fmt ");
    let fmt_len: u32 = if format == WavFormat::Float32 { 18 } else { 16 };
    out.extend_from_slice(&fmt_len.to_le_bytes());
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&sample_rate.to_le_bytes());
    out.extend_from_slice(&(sample_rate * block as u32).to_le_bytes());
    out.extend_from_slice(&block.to_le_bytes());
    out.extend_from_slice(&bits.to_le_bytes());
    if format == WavFormat::Float32 {
        out.extend_from_slice(&0u16.to_le_bytes()); // cbSize
        out.extend_from_slice(b"fact");
        out.extend_from_slice(&4u32.to_le_bytes());
        out.extend_from_slice(&frames.to_le_bytes());
    }
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    Ok(out)
}

/// Samples as 16-bit little-endian PCM (`round(s * 32768)`, clamped), as [`WavFormat::Pcm16`]
/// writes them: raw PCM for streaming.
pub fn encode_pcm16(samples: &[f32]) -> Vec<u8> {
    samples.iter().flat_map(|&s| ((s * 32768.0).round().clamp(-32768.0, 32767.0) as i16).to_le_bytes()).collect()
}

/// Writes mono samples as a WAV file (e.g. TTS output).
pub fn write_wav(path: impl AsRef<Path>, samples: &[f32], sample_rate: u32, format: WavFormat) -> Result<()> {
    let path = path.as_ref();
    let bytes = encode_wav(samples, sample_rate, format)?;
    std::fs::write(path, bytes).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}
