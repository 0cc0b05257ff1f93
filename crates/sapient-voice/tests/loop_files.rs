//! The whole loop on recordings (whisper-tiny.en, SmolLM2-135M, Kokoro, Silero VAD from the
//! model cache): a spoken question gets a spoken answer whose Whisper transcription is the
//! reply's text; speech during the answer stops it within 300 ms of audio; silence gets no
//! answer. The file mode pushes the input in 20 ms frames and pulls the output in step.

use anyhow::{ensure, Context, Result};
use sapient_voice::{file, Event, ReplyStatus, VoiceLoop, VoiceModels, VoiceOptions};
use std::sync::{Arc, OnceLock};

const RATE: u32 = 24_000;

struct Fixture {
    models: VoiceModels,
    vad_file: std::path::PathBuf,
    librivox: std::path::PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| load().expect("loading the models (whisper-tiny.en, smollm2-135m-instruct, kokoro-82m, silero-vad)"))
}

fn load() -> Result<Fixture> {
    let hub = sapient_hub::Hub::new()?;
    let cpu = candle_core::Device::Cpu;
    let kokoro = hub.fetch_preset("kokoro-82m", &mut |_| {})?;
    let vad_file = hub.fetch_preset("silero-vad", &mut |_| {})?.file("onnx")?.to_path_buf();
    let librivox = hub.fetch_preset("speech-librivox", &mut |_| {})?.dir.clone();
    let pipe = sapient_generate::Pipeline::from_pretrained("smollm2-135m-instruct")?;
    let models = VoiceModels {
        transcriber: Arc::new(sapient_whisper::Transcriber::from_pretrained("whisper-tiny.en")?),
        tts: Arc::new(sapient_kokoro::KokoroTts::from_dir(&kokoro.dir, &cpu)?),
        llm: Arc::new(sapient_generate::Engine::new(pipe.model(), Default::default())?),
    };
    Ok(Fixture { models, vad_file, librivox })
}

fn new_loop(f: &Fixture) -> Result<VoiceLoop> {
    let vad = sapient_audio::SileroVad::load(&f.vad_file, &candle_core::Device::Cpu)?;
    let opts = VoiceOptions { input_rate: RATE, max_reply_tokens: 60, ..VoiceOptions::default() };
    Ok(VoiceLoop::new(f.models.clone(), vad, opts)?)
}

/// A question spoken by Kokoro with another voice than the reply's (24 kHz).
fn spoken(f: &Fixture, text: &str) -> Result<Vec<f32>> {
    Ok(f.models.tts.synthesize(text, "jf_gongitsune", 1.0)?.samples)
}

fn silence(s: f64) -> Vec<f32> {
    vec![0.0; (s * RATE as f64) as usize]
}

fn heard_by_whisper(f: &Fixture, audio24: &[f32]) -> Result<String> {
    let a16 = sapient_audio::resample(audio24, RATE, 16_000)?;
    Ok(f.models.transcriber.transcribe(&a16, &sapient_whisper::TranscribeOptions::default())?.text)
}

/// Lower-case words; Whisper writes small numbers as digits.
fn words(s: &str) -> Vec<String> {
    const NUM: [&str; 13] = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"];
    sapient_whisper::eval::normalize(s)
        .into_iter()
        .map(|w| w.parse::<usize>().ok().and_then(|n| NUM.get(n)).map_or(w, |n| n.to_string()))
        .collect()
}

fn wer(reference: &str, hypothesis: &str) -> f64 {
    let (r, h) = (words(reference), words(hypothesis));
    sapient_whisper::eval::word_errors(&r, &h) as f64 / r.len().max(1) as f64
}

fn position(run: &file::FileRun, pred: impl Fn(&Event) -> bool) -> Option<usize> {
    run.events.iter().position(|(_, e)| pred(e))
}

