//! Long-form transcription as openai-whisper's `transcribe.py`: 30 s windows over the padded
//! log-mel, each decoded with temperature fallback, cut into segments at timestamp pairs,
//! the next window starting at the last complete timestamp; windows judged silent are
//! skipped; the previous text conditions the next window.
//!
//! This file holds the options, the results and loading ([`Transcriber`]); the sequential
//! loop is in `sequential.rs`, batched long form in `batched.rs`, word timestamps in
//! `words.rs`.

use crate::config::WhisperConfig;
use crate::decode::{decode_batch, decode_window, detect_language, DecodeOptions, DecodeResult, Task};
use crate::model::{QuantizeWeights, TensorMap, Whisper};
use crate::timing::{self, Word};
use crate::tokenizer::WhisperTokenizer;
use crate::{ct2, Error, Result};
use candle_core::{DType, Device, Tensor};
use sapient_audio::mel::{HOP_LENGTH, N_FFT, N_SAMPLES, SAMPLE_RATE};
use sapient_audio::LogMel;
use sapient_hub::{Hub, Progress};
use std::path::Path;

mod batched;
mod sequential;
mod words;
pub(crate) use sequential::LoopState;

/// Options of a transcription (openai-whisper's `transcribe` arguments).
#[derive(Clone, Debug)]
pub struct TranscribeOptions {
    pub task: Task,
    /// None: detected on the first window (multilingual models); `en` for English-only ones.
    pub language: Option<String>,
    /// Tried in order until a window's result passes the thresholds.
    pub temperatures: Vec<f32>,
    /// Beam search at temperature 0 (None: greedy).
    pub beam_size: Option<usize>,
    pub patience: f32,
    /// Samples per window at temperature > 0.
    pub best_of: usize,
    pub length_penalty: Option<f32>,
    pub compression_ratio_threshold: Option<f32>,
    pub logprob_threshold: Option<f32>,
    pub no_speech_threshold: Option<f32>,
    pub condition_on_previous_text: bool,
    pub initial_prompt: Option<String>,
    pub without_timestamps: bool,
    /// Word-level timestamps from the alignment heads' cross-attention (DTW).
    pub word_timestamps: bool,
    pub seed: u64,
    /// With a VAD attached ([`Transcriber::set_vad`]): a window in which the VAD hears no
    /// speech is skipped when the model's no-speech probability is above this (checked on the
    /// first decoder step, before any text is decoded). None: the VAD is not consulted.
    pub vad_no_speech_threshold: Option<f32>,
    /// How audio longer than one window is cut and decoded: sequential 30 s windows, each
    /// conditioned on the previous text (the default), or Silero VAD chunks decoded in
    /// batches without conditioning ([`LongForm::Batched`]).
    pub long_form: LongForm,
}

/// How long-form audio is transcribed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LongForm {
    /// openai-whisper's loop: 30 s windows one after the other, each starting at the last
    /// complete timestamp of the one before and conditioned on its text (with
    /// [`TranscribeOptions::condition_on_previous_text`]). The default: the previous text
    /// keeps names, spelling and style consistent across windows.
    #[default]
    Sequential,
    /// faster-whisper's `BatchedInferencePipeline`: the attached Silero VAD
    /// ([`Transcriber::set_vad`], required) finds the speech (regions padded by 400 ms),
    /// the regions are gathered in order into chunks of up to 30 s of audio, each chunk's
    /// regions heard one after the other without the silence between them (times are
    /// mapped back to the file's), and `batch_size` chunks at a time go through
    /// the encoder as one batch and through the decoder together (one decoder step over
    /// every chunk's beams). No chunk is conditioned on another's text (the initial prompt,
    /// if any, is given to every chunk); each chunk whose result fails the thresholds is
    /// decoded again at the higher temperatures, alone. Faster on long audio with several
    /// cores; silence between chunks is never decoded.
    Batched {
        /// Chunks per batch ([`DEFAULT_BATCH_SIZE`]).
        batch_size: usize,
    },
}

