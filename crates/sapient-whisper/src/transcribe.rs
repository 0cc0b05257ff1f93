//! Long-form transcription as openai-whisper's `transcribe.py`: 30 s windows over the padded
//! log-mel, each decoded with temperature fallback, cut into segments at timestamp pairs,
//! the next window starting at the last complete timestamp; windows judged silent are
//! skipped; the previous text conditions the next window.

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

/// How to load a model.
#[derive(Clone, Copy, Debug, Default)]
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

impl LoadOptions {
    /// Encoder and decoder matrices in `dtype` (`sapient transcribe --quant q8_0`).
    pub fn quantized(dtype: candle_core::quantized::GgmlDType) -> Self {
        Self { quantize_decoder: Some(dtype), quantize_encoder: Some(dtype), ..Self::default() }
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

    /// [`LongForm::Batched`]: VAD chunks of up to 30 s of speech, `batch_size` at a time
    /// through the encoder and the decoder.
    fn transcribe_batched(&self, samples: &[f32], opts: &TranscribeOptions, batch_size: usize, on_segment: &mut dyn FnMut(&Segment)) -> Result<Transcript> {
        self.check_options(opts)?;
        if batch_size == 0 {
            return Err(Error::Options("the batch size of batched transcription must be at least 1".into()));
        }
        if self.vad.is_none() {
            return Err(Error::Options(
                "batched transcription cuts the audio at the speech the VAD finds: attach one (Transcriber::set_vad; the CLI does unless --no-vad)".into(),
            ));
        }
        let tok = &self.tokenizer;
        let mut out = begin_transcript(samples, opts)?;
        let duration = out.duration;
        if samples.len() < HOP_LENGTH {
            return Ok(out);
        }
        let language = if !tok.multilingual {
            Some("en".to_string())
        } else if opts.language.is_some() {
            opts.language.clone()
        } else {
            let probs = self.detect_language(samples)?;
            out.language_probs = probs;
            out.language_probs.first().map(|p| p.0.clone())
        };
        out.language = language.clone().unwrap_or_default();
        let t_vad = std::time::Instant::now();
        let chunks = self.speech_chunks(samples)?;
        tracing::debug!(chunks = chunks.len(), vad_s = t_vad.elapsed().as_secs_f64(), "batched transcription");
        for c in &chunks {
            tracing::debug!(pieces = ?c.pieces, seconds = c.len() as f64 / SAMPLE_RATE as f64, "chunk");
        }
        let mut queue: std::collections::VecDeque<Chunk> = chunks.into();
        let mut segments: Vec<Segment> = Vec::new();
        let prompt = match &opts.initial_prompt {
            Some(p) => tok.encode(&format!(" {}", p.trim()))?,
            None => Vec::new(),
        };
        let n_frames = self.model.n_frames();
        let sr = SAMPLE_RATE as f64;
        while !queue.is_empty() {
            let batch: Vec<Chunk> = queue.drain(..batch_size.min(queue.len())).collect();
            // each chunk's log-mel window (its speech one after the other), zero-padded to 30 s
            let mut windows = Vec::with_capacity(batch.len());
            let mut frames = Vec::with_capacity(batch.len());
            let t0 = std::time::Instant::now();
            for chunk in &batch {
                // Padded by one STFT window, not 30 s: the content frames see the zeros
                // after the audio as they do in a 30 s padding (their normalisation too:
                // frames of zeros are at the floor), and the frames of the padding itself,
                // zeros in the window, are not computed.
                let mel = self.mel.log_mel_padded(&chunk.samples(samples), N_FFT)?;
                let content = (chunk.len() / HOP_LENGTH).clamp(1, n_frames.min(mel.n_frames));
                windows.push(self.window(&mel, 0, content)?);
                frames.push(content);
            }
            let t1 = std::time::Instant::now();
            let audio = self.model.encode(&Tensor::stack(&windows, 0)?)?;
            let crosses = self.model.cross_kv_batch(&audio)?;
            drop(audio);
            let t2 = std::time::Instant::now();
            let base = DecodeOptions {
                task: opts.task,
                language: language.clone(),
                beam_size: opts.beam_size,
                best_of: Some(opts.best_of),
                patience: opts.patience,
                length_penalty: opts.length_penalty,
                prompt: prompt.clone(),
                without_timestamps: opts.without_timestamps,
                seed: opts.seed,
                ..DecodeOptions::default()
            };
            let first = DecodeOptions { temperature: opts.temperatures[0], ..base.clone() };
            let first = DecodeOptions {
                beam_size: if first.temperature > 0.0 { None } else { first.beam_size },
                best_of: if first.temperature > 0.0 { first.best_of } else { None },
                seed: base.seed ^ 0x9E37_79B9_7F4A_7C15,
                ..first
            };
            let refs: Vec<&crate::model::CrossKv> = crosses.iter().collect();
            let results = decode_batch(&self.model, tok, &refs, &first)?;
            tracing::debug!(chunks = batch.len(), mel_s = (t1 - t0).as_secs_f64(), encode_s = (t2 - t1).as_secs_f64(), decode_s = t2.elapsed().as_secs_f64(), "batch decoded");
            for (((chunk, cross), r), &content) in batch.iter().zip(&crosses).zip(results).zip(&frames) {
                let time_offset = chunk.start() as f64 / sr;
                let chunk_len = chunk.len();
                let seed = opts.seed.wrapping_add(seek_of(time_offset) as u64);
                let base = DecodeOptions { seed, ..base.clone() };
                let (result, _) = self.decode_with_fallback(cross, &base, opts, Some(r))?;
                if let Some(nst) = opts.no_speech_threshold {
                    let speech = opts.logprob_threshold.is_some_and(|lt| result.avg_logprob > lt);
                    if result.no_speech_prob > nst && !speech {
                        tracing::debug!(start = time_offset, no_speech = result.no_speech_prob, "chunk skipped as silent");
                        continue;
                    }
                }
                // segments in chunk time
                let (mut current, last_ts, trailing) = chunk_segments(tok, &result.tokens, 0.0, chunk_len as f64 / sr);
                let failed = result.looped || opts.compression_ratio_threshold.is_some_and(|c| result.compression_ratio > c);
                if failed {
                    drop_repeats(&mut current, &[], tok.eot);
                } else if let Some(lt) = last_ts {
                    // Whisper often ends a window at a timestamp before its last sentence
                    // (the sequential loop's next window starts there): speech after the last
                    // timestamp goes back into the queue as a chunk of its own, and text
                    // decoded after that timestamp is dropped (it is decoded again there).
                    let rest = ((lt * sr).ceil() as usize).min(chunk_len);
                    let tail = chunk.tail(rest);
                    if rest > 0 && tail.len() >= SAMPLE_RATE as usize && tail.speech(self.chunk_pad()) >= SAMPLE_RATE as usize / 2 {
                        if trailing {
                            current.pop();
                        }
                        tracing::debug!(from = chunk.file_time(lt, false), "speech after the last timestamp: decoded again");
                        queue.push_back(tail);
                    }
                }
                let mut segs: Vec<Segment> = Vec::with_capacity(current.len());
                for (start, end, toks) in current {
                    segs.push(Segment::decoded(seek_of(time_offset), start, end, tok.decode_text(&toks)?, toks, &result));
                }
                if opts.word_timestamps && !segs.is_empty() {
                    let mut last_speech_timestamp = 0.0;
                    self.add_word_timestamps(&mut segs, cross, &base, 0.0, content, &mut last_speech_timestamp)?;
                }
                for mut seg in segs {
                    // chunk time to file time: a word by the piece its middle is in
                    for w in seg.words.iter_mut() {
                        let (start, end) = chunk.file_span(w.start, w.end);
                        w.start = start;
                        w.end = end;
                    }
                    seg.start = chunk.file_time(seg.start, false);
                    seg.end = chunk.file_time(seg.end, true).min(duration).max(seg.start);
                    if !seg.text.trim().is_empty() && seg.start < seg.end {
                        segments.push(seg);
                    }
                }
            }
        }
        // chunks decoded again from their last timestamp come later in the queue
        segments.sort_by(|x, y| x.start.total_cmp(&y.start));
        for mut seg in segments {
            seg.id = out.segments.len();
            out.segments.push(seg);
            if let Some(seg) = out.segments.last() {
                on_segment(seg);
            }
        }
        let text_tokens: Vec<u32> = out.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        out.text = tok.decode_text(&text_tokens)?;
        Ok(out)
    }

    /// The VAD options of [`LongForm::Batched`]: faster-whisper's `BatchedInferencePipeline`
    /// ones (speech regions of up to 30 s, cut at the last silence of 98 ms or more; a
    /// silence of 160 ms ends one; 400 ms of padding on each side, so that a word's soft
    /// onset is not cut off).
    fn chunk_vad_options() -> sapient_audio::VadOptions {
        sapient_audio::VadOptions {
            max_speech_s: CHUNK_S,
            min_silence_ms: 160,
            min_speech_ms: 0,
            speech_pad_ms: CHUNK_PAD_MS,
            use_max_possible_silence_at_max_speech: false,
            ..Default::default()
        }
    }

    /// [`CHUNK_PAD_MS`] in samples.
    fn chunk_pad(&self) -> usize {
        CHUNK_PAD_MS as usize * SAMPLE_RATE as usize / 1000
    }

    /// The chunks of [`LongForm::Batched`]: the attached VAD's padded speech regions, heard
    /// one after the other without the silence between them, up to 30 s of them per chunk
    /// (faster-whisper's `collect_chunks`).
    fn speech_chunks(&self, samples: &[f32]) -> Result<Vec<Chunk>> {
        let Some(vad) = &self.vad else { return Ok(Vec::new()) };
        let mut vad = vad.lock().map_err(|_| Error::Options("the VAD's lock was poisoned by a panic".into()))?;
        let probs = vad.probabilities(samples)?;
        let seg = sapient_audio::VadSegmenter::new(Self::chunk_vad_options())?;
        let regions: Vec<(usize, usize)> = seg.segments(&probs, samples.len()).iter().map(|s| (s.start, s.end.min(samples.len()))).collect();
        Ok(collect_chunks(&regions, (CHUNK_S * SAMPLE_RATE as f64) as usize))
    }

    /// The transcription loop; `previous` (text tokens that came before this audio, for the
    /// streaming mode) replaces the initial prompt when given.
    pub(crate) fn transcribe_prompted(
        &self,
        samples: &[f32],
        opts: &TranscribeOptions,
        previous: Option<&[u32]>,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<Transcript> {
        self.check_options(opts)?;
        let tok = &self.tokenizer;
        let mut out = begin_transcript(samples, opts)?;
        let duration = out.duration;
        // Shorter than one mel frame: nothing to hear.
        if samples.len() < HOP_LENGTH {
            return Ok(out);
        }
        let mel = self.mel.log_mel_padded(samples, N_SAMPLES)?;
        let n_frames = self.model.n_frames();
        let content_frames = mel.n_frames.saturating_sub(n_frames);
        if content_frames == 0 {
            return Ok(out);
        }
        let mut language = opts.language.clone();
        // the first window encoded for the language detection, kept for the loop's first window
        let mut encoded = None;
        if tok.multilingual {
            if language.is_none() {
                let window = self.window(&mel, 0, n_frames)?;
                let cross = self.model.cross_kv(&self.model.encode(&window)?)?;
                let probs = detect_language(&self.model, tok, &cross)?;
                language = probs.first().map(|p| p.0.clone());
                tracing::debug!(language = ?language, "detected language");
                out.language_probs = probs;
                encoded = Some((n_frames, cross));
            }
        } else {
            language = Some("en".into());
        }
        out.language = language.clone().unwrap_or_default();

        let speech = match opts.vad_no_speech_threshold {
            Some(_) => self.vad_segments(samples)?,
            None => None,
        };
        let mut st = LoopState::new(self, opts, previous)?;
        st.encoded = encoded;
        while st.seek < content_frames {
            let segment_size = n_frames.min(content_frames - st.seek);
            let window = self.window(&mel, st.seek, segment_size)?;
            let (a, b) = (st.seek * HOP_LENGTH, (st.seek + segment_size) * HOP_LENGTH);
            let vad_speech = speech.as_ref().map(|sp| sp.iter().any(|&(s, e)| s < b && e > a));
            self.window_step(&window, segment_size, duration, opts, language.as_deref(), vad_speech, &mut st, &mut out.segments, on_segment)?;
        }
        let text_tokens: Vec<u32> = out.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        out.text = tok.decode_text(&text_tokens)?;
        Ok(out)
    }

    /// The options' own errors (temperatures, language and task for the model, sizes).
    pub(crate) fn check_options(&self, opts: &TranscribeOptions) -> Result<()> {
        if opts.temperatures.is_empty() {
            return Err(Error::Options("no temperature to decode with".into()));
        }
        if let Some(&t) = opts.temperatures.iter().find(|t| t.is_nan() || **t < 0.0) {
            return Err(Error::Options(format!("temperature {t} must be >= 0")));
        }
        let tok = &self.tokenizer;
        if !tok.multilingual {
            if let Some(l) = opts.language.as_deref().filter(|l| *l != "en") {
                return Err(Error::Options(format!("an English-only model cannot take language '{l}'")));
            }
            if opts.task == Task::Translate {
                return Err(Error::Options("an English-only model cannot translate".into()));
            }
        } else if let Some(l) = opts.language.as_deref() {
            tok.language_token(l)?;
        }
        if opts.beam_size == Some(0) || opts.best_of == 0 {
            return Err(Error::Options("beam_size and best_of must be at least 1".into()));
        }
        Ok(())
    }

    /// One window of the long-form loop: decode frames `[st.seek, st.seek + segment_size)`
    /// (already cut and zero-padded into `window`), append its segments to `segments`
    /// (handing each to `on_segment`) and move `st.seek` on. `duration` (s) bounds the last
    /// segment's end. The file mode and the streaming mode both run their windows through it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn window_step(
        &self,
        window: &Tensor,
        segment_size: usize,
        duration: f64,
        opts: &TranscribeOptions,
        language: Option<&str>,
        vad_speech: Option<bool>,
        st: &mut LoopState,
        segments: &mut Vec<Segment>,
        on_segment: &mut dyn FnMut(&Segment),
    ) -> Result<()> {
        let tok = &self.tokenizer;
        let time_offset = (st.seek * HOP_LENGTH) as f64 / SAMPLE_RATE as f64;
        let segment_duration = (segment_size * HOP_LENGTH) as f64 / SAMPLE_RATE as f64;
        let cross = match st.encoded.take() {
            // the same frames (from 0, a whole window) encoded already
            Some((len, cross)) if st.seek == 0 && len == segment_size => cross,
            _ => self.model.cross_kv(&self.model.encode(window)?)?,
        };
        let base = DecodeOptions {
            task: opts.task,
            language: language.map(str::to_string),
            beam_size: opts.beam_size,
            best_of: Some(opts.best_of),
            patience: opts.patience,
            length_penalty: opts.length_penalty,
            prompt: st.all_tokens[st.prompt_reset_since..].to_vec(),
            without_timestamps: opts.without_timestamps,
            seed: opts.seed.wrapping_add(st.seek as u64),
            ..DecodeOptions::default()
        };
        if let (Some(false), Some(vt)) = (vad_speech, opts.vad_no_speech_threshold) {
            // the VAD hears no speech: one decoder step tells whether Whisper agrees
            let probe = DecodeOptions { sample_len: Some(1), ..base.clone() };
            let r = decode_window(&self.model, tok, &cross, &probe)?;
            if r.no_speech_prob > vt {
                tracing::debug!(seek = st.seek, no_speech = r.no_speech_prob, "window skipped: no speech for the VAD and the model");
                st.seek += segment_size;
                return Ok(());
            }
        }
        let (result, unprompted) = self.decode_with_fallback(&cross, &base, opts, None)?;

        if let Some(nst) = opts.no_speech_threshold {
            let mut skip = result.no_speech_prob > nst;
            if let Some(lt) = opts.logprob_threshold {
                if result.avg_logprob > lt {
                    skip = false;
                }
            }
            if skip {
                tracing::debug!(seek = st.seek, no_speech = result.no_speech_prob, "window skipped as silent");
                st.seek += segment_size;
                return Ok(());
            }
        }

        let tokens = &result.tokens;
        let is_ts = |t: u32| t >= tok.timestamp_begin;
        let n = tokens.len();
        let single_timestamp_ending = n >= 2 && !is_ts(tokens[n - 2]) && is_ts(tokens[n - 1]);
        let mut consecutive: Vec<usize> = (1..n).filter(|&i| is_ts(tokens[i - 1]) && is_ts(tokens[i])).collect();
        let mut current: Vec<(f64, f64, Vec<u32>)> = Vec::new();
        if !consecutive.is_empty() {
            if single_timestamp_ending {
                consecutive.push(n);
            }
            let mut last_slice = 0;
            for &cur in &consecutive {
                let sliced = &tokens[last_slice..cur];
                let start = tok.timestamp_seconds(sliced[0]);
                let end = tok.timestamp_seconds(sliced[sliced.len() - 1]);
                current.push((time_offset + start, time_offset + end, sliced.to_vec()));
                last_slice = cur;
            }
            if single_timestamp_ending {
                st.seek += segment_size;
            } else {
                let last_pos = tokens[last_slice - 1].saturating_sub(tok.timestamp_begin) as usize;
                st.seek += last_pos * INPUT_STRIDE;
            }
        } else {
            let mut dur = segment_duration;
            if let Some(&last) = tokens.iter().rev().find(|&&t| is_ts(t)) {
                if last != tok.timestamp_begin {
                    dur = (last - tok.timestamp_begin) as f64 * TIME_PRECISION;
                }
            }
            current.push((time_offset, time_offset + dur, tokens.clone()));
            st.seek += segment_size;
        }
        let failed = result.looped || opts.compression_ratio_threshold.is_some_and(|c| result.compression_ratio > c);
        if failed {
            // every temperature looped: keep each sentence once
            let before: Vec<Vec<u32>> = segments.iter().rev().take(3).map(|s| text_of(&s.tokens, tok.eot)).collect();
            drop_repeats(&mut current, &before, tok.eot);
        }
        if unprompted {
            // without the previous text the window hears the end of its last word again
            if let (Some(prev), Some(first)) = (segments.last(), current.first_mut()) {
                drop_boundary_repeat(&mut first.2, &text_of(&prev.tokens, tok.eot), tok.eot);
            }
        }
        let mut segs: Vec<Segment> = Vec::with_capacity(current.len());
        for (start, end, toks) in current {
            let text = tok.decode_text(&toks)?;
            segs.push(Segment::decoded(seek_of(time_offset), start, end, text, toks, &result));
        }
        if opts.word_timestamps && !segs.is_empty() {
            self.add_word_timestamps(&mut segs, &cross, &base, time_offset, segment_size, &mut st.last_speech_timestamp)?;
            if !single_timestamp_ending {
                let last_word_end = segs.iter().rev().flat_map(|s| s.words.last()).map(|w| w.end).next();
                if let Some(e) = last_word_end.filter(|&e| e > time_offset) {
                    st.seek = (e * 100.0).round() as usize;
                }
            }
        }
        if unprompted {
            // decoded without the previous text: the next window is conditioned on this
            // window's text only
            st.prompt_reset_since = st.all_tokens.len();
        }
        for mut seg in segs {
            if seg.start == seg.end || seg.text.trim().is_empty() {
                continue;
            }
            st.all_tokens.extend(seg.tokens.iter().copied());
            seg.id = segments.len();
            seg.end = seg.end.min(duration.max(seg.start));
            segments.push(seg);
            if let Some(seg) = segments.last() {
                on_segment(seg);
            }
        }
        if !opts.condition_on_previous_text || result.temperature > 0.5 {
            st.prompt_reset_since = st.all_tokens.len();
        }
        Ok(())
    }

    /// openai-whisper's `add_word_timestamps` for the segments of one window.
    fn add_word_timestamps(
        &self,
        segs: &mut [Segment],
        cross: &crate::model::CrossKv,
        base: &DecodeOptions,
        time_offset: f64,
        num_frames: usize,
        last_speech_timestamp: &mut f64,
    ) -> Result<()> {
        let tok = &self.tokenizer;
        let per_segment: Vec<Vec<u32>> = segs.iter().map(|s| s.tokens.iter().copied().filter(|&t| t < tok.eot).collect()).collect();
        let text_tokens: Vec<u32> = per_segment.iter().flatten().copied().collect();
        let plain = DecodeOptions { prompt: Vec::new(), without_timestamps: false, ..base.clone() };
        let (sot_sequence, _) = crate::decode::initial_tokens(&self.model, tok, &plain)?;
        let mut alignment = timing::find_alignment(&self.model, tok, cross, &sot_sequence, &text_tokens, num_frames)?;
        let (median, max_duration) = timing::truncate_long_words(&mut alignment);
        timing::merge_punctuations(&mut alignment);
        let r2 = |x: f64| (x * 100.0).round() / 100.0;
        let mut wi = 0;
        for (seg, toks) in segs.iter_mut().zip(&per_segment) {
            let mut saved = 0;
            let mut words: Vec<Word> = Vec::new();
            while wi < alignment.len() && saved < toks.len() {
                let w = &alignment[wi];
                if !w.word.is_empty() {
                    words.push(Word { start: r2(time_offset + w.start), end: r2(time_offset + w.end), ..w.clone() });
                }
                saved += w.tokens.len();
                wi += 1;
            }
            if !words.is_empty() {
                // the first and second word after a pause are not longer than twice the median
                let first_long = words[0].end - words[0].start > max_duration;
                let second_long = words.len() > 1 && words[1].end - words[0].start > max_duration * 2.0;
                if words[0].end - *last_speech_timestamp > median * 4.0 && (first_long || second_long) {
                    if words.len() > 1 && words[1].end - words[1].start > max_duration {
                        let boundary = (words[1].end / 2.0).max(words[1].end - max_duration);
                        words[0].end = boundary;
                        words[1].start = boundary;
                    }
                    words[0].start = (words[0].end - max_duration).max(0.0);
                }
                // the segment's own start / end when the first / last word is too long
                if seg.start < words[0].end && seg.start - 0.5 > words[0].start {
                    words[0].start = (words[0].end - median).min(seg.start).max(0.0);
                } else {
                    seg.start = words[0].start;
                }
                let last = words.len() - 1;
                if seg.end > words[last].start && seg.end + 0.5 < words[last].end {
                    words[last].end = (words[last].start + median).max(seg.end);
                } else {
                    seg.end = words[last].end;
                }
                *last_speech_timestamp = seg.end;
            }
            seg.words = words;
        }
        Ok(())
    }

    /// Decode with the temperature fallback; `first`, when given, is the result at the first
    /// temperature (decoded already, in a batch). Returns the result and whether it was
    /// decoded without the prompt.
    ///
    /// A prompted decode at temperature 0 that repeats itself (stopped in a loop, or over the
    /// compression threshold) is decoded once more at temperature 0 without the prompt
    /// (openai-whisper's `condition_on_previous_text=False` for this window) before the
    /// sampled temperatures: the previous text is what a repetition loop most often copies
    /// (a window that starts in the middle of the prompt's last sentence hears it again and
    /// repeats it), and a deterministic decode of the audio alone is a better next try than
    /// a sample.
    fn decode_with_fallback(&self, cross: &crate::model::CrossKv, base: &DecodeOptions, opts: &TranscribeOptions, first: Option<DecodeResult>) -> Result<(DecodeResult, bool)> {
        // Every temperature's result, and whether its compression ratio passed.
        let mut tried: Vec<(DecodeResult, bool)> = Vec::new();
        let mut first = first;
        let mut unprompted_retry = !base.prompt.is_empty();
        let mut plan: Vec<(usize, f32, bool)> = opts.temperatures.iter().enumerate().map(|(i, &t)| (i, t, false)).collect();
        let mut k = 0;
        while k < plan.len() {
            let (i, t, unprompted) = plan[k];
            k += 1;
            let mut o = base.clone();
            o.temperature = t;
            if unprompted {
                o.prompt.clear();
            }
            // A generator of its own for each temperature: with one seed for all, every
            // temperature drew the same uniforms, so the retries were not independent tries
            // (faster-whisper's sampler runs on between them).
            o.seed = base.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            if t > 0.0 {
                o.beam_size = None;
            } else {
                o.best_of = None;
            }
            let r = match first.take() {
                Some(r) => r,
                None => decode_window(&self.model, &self.tokenizer, cross, &o)?,
            };
            let mut fallback = false;
            let mut compression_ok = true;
            if let Some(c) = opts.compression_ratio_threshold {
                if r.compression_ratio > c {
                    fallback = true;
                    compression_ok = false;
                }
            }
            if r.looped {
                // stopped in a repetition loop: repetitive text, as a high compression ratio
                fallback = true;
                compression_ok = false;
            }
            if let Some(l) = opts.logprob_threshold {
                if r.avg_logprob < l {
                    fallback = true;
                }
            }
            if let (Some(n), Some(l)) = (opts.no_speech_threshold, opts.logprob_threshold) {
                if r.no_speech_prob > n && r.avg_logprob < l {
                    fallback = false; // silence: no point in trying harder
                }
            }
            tracing::debug!(temperature = t, unprompted, avg_logprob = r.avg_logprob, compression = r.compression_ratio, fallback, looped = r.looped, "window decoded");
            tracing::trace!(tokens = ?r.tokens, "window tokens");
            if !fallback {
                let ts = self.tokenizer.timestamp_begin;
                let twice = repeats_a_sentence(&r.tokens, ts);
                if !unprompted && unprompted_retry && t == 0.0 && (twice || repeats_the_prompt(&r.tokens, &base.prompt, ts)) {
                    // One sentence said twice with others between, or the window opening
                    // with one of the prompt's last sentences: most often the previous text
                    // copied instead of the audio heard. The window decoded without the
                    // prompt (which cannot copy it) is kept if it passes and says no
                    // sentence twice; if it does, the audio repeats itself and the prompted
                    // result stands.
                    let mut o = o.clone();
                    o.prompt.clear();
                    let u = decode_window(&self.model, &self.tokenizer, cross, &o)?;
                    let passes = !u.looped
                        && opts.compression_ratio_threshold.is_none_or(|c| u.compression_ratio <= c)
                        && opts.logprob_threshold.is_none_or(|l| u.avg_logprob >= l);
                    tracing::debug!(passes, twice, avg_logprob = u.avg_logprob, "window said a sentence twice or the prompt's again: decoded without the prompt");
                    if passes && !repeats_a_sentence(&u.tokens, ts) {
                        return Ok((u, true));
                    }
                }
                return Ok((r, unprompted));
            }
            if t == 0.0 && !compression_ok && unprompted_retry {
                unprompted_retry = false;
                plan.insert(k, (i, t, true));
            }
            // a failed unprompted retry is not kept: the fallback's results are prompted
            if !unprompted {
                tried.push((r, compression_ok));
            }
        }
        let r = pick_after_fallback(tried).ok_or_else(|| Error::Options("no temperature to decode with".into()))?;
        Ok((r, false))
    }
}

/// Whether two segments of a window's `tokens` (text between timestamp tokens, those from
/// `timestamp_begin` on) say the same sentence of at least [`REPEAT_MIN_TOKENS`] tokens.
///
/// A prompted decode that copies the previous window's text instead of hearing the audio
/// says one of its sentences again and again, with other sentences between, which neither
/// the loop check (a repetition at the end) nor the compression ratio (a few sentences are
/// not compressible enough) catches. A speaker who says one long sentence twice within 30
/// seconds costs only a decode without the prompt.
fn repeats_a_sentence(tokens: &[u32], timestamp_begin: u32) -> bool {
    let segments: Vec<&[u32]> = tokens.split(|&t| t >= timestamp_begin).filter(|s| s.len() >= REPEAT_MIN_TOKENS).collect();
    segments.iter().enumerate().any(|(i, a)| segments[i + 1..].contains(a))
}

/// Whether one of the first [`PROMPT_COPY_SEGMENTS`] segments of a window's `tokens` is one
/// of the last [`PROMPT_COPY_SEGMENTS`] segments of its `prompt` (the previous text), at
/// least [`REPEAT_MIN_TOKENS`] long.
///
/// A prompted decode can open by saying the previous window's last sentences again, with
/// timestamps stretched over the audio it did not hear (tiny.en greedy on the long-form
/// case: "Had he married a more amiable woman ... than" from 205 s to 231 s, the prompt's
/// second-to-last sentence, over audio of four other sentences), and then stop: no loop,
/// no repetition inside the window, a compression ratio and log probability that pass.
/// A window of real speech starts where the prompt's last segment ended, so it opens with
/// what comes after those sentences; a speaker who says a sentence again right away costs
/// only a decode without the prompt.
fn repeats_the_prompt(tokens: &[u32], prompt: &[u32], timestamp_begin: u32) -> bool {
    let recent: Vec<&[u32]> = prompt.split(|&t| t >= timestamp_begin).filter(|s| !s.is_empty()).rev().take(PROMPT_COPY_SEGMENTS).collect();
    tokens
        .split(|&t| t >= timestamp_begin)
        .filter(|s| !s.is_empty())
        .take(PROMPT_COPY_SEGMENTS)
        .any(|s| s.len() >= REPEAT_MIN_TOKENS && recent.contains(&s))
}

/// Segments at the end of the prompt and at the start of the window that
/// [`repeats_the_prompt`] compares.
const PROMPT_COPY_SEGMENTS: usize = 3;

/// The shortest sentence [`repeats_a_sentence`] counts (shorter ones, "Thank you.", are
/// said twice in earnest).
const REPEAT_MIN_TOKENS: usize = 6;

/// When every temperature failed, the result faster-whisper keeps: the best average log
/// probability among those whose compression ratio passed (a looping text only when all
/// loop), reported at the last temperature tried (which decides the prompt reset).
fn pick_after_fallback(tried: Vec<(DecodeResult, bool)>) -> Option<DecodeResult> {
    let last_t = tried.last().map(|(r, _)| r.temperature)?;
    let any_ok = tried.iter().any(|(_, ok)| *ok);
    let mut best: Option<DecodeResult> = None;
    for (r, ok) in tried {
        // `max` in Python keeps the first of equal values.
        if (ok || !any_ok) && best.as_ref().is_none_or(|b| r.avg_logprob > b.avg_logprob) {
            best = Some(r);
        }
    }
    best.map(|mut r| {
        r.temperature = last_t;
        r
    })
}

/// The state the long-form loop carries from one window to the next.
#[derive(Clone, Debug)]
pub(crate) struct LoopState {
    /// Text and timestamp tokens of the segments so far (the prompt of the next window).
    pub all_tokens: Vec<u32>,
    pub prompt_reset_since: usize,
    /// Mel frame the next window starts at.
    pub seek: usize,
    pub last_speech_timestamp: f64,
    /// The window from frame 0 of `.0` frames, encoded already (by the language detection).
    pub encoded: Option<(usize, crate::model::CrossKv)>,
}

impl LoopState {
    /// `previous` (text tokens that came before this audio) replaces the initial prompt.
    pub fn new(t: &Transcriber, opts: &TranscribeOptions, previous: Option<&[u32]>) -> Result<Self> {
        let mut all_tokens = Vec::new();
        match previous {
            Some(p) => all_tokens.extend_from_slice(p),
            None => {
                if let Some(p) = &opts.initial_prompt {
                    all_tokens.extend(t.tokenizer.encode(&format!(" {}", p.trim()))?);
                }
            }
        }
        Ok(Self { all_tokens, prompt_reset_since: 0, seek: 0, last_speech_timestamp: 0.0, encoded: None })
    }
}

fn text_of(tokens: &[u32], eot: u32) -> Vec<u32> {
    tokens.iter().copied().filter(|&t| t < eot).collect()
}

/// Drops the first text tokens of `first` (a window's first segment, timestamps and all)
/// where they repeat the last text tokens of `prev` (the segment before it): up to three
/// tokens, the longest such overlap. A window decoded without the previous text, which
/// starts where the last segment ended, hears the end of that segment's last word and says
/// it again ("... amiable himself." then "himself. And ...").
fn drop_boundary_repeat(first: &mut Vec<u32>, prev: &[u32], eot: u32) {
    let Some(at) = first.iter().position(|&t| t < eot) else {
        return;
    };
    let text: Vec<u32> = first[at..].iter().copied().take_while(|&t| t < eot).collect();
    let k = (1..=3.min(prev.len()).min(text.len())).rev().find(|&k| prev[prev.len() - k..] == text[..k]).unwrap_or(0);
    first.drain(at..at + k);
}

/// The segments of a looping result without the loop: a segment whose text is that of an
/// earlier one (in the window, or one of `before`, the last segments already decided) is
/// dropped, and one that loops inside itself is cut where the loop starts.
fn drop_repeats(current: &mut Vec<(f64, f64, Vec<u32>)>, before: &[Vec<u32>], eot: u32) {
    let mut seen: Vec<Vec<u32>> = before.iter().filter(|t| !t.is_empty()).cloned().collect();
    current.retain_mut(|(_, _, toks)| {
        let text = text_of(toks, eot);
        if let Some(k) = crate::decode::loop_start(&text) {
            // cut before the k-th text token (timestamps before it kept)
            let mut n_text = 0;
            let cut = toks.iter().position(|&t| {
                let hit = t < eot && n_text == k;
                if t < eot {
                    n_text += 1;
                }
                hit
            });
            if let Some(c) = cut {
                toks.truncate(c);
            }
        }
        let text = text_of(toks, eot);
        if text.is_empty() || seen.contains(&text) {
            return false;
        }
        seen.push(text);
        true
    });
}

/// The segments of one chunk's tokens (batched mode): text between timestamp tokens, the
/// times offset by the chunk's start and kept within the chunk; text after the last
/// timestamp (or all of it, without timestamps) ends at the chunk's end. Also returns the
/// last timestamp (file time) and whether text came after it (the last segment).
type Pieces = Vec<(f64, f64, Vec<u32>)>;

fn chunk_segments(tok: &WhisperTokenizer, tokens: &[u32], offset: f64, chunk_end: f64) -> (Pieces, Option<f64>, bool) {
    let mut out = Vec::new();
    let mut start = offset;
    let mut last_ts = None;
    let mut text: Vec<u32> = Vec::new();
    for &t in tokens {
        if t >= tok.timestamp_begin {
            let time = (offset + tok.timestamp_seconds(t)).min(chunk_end);
            if !text.is_empty() {
                out.push((start, time.max(start), std::mem::take(&mut text)));
            }
            start = time;
            last_ts = Some(time);
        } else if t < tok.eot {
            text.push(t);
        }
    }
    let trailing = !text.is_empty();
    if trailing {
        out.push((start, chunk_end.max(start), text));
    }
    (out, last_ts, trailing)
}

/// Padding of the speech regions of [`LongForm::Batched`] (faster-whisper's default).
const CHUNK_PAD_MS: u32 = 400;

/// A chunk of [`LongForm::Batched`]: speech regions of the audio (16 kHz sample ranges, in
/// order, not touching) heard one after the other, the silence between them left out.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Chunk {
    pieces: Vec<(usize, usize)>,
}