#[test]
fn spoken_question_gets_a_spoken_answer() -> Result<()> {
    let f = fixture();
    let mut lp = new_loop(f)?;
    let mut input = silence(0.5);
    input.extend(spoken(f, "What is the capital of France?")?);
    input.extend(silence(1.5));
    let run = file::run(&mut lp, &input, 20, 60.0)?;
    for (t, e) in &run.events {
        match e {
            Event::Audio { samples, text, .. } => eprintln!("{t:6} ms  Audio {:.2} s {text:?}", samples.len() as f64 / RATE as f64),
            e => eprintln!("{t:6} ms  {e:?}"),
        }
    }
    // the stages, in order
    let at = |p: &dyn Fn(&Event) -> bool| position(&run, p).context("an expected event is missing");
    let started = at(&|e| matches!(e, Event::SpeechStarted { .. }))?;
    let stopped = at(&|e| matches!(e, Event::SpeechStopped { .. }))?;
    let transcript = at(&|e| matches!(e, Event::Transcript { .. }))?;
    let response = at(&|e| matches!(e, Event::ResponseStarted { .. }))?;
    let delta = at(&|e| matches!(e, Event::TextDelta { .. }))?;
    let audio = at(&|e| matches!(e, Event::Audio { .. }))?;
    let done = at(&|e| matches!(e, Event::ResponseDone { .. }))?;
    ensure!(started < stopped && stopped < transcript && transcript < response && response < delta && delta < audio && audio < done);
    let Event::Transcript { text, .. } = &run.events[transcript].1 else { unreachable!() };
    let heard = words(text);
    ensure!(heard.contains(&"capital".to_string()) && heard.contains(&"france".to_string()), "the question was heard as {text:?}");
    let Event::ResponseDone { status, generated, timings, text: kept, .. } = &run.events[done].1 else { unreachable!() };
    ensure!(*status == ReplyStatus::Completed);
    ensure!(timings.first_audio_ms.is_some() && timings.first_token_ms.is_some() && timings.generated_tokens > 0, "{timings:?}");
    // the turn ended at the pause whose text was transcribed: that text was the turn's, and
    // the reply started at the pause was the one kept
    let Event::Transcript { reused, .. } = &run.events[transcript].1 else { unreachable!() };
    ensure!(*reused && timings.transcribe_ms == 0.0 && timings.early_ms > 0.0, "{timings:?}");
    eprintln!("reply: {generated:?}\ntimings: {timings:?}");
    // one turn each in the history, the reply whole
    let h = lp.history();
    ensure!(h.len() == 2 && h[1].content == *kept && kept == generated.trim(), "history {h:?}");
    // the reply's audio, as spoken, is its text
    let reply_audio: Vec<f32> = run.output.iter().copied().skip_while(|x| *x == 0.0).collect();
    ensure!(reply_audio.len() > RATE as usize / 2, "no reply audio in the output");
    let back = heard_by_whisper(f, &reply_audio)?;
    let e = wer(generated, &back);
    eprintln!("reply heard back: {back:?} (WER {:.2})", e);
    ensure!(e < 0.2, "WER {e:.2}: the reply {generated:?} was heard as {back:?}");
    Ok(())
}

