//! Static shapes: a dim is `Some(n)` when known at graph-construction time, `None` otherwise
//! (a placeholder's batch dim). Runtime shapes are plain `&[usize]`.

use crate::base::error::Result;
use crate::value_err;

pub type Dim = Option<usize>;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    pub fn known(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Some(d)).collect())
    }
    pub fn scalar() -> Shape {
        Shape(vec![])
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }
    /// The number of elements, when every dim is known.
    pub fn numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, d| d.map(|d| acc * d))
    }
    pub fn to_known(&self) -> Option<Vec<usize>> {
        self.0.iter().copied().collect()
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d {
                Some(n) => write!(f, "{n}")?,
                None => f.write_str("None")?,
            }
        }
        if self.0.len() == 1 {
            f.write_str(",")?;
        }
        f.write_str(")")
    }
}

/// Row-major (C order) strides, in elements, of an array of `dims`.
pub fn row_major_strides(dims: &[usize]) -> Vec<usize> {
    let mut st = vec![1; dims.len()];
    for i in (1..dims.len()).rev() {
        st[i - 1] = st[i] * dims[i];
    }
    st
}

/// Normalises a possibly negative axis against `rank`, naming `op` in the error.
pub fn norm_axis(op: &str, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(value_err!(
            "{op}: axis {axis} is out of range for a tensor of rank {rank} (expected {} <= axis < {rank})",
            -r
        ));
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

/// Normalises a list of axes; duplicates are an error.
pub fn norm_axes(op: &str, axes: &[i64], rank: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(op, a, rank)?;
        if out.contains(&n) {
            return Err(value_err!("{op}: axis {a} is repeated in {axes:?}"));
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// NumPy broadcasting of two static shapes.
pub fn broadcast_static(op: &str, a: &Shape, b: &Shape) -> Result<Shape> {
    let r = a.rank().max(b.rank());
    let mut out = vec![None; r];
    for i in 0..r {
        let da = if i + a.rank() >= r {
            a.0[i + a.rank() - r]
        } else {
            Some(1)
        };
        let db = if i + b.rank() >= r {
            b.0[i + b.rank() - r]
        } else {
            Some(1)
        };
        out[i] = match (da, db) {
            (Some(1), d) | (d, Some(1)) => d,
            (Some(x), Some(y)) if x == y => Some(x),
            (Some(_), Some(_)) => {
                return Err(value_err!(
                    "{op}: shapes {a} and {b} cannot be broadcast together"
                ))
            }
            (Some(x), None) | (None, Some(x)) => Some(x),
            (None, None) => None,
        };
    }
    Ok(Shape(out))
}

/// NumPy broadcasting of runtime shapes.
pub fn broadcast_runtime(op: &str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(value_err!(
                "{op}: shapes {a:?} and {b:?} cannot be broadcast together"
            ));
        };
    }
    Ok(out)
}