/// Chunks per batch of [`LongForm::Batched`] by default (faster-whisper's benchmark setting).
pub const DEFAULT_BATCH_SIZE: usize = 8;

/// Longest chunk of [`LongForm::Batched`], in seconds (one window).
const CHUNK_S: f64 = 30.0;

impl Default for TranscribeOptions {
    fn default() -> Self {
        Self {
            task: Task::Transcribe,
            language: None,
            temperatures: vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            beam_size: None,
            patience: 1.0,
            best_of: 5,
            length_penalty: None,
            compression_ratio_threshold: Some(2.4),
            logprob_threshold: Some(-1.0),
            no_speech_threshold: Some(0.6),
            condition_on_previous_text: true,
            initial_prompt: None,
            without_timestamps: false,
            word_timestamps: false,
            seed: 0,
            vad_no_speech_threshold: Some(VAD_NO_SPEECH_THRESHOLD),
            long_form: LongForm::Sequential,
        }
    }
}

/// A piece of the transcript between two timestamps.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub id: usize,
    /// Mel frame the window started at.
    pub seek: usize,
    /// Seconds from the start of the audio.
    pub start: f64,
    pub end: f64,
    pub text: String,
    pub tokens: Vec<u32>,
    pub temperature: f32,
    pub avg_logprob: f32,
    pub compression_ratio: f32,
    pub no_speech_prob: f32,
    /// With [`TranscribeOptions::word_timestamps`].
    pub words: Vec<Word>,
}

impl Segment {
    /// A segment of a window's decode (`id` set and words added later).
    fn decoded(seek: usize, start: f64, end: f64, text: String, tokens: Vec<u32>, result: &DecodeResult) -> Self {
        Segment {
            id: 0,
            seek,
            start,
            end,
            text,
            tokens,
            temperature: result.temperature,
            avg_logprob: result.avg_logprob,
            compression_ratio: result.compression_ratio,
            no_speech_prob: result.no_speech_prob,
            words: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Transcript {
    pub text: String,
    pub segments: Vec<Segment>,
    pub language: String,
    /// Language probabilities, most likely first, when the language was detected.
    pub language_probs: Vec<(String, f32)>,
    /// Seconds of audio.
    pub duration: f64,
}

/// How to load a model. The default quantizes the encoder's and decoder's matrices to Q8_0
/// at load (int8 products: about 2.5x faster than f32 on CPUs without AMX at the same word
/// errors on the speech clips, see docs/benchmarks.md); [`LoadOptions::f32`] keeps every
/// matrix in f32, as the checkpoint has it.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Quantize the decoder's matrices (and the output projection) to this type at load, for
    /// sapient-tensor's quantized kernels in the decoding steps (CPU only).
    /// `Some(GgmlDType::Q8_0)` is the int8 setting.
    pub quantize_decoder: Option<candle_core::quantized::GgmlDType>,
    /// The same for the encoder layers' matrices (CPU only; the convolutions and the
    /// attention products stay f32). Where the CPU has AMX-BF16 the encoder runs them as
    /// dense products of the quantized values (faster there than the Q8_0 kernels).
    pub quantize_encoder: Option<candle_core::quantized::GgmlDType>,
    /// What a model file may make the loader allocate (a CTranslate2 `model.bin` is read
    /// whole; safetensors/GGUF tensors are checked one by one).
    pub limits: sapient_tensor::Limits,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self::quantized(candle_core::quantized::GgmlDType::Q8_0)
    }
}

impl LoadOptions {
    /// Encoder and decoder matrices in `dtype` (`sapient transcribe --quant q8_0`).
    pub fn quantized(dtype: candle_core::quantized::GgmlDType) -> Self {
        Self { quantize_decoder: Some(dtype), quantize_encoder: Some(dtype), limits: sapient_tensor::Limits::default() }
    }