#[test]
fn a_reply_started_at_a_pause_is_dropped_when_the_user_goes_on() -> Result<()> {
    let f = fixture();
    let mut lp = new_loop(f)?;
    // "What is the capital", a pause longer than `pause_ms` but shorter than the end of
    // the turn, "of France?"
    // (Kokoro's own leading and trailing silence cut off)
    let trimmed = |x: Vec<f32>| -> Vec<f32> {
        let loud = |v: &f32| v.abs() > 0.01;
        let (a, b) = (x.iter().position(loud).unwrap_or(0), x.iter().rposition(loud).map_or(0, |i| i + 1));
        x[a..b.max(a)].to_vec()
    };
    let mut input = silence(0.5);
    input.extend(trimmed(spoken(f, "What is the capital")?));
    input.extend(silence(0.3));
    input.extend(trimmed(spoken(f, "of France?")?));
    input.extend(silence(1.5));
    let run = file::run(&mut lp, &input, 20, 60.0)?;
    for (t, e) in &run.events {
        if !matches!(e, Event::Audio { .. } | Event::TextDelta { .. }) {
            eprintln!("{t:6} ms  {e:?}");
        }
    }
    let kinds = |p: &dyn Fn(&Event) -> bool| run.events.iter().filter(|(_, e)| p(e)).count();
    // one turn; a reply was started early at the pause (its partial text), then dropped
    ensure!(kinds(&|e| matches!(e, Event::SpeechStopped { .. })) == 1, "not one turn");
    let stopped = position(&run, |e| matches!(e, Event::SpeechStopped { .. })).context("no end of turn")?;
    let partials: Vec<(usize, &str)> = run
        .events
        .iter()
        .enumerate()
        .filter_map(|(i, (_, e))| match e {
            Event::TranscriptPartial { text } => Some((i, text.as_str())),
            _ => None,
        })
        .collect();
    // the pause inside the turn was transcribed (a reply was started on that text)
    ensure!(partials.len() >= 2 && partials.iter().all(|(i, _)| *i < stopped), "partials {partials:?}");
    ensure!(!words(partials[0].1).contains(&"france".to_string()), "partials {partials:?}");
    // nothing of a reply before the turn's end, then exactly one reply, to the whole turn
    let first_reply = position(&run, |e| matches!(e, Event::ResponseStarted { .. } | Event::TextDelta { .. } | Event::Audio { .. })).context("no reply")?;
    ensure!(first_reply > stopped, "reply events before the end of the turn");
    ensure!(kinds(&|e| matches!(e, Event::ResponseStarted { .. })) == 1 && kinds(&|e| matches!(e, Event::ResponseDone { .. })) == 1);
    let Some(Event::Transcript { text, .. }) = run.events.iter().map(|(_, e)| e).find(|e| matches!(e, Event::Transcript { .. })) else {
        anyhow::bail!("no transcript")
    };
    ensure!(words(text).contains(&"france".to_string()), "the turn was heard as {text:?}");
    let done = run.events.iter().find_map(|(_, e)| match e {
        Event::ResponseDone { generated, .. } => Some(generated.clone()),
        _ => None,
    });
    let generated = done.context("no reply")?;
    let h = lp.history();
    ensure!(h.len() == 2 && h[0].content == *text && h[1].content == generated.trim(), "history {h:?}");
    // the same conversation answered at the end of the turn, without early replies
    let mut plain = new_loop(f)?;
    let mut opts = plain.options().clone();
    opts.turn = opts.turn.map(|t| sapient_voice::TurnOptions { early_reply: false, ..t });
    plain.update(opts)?;
    let again = file::run(&mut plain, &input, 20, 60.0)?;
    let generated_again = again.events.iter().find_map(|(_, e)| match e {
        Event::ResponseDone { generated, .. } => Some(generated.clone()),
        _ => None,
    });
    ensure!(generated_again.as_deref() == Some(generated.as_str()), "{generated_again:?} vs {generated:?}");
    Ok(())
}

