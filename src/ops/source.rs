//! Sources: placeholders (fed per call), constants (immutable) and variables (mutable,
//! shared by every graph that reads them). The executor supplies their values.

use super::Op;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{fresh_id, Tensor};
use crate::runtime::value::Value;
use crate::shape::Shape;
use std::sync::{Arc, RwLock};

#[derive(Debug)]
pub struct PlaceholderInfo {
    pub name: String,
    pub shape: Shape,
    pub dtype: DType,
    /// Used when the placeholder is not fed (the learning phase defaults to 0).
    pub default: Option<Value>,
}

#[derive(Debug)]
pub struct VarCell {
    pub id: u64,
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub value: RwLock<Value>,
}

impl VarCell {
    pub fn get(&self) -> Value {
        self.value.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the value; the shape must match and the dtype is converted.
    pub fn set(&self, v: Value) -> Result<()> {
        if v.shape() != self.shape.as_slice() {
            return Err(Error::Value(format!(
                "set_value: variable '{}' has shape {:?}, the new value has shape {:?}",
                self.name,
                self.shape,
                v.shape()
            )));
        }
        *self.value.write().unwrap_or_else(|e| e.into_inner()) = v.cast(self.dtype).standard();
        Ok(())
    }
}

pub fn placeholder(name: &str, shape: Shape, dtype: DType, default: Option<Value>) -> Result<Tensor> {
    if let Some(d) = &default {
        if d.dtype() != dtype {
            return Err(Error::Type(format!("placeholder '{name}': default has dtype {}, expected {dtype}", d.dtype())));
        }
    }
    Tensor::new(Op::Placeholder(Arc::new(PlaceholderInfo { name: name.to_string(), shape, dtype, default })), vec![])
}

pub fn constant(v: Value) -> Tensor {
    let v = v.standard();
    Tensor::new(Op::Constant(Arc::new(v)), vec![]).expect("a constant always has a shape")
}

pub fn variable(name: &str, v: Value) -> (Arc<VarCell>, Tensor) {
    let v = v.standard();
    let cell = Arc::new(VarCell {
        id: fresh_id(),
        name: name.to_string(),
        dtype: v.dtype(),
        shape: v.shape().to_vec(),
        value: RwLock::new(v),
    });
    let t = Tensor::new(Op::Variable(cell.clone()), vec![]).expect("a variable always has a shape");
    (cell, t)
}

pub fn infer(op: &Op) -> Result<(Shape, DType)> {
    Ok(match op {
        Op::Placeholder(p) => (p.shape.clone(), p.dtype),
        Op::Constant(v) => (Shape::known(v.shape()), v.dtype()),
        Op::Variable(c) => (Shape::known(&c.shape), c.dtype),
        other => return Err(Error::Runtime(format!("{} is not a source", other.name()))),
    })
}

pub fn cpu(op: &Op) -> Result<Value> {
    match op {
        Op::Constant(v) => Ok((**v).clone()),
        Op::Variable(c) => Ok(c.get()),
        Op::Placeholder(p) => p.default.clone().ok_or_else(|| {
            Error::Unfed(format!("placeholder '{}' (shape {}, {}) must be fed a value", p.name, p.shape, p.dtype))
        }),
        other => Err(Error::Runtime(format!("{} is not a source", other.name()))),
    }
}
