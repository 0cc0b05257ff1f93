//! sapient-tokenizers