#[test]
fn speech_during_the_reply_stops_it() -> Result<()> {
    let f = fixture();
    let mut lp = new_loop(f)?;
    // real speech to interrupt with: a LibriVox clip's first 2.5 s after its speech starts
    let clip_path = std::fs::read_dir(&f.librivox)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wav"))
        .min()
        .context("no LibriVox wav")?;
    let clip16 = sapient_audio::decode_file(&clip_path)?.into_16k()?.samples;
    let mut vad = sapient_audio::SileroVad::load(&f.vad_file, &candle_core::Device::Cpu)?;
    let probs = vad.probabilities(&clip16)?;
    let segs = sapient_audio::VadSegmenter::new(sapient_audio::VadOptions::default())?.segments(&probs, clip16.len());
    let onset16 = segs.first().context("no speech in the clip")?.start;
    let clip = sapient_audio::resample(&clip16[onset16..(onset16 + 40_000).min(clip16.len())], 16_000, RATE)?;

    let mut input = silence(0.5);
    input.extend(spoken(f, "Tell me about the history of the city of Paris.")?);
    input.extend(silence(2.0));
    let onset_ms = input.len() as u64 * 1000 / RATE as u64;
    input.extend(clip);
    input.extend(silence(1.0));
    let run = file::run(&mut lp, &input, 20, 60.0)?;
    for (t, e) in &run.events {
        if !matches!(e, Event::Audio { .. } | Event::TextDelta { .. }) {
            eprintln!("{t:6} ms  {e:?}");
        }
    }
    let ms_to_out = |ms: u64| (ms * RATE as u64 / 1000) as usize;
    // the reply was playing when the interruption began
    let before = &run.output[ms_to_out(onset_ms - 200)..ms_to_out(onset_ms)];
    ensure!(before.iter().any(|x| x.abs() > 1e-3), "no reply audio was playing when the interrupting speech began");
    let (t_int, heard) = run
        .events
        .iter()
        .find_map(|(t, e)| match e {
            Event::Interrupted { heard, .. } => Some((*t, heard.clone())),
            _ => None,
        })
        .context("no barge-in")?;
    ensure!(t_int >= onset_ms && t_int <= onset_ms + 300, "barge-in at {t_int} ms, speech began at {onset_ms} ms");
    // from 300 ms after the onset to the next reply, the output is silent
    let next = run.events.iter().filter(|(t, e)| *t > t_int && matches!(e, Event::ResponseStarted { .. })).map(|(t, _)| *t).next();
    let end = next.map_or(run.output.len(), ms_to_out).min(run.output.len());
    let after = &run.output[ms_to_out(onset_ms + 300).min(end)..end];
    ensure!(after.iter().all(|x| *x == 0.0), "reply audio after the barge-in");
    // the history keeps what was heard: a part of what was generated
    let first_done = run.events.iter().find_map(|(_, e)| match e {
        Event::ResponseDone { status, generated, text, .. } => Some((*status, generated.clone(), text.clone())),
        _ => None,
    });
    let (status, generated, kept) = first_done.context("no end of the interrupted reply")?;
    ensure!(status == ReplyStatus::Interrupted && kept == heard);
    let (g, k) = (words(&generated), words(&kept));
    ensure!(k.len() < g.len() && g.starts_with(&k), "kept {kept:?} of {generated:?}");
    ensure!(lp.history().iter().any(|m| m.content == kept), "history {:?}", lp.history());
    Ok(())
}

#[test]
fn silence_and_noise_get_no_reply() -> Result<()> {
    let f = fixture();
    let mut lp = new_loop(f)?;
    let mut input = silence(2.0);
    // quiet noise (about -50 dBFS), deterministic
    let mut x = 0x2545_f491_u32;
    input.extend((0..3 * RATE).map(|_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        (x as f32 / u32::MAX as f32 - 0.5) * 0.006
    }));
    let run = file::run(&mut lp, &input, 20, 10.0)?;
    ensure!(run.events.is_empty(), "events on silence: {:?}", run.events);
    ensure!(run.output.iter().all(|x| *x == 0.0));
    ensure!(lp.history().is_empty());
    Ok(())
}

#[test]
fn bad_input_is_an_error_not_a_panic() -> Result<()> {
    let f = fixture();
    let mut lp = new_loop(f)?;
    let e = lp.push_audio(&[0.0, f32::NAN, 0.0]).err().context("NaN accepted")?;
    ensure!(e.to_string().contains("not a finite number"), "{e}");
    ensure!(lp.check_voice("nobody").is_err());
    // nothing to commit, nothing to cancel
    ensure!(lp.commit().is_err());
    ensure!(!lp.cancel());
    let vad = sapient_voice::load_vad(&f.vad_file)?;
    let bad = VoiceOptions { speed: 9.0, ..VoiceOptions::default() };
    ensure!(VoiceLoop::new(f.models.clone(), vad, bad).is_err());
    Ok(())
}
