//! One error type for the whole core; the Python layer maps each kind to one exception class.

use thiserror::Error;

#[derive(Debug, Error, Clone)]
pub enum Error {
    /// Arguments whose values are wrong: shapes, axes, sizes. Maps to `ValueError`.
    #[error("{0}")]
    Value(String),
    /// Arguments of the wrong kind or dtype. Maps to `TypeError`.
    #[error("{0}")]
    Type(String),
    /// A placeholder a computation needs was not fed. Maps to `ValueError`.
    #[error("{0}")]
    Unfed(String),
    /// A feature this build or device does not have. Maps to `NotImplementedError`-free `RuntimeError`.
    #[error("{0}")]
    Unsupported(String),
    /// A failure while running a plan (arithmetic fault, internal error). Maps to `RuntimeError`.
    #[error("{0}")]
    Runtime(String),
    /// A device fault: no such adapter, out of GPU memory, device lost, a shader that does
    /// not compile, a buffer over the adapter's limits. Maps to `ferrokeras.DeviceError`
    /// (a `RuntimeError`).
    #[error("{0}")]
    Device(String),
    /// An error raised by a host callback (`py_function`), carried unchanged so the binding
    /// layer can re-raise the original exception.
    #[error("{1}")]
    Callback(std::sync::Arc<dyn std::any::Any + Send + Sync>, String),
    /// A run on a rayon worker read a variable held by another call's in-place update
    /// (`VarCell::take_for_update`) and stopped instead of waiting; `Function::call` runs it again once
    /// the variable is assigned, so this never reaches Python.
    #[error("variable '{0}' is being updated in place")]
    UpdatingInPlace(String),
}

pub type Result<T> = std::result::Result<T, Error>;

#[macro_export]
macro_rules! value_err {
    ($($t:tt)*) => { $crate::base::error::Error::Value(format!($($t)*)) };
}

#[macro_export]
macro_rules! type_err {
    ($($t:tt)*) => { $crate::base::error::Error::Type(format!($($t)*)) };
}
