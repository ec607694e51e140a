//! The lazy graph: immutable, reference-counted nodes. A `Tensor` is a handle to a node;
//! building one runs the op's shape/dtype rule, so every node has a static shape and dtype.

use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use crate::base::shape::Shape;
use crate::ops::{Class, Op};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub fn fresh_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug)]
pub struct Node {
    pub id: u64,
    pub op: Op,
    pub inputs: Vec<Tensor>,
    pub shape: Shape,
    pub dtype: DType,
}

#[derive(Clone, Debug)]
pub struct Tensor(pub Arc<Node>);

impl Tensor {
    /// Builds a node after checking `inputs` against the op's shape and dtype rule.
    pub fn new(op: Op, inputs: Vec<Tensor>) -> Result<Tensor> {
        let (shape, dtype) = op.infer(&inputs)?;
        check_size(&op, &shape, dtype)?;
        Ok(Tensor(Arc::new(Node {
            id: fresh_id(),
            op,
            inputs,
            shape,
            dtype,
        })))
    }

    pub fn id(&self) -> u64 {
        self.0.id
    }
    pub fn op(&self) -> &Op {
        &self.0.op
    }
    pub fn inputs(&self) -> &[Tensor] {
        &self.0.inputs
    }
    pub fn input(&self, i: usize) -> &Tensor {
        &self.0.inputs[i]
    }
    pub fn shape(&self) -> &Shape {
        &self.0.shape
    }
    pub fn rank(&self) -> usize {
        self.0.shape.rank()
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    pub fn same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.same(other)
    }
}
impl Eq for Tensor {}
impl std::hash::Hash for Tensor {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.id.hash(state)
    }
}

/// Every node `roots` depend on, each once, inputs before users. Iterative, so deep graphs
/// (long unrolled RNNs) cannot overflow the stack. Nodes in `stop` are treated as leaves.
pub fn topo_order(roots: &[Tensor], stop: &dyn Fn(&Tensor) -> bool) -> Vec<Tensor> {
    let mut seen = std::collections::HashSet::new();
    let mut order = Vec::new();
    let mut stack: Vec<(Tensor, bool)> = roots.iter().rev().map(|t| (t.clone(), false)).collect();
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if !stop(&t) {
            for i in t.inputs().iter().rev() {
                if !seen.contains(&i.id()) {
                    stack.push((i.clone(), false));
                }
            }
        }
    }
    order
}

/// Refuses a node whose result, of a static shape, could not fit in this machine's memory.
/// Its kernel would fail to allocate it, and Rust aborts the process on a failed
/// allocation. Sources (placeholders, constants, variables) allocate nothing here.
fn check_size(op: &Op, shape: &Shape, dtype: DType) -> Result<()> {
    if op.class() == Class::Source {
        return Ok(());
    }
    let Some(dims) = shape.to_known() else {
        return Ok(());
    };
    let bytes = dims
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64));
    let limit = memory_bytes();
    match bytes {
        Some(b) if b <= limit => Ok(()),
        _ => Err(Error::Value(format!(
            "{}: a result of shape {shape} and dtype {dtype} needs {} bytes, more than this machine's memory ({limit} bytes)",
            op.name(),
            bytes.map_or_else(|| "over 2^64".to_string(), |b| b.to_string()),
        ))),
    }
}

/// Physical memory in bytes (capped at isize::MAX, the largest allocation Rust allows).
fn memory_bytes() -> u64 {
    static MEM: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MEM.get_or_init(|| {
        let cap = isize::MAX as u64;
        #[cfg(unix)]
        {
            // SAFETY: sysconf only reads system configuration values.
            let (pages, size) = unsafe {
                (
                    libc::sysconf(libc::_SC_PHYS_PAGES),
                    libc::sysconf(libc::_SC_PAGESIZE),
                )
            };
            if pages > 0 && size > 0 {
                return (pages as u64).saturating_mul(size as u64).min(cap);
            }
        }
        cap
    })
}
