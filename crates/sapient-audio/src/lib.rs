//! sapient-audio
