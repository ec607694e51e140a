//! Element types. Kernels compute in three classes: f32 (f16 is widened to it), f64, and i64
//! (every integer type and bool is widened to it); storage keeps the declared type.

use crate::base::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 9] = [
        DType::F16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    pub fn parse(s: &str) -> Result<DType> {
        Ok(match s {
            "float16" | "half" => DType::F16,
            "float32" | "float" => DType::F32,
            "float64" | "double" => DType::F64,
            "int8" => DType::I8,
            "int16" => DType::I16,
            "int32" => DType::I32,
            "int64" => DType::I64,
            "uint8" => DType::U8,
            "bool" => DType::Bool,
            _ => {
                return Err(Error::Type(format!(
                    "unknown dtype '{s}': expected one of float16, float32, float64, int8, int16, int32, int64, uint8, bool"
                )))
            }
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::F32 | DType::F64)
    }

    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8
        )
    }

    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::I16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