impl Chunk {
    /// Samples of audio in the chunk.
    fn len(&self) -> usize {
        self.pieces.iter().map(|&(s, e)| e - s).sum()
    }

    /// The sample of the file the chunk starts at.
    fn start(&self) -> usize {
        self.pieces.first().map_or(0, |p| p.0)
    }

    /// The chunk's audio.
    fn samples(&self, audio: &[f32]) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.len());
        for &(s, e) in &self.pieces {
            v.extend_from_slice(&audio[s.min(audio.len())..e.min(audio.len())]);
        }
        v
    }

    /// The piece chunk time `t` (seconds) falls in, and the chunk sample that piece starts
    /// at. A time on the joint of two pieces is in the first when `is_end`, else in the
    /// second; times past the end are in the last piece.
    fn piece_at(&self, t: f64, is_end: bool) -> (usize, usize) {
        let x = t * SAMPLE_RATE as f64;
        let mut acc = 0;
        for (i, &(s, e)) in self.pieces.iter().enumerate() {
            let end = (acc + e - s) as f64;
            if x < end || (is_end && x <= end) || i + 1 == self.pieces.len() {
                return (i, acc);
            }
            acc += e - s;
        }
        (0, 0)
    }

    /// File time (seconds) of chunk time `t`; see [`Chunk::piece_at`] for `is_end`.
    fn file_time(&self, t: f64, is_end: bool) -> f64 {
        self.file_time_in(t, self.piece_at(t, is_end))
    }

    fn file_time_in(&self, t: f64, (i, acc): (usize, usize)) -> f64 {
        let Some(&(s, e)) = self.pieces.get(i) else { return t };
        let x = (t * SAMPLE_RATE as f64 - acc as f64).clamp(0.0, (e - s) as f64);
        (s as f64 + x) / SAMPLE_RATE as f64
    }

    /// File times of a span of chunk time (a word), both in the piece its middle is in.
    fn file_span(&self, start: f64, end: f64) -> (f64, f64) {
        let piece = self.piece_at((start + end) / 2.0, false);
        (self.file_time_in(start, piece), self.file_time_in(end, piece))
    }

    /// The chunk from chunk sample `from` on.
    fn tail(&self, from: usize) -> Chunk {
        let mut acc = 0;
        let mut pieces = Vec::new();
        for &(s, e) in &self.pieces {
            let skip = from.saturating_sub(acc).min(e - s);
            if s + skip < e {
                pieces.push((s + skip, e));
            }
            acc += e - s;
        }
        Chunk { pieces }
    }

    /// Samples of speech in the chunk: each piece without the padding at its ends (`pad`
    /// samples each side).
    fn speech(&self, pad: usize) -> usize {
        self.pieces.iter().map(|&(s, e)| (e - s).saturating_sub(2 * pad)).sum()
    }
}

/// faster-whisper's `collect_chunks`: speech regions (sample ranges, in order) gathered into
/// chunks of at most `max_len` samples of audio, a region that would take a chunk past it
/// starting the next; a region longer than `max_len` is cut to it. Regions that touch are
/// one piece.
pub(crate) fn collect_chunks(regions: &[(usize, usize)], max_len: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    let mut cur: Vec<(usize, usize)> = Vec::new();
    let mut cur_len = 0;
    for &(s, e) in regions {
        let e = e.min(s + max_len);
        if e <= s {
            continue;
        }
        if cur_len + (e - s) > max_len && !cur.is_empty() {
            out.push(Chunk { pieces: std::mem::take(&mut cur) });
            cur_len = 0;
        }
        match cur.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => cur.push((s, e)),
        }
        cur_len += e - s;
    }
    if !cur.is_empty() {
        out.push(Chunk { pieces: cur });
    }
    out
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
