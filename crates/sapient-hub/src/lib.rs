//! sapient-hub