    /// Every matrix in f32, as the checkpoint has it (`sapient transcribe --quant none`).
    pub fn f32() -> Self {
        Self { quantize_decoder: None, quantize_encoder: None, limits: sapient_tensor::Limits::default() }
    }
}

/// Default of [`TranscribeOptions::vad_no_speech_threshold`].
pub const VAD_NO_SPEECH_THRESHOLD: f32 = 0.1;

/// A Whisper model with its tokenizer and log-mel front end.
pub struct Transcriber {
    pub model: Whisper,
    pub tokenizer: WhisperTokenizer,
    pub(crate) mel: LogMel,
    /// Silero VAD consulted by the file mode (see [`Transcriber::set_vad`]).
    vad: Option<std::sync::Mutex<sapient_audio::SileroVad>>,
}

const INPUT_STRIDE: usize = 2; // mel frames per encoder position
const TIME_PRECISION: f64 = 0.02; // seconds per timestamp token

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Transcriber {
    /// A preset (`whisper-tiny.en`, `whisper-base`), a directory (CTranslate2: `model.bin`,
    /// `config.json`, `tokenizer.json`; or transformers: `*.safetensors` or one `model.gguf`
    /// from `cargo xtask convert ct2-to-gguf`, `config.json`, `tokenizer.json`) or a
    /// `model.bin` path, on the CPU.
    pub fn from_pretrained(reference: &str) -> Result<Self> {
        Self::load(reference, &Device::Cpu, &mut |_| {})
    }

    pub fn load(reference: &str, device: &Device, progress: &mut dyn FnMut(Progress)) -> Result<Self> {
        Self::load_with(reference, device, LoadOptions::default(), progress)
    }

    /// As [`Transcriber::load`], with options (quantized decoder).
    pub fn load_with(reference: &str, device: &Device, load: LoadOptions, progress: &mut dyn FnMut(Progress)) -> Result<Self> {
        let path = Path::new(reference);
        if path.exists() {
            let dir = if path.is_dir() { path.to_path_buf() } else { path.parent().map(Path::to_path_buf).unwrap_or_default() };
            let tokenizer = dir.join("tokenizer.json");
            let weights_file = path.is_file() && path.extension().is_some_and(|e| e == "safetensors" || e == "gguf");
            if weights_file || (has_ext(&dir, "safetensors")? || has_ext(&dir, "gguf")?) && !path.is_file() {
                return Self::from_hf_dir_with(&dir, &tokenizer, device, load);
            }
            let bin = if path.is_file() { path.to_path_buf() } else { dir.join("model.bin") };
            if !bin.is_file() {
                return Err(Error::Model {
                    reference: reference.to_string(),
                    what: "no model.bin (CTranslate2), *.safetensors or model.gguf (transformers names) here".into(),
                });
            }
            let cfg = dir.join("config.json");
            return Self::from_ct2_with(&bin, cfg.is_file().then_some(cfg.as_path()), &tokenizer, device, load);
        }
        let hub = Hub::new()?;
        let m = hub.resolve(reference, progress)?;
        if m.kind != "whisper" && !m.kind.is_empty() {
            return Err(Error::Model {
                reference: reference.to_string(),
                what: format!("is a '{}' preset, not a Whisper model", m.kind),
            });
        }
        let tokenizer = m.file("tokenizer")?.to_path_buf();
        if let Ok(bin) = m.file("model") {
            let cfg = m.file("config").ok().map(Path::to_path_buf);
            return Self::from_ct2_with(bin, cfg.as_deref(), &tokenizer, device, load);
        }
        Self::from_hf_dir_with(&m.dir, &tokenizer, device, load)
    }

    /// From a CTranslate2 `model.bin` (converted in memory), its `config.json` and `tokenizer.json`.
    pub fn from_ct2(model_bin: &Path, ct2_config: Option<&Path>, tokenizer: &Path, device: &Device) -> Result<Self> {
        Self::from_ct2_with(model_bin, ct2_config, tokenizer, device, LoadOptions::default())
    }

    pub fn from_ct2_with(model_bin: &Path, ct2_config: Option<&Path>, tokenizer: &Path, device: &Device, load: LoadOptions) -> Result<Self> {
        let (cfg, tensors) = ct2::import_with(model_bin, ct2_config, &load.limits)?;
        let src = TensorMap::new(model_bin, tensors);
        Self::build(cfg, &src, tokenizer, device, load)
    }

    /// From a transformers directory (`config.json`, `*.safetensors`) and a `tokenizer.json`.
    pub fn from_hf_dir(dir: &Path, tokenizer: &Path, device: &Device) -> Result<Self> {
        Self::from_hf_dir_with(dir, tokenizer, device, LoadOptions::default())
    }

    pub fn from_hf_dir_with(dir: &Path, tokenizer: &Path, device: &Device, load: LoadOptions) -> Result<Self> {
        let cfg = WhisperConfig::from_hf_dir(dir)?;
        let src = sapient_tensor::open_weights_with(dir, &load.limits)?;
        Self::build(cfg, src.as_ref(), tokenizer, device, load)
    }

    fn build(cfg: WhisperConfig, src: &dyn sapient_tensor::WeightSource, tokenizer: &Path, device: &Device, load: LoadOptions) -> Result<Self> {
        if !tokenizer.is_file() {
            return Err(Error::Model {
                reference: src.location().display().to_string(),
                what: format!("no tokenizer at {}", tokenizer.display()),
            });
        }
        let tok = WhisperTokenizer::from_file(tokenizer, &cfg)?;
        let mel = LogMel::new(cfg.num_mel_bins)?;
        let dtype = if device.is_cpu() { DType::F32 } else { sapient_tensor::activation_dtype(device) };
        let model = if device.is_cpu() && (load.quantize_decoder.is_some() || load.quantize_encoder.is_some()) {
            let q = QuantizeWeights { inner: src, encoder: load.quantize_encoder, decoder: load.quantize_decoder };
            Whisper::load(cfg, &q, device, dtype)?
        } else {
            Whisper::load(cfg, src, device, dtype)?
        };
        tracing::debug!(multilingual = tok.multilingual, "whisper model loaded");
        Ok(Self { model, tokenizer: tok, mel, vad: None })
    }

    /// Attach a Silero VAD (or detach it with None). The file mode then runs it over the
    /// audio once, and a 30 s window in which it finds no speech is skipped when Whisper's
    /// own no-speech probability agrees ([`TranscribeOptions::vad_no_speech_threshold`]):
    /// Whisper alone says "you" or "Thank you." over silence, noise or a tone often enough
    /// with a log probability that passes openai-whisper's silence rule.
    pub fn set_vad(&mut self, vad: Option<sapient_audio::SileroVad>) {
        self.vad = vad.map(std::sync::Mutex::new);
    }

    /// Builder form of [`Transcriber::set_vad`].
    pub fn with_vad(mut self, vad: sapient_audio::SileroVad) -> Self {
        self.set_vad(Some(vad));
        self
    }

    /// Whether a VAD is attached.
    pub fn has_vad(&self) -> bool {
        self.vad.is_some()
    }

    /// The attached VAD's speech segments (16 kHz sample ranges) of `samples`, or None.
    fn vad_segments(&self, samples: &[f32]) -> Result<Option<Vec<(usize, usize)>>> {
        let Some(vad) = &self.vad else { return Ok(None) };
        let mut vad = vad.lock().map_err(|_| Error::Options("the VAD's lock was poisoned by a panic".into()))?;
        let probs = vad.probabilities(samples)?;
        let seg = sapient_audio::VadSegmenter::new(sapient_audio::VadOptions::default())?;
        Ok(Some(seg.segments(&probs, samples.len()).iter().map(|s| (s.start, s.end)).collect()))
    }

    /// Transcribe an audio file (any format `sapient-audio` decodes; resampled to 16 kHz).
    pub fn transcribe_file(&self, path: &Path, opts: &TranscribeOptions) -> Result<Transcript> {
        let audio = sapient_audio::decode_file(path)?.into_16k()?;
        self.transcribe(&audio.samples, opts)
    }

    /// Language probabilities of the first 30 s of 16 kHz audio.
    pub fn detect_language(&self, samples: &[f32]) -> Result<Vec<(String, f32)>> {
        if samples.is_empty() {
            return Err(Error::Options("no audio to detect a language in".into()));
        }
        let n = samples.len().min(N_SAMPLES);
        let mel = self.mel.log_mel_padded(&samples[..n], N_SAMPLES)?;
        let window = self.window(&mel, 0, self.model.n_frames())?;
        let audio = self.model.encode(&window)?;
        let cross = self.model.cross_kv(&audio)?;
        detect_language(&self.model, &self.tokenizer, &cross)
    }

    /// The log-mel window of the first 30 s of 16 kHz audio (zero-padded), as
    /// [`Whisper::encode`] takes it.
    pub fn mel_window(&self, samples: &[f32]) -> Result<Tensor> {
        let n = samples.len().min(N_SAMPLES);
        let mel = self.mel.log_mel_padded(&samples[..n], N_SAMPLES)?;
        self.window(&mel, 0, self.model.n_frames())
    }

    /// Frames `[seek, seek + len)` of the mel, zero-padded (the normalised floor is not
    /// zero: openai-whisper pads the log-mel itself with zeros) to one window.
    fn window(&self, mel: &sapient_audio::Mel, seek: usize, len: usize) -> Result<Tensor> {
        let nf = self.model.n_frames();
        let n_mels = mel.n_mels;
        let mut w = vec![0f32; n_mels * nf];
        let len = len.min(nf).min(mel.n_frames.saturating_sub(seek));
        for m in 0..n_mels {
            let row = mel.row(m);
            w[m * nf..m * nf + len].copy_from_slice(&row[seek..seek + len]);
        }
        Ok(Tensor::from_vec(w, (n_mels, nf), self.model.device())?)
    }

    /// Transcribe 16 kHz mono samples.
    pub fn transcribe(&self, samples: &[f32], opts: &TranscribeOptions) -> Result<Transcript> {
        self.transcribe_with(samples, opts, &mut |_| {})
    }

    /// As [`Transcriber::transcribe`], handing each segment to `on_segment` as soon as its
    /// window is decoded.
    pub fn transcribe_with(&self, samples: &[f32], opts: &TranscribeOptions, on_segment: &mut dyn FnMut(&Segment)) -> Result<Transcript> {
        if let LongForm::Batched { batch_size } = opts.long_form {
            return self.transcribe_batched(samples, opts, batch_size, on_segment);
        }
        self.transcribe_prompted(samples, opts, None, on_segment)
    }

}

fn seek_of(time_offset: f64) -> usize {
    (time_offset * SAMPLE_RATE as f64 / HOP_LENGTH as f64).round() as usize
}

fn has_ext(dir: &Path, ext: &str) -> Result<bool> {
    if !dir.is_dir() {
        return Ok(false);
    }
    let rd = std::fs::read_dir(dir).map_err(io(dir))?;
    Ok(rd.filter_map(|e| e.ok()).any(|e| e.path().extension().is_some_and(|x| x == ext)))
}


/// The samples checked (every one a finite number) and an empty transcript of their length,
/// in the language asked for (English unless told).
fn begin_transcript(samples: &[f32], opts: &TranscribeOptions) -> Result<Transcript> {
    if let Some(i) = samples.iter().position(|x| !x.is_finite()) {
        return Err(Error::Options(format!("sample {i} is not a finite number")));
    }
    Ok(Transcript {
        duration: samples.len() as f64 / SAMPLE_RATE as f64,
        language: opts.language.clone().unwrap_or_else(|| "en".into()),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::batched::collect_chunks;
    use super::sequential::{drop_boundary_repeat, pick_after_fallback, repeats_a_sentence, repeats_the_prompt};
    use super::*;

    /// Sentences said twice with another between are found; short ones, and a window of
    /// different sentences, are not.
    #[test]
    fn repeated_sentences_are_found() {
        const TS: u32 = 50_000;
        let ts = |x: u32| TS + x;
        let a = [1u32, 2, 3, 4, 5, 6];
        let b = [7u32, 8, 9, 10, 11, 12, 13];
        let window = |segs: &[&[u32]]| -> Vec<u32> {
            let mut v = Vec::new();
            for (i, s) in segs.iter().enumerate() {
                v.push(ts(2 * i as u32));
                v.extend_from_slice(s);
                v.push(ts(2 * i as u32 + 1));
            }
            v
        };
        assert!(repeats_a_sentence(&window(&[&a, &b, &a]), TS));
        assert!(repeats_a_sentence(&window(&[&b, &b]), TS));
        assert!(!repeats_a_sentence(&window(&[&a, &b]), TS));
        // under six tokens ("Thank you.") said twice is speech
        assert!(!repeats_a_sentence(&window(&[&a[..5], &b, &a[..5]]), TS));
        // one sentence that contains another is not a repetition
        assert!(!repeats_a_sentence(&window(&[&[1, 2, 3, 4, 5, 6, 7], &a]), TS));
        assert!(!repeats_a_sentence(&[], TS));
    }

    /// A window that opens with one of the prompt's last sentences is found; one that opens
    /// with what follows them, or says a sentence the prompt said longer ago, or a short one
    /// ("Thank you."), is not.
    #[test]
    fn windows_opening_with_the_prompt_are_found() {
        const TS: u32 = 50_000;
        let segs = |segs: &[&[u32]]| -> Vec<u32> {
            let mut v = Vec::new();
            for (i, s) in segs.iter().enumerate() {
                v.push(TS + 2 * i as u32);
                v.extend_from_slice(s);
                v.push(TS + 2 * i as u32 + 1);
            }
            v
        };
        let a: &[u32] = &[1, 2, 3, 4, 5, 6];
        let b: &[u32] = &[7, 8, 9, 10, 11, 12, 13];
        let c: &[u32] = &[14, 15];
        let d: &[u32] = &[20, 21, 22, 23, 24, 25, 26];
        let e: &[u32] = &[30, 31, 32, 33, 34, 35];
        let f: &[u32] = &[40, 41, 42, 43, 44, 45];
        // the prompt ends "... A. B. C." and the window says "B." (the failure) or "A."
        let prompt = segs(&[d, e, a, b, c]);
        assert!(repeats_the_prompt(&segs(&[b, c]), &prompt, TS));
        assert!(repeats_the_prompt(&segs(&[a]), &prompt, TS));
        // ... or the second segment does, after a short one
        assert!(repeats_the_prompt(&segs(&[c, b, f]), &prompt, TS));
        // what comes next, and a sentence said longer ago
        assert!(!repeats_the_prompt(&segs(&[f, d]), &prompt, TS));
        assert!(!repeats_the_prompt(&segs(&[d]), &prompt, TS));
        // the prompt's sentence later in the window (the audio itself repeating)
        assert!(!repeats_the_prompt(&segs(&[f, d, e, b]), &prompt, TS));
        // a short sentence said again is speech; no prompt, no window
        assert!(!repeats_the_prompt(&segs(&[c]), &prompt, TS));
        assert!(!repeats_the_prompt(&segs(&[b]), &[], TS));
        assert!(!repeats_the_prompt(&[], &prompt, TS));
        // a window that contains a prompt sentence and more in one segment is not a copy
        let longer: Vec<u32> = b.iter().chain(f).copied().collect();
        assert!(!repeats_the_prompt(&segs(&[&longer]), &prompt, TS));
    }

    /// The longest overlap of up to three text tokens between the end of the previous segment
    /// and the start of the next is dropped, the timestamps kept.
    #[test]
    fn boundary_repeats_are_dropped() {
        const EOT: u32 = 50_000;
        let ts = EOT + 10;
        let mut first = vec![ts, 7, 8, 9, ts + 1];
        drop_boundary_repeat(&mut first, &[1, 2, 7], EOT);
        assert_eq!(first, [ts, 8, 9, ts + 1]);
        let mut first = vec![ts, 6, 7, 8, 9, ts + 1];
        drop_boundary_repeat(&mut first, &[5, 6, 7], EOT);
        assert_eq!(first, [ts, 8, 9, ts + 1], "two tokens");
        let mut first = vec![ts, 8, 9, ts + 1];
        drop_boundary_repeat(&mut first, &[5, 6, 7], EOT);
        assert_eq!(first, [ts, 8, 9, ts + 1], "no overlap");
        let mut first = vec![ts, 7, ts + 1];
        drop_boundary_repeat(&mut first, &[], EOT);
        assert_eq!(first, [ts, 7, ts + 1], "nothing before");
        let mut first = vec![ts, ts + 1];
        drop_boundary_repeat(&mut first, &[7], EOT);
        assert_eq!(first, [ts, ts + 1], "no text");
    }

    /// Regions are gathered while a chunk holds at most the longest chunk's samples, touching
    /// ones joined; chunk times map back to the file around the silence left out.
    #[test]
    fn chunks_hold_speech_only_and_map_times_back() {
        let chunks = collect_chunks(&[(100, 200), (200, 300), (500, 700), (900, 1000), (1000, 1500)], 400);
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].pieces, [(100, 300), (500, 700)]);
        // the next region would take the chunk past 400 samples; one longer than that is cut
        assert_eq!(chunks[1].pieces, [(900, 1000)]);
        assert_eq!(chunks[2].pieces, [(1000, 1400)]);
        assert_eq!((chunks[0].len(), chunks[0].start(), chunks[1].len()), (400, 100, 100));
        let audio: Vec<f32> = (0..2000).map(|i| i as f32).collect();
        let x = chunks[0].samples(&audio);
        assert_eq!((x.len(), x[199], x[200]), (400, 299.0, 500.0));
        // chunk sample 200 is the joint: the end of the first piece or the start of the second
        let sr = SAMPLE_RATE as f64;
        let c = &chunks[0];
        assert_eq!(c.file_time(200.0 / sr, true), 300.0 / sr);
        assert_eq!(c.file_time(200.0 / sr, false), 500.0 / sr);
        assert_eq!(c.file_time(50.0 / sr, false), 150.0 / sr);
        assert_eq!(c.file_time(999.0 / sr, true), 700.0 / sr, "past the end: the end");
        // a word across the joint is in the piece its middle is in, clamped to it
        assert_eq!(c.file_span(190.0 / sr, 230.0 / sr), (500.0 / sr, 530.0 / sr));
        assert_eq!(c.file_span(150.0 / sr, 210.0 / sr), (250.0 / sr, 300.0 / sr));
        assert_eq!(c.tail(250).pieces, [(550, 700)]);
        assert_eq!(c.tail(0), *c);
        assert_eq!(c.speech(50), 100 + 100);
        assert!(collect_chunks(&[], 400).is_empty());
    }

    fn result(t: f32, avg_logprob: f32, compression_ratio: f32) -> DecodeResult {
        DecodeResult { tokens: vec![], text: format!("t={t}"), avg_logprob, no_speech_prob: 0.0, temperature: t, compression_ratio, looped: false }
    }

    /// faster-whisper's choice when every temperature fails: the best average log probability
    /// among the results whose compression ratio passed, else among all; at the last temperature.
    #[test]
    fn all_failed_keeps_the_best_non_repetitive_result() {
        let tried = vec![
            (result(0.0, -0.3, 3.1), false), // a loop with a good log probability
            (result(0.2, -1.4, 1.6), true),
            (result(0.4, -1.2, 1.7), true),
            (result(0.6, -1.9, 1.5), true),
        ];
        let r = pick_after_fallback(tried).unwrap();
        assert_eq!((r.text.as_str(), r.temperature), ("t=0.4", 0.6));
        let loops = vec![(result(0.0, -0.5, 2.9), false), (result(0.2, -0.2, 2.6), false), (result(0.4, -0.9, 3.0), false)];
        let r = pick_after_fallback(loops).unwrap();
        assert_eq!((r.text.as_str(), r.temperature), ("t=0.2", 0.4));
        assert!(pick_after_fallback(vec![]).is_none());
    }
}
