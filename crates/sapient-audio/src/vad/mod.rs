//! Silero VAD v6 and speech segmentation.

mod segment;
mod silero;

pub use segment::{SegmenterState, SpeechSegment, VadOptions, VadSegmenter};
pub use silero::{SileroVad, WeightFormat, CONTEXT, VAD_SAMPLE_RATE, WINDOW};
