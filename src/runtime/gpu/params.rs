//! Typed parameter blocks of the GPU kernels. Every kernel reads its parameters from
//! binding 0 as one WGSL `struct` (`var<storage, read> p: Strided;`, then `p.rank`,
//! `p.base`); the `#[repr(C)]` struct of the same name and fields here is what the
//! executor uploads. The hand-written structs sit at the top of `shaders/<family>.wgsl`,
//! the fused kernel's in `FUSED_WGSL`; a test parses them with naga and checks that
//! sizes and field offsets agree, so the two sides cannot drift.
//!
//! Variable-length data (the per-dimension shape and strides of an N-d tensor, a fused
//! kernel's broadcast strides and folded constants) follows the fixed fields as a
//! runtime-sized `tail: array<u32>` in the same storage binding, as the earlier
//! positional word lists did: there is no maximum rank. Blocks with a tail say so
//! (`+ tail`) and document its layout.

use bytemuck::{Pod, Zeroable};

/// The words of one dispatch's parameter binding: a block, then its tail (if any).
pub(crate) struct Params(pub(crate) Vec<u32>);

impl Params {
    /// A block without a tail.
    pub(crate) fn of<B: Pod>(block: &B) -> Params {
        Params(bytemuck::cast_slice(std::slice::from_ref(block)).to_vec())
    }

    /// A block followed by its runtime-sized tail. An empty tail is bound as one zero
    /// word: the shader's minimum binding size counts one element of a runtime array.
    pub(crate) fn with_tail<B: Pod>(block: &B, tail: &[u32]) -> Params {
        let mut w = Params::of(block).0;
        w.extend_from_slice(tail);
        if tail.is_empty() {
            w.push(0);
        }
        Params(w)
    }
}

