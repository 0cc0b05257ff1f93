//! `cargo xtask bench voice`: the spoken conversation loop (sapient-voice) at real-time
//! pace. Each question is pushed in 20 ms frames as a microphone would deliver them (the
//! pushes are paced by the clock), into a fresh conversation; the reply's audio is pulled
//! in step. Per question: the time from the arrival of the end of the user's speech to the
//! first reply audio (the end-of-turn silence included), what each stage cost (Whisper
//! after the turn, the first token, Kokoro on the first clause), the question's words as
//! recognised (WER against its text), and the reply's audio transcribed back by Whisper
//! against the reply's text.
//!
//! The questions are short English questions spoken by Kokoro (voice `jf_gongitsune`,
//! another voice than the reply's) and the first seconds of the LibriVox clips (real
//! recorded speech; recognition scored only for the synthesized questions, whose text is
//! known exactly).

use anyhow::{Context, Result};
use sapient_voice::{Event, VoiceLoop, VoiceModels, VoiceOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QUESTIONS: &[&str] = &[
    "What is the capital of France?",
    "How many days are there in a week?",
    "What color is the sky on a clear day?",
    "Can you name a fruit that is yellow?",
    "What do bees make?",
    "Which animal is known as the king of the jungle?",
];

#[derive(clap::Args)]
pub struct Args {
    /// The language model (preset, GGUF file or directory).
    #[arg(long, default_value = "smollm2-135m-instruct")]
    pub model: String,
    #[arg(long, default_value = "whisper-tiny.en")]
    pub whisper: String,
    /// The reply's voice.
    #[arg(long, default_value = "jm_kumo")]
    pub voice: String,
    #[arg(long, default_value_t = 500)]
    pub end_of_turn_ms: u32,
    /// The pause inside a turn at which Whisper runs (and the early reply starts).
    #[arg(long, default_value_t = sapient_voice::TurnOptions::default().pause_ms)]
    pub pause_ms: u32,
    /// Start each reply at the end of the turn only, not at the pause before it.
    #[arg(long)]
    pub no_early_reply: bool,
    /// Most words in the reply's first clause.
    #[arg(long, default_value_t = sapient_voice::ClauseOptions::default().first_max_words)]
    pub first_clause_words: usize,
    /// Only the first N questions (synthesized ones first, then the LibriVox clips).
    #[arg(long)]
    pub questions: Option<usize>,
    /// Before the loop, time Kokoro alone on clauses of 1 to 12 words (the reply's voice;
    /// best of 3 each): what a first clause costs by its length on this machine.
    #[arg(long)]
    pub tts_probe: bool,
    #[arg(long, default_value = "target/bench/voice.json")]
    pub json: std::path::PathBuf,
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn words(s: &str) -> Vec<String> {
    sapient_whisper::eval::normalize(s)
}

pub fn run(a: Args) -> Result<()> {
    let hub = sapient_hub::Hub::new()?;
    let cpu = candle_core::Device::Cpu;
    let kokoro = hub.fetch_preset("kokoro-82m", &mut |_| {})?;
    let vad_file = hub.fetch_preset("silero-vad", &mut |_| {})?.file("onnx")?.to_path_buf();
    let librivox = hub.fetch_preset("speech-librivox", &mut |_| {})?.dir.clone();
    let pipe = sapient_generate::Pipeline::load(&a.model, Default::default(), |_| {})?;
    let tts = Arc::new(sapient_kokoro::KokoroTts::from_dir(&kokoro.dir, &cpu)?);
    let transcriber = Arc::new(sapient_whisper::Transcriber::load(&a.whisper, &cpu, &mut |_| {})?);
    let models = VoiceModels { transcriber: transcriber.clone(), tts: tts.clone(), llm: Arc::new(sapient_generate::Engine::new(pipe.model(), Default::default())?) };
    const RATE: u32 = 24_000;

    // (text if known, 24 kHz speech)
    let mut inputs: Vec<(Option<String>, Vec<f32>)> = Vec::new();
    for q in QUESTIONS {
        inputs.push((Some(q.to_string()), tts.synthesize(q, "jf_gongitsune", 1.0)?.samples));
    }
    let mut clips: Vec<_> = std::fs::read_dir(&librivox)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "wav")).collect();
    clips.sort();
    for c in clips {
        let s16 = sapient_audio::decode_file(&c)?.into_16k()?.samples;
        let s16 = &s16[..s16.len().min(16_000 * 4)];
        inputs.push((None, sapient_audio::resample(s16, 16_000, RATE)?));
    }
    if let Some(n) = a.questions {
        inputs.truncate(n);
    }

    if a.tts_probe {
        tts_probe(&tts, &a.voice)?;
    }
    let frame = (RATE / 50) as usize;
    let mut rows = Vec::new();
    for (i, (text, speech)) in inputs.iter().enumerate() {
        let vad = sapient_voice::load_vad(&vad_file)?;
        let turn = sapient_voice::TurnOptions { end_of_turn_ms: a.end_of_turn_ms, pause_ms: a.pause_ms, early_reply: !a.no_early_reply, ..Default::default() };
        let clauses = sapient_voice::ClauseOptions { first_max_words: a.first_clause_words, ..Default::default() };
        let opts = VoiceOptions { input_rate: RATE, voice: a.voice.clone(), turn: Some(turn), clauses, ..VoiceOptions::default() };
        let mut lp = VoiceLoop::new(models.clone(), vad, opts)?;
        let mut input = vec![0.0; RATE as usize / 4];
        input.extend_from_slice(speech);
        let start = Instant::now();
        let (mut heard, mut reply_text, mut reply_audio, mut timings) = (String::new(), String::new(), Vec::new(), None);
        // the first clause spoken: its text and seconds of audio
        let mut first_clause: Option<(String, f64)> = None;
        let mut k = 0usize;
        // the speech, then silence until the reply is spoken (30 s at most)
        while timings.is_none() && k * frame < input.len() + 30 * RATE as usize {
            let due = start + Duration::from_secs_f64((k * frame) as f64 / f64::from(RATE));
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let chunk: Vec<f32> = input.get(k * frame..((k + 1) * frame).min(input.len())).map_or_else(|| vec![0.0; frame], <[f32]>::to_vec);
            lp.push_audio(&chunk)?;
            let _ = lp.pull_audio(frame, false);
            for ev in lp.drain_events() {
                match ev {
                    Event::Transcript { text, .. } => heard = text,
                    Event::Audio { samples, text, .. } => {
                        first_clause.get_or_insert_with(|| (text, samples.len() as f64 / f64::from(RATE)));
                        reply_audio.extend(samples);
                    }
                    Event::ResponseDone { generated, timings: t, .. } => {
                        reply_text = generated;
                        timings = Some(t);
                    }
                    _ => {}
                }
            }
            k += 1;
        }
        let t = timings.with_context(|| format!("question {i}: no reply within 30 s"))?;
        let q_wer = text.as_ref().map(|q| {
            let r = words(q);
            sapient_whisper::eval::word_errors(&r, &words(&heard)) as f64 / r.len().max(1) as f64
        });
        let back = transcriber.transcribe(&sapient_audio::resample(&reply_audio, RATE, 16_000)?, &Default::default())?.text;
        let rw = words(&reply_text);
        let r_wer = sapient_whisper::eval::word_errors(&rw, &words(&back)) as f64 / rw.len().max(1) as f64;
        let (fc_text, fc_secs) = first_clause.clone().unwrap_or_default();
        let start = t.start_after_speech_end_ms.unwrap_or(f64::NAN);
        // the reply's leading silence: what is heard is speech this much after its first audio
        let lead_ms = reply_audio.iter().position(|x: &f32| x.abs() >= 0.01).unwrap_or(reply_audio.len()) as f64 * 1000.0 / f64::from(RATE);
        println!(
            "{i}: speech end -> first audio {:.0} ms (end of turn {:.0}, transcribe {:.0}, reply started {:.0} ms after the speech end ({:.0} ms early, Whisper at the pause {:.0}), first token {:.0}, first clause {:.0} ({} words, {fc_secs:.2} s of audio), first audio ready {:.0} ms after the speech end, its first {lead_ms:.0} ms silent); heard {heard:?}{}; reply {reply_text:?}, heard back with WER {r_wer:.2}",
            t.speech_end_to_first_audio_ms.unwrap_or(f64::NAN),
            t.end_of_turn_ms.unwrap_or(f64::NAN),
            t.transcribe_ms,
            start,
            t.early_ms,
            t.pause_transcribe_ms.unwrap_or(f64::NAN),
            t.first_token_ms.unwrap_or(f64::NAN),
            t.first_clause_synth_ms.unwrap_or(f64::NAN),
            fc_text.split_whitespace().count(),
            start + t.first_audio_ms.unwrap_or(f64::NAN),
            q_wer.map(|w| format!(" (WER {w:.2})")).unwrap_or_default()
        );
        rows.push(serde_json::json!({"question": text, "heard": heard, "question_wer": q_wer, "reply": reply_text, "reply_heard_back": back, "reply_wer": r_wer,
            "speech_end_to_first_audio_ms": t.speech_end_to_first_audio_ms, "end_of_turn_ms": t.end_of_turn_ms, "early_ms": t.early_ms, "transcribe_ms": t.transcribe_ms, "first_token_ms": t.first_token_ms,
            "first_clause_synth_ms": t.first_clause_synth_ms, "first_audio_ms": t.first_audio_ms, "pause_transcribe_ms": t.pause_transcribe_ms, "start_after_speech_end_ms": t.start_after_speech_end_ms,
            "first_clause": fc_text, "first_clause_audio_s": fc_secs, "lead_silence_ms": lead_ms, "first_audio_ready_ms": start + t.first_audio_ms.unwrap_or(f64::NAN), "prompt_tokens": t.prompt_tokens, "generated_tokens": t.generated_tokens}));
    }
    let col = |k: &str| rows.iter().map(|r| r[k].as_f64().unwrap_or(f64::NAN)).collect::<Vec<f64>>();
    let lat = col("speech_end_to_first_audio_ms");
    println!(
        "{} questions, end-of-turn {} ms, early reply {}: speech end -> first audio p50 {:.0} ms, p95 {:.0} ms; stage medians: end of turn {:.0} ms, transcribe {:.0} ms, started early {:.0} ms, first token {:.0} ms, first clause {:.0} ms, first audio {:.0} ms, reply started {:.0} ms after the speech end, first audio ready {:.0} ms after it, its leading silence {:.0} ms; reply WER median {:.2} (worst {:.2})",
        rows.len(),
        a.end_of_turn_ms,
        if a.no_early_reply { "off" } else { "on" },
        percentile(&lat, 0.5),
        percentile(&lat, 0.95),
        percentile(&col("end_of_turn_ms"), 0.5),
        percentile(&col("transcribe_ms"), 0.5),
        percentile(&col("early_ms"), 0.5),
        percentile(&col("first_token_ms"), 0.5),
        percentile(&col("first_clause_synth_ms"), 0.5),
        percentile(&col("first_audio_ms"), 0.5),
        percentile(&col("start_after_speech_end_ms"), 0.5),
        percentile(&col("first_audio_ready_ms"), 0.5),
        percentile(&col("lead_silence_ms"), 0.5),
        percentile(&col("reply_wer"), 0.5),
        percentile(&col("reply_wer"), 1.0)
    );
    if let Some(dir) = a.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&a.json, serde_json::to_string_pretty(&serde_json::json!({"machine": super::machine(), "model": a.model, "whisper": a.whisper, "end_of_turn_ms": a.end_of_turn_ms, "early_reply": !a.no_early_reply, "pause_ms": a.pause_ms, "first_clause_words": a.first_clause_words, "rows": rows}))?)?;
    println!("wrote {}", a.json.display());
    Ok(())
}

/// Kokoro alone on the first words of a reply, 1 to 12 of them (best of 3 runs each).
fn tts_probe(tts: &sapient_kokoro::KokoroTts, voice: &str) -> Result<()> {
    const REPLY: &str = "The capital of France is Paris, a large and old city on the river Seine.";
    let words: Vec<&str> = REPLY.split_whitespace().collect();
    for n in [1, 2, 3, 4, 6, 8, 12] {
        let text = words[..n.min(words.len())].join(" ");
        let mut best = f64::INFINITY;
        let mut secs = 0.0;
        for _ in 0..3 {
            let t0 = Instant::now();
            let s = tts.synthesize(&text, voice, 1.0)?;
            best = best.min(t0.elapsed().as_secs_f64() * 1000.0);
            secs = s.samples.len() as f64 / f64::from(s.sample_rate);
        }
        let (ids, _) = tts.vocab().encode(&tts.phonemize(&text)?);
        let vp = tts.voices().get(voice)?;
        let d = tts.model().forward(&ids, vp.style_for(ids.len())?, 1.0, None)?.durations;
        println!("kokoro alone, {n:2} words: {best:5.0} ms for {secs:.2} s of audio ({text:?}); frames per token {d:?}");
    }
    Ok(())
}
