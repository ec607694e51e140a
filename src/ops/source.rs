//! Sources: placeholders (fed per call), constants (immutable) and variables (mutable,
//! shared by every graph that reads them). The executor supplies their values.

use super::Op;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::base::value::Value;
use crate::ops::graph::{fresh_id, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// A copy of a variable's value in a device's memory, kept between calls: made and read by
/// the runtime of that device (the GPU runtime's `Resident`, which it gets back through
/// `as_any`); a variable only stores it, tells devices apart and reads the value back.
pub trait DeviceCopy: Send + Sync {
    /// The device that holds the copy (its runtime's id for it).
    fn device_id(&self) -> u64;
    /// Copies the value back to the host.
    fn download(&self) -> Result<Value>;
    fn as_any(&self) -> &dyn std::any::Any;
}

#[derive(Debug)]
pub struct PlaceholderInfo {
    pub name: String,
    pub shape: Shape,
    pub dtype: DType,
    /// Used when the placeholder is not fed (the learning phase defaults to 0).
    pub default: Option<Value>,
}

/// A variable's value. Ownership rule: at least one of `host` and `device` is present, and
/// both, when present, hold the same value. A host write (`set`) replaces the host copy
/// and drops the device copy; a GPU update (`set_resident`) replaces the device copy and
/// drops the host copy, which `get` downloads again lazily. `version` counts writes, so a
/// copy made from an older value is never attached.
///
/// One exception: while a run that assigns the variable updates its buffer in place
/// (`take_for_update`), `updating` is set and neither copy is present; readers wait until the run
/// assigns the new value.
pub struct VarState {
    pub host: Option<Value>,
    pub device: Option<Arc<dyn DeviceCopy>>,
    pub version: u64,
    pub updating: bool,
}

/// Variables held by in-place updates now, process-wide (`VarCell::take_for_update`).
static UPDATING: AtomicUsize = AtomicUsize::new(0);

/// Ends an in-place update, if the state is in one.
fn settle(st: &mut VarState) {
    if std::mem::replace(&mut st.updating, false) {
        UPDATING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits until no variable is held by an in-place update (a run that stopped on one,
/// `Error::UpdatingInPlace`, goes again then).
pub fn wait_for_in_place_updates() {
    let mut polls = 0;
    while UPDATING.load(Ordering::Acquire) > 0 {
        pause(&mut polls);
    }
}

/// One wait of a poll for the end of an in-place update, which comes a few kernels later: yields
/// at first, then sleeps 50 us at a time.
fn pause(polls: &mut u32) {
    *polls += 1;
    if *polls < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

pub struct VarCell {
    pub id: u64,
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub state: RwLock<VarState>,
}

impl std::fmt::Debug for VarCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VarCell({} {:?} {})", self.name, self.shape, self.dtype)
    }
}

impl VarCell {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, VarState> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, VarState> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The state once no run holds the value for an in-place update (`take_for_update`). With
    /// `stop_on_worker`, a held value on a rayon worker is `Error::UpdatingInPlace` instead of a wait
    /// (see `get`).
    fn read_settled(
        &self,
        stop_on_worker: bool,
    ) -> Result<std::sync::RwLockReadGuard<'_, VarState>> {
        let mut polls = 0;
        loop {
            let st = self.read();
            if !st.updating {
                return Ok(st);
            }
            if stop_on_worker && rayon::current_thread_index().is_some() {
                return Err(Error::UpdatingInPlace(self.name.clone()));
            }
            drop(st);
            pause(&mut polls);
        }
    }

    /// Hands the host value to a run that holds the same array in `slot` and will assign
    /// the variable a new value: if no one else holds the array, the cell lets go of it
    /// and returns it, owned, for the run to overwrite; readers then wait until the
    /// assignment (`set`). Otherwise nothing changes and `None` is returned.
    pub fn take_for_update(
        &self,
        slot: &mut Option<Value>,
    ) -> Option<ndarray::Array<f32, ndarray::IxDyn>> {
        let mut st = self.write();
        let same = matches!((&st.host, &*slot), (Some(Value::F32(h)), Some(Value::F32(a))) if h.as_ptr() == a.as_ptr() && a.is_standard_layout());
        if !same || st.updating {
            return None;
        }
        st.host = None;
        let Some(Value::F32(a)) = slot.take() else {
            unreachable!("checked above")
        };
        match a.try_into_owned_nocopy() {
            Ok(own) => {
                st.updating = true;
                UPDATING.fetch_add(1, Ordering::AcqRel);
                Some(own)
            }
            Err(a) => {
                st.host = Some(Value::F32(a.clone()));
                *slot = Some(Value::F32(a));
                None
            }
        }
    }

    /// Whether a run holds the value for an in-place update.
    pub fn is_updating(&self) -> bool {
        self.read().updating
    }

    /// Ends an in-place update that no assignment ended (a run that failed or panicked
    /// during the update, which the executor rules out): the value is gone, so the variable becomes
    /// NaN; returns whether that happened.
    pub fn abandon_update(&self) -> bool {
        let mut st = self.write();
        if !st.updating {
            return false;
        }
        settle(&mut st);
        st.host = Some(Value::full(self.dtype, &self.shape, f64::NAN));
        st.device = None;
        st.version += 1;
        true
    }

    /// The value on the host, downloading it from the device if only the device has it.
    ///
    /// While the value is held by an in-place update (`take_for_update`) this waits for the
    /// assignment, except on a rayon worker: there it returns `Error::UpdatingInPlace`, since the
    /// updating run may be waiting for this very thread (a worker waiting in the pool runs
    /// other jobs, so this read may sit on top of the updating run's stack).
    pub fn get(&self) -> Result<Value> {
        let (dev, version) = {
            let st = self.read_settled(true)?;
            if let Some(h) = &st.host {
                return Ok(h.clone());
            }
            (
                st.device
                    .clone()
                    .expect("a variable has a host or a device copy"),
                st.version,
            )
        };
        let v = dev.download()?;
        let mut st = self.write();
        if st.version == version {
            st.host = Some(v.clone());
        }
        Ok(v)
    }

    /// The host value if there is one, else the device copy (for executors).
    pub fn snapshot(&self) -> (Option<Value>, Option<Arc<dyn DeviceCopy>>, u64) {
        let st = self.read_settled(false).expect("waits, never stops");
        (st.host.clone(), st.device.clone(), st.version)
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
        // A value read in place from the caller's NumPy array must not outlive the call.
        let v = match crate::base::value::foreign::aliases(&v) {
            true => crate::map_value!(v, a => a.to_owned().into_shared()),
            false => v,
        };
        let v = v.cast(self.dtype).standard();
        let mut st = self.write();
        st.host = Some(v);
        st.device = None;
        st.version += 1;
        settle(&mut st);
        Ok(())
    }

    /// Replaces the value with one that lives on a device (a GPU update).
    pub fn set_resident(&self, r: Arc<dyn DeviceCopy>) {
        let mut st = self.write();
        st.host = None;
        st.device = Some(r);
        st.version += 1;
        settle(&mut st);
    }

    /// Records a device copy of the current value, unless the value changed since
    /// `version` was read.
    pub fn attach_resident(&self, r: Arc<dyn DeviceCopy>, version: u64) {
        let mut st = self.write();
        if st.version == version {
            st.device = Some(r);
        }
    }
}

// ---- placeholder, constant, variable ----

pub fn placeholder(
    name: &str,
    shape: Shape,
    dtype: DType,
    default: Option<Value>,
) -> Result<Tensor> {
    if let Some(d) = &default {
        if d.dtype() != dtype {
            return Err(Error::Type(format!(
                "placeholder '{name}': default has dtype {}, expected {dtype}",
                d.dtype()
            )));
        }
    }
    Tensor::new(
        Op::Placeholder(Arc::new(PlaceholderInfo {
            name: name.to_string(),
            shape,
            dtype,
            default,
        })),
        vec![],
    )
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
        state: RwLock::new(VarState {
            host: Some(v),
            device: None,
            version: 0,
            updating: false,
        }),
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
        Op::Variable(c) => c.get(),
        Op::Placeholder(p) => p.default.clone().ok_or_else(|| {
            Error::Unfed(format!(
                "placeholder '{}' (shape {}, {}) must be fed a value",
                p.name, p.shape, p.dtype
            ))
        }),
        other => Err(Error::Runtime(format!("{} is not a source", other.name()))),
    }
}