/// Declares the blocks, and (for the layout test) each one's shader families, size,
/// field offsets and whether a tail follows.
macro_rules! blocks {
    ($(
        $(#[$m:meta])*
        struct $name:ident in [$($fam:literal),+] $(+ $tail:ident)? {
            $( $(#[$fm:meta])* $f:ident : $t:ty ),* $(,)?
        }
    )*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
            pub(crate) struct $name {
                $( $(#[$fm])* pub $f: $t ),*
            }
        )*

        #[cfg(test)]
        const LAYOUTS: &[tests::Layout] = &[$(
            tests::Layout {
                name: stringify!($name),
                families: &[$($fam),+],
                size: std::mem::size_of::<$name>(),
                fields: &[$( (stringify!($f), std::mem::offset_of!($name, $f)) ),*],
                tail: blocks!(@tail $($tail)?),
            }
        ),*];
    };
    (@tail tail) => { true };
    (@tail) => { false };
}

blocks! {
    /// `movement.wgsl` `gather_strided` and `scatter_strided`: element `i` of the iterated
    /// shape lives at word `base + sum(coord[d] * stride[d])` of the strided side.
    /// Tail: `dims[rank]`, then `strides[rank]` (i32 bits).
    struct Strided in ["movement"] + tail {
        n: u32,
        rank: u32,
        base: i32,
    }

    /// `movement.wgsl` `fill`: `n` words of `word`.
    struct Fill in ["movement"] {
        n: u32,
        word: u32,
    }

    /// `movement.wgsl` `gather` and `scatter.wgsl` `scatter_add`: rows of an
    /// `(outer, axis_len, inner)` tensor picked by `n_idx` indices; an index out of range
    /// records `tag` in the status word.
    struct Indexed in ["movement", "scatter"] {
        n: u32,
        n_idx: u32,
        axis_len: u32,
        inner: u32,
        tag: u32,
    }

    /// `reduce.wgsl` `reduce_serial`, `reduce_tree` (op 0 sum, 1 prod, 2 max, 3 min,
    /// 4 mean) and `arg` (op 0 argmax, 1 argmin) over `(outer, red, inner)` blocks.
    struct Reduce in ["reduce"] {
        outer: u32,
        red: u32,
        inner: u32,
        op: u32,
        /// Steps `[r0, r1)` of the reduced axis this dispatch covers: a long axis is split
        /// over dispatches, each going on from the partial result of the one before.
        r0: u32,
        r1: u32,
    }

    /// `reduce.wgsl` `scan` (op 0 cumsum, 1 cumprod) over `(outer, red, inner)` blocks.
    struct Scan in ["reduce"] {
        outer: u32,
        red: u32,
        inner: u32,
        op: u32,
        exclusive: u32,
        reverse: u32,
        /// Steps `[k0, k0 + klen)` of the scan this dispatch covers, going on from the
        /// value its predecessor wrote before step `k0`.
        k0: u32,
        klen: u32,
    }

    /// `matmul.wgsl`: `c[b] = op(a[b]) @ op(b[b])` with `m x k` and `k x n` operands
    /// addressed through row and column strides. `vec4` bit 0: a loads as vec4, bit 1: b.
    /// Tail: `out_batch[batch_rank]`, `a_batch_stride[batch_rank]`,
    /// `b_batch_stride[batch_rank]` (0 on broadcast batch dims).
    struct Matmul in ["matmul"] + tail {
        m: u32,
        n: u32,
        k: u32,
        batch_rank: u32,
        a_rs: u32,
        a_cs: u32,
        b_rs: u32,
        b_cs: u32,
        vec4: u32,
        ta: u32,
        tb: u32,
        /// The grid's first tile and batch: a grid over the adapter's limit per dimension
        /// is split over several dispatches.
        col_tile0: u32,
        row_tile0: u32,
        batch0: u32,
        /// The slice `[k_lo, k_hi)` of the contracted dim this dispatch sums, added to
        /// `out` when `add` is set (a long `k` is split over dispatches).
        k_lo: u32,
        k_hi: u32,
        add: u32,
    }

    /// `random.wgsl`: `n` draws of call `(call_hi, call_lo)` under Philox key `(key0, key1)`;
    /// dist 0 uniform, 1 normal, 2 truncated normal.
    struct Random in ["random"] {
        n: u32,
        key0: u32,
        key1: u32,
        call_lo: u32,
        call_hi: u32,
        dist: u32,
    }

    /// The window geometry shared by `conv.wgsl` and `pool.wgsl`: `n` images of `x` pixels,
    /// kernel `k`, output `o`, stride `s`, dilation `d`, padding before `pad`, spatial dims
    /// canonicalised to three.
    struct Window in ["conv", "pool"] {
        n: u32,
        x: [u32; 3],
        k: [u32; 3],
        o: [u32; 3],
        s: [u32; 3],
        d: [u32; 3],
        pad: [u32; 3],
    }

    /// Every `conv.wgsl` kernel. `row_base` offsets the GEMM rows of one dispatch (tall
    /// GEMMs are split into dispatches of at most 65535 row tiles); `splits` and `chunk`
    /// split the kernel gradient's reduction; the stride phase (`first` .. `kcount`, see
    /// `kernels::conv::stride_phase`) is read by `conv_dx` only and zero elsewhere.
    struct Conv in ["conv"] {
        w: Window,
        cin: u32,
        cout: u32,
        groups: u32,
        cg: u32,
        og: u32,
        row_base: u32,
        splits: u32,
        chunk: u32,
        first: [u32; 3],
        count: [u32; 3],
        kstart: [u32; 3],
        kstep: [u32; 3],
        kcount: [u32; 3],
    }

    /// Every `pool.wgsl` kernel; mode 0 max, 1 average, 2 select (see the shader).
    struct Pool in ["pool"] {
        w: Window,
        channels: u32,
        mode: u32,
    }

    /// The generated fused elementwise kernels (`fusion.rs`, WGSL in `FUSED_WGSL`), and
    /// the generated epilogues of product and convolution kernels (`EPILOGUE_WGSL`).
    /// Tail: `out_shape[rank]`; `rank` strides and an offset per output written through
    /// strides (a concatenation's piece); `rank` strides and an offset per broadcast input
    /// or lazy slice, `rank` starts and `rank` lengths per lazy slice gradient, in input
    /// order; then one word per folded scalar constant.
    struct Fused in ["fused", "epilogue"] + tail {
        n: u32,
        rank: u32,
    }
}

/// The parameter block and binding of the generated fused kernels.
pub(crate) const FUSED_WGSL: &str = "struct Fused {\n    n: u32,\n    rank: u32,\n    \
     tail: array<u32>,\n}\n@group(0) @binding(0) var<storage, read> p: Fused;\n";

/// The binding of an epilogue's parameter block in the kernel it runs in (past the
/// hand-written kernels' bindings); its outputs and inputs follow.
pub(crate) const EPILOGUE_BINDING: u32 = 7;

/// The parameter block of a generated epilogue (`fusion::Epilogue`): a `Fused` block,
/// bound at `EPILOGUE_BINDING` of the product's or convolution's kernel as `ep`.
pub(crate) const EPILOGUE_WGSL: &str = "struct Fused {\n    n: u32,\n    rank: u32,\n    \
     tail: array<u32>,\n}\n@group(0) @binding(7) var<storage, read> ep: Fused;\n";

#[cfg(test)]
mod tests {
    use super::super::pipelines;
    use super::{EPILOGUE_WGSL, FUSED_WGSL, LAYOUTS};

    pub(super) struct Layout {
        pub name: &'static str,
        pub families: &'static [&'static str],
        pub size: usize,
        pub fields: &'static [(&'static str, usize)],
        pub tail: bool,
    }

    fn module(family: &str) -> naga::Module {
        let src = if family == "fused" {
            format!("{}{FUSED_WGSL}", pipelines::common(false))
        } else if family == "epilogue" {
            format!("{}{EPILOGUE_WGSL}", pipelines::common(false))
        } else {
            pipelines::family_source(family, "f32", false)
        };
        let m = naga::front::wgsl::parse_str(&src)
            .unwrap_or_else(|e| panic!("{family}: {}", e.emit_to_string(&src)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&m)
        .unwrap_or_else(|e| panic!("{family}: {e:?}"));
        m
    }

    #[test]
    fn rust_blocks_match_their_wgsl_structs() {
        for l in LAYOUTS {
            for fam in l.families {
                let m = module(fam);
                let mut layouter = naga::proc::Layouter::default();
                layouter.update(m.to_ctx()).expect("layout");
                let (h, ty) = m
                    .types
                    .iter()
                    .find(|(_, t)| t.name.as_deref() == Some(l.name))
                    .unwrap_or_else(|| panic!("{fam}.wgsl declares no struct {}", l.name));
                let naga::TypeInner::Struct { members, span } = &ty.inner else {
                    panic!("{} is not a struct in {fam}", l.name);
                };
                let wgsl: Vec<(&str, usize)> = members
                    .iter()
                    .map(|mb| (mb.name.as_deref().unwrap_or(""), mb.offset as usize))
                    .collect();
                let mut want: Vec<(&str, usize)> = l.fields.to_vec();
                if l.tail {
                    want.push(("tail", l.size));
                    let last = members.last().expect("a member");
                    assert!(
                        matches!(
                            m.types[last.ty].inner,
                            naga::TypeInner::Array {
                                size: naga::ArraySize::Dynamic,
                                ..
                            }
                        ),
                        "{}.tail in {fam} is not a runtime-sized array",
                        l.name
                    );
                } else {
                    assert_eq!(
                        *span as usize, l.size,
                        "{} in {fam}: WGSL size {span}, Rust size {}",
                        l.name, l.size
                    );
                    assert_eq!(layouter[h].size as usize, l.size);
                }
                assert_eq!(
                    wgsl, want,
                    "{} in {fam}: WGSL fields vs Rust fields",
                    l.name
                );
            }
        }
    }

    #[test]
    fn every_shader_binds_declared_blocks() {
        // Each hand-written family reads binding 0 only through structs listed here.
        for (fam, _) in pipelines::SHADERS {
            if matches!(*fam, "elementwise" | "window") {
                continue; // shared declarations, included in the modules that use them
            }
            let m = module(fam);
            for (_, v) in m.global_variables.iter() {
                let Some(b) = &v.binding else { continue };
                if b.binding != 0 {
                    continue;
                }
                let name = m.types[v.ty].name.clone().unwrap_or_default();
                assert!(
                    LAYOUTS
                        .iter()
                        .any(|l| l.name == name && l.families.contains(fam)),
                    "{fam}.wgsl binds {name:?} at binding 0, which has no Rust block"
                );
            }
        }
    }
}
