//! sapient-sample
