//! Transcript writers: plain text, SRT, WebVTT, JSON (segments with timings and scores).

use crate::transcribe::Transcript;
use crate::{Error, Result};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Srt,
    Vtt,
    Json,
}

impl std::str::FromStr for OutputFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "text" | "txt" => Ok(Self::Text),
            "srt" => Ok(Self::Srt),
            "vtt" => Ok(Self::Vtt),
            "json" => Ok(Self::Json),
            _ => Err(Error::Options(format!("output format '{s}' (expected text, srt, vtt or json)"))),
        }
    }
}

/// `HH:MM:SS{sep}mmm` (SRT uses a comma, WebVTT a dot).
pub fn timestamp(seconds: f64, sep: char) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    format!("{h:02}:{m:02}:{s:02}{sep}{ms:03}")
}

impl Transcript {
    /// Render in `format`.
    pub fn render(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Text => {
                let mut s: String = self.segments.iter().map(|g| format!("{}\n", g.text.trim())).collect();
                if s.is_empty() {
                    s.push('\n');
                }
                s
            }
            OutputFormat::Srt => self
                .segments
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    format!("{}\n{} --> {}\n{}\n\n", i + 1, timestamp(g.start, ','), timestamp(g.end, ','), g.text.trim())
                })
                .collect(),
            OutputFormat::Vtt => {
                let mut s = String::from("WEBVTT\n\n");
                for g in &self.segments {
                    s.push_str(&format!("{} --> {}\n{}\n\n", timestamp(g.start, '.'), timestamp(g.end, '.'), g.text.trim()));
                }
                s
            }
            OutputFormat::Json => {
                let segs: Vec<_> = self
                    .segments
                    .iter()
                    .map(|g| {
                        json!({
                            "id": g.id, "seek": g.seek, "start": round3(g.start), "end": round3(g.end),
                            "text": g.text, "tokens": g.tokens, "temperature": g.temperature,
                            "avg_logprob": g.avg_logprob, "compression_ratio": g.compression_ratio,
                            "no_speech_prob": g.no_speech_prob,
                            "words": g.words.iter().map(|w| json!({
                                "word": w.word, "start": round3(w.start), "end": round3(w.end), "probability": w.probability,
                            })).collect::<Vec<_>>(),
                        })
                    })
                    .collect();
                let mut v = json!({
                    "text": self.text, "language": self.language, "duration": round3(self.duration), "segments": segs,
                });
                if !self.language_probs.is_empty() {
                    v["language_probs"] = self.language_probs.iter().take(5).map(|(l, p)| json!([l, p])).collect();
                }
                let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
                s.push('\n');
                s
            }
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
