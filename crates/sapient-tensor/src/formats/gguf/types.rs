//! ggml tensor types and GGUF metadata values.

use candle_core::quantized::GgmlDType;

/// Every tensor type ggml defines (ids as in `ggml.h`). Listing and size computations work
/// for all of them; loading works for those candle can hold ([`GgmlType::to_candle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
        }
    }

    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
        }
    }

    /// Parse a type name such as `q8_0`, `Q4_K`, `f16` (case-insensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        let up = s.to_ascii_uppercase();
        (0..40).filter_map(Self::from_id).find(|t| t.name() == up)
    }

    /// (elements per block, bytes per block), as in ggml's type traits.
    pub fn block_layout(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 | BF16 => (1, 2),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2_K => (256, 84),
            Q3_K => (256, 110),
            Q4_K => (256, 144),
            Q5_K => (256, 176),
            Q6_K => (256, 210),
            Q8_K => (256, 292),
            IQ2_XXS => (256, 66),
            IQ2_XS => (256, 74),
            IQ3_XXS => (256, 98),
            IQ1_S => (256, 50),
            IQ4_NL => (32, 18),
            IQ3_S => (256, 110),
            IQ2_S => (256, 82),
            IQ4_XS => (256, 136),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 | F64 => (1, 8),
            IQ1_M => (256, 56),
            TQ1_0 => (256, 54),
            TQ2_0 => (256, 66),
            MXFP4 => (32, 17),
        }
    }

    /// Bytes needed for `n_elements` of this type, or `None` when `n_elements` is not a whole
    /// number of blocks (or overflows).
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let (bs, ts) = self.block_layout();
        if !n_elements.is_multiple_of(bs as u64) {
            return None;
        }
        (n_elements / bs as u64).checked_mul(ts as u64)
    }

    /// The candle dtype that holds this type, if any.
    pub fn to_candle(self) -> Option<GgmlDType> {
        use GgmlType::*;
        Some(match self {
            F32 => GgmlDType::F32,
            F16 => GgmlDType::F16,
            BF16 => GgmlDType::BF16,
            Q4_0 => GgmlDType::Q4_0,
            Q4_1 => GgmlDType::Q4_1,
            Q5_0 => GgmlDType::Q5_0,
            Q5_1 => GgmlDType::Q5_1,
            Q8_0 => GgmlDType::Q8_0,
            Q8_1 => GgmlDType::Q8_1,
            Q2_K => GgmlDType::Q2K,
            Q3_K => GgmlDType::Q3K,
            Q4_K => GgmlDType::Q4K,
            Q5_K => GgmlDType::Q5K,
            Q6_K => GgmlDType::Q6K,
            Q8_K => GgmlDType::Q8K,
            _ => return None,
        })
    }

    pub fn from_candle(d: GgmlDType) -> Self {
        use GgmlType::*;
        match d {
            GgmlDType::F32 => F32,
            GgmlDType::F16 => F16,
            GgmlDType::BF16 => BF16,
            GgmlDType::Q4_0 => Q4_0,
            GgmlDType::Q4_1 => Q4_1,
            GgmlDType::Q5_0 => Q5_0,
            GgmlDType::Q5_1 => Q5_1,
            GgmlDType::Q8_0 => Q8_0,
            GgmlDType::Q8_1 => Q8_1,
            GgmlDType::Q2K => Q2_K,
            GgmlDType::Q3K => Q3_K,
            GgmlDType::Q4K => Q4_K,
            GgmlDType::Q5K => Q5_K,
            GgmlDType::Q6K => Q6_K,
            GgmlDType::Q8K => Q8_K,
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The type tag of a GGUF metadata value (ids as in the GGUF spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type (needed to write empty arrays back) and the values.
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer (or bool) value as i128, so callers need not care which width a writer chose.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            Value::Bool(v) => v as i128,
            _ => return None,
        })
    }

    /// Any float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }

    /// A short rendering for listings: arrays show their length and first elements.
    pub fn summary(&self) -> String {
        match self {
            Value::String(s) if s.len() > 80 => {
                let cut: String = s.chars().take(77).collect();
                format!("{cut:?}...")
            }
            Value::String(s) => format!("{s:?}"),
            Value::Array(t, v) => {
                let head: Vec<String> = v.iter().take(4).map(|x| x.summary()).collect();
                let more = if v.len() > 4 { ", ..." } else { "" };
                format!("[{}; {}] [{}{}]", t.name(), v.len(), head.join(", "), more)
            }
            Value::F32(x) => format!("{x}"),
            Value::F64(x) => format!("{x}"),
            Value::Bool(b) => format!("{b}"),
            other => match other.as_int() {
                Some(i) => format!("{i}"),
                None => format!("{other:?}"),
            },
        }
    }
}
