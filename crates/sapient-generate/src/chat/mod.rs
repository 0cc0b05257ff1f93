//! Chat-format rules: what a model's output means beyond its text. A reasoning model's
//! `<think>` block ([`think`]).

pub mod think;

pub use think::split_reasoning;
