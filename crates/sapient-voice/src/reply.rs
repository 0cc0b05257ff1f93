//! One reply: the engine's text read on one thread (which cancels the request at the next
//! engine step once asked), cut into clauses, each spoken by Kokoro on a second thread as
//! soon as it is complete, so the first clause is heard while the rest is generated.

use crate::clause::{ClauseOptions, ClauseSplitter};
use crate::{Error, Result};
use sapient_generate::{Event as EngineEvent, FinishReason, Generation, RequestHandle};
use sapient_kokoro::{KokoroTts, WordTiming};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a reply's threads send to the loop.
pub(crate) enum ReplyMsg {
    /// A piece of text, and when the engine gave it.
    Text(String, Instant),
    /// A clause's audio, and when Kokoro finished it.
    Audio { text: String, samples: Vec<f32>, words: Vec<WordTiming>, synth: Duration, at: Instant },
    /// A clause Kokoro could not speak (nothing speakable in it).
    Skipped { text: String, why: String },
    /// The generation ended (text thread).
    TextDone(std::result::Result<Generation, String>),
    /// Every clause was spoken or dropped (speech thread).
    AudioDone,
}

/// The threads of a reply in flight.
pub(crate) struct ReplyThreads {
    pub(crate) rx: Receiver<ReplyMsg>,
    pub(crate) cancel: Arc<AtomicBool>,
}

pub(crate) struct SpeechSettings {
    /// Off: clauses are dropped (a text-only reply).
    pub(crate) speak: bool,
    pub(crate) voice: String,
    pub(crate) speed: f32,
    pub(crate) clauses: ClauseOptions,
}

/// Starts the two threads of a reply for the request `handle`.
pub(crate) fn spawn(mut handle: RequestHandle, tts: Arc<KokoroTts>, s: SpeechSettings) -> Result<ReplyThreads> {
    let (tx, rx) = channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let (clause_tx, clause_rx) = channel::<String>();
    {
        let (tx, cancel) = (tx.clone(), cancel.clone());
        let clauses = s.clauses;
        std::thread::Builder::new()
            .name("sapient-voice-text".into())
            .spawn(move || read_text(&mut handle, &tx, &clause_tx, &cancel, clauses))
            .map_err(|e| Error::Worker(format!("cannot start the reply's text thread: {e}")))?;
    }
    {
        let cancel = cancel.clone();
        std::thread::Builder::new()
            .name("sapient-voice-speech".into())
            .spawn(move || speak(&tts, &s, &clause_rx, &tx, &cancel))
            .map_err(|e| Error::Worker(format!("cannot start the reply's speech thread: {e}")))?;
    }
    Ok(ReplyThreads { rx, cancel })
}

fn read_text(handle: &mut RequestHandle, tx: &Sender<ReplyMsg>, clauses: &Sender<String>, cancel: &AtomicBool, opts: ClauseOptions) {
    let mut split = ClauseSplitter::new(opts);
    let mut asked = false;
    let mut result = Err("the engine stopped before the reply ended".to_string());
    while let Some(ev) = handle.blocking_next() {
        if cancel.load(Ordering::Relaxed) && !asked {
            handle.cancel();
            asked = true;
        }
        match ev {
            EngineEvent::Text(t) => {
                let _ = tx.send(ReplyMsg::Text(t.clone(), Instant::now()));
                if !asked {
                    for c in split.push(&t) {
                        let _ = clauses.send(c);
                    }
                }
            }
            EngineEvent::Done(r) => {
                if let (Ok(g), false) = (&r, asked) {
                    if g.finish != FinishReason::Cancelled {
                        if let Some(rest) = split.finish() {
                            let _ = clauses.send(rest);
                        }
                    }
                }
                result = r.map_err(|e| e.to_string());
                break;
            }
            _ => {}
        }
    }
    let _ = tx.send(ReplyMsg::TextDone(result));
}

fn speak(tts: &KokoroTts, s: &SpeechSettings, clauses: &Receiver<String>, tx: &Sender<ReplyMsg>, cancel: &AtomicBool) {
    for clause in clauses {
        if cancel.load(Ordering::Relaxed) || !s.speak {
            continue;
        }
        let started = Instant::now();
        let stream = match tts.stream(&clause, &s.voice, s.speed) {
            Ok(st) => st.with_lead_silence(LEAD_FRAMES),
            Err(e) => {
                let _ = tx.send(ReplyMsg::Skipped { text: clause, why: e.to_string() });
                continue;
            }
        };
        for chunk in stream {
            if cancel.load(Ordering::Relaxed) {
                break;
            }
            match chunk {
                Ok(c) => {
                    let msg = ReplyMsg::Audio { text: c.text, samples: c.samples, words: c.words, synth: started.elapsed(), at: Instant::now() };
                    if tx.send(msg).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(ReplyMsg::Skipped { text: clause.clone(), why: e.to_string() });
                    break;
                }
            }
        }
    }
    let _ = tx.send(ReplyMsg::AudioDone);
}

/// Frames (25 ms) of silence kept before a clause's speech: Kokoro predicts about 350 ms,
/// which would be heard as that much more delay before the reply, and as a long gap between
/// its clauses.
const LEAD_FRAMES: u32 = 3;

/// A spoken clause: its text, its words with their times (seconds from the clause's
/// start), and where its samples are in the reply's audio.
pub(crate) struct SpokenClause {
    pub(crate) text: String,
    pub(crate) words: Vec<WordTiming>,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// What of a reply was heard once `played` of its samples were played: the clauses played
/// whole, and the words of the clause under way that had ended.
pub(crate) fn heard_text(clauses: &[SpokenClause], played: usize, rate: u32) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in clauses {
        if c.start + c.len <= played {
            parts.push(c.text.clone());
        } else if c.start < played {
            let t = (played - c.start) as f32 / rate as f32;
            let words: Vec<&str> = c.words.iter().filter(|w| w.end <= t).map(|w| w.word.as_str()).collect();
            if !words.is_empty() {
                parts.push(words.join(" "));
            }
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heard_text_keeps_played_clauses_and_ended_words() {
        let w = |word: &str, start: f32, end: f32| WordTiming { word: word.into(), start, end };
        let clauses = vec![
            SpokenClause { text: "Paris is the capital.".into(), words: vec![], start: 0, len: 24_000 },
            SpokenClause { text: "It is a big city.".into(), words: vec![w("It", 0.0, 0.2), w("is", 0.2, 0.4), w("a", 0.4, 0.5), w("big", 0.5, 0.8), w("city", 0.8, 1.2)], start: 24_000, len: 30_000 },
        ];
        assert_eq!(heard_text(&clauses, 10, 24_000), "");
        assert_eq!(heard_text(&clauses, 24_000, 24_000), "Paris is the capital.");
        assert_eq!(heard_text(&clauses, 24_000 + 12_000, 24_000), "Paris is the capital. It is a");
        assert_eq!(heard_text(&clauses, 60_000, 24_000), "Paris is the capital. It is a big city.");
    }
}
