//! Device selection and the dtype policy per device.

use crate::{Error, Result};
use candle_core::{DType, Device};
use std::str::FromStr;

/// What the user asked for: `cpu`, `cuda`, `cuda:N`, `metal`, `metal:N` or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    #[default]
    Cpu,
    Cuda(usize),
    Metal(usize),
    /// The first accelerator compiled in and present, else the CPU.
    Auto,
}

impl FromStr for DeviceRequest {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        let (kind, ordinal) = match s.split_once(':') {
            Some((k, n)) => {
                let n = n
                    .parse::<usize>()
                    .map_err(|_| Error::Device(s.clone(), format!("'{n}' is not a device number")))?;
                (k.to_string(), n)
            }
            None => (s.clone(), 0),
        };
        match kind.as_str() {
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(ordinal)),
            "metal" | "mps" => Ok(Self::Metal(ordinal)),
            "auto" => Ok(Self::Auto),
            _ => Err(Error::Device(
                s.clone(),
                "expected one of cpu, cuda, cuda:N, metal, metal:N, auto".into(),
            )),
        }
    }
}

impl DeviceRequest {
    /// Open the device. A request for a backend that this build does not include is an error
    /// that says which cargo feature enables it.
    pub fn open(self) -> Result<Device> {
        match self {
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda(n) => {
                if !cfg!(feature = "cuda") {
                    return Err(Error::Device(
                        format!("cuda:{n}"),
                        "this build has no CUDA support (rebuild with the `cuda` feature)".into(),
                    ));
                }
                Device::new_cuda(n).map_err(|e| Error::Device(format!("cuda:{n}"), e.to_string()))
            }
            Self::Metal(n) => {
                if !cfg!(feature = "metal") {
                    return Err(Error::Device(
                        format!("metal:{n}"),
                        "this build has no Metal support (rebuild with the `metal` feature)".into(),
                    ));
                }
                Device::new_metal(n)
                    .map_err(|e| Error::Device(format!("metal:{n}"), e.to_string()))
            }
            Self::Auto => {
                if cfg!(feature = "cuda") {
                    if let Ok(d) = Device::new_cuda(0) {
                        return Ok(d);
                    }
                }
                if cfg!(feature = "metal") {
                    if let Ok(d) = Device::new_metal(0) {
                        return Ok(d);
                    }
                }
                Ok(Device::Cpu)
            }
        }
    }
}

/// The dtype activations and dense weights use on a device: f32 on the CPU (candle's CPU
/// kernels are fastest and exact in f32), bf16 on CUDA, f16 on Metal.
pub fn activation_dtype(device: &Device) -> DType {
    match device {
        Device::Cpu => DType::F32,
        Device::Cuda(_) => DType::BF16,
        Device::Metal(_) => DType::F16,
    }
}

/// A short human name for a device, for logs and stats.
pub fn device_name(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => "cuda".into(),
        Device::Metal(_) => "metal".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests() {
        assert_eq!("cpu".parse::<DeviceRequest>().unwrap(), DeviceRequest::Cpu);
        assert_eq!("CUDA:1".parse::<DeviceRequest>().unwrap(), DeviceRequest::Cuda(1));
        assert_eq!("metal".parse::<DeviceRequest>().unwrap(), DeviceRequest::Metal(0));
        assert!("tpu".parse::<DeviceRequest>().is_err());
        assert!("cuda:x".parse::<DeviceRequest>().is_err());
    }

    #[test]
    fn missing_backend_is_a_clear_error() {
        if !cfg!(feature = "cuda") {
            let e = DeviceRequest::Cuda(0).open().unwrap_err().to_string();
            assert!(e.contains("`cuda` feature"), "{e}");
        }
        assert!(matches!(DeviceRequest::Auto.open().unwrap(), Device::Cpu) || cfg!(any(feature = "cuda", feature = "metal")));
    }
}
