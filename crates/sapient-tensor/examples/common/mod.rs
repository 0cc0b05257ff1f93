//! Shared by the kernel examples (gemv, gemm_stream).
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use sapient_tensor::kernels::QMatrix;
use std::sync::Arc;

/// A random `[rows, cols]` matrix quantized to `dt`, copied into distinct buffers until
/// the copies hold more than `total` bytes (enough of them to exceed the caches); also the
/// candle tensor they came from.
pub fn quantized_copies(dt: GgmlDType, rows: usize, cols: usize, total: usize) -> anyhow::Result<(Arc<QTensor>, Vec<QMatrix>)> {
    let t = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu)?;
    let q = Arc::new(QTensor::quantize(&t, dt)?);
    let m = QMatrix::from_qtensor(&q).ok_or_else(|| anyhow::anyhow!("{dt:?} has no kernel"))?;
    let bytes = m.rows() * m.row_bytes();
    let mats = (0..total / bytes + 1)
        .map(|_| {
            let mut b = vec![0u8; bytes];
            m.with_bytes(|s| b.copy_from_slice(s));
            Ok(QMatrix::from_bytes(m.qtype(), rows, cols, b)?)
        })
        .collect::<anyhow::Result<_>>()?;
    Ok((q, mats))
}
