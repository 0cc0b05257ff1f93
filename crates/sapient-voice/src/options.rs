//! The loop's options, values passed when it is made (or changed with
//! [`crate::VoiceLoop::update`]).

use crate::{ClauseOptions, Error, Result};
use sapient_generate::SamplerConfig;

/// Turn detection by the VAD (OpenAI's `server_vad`).
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOptions {
    /// Speech probability at or above which a window is speech (0..1, default 0.5).
    pub threshold: f32,
    /// Silence that ends the user's turn (default 500 ms).
    pub end_of_turn_ms: u32,
    /// Shorter stretches of speech are not turns (a cough, a click; default 250 ms).
    pub min_speech_ms: u32,
    /// Audio kept before the detected start of speech (default 300 ms).
    pub prefix_padding_ms: u32,
    /// A pause this long inside a turn transcribes what was said so far (partial text;
    /// reused at the end of the turn when nothing was said after it). Default 200 ms.
    pub pause_ms: u32,
    /// Speech this long while a reply plays interrupts it (barge-in; default 100 ms).
    pub barge_in_ms: u32,
    /// Whether speech interrupts a reply at all (off: the reply plays to its end, e.g.
    /// with a loudspeaker and no echo cancellation).
    pub interrupt: bool,
    /// Whether the end of a turn starts a reply (off: the caller asks with
    /// [`crate::VoiceLoop::respond`]).
    pub respond: bool,
    /// Whether the reply starts at a pause, on the pause's text, before the turn ends
    /// (generated and synthesized during the rest of the end-of-turn silence, held back until
    /// the turn ends at that pause, dropped unheard when the user speaks again). The reply is
    /// the one the end of the turn would start: same history, same text. Needs `respond`.
    pub early_reply: bool,
}

impl Default for TurnOptions {
    fn default() -> Self {
        Self {
            threshold: 0.5,
            end_of_turn_ms: 500,
            min_speech_ms: 250,
            prefix_padding_ms: 300,
            pause_ms: 200,
            barge_in_ms: 100,
            interrupt: true,
            respond: true,
            early_reply: true,
        }
    }
}

impl TurnOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        if !(self.threshold > 0.0 && self.threshold < 1.0) {
            return Err(Error::Options(format!("turn threshold {} is not in (0, 1)", self.threshold)));
        }
        if self.end_of_turn_ms < 32 || self.end_of_turn_ms > 60_000 {
            return Err(Error::Options(format!("end_of_turn_ms {} is not in 32..=60000", self.end_of_turn_ms)));
        }
        for (name, v) in [("min_speech_ms", self.min_speech_ms), ("prefix_padding_ms", self.prefix_padding_ms), ("pause_ms", self.pause_ms), ("barge_in_ms", self.barge_in_ms)] {
            if v > 60_000 {
                return Err(Error::Options(format!("{name} {v} is over 60000")));
            }
        }
        Ok(())
    }
}

/// How the reply's audio is considered played.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Playout {
    /// The caller pulls the audio ([`crate::VoiceLoop::pull_audio`]) as it plays it (a
    /// sound card, a file written in step with the input): what was pulled was played.
    #[default]
    Pull,
    /// The audio goes out in [`crate::Event::Audio`] events (a network client) and is
    /// taken as played at real-time pace from the first chunk of the reply.
    Clock,
}

/// The whole loop's options.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceOptions {
    /// The system prompt.
    pub instructions: String,
    /// Kokoro voice (a name or a blend, `jf_alpha:0.6,jm_kumo:0.4`).
    pub voice: String,
    /// Speech speed (0.25..=4).
    pub speed: f32,
    /// Most tokens in a reply.
    pub max_reply_tokens: usize,
    pub sampling: SamplerConfig,
    /// Turn detection; `None`: turns are committed by hand ([`crate::VoiceLoop::commit`]).
    pub turn: Option<TurnOptions>,
    /// Whisper's language (`None`: the model's; detected by multilingual models).
    pub language: Option<String>,
    /// Sample rate of the audio pushed in (resampled to 16 kHz inside).
    pub input_rate: u32,
    pub playout: Playout,
    pub clauses: ClauseOptions,
    /// Most messages of history kept in the prompt besides the system prompt (the oldest
    /// go first).
    pub max_history: usize,
    /// Whether replies are spoken (off: text only, no Kokoro).
    pub speak: bool,
}

impl Default for VoiceOptions {
    fn default() -> Self {
        Self {
            instructions: "You are a helpful voice assistant. Answer in one or two short spoken sentences, without lists, markup or emoji.".into(),
            voice: "jm_kumo".into(),
            speed: 1.0,
            max_reply_tokens: 120,
            sampling: SamplerConfig::greedy(),
            turn: Some(TurnOptions::default()),
            language: None,
            input_rate: 16_000,
            playout: Playout::Pull,
            clauses: ClauseOptions::default(),
            max_history: 40,
            speak: true,
        }
    }
}

impl VoiceOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        if !(0.25..=4.0).contains(&self.speed) {
            return Err(Error::Options(format!("speed {} is outside 0.25..=4", self.speed)));
        }
        if self.max_reply_tokens == 0 {
            return Err(Error::Options("max_reply_tokens must be at least 1".into()));
        }
        if self.clauses.first_max_words == 0 || self.clauses.max_words == 0 {
            return Err(Error::Options("clause word limits must be at least 1".into()));
        }
        if let Some(t) = &self.turn {
            t.validate()?;
        }
        self.sampling.validate().map_err(|e| Error::Options(e.to_string()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_are_errors_naming_them() {
        let bad = |o: VoiceOptions, what: &str| {
            let e = o.validate().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(what), "{e:?} does not name {what}");
        };
        bad(VoiceOptions { speed: 5.0, ..VoiceOptions::default() }, "speed");
        bad(VoiceOptions { max_reply_tokens: 0, ..VoiceOptions::default() }, "max_reply_tokens");
        bad(VoiceOptions { turn: Some(TurnOptions { threshold: 1.5, ..TurnOptions::default() }), ..VoiceOptions::default() }, "threshold");
        bad(VoiceOptions { turn: Some(TurnOptions { end_of_turn_ms: 0, ..TurnOptions::default() }), ..VoiceOptions::default() }, "end_of_turn_ms");
        bad(VoiceOptions { turn: Some(TurnOptions { barge_in_ms: 90_000, ..TurnOptions::default() }), ..VoiceOptions::default() }, "barge_in_ms");
        assert!(VoiceOptions::default().validate().is_ok());
        assert!(VoiceOptions { turn: None, ..VoiceOptions::default() }.validate().is_ok());
    }
}
