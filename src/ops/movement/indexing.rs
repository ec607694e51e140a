//! Indexed reads and their adjoint: `gather`, `scatter_add`.

use super::*;

// ---- gather, scatter_add ----

pub fn gather(p: &Tensor, i: &Tensor, axis: usize) -> Result<Tensor> {
    Tensor::new(Op::Gather(axis), vec![p.clone(), i.clone()])
}

pub fn scatter_add(u: &Tensor, i: &Tensor, like: &Tensor, axis: usize) -> Result<Tensor> {
    Tensor::new(
        Op::ScatterAdd(axis),
        vec![u.clone(), i.clone(), like.clone()],
    )
}

fn check_indices(op: &str, i: &Tensor) -> Result<()> {
    if !i.dtype().is_int() {
        return Err(Error::Type(format!(
            "{op}: indices must be integers, got {}",
            i.dtype()
        )));
    }
    Ok(())
}

pub fn infer_gather(axis: usize, p: &Tensor, i: &Tensor) -> Result<(Shape, DType)> {
    check_indices("gather", i)?;
    if axis >= p.rank() {
        return Err(value_err!(
            "gather: axis {axis} is out of range for rank {}",
            p.rank()
        ));
    }
    let d = p.shape().dims();
    let mut dims = d[..axis].to_vec();
    dims.extend_from_slice(i.shape().dims());
    dims.extend_from_slice(&d[axis + 1..]);
    Ok((Shape(dims), p.dtype()))
}

pub fn infer_scatter_add(axis: usize, ins: &[Tensor]) -> Result<(Shape, DType)> {
    check_indices("scatter_add", &ins[1])?;
    if axis >= ins[2].rank() {
        return Err(value_err!(
            "scatter_add: axis {axis} is out of range for rank {}",
            ins[2].rank()
        ));
    }
    Ok((ins[2].shape().clone(), ins[0].dtype()))
}

pub fn vjp_gather(axis: usize, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![
        Some(scatter_add(g, node.input(1), node.input(0), axis)?),
        None,
    ])
}

pub fn vjp_scatter_add(axis: usize, node: &Tensor, g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    Ok(vec![Some(gather(g, node.input(1), axis)?), None, None])
}

pub fn cpu_gather(axis: usize, p: &Value, i: &Value) -> Result<Value> {
    let ps = p.shape();
    let (outer, n, inner) = (
        ps[..axis].iter().product::<usize>(),
        ps[axis],
        ps[axis + 1..].iter().product::<usize>(),
    );
    let idx = indices("gather", i, n)?;
    let mut shape = ps[..axis].to_vec();
    shape.extend_from_slice(i.shape());
    shape.extend_from_slice(&ps[axis + 1..]);
    fn go<T: Elem>(
        a: &Arr<T>,
        idx: &[usize],
        outer: usize,
        n: usize,
        inner: usize,
        shape: &[usize],
    ) -> Result<Value> {
        let src = a.as_slice().expect("standard");
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            for &k in idx {
                let base = (o * n + k) * inner;
                out.extend_from_slice(&src[base..base + inner]);
            }
        }
        Value::from_vec(shape, out)
    }
    with_value!(p, a => go(a, &idx, outer, n, inner, &shape))
}

pub fn cpu_scatter_add(axis: usize, u: &Value, i: &Value, like: &Value) -> Result<Value> {
    let ls = like.shape();
    let (outer, n, inner) = (
        ls[..axis].iter().product::<usize>(),
        ls[axis],
        ls[axis + 1..].iter().product::<usize>(),
    );
    let idx = indices("scatter_add", i, n)?;
    if u.len() != outer * idx.len() * inner {
        return Err(value_err!(
            "scatter_add: updates of shape {:?} do not match indices {:?} into {ls:?}",
            u.shape(),
            i.shape()
        ));
    }
    let f = u.cast(if u.dtype() == DType::F64 {
        DType::F64
    } else if u.dtype().is_float() {
        DType::F32
    } else {
        DType::I64
    });
    fn go<T: Elem + std::ops::AddAssign>(
        a: &Arr<T>,
        idx: &[usize],
        outer: usize,
        n: usize,
        inner: usize,
        shape: &[usize],
    ) -> Result<Value> {
        let src = a.as_slice().expect("standard");
        let mut out = vec![T::default(); outer * n * inner];
        let mut s = 0;
        for o in 0..outer {
            for &k in idx {
                let base = (o * n + k) * inner;
                for (d, &v) in out[base..base + inner].iter_mut().zip(&src[s..s + inner]) {
                    *d += v;
                }
                s += inner;
            }
        }
        Value::from_vec(shape, out)
    }
    let r = match &f {
        Value::F32(a) => go(a, &idx, outer, n, inner, ls)?,
        Value::F64(a) => go(a, &idx, outer, n, inner, ls)?,
        Value::I64(a) => go(a, &idx, outer, n, inner, ls)?,
        _ => unreachable!("widened above"),
    };
    Ok(r.cast(u.dtype()))
}

pub fn indices(op: &str, i: &Value, n: usize) -> Result<Vec<usize>> {
    i.to_i64_vec()
        .into_iter()
        .map(|k| {
            if k < 0 || k as usize >= n {
                Err(value_err!(
                    "{op}: index {k} is out of range for an axis of size {n}"
                ))
            } else {
                Ok(k as usize)
            }
        })
        .collect()
}
