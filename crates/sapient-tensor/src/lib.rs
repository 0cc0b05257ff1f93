//! sapient-tensor
