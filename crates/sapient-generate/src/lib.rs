//! sapient-generate
