//! sapient-llama
