//! The shader table and the pipeline cache. Naming contract: `shaders/<family>.wgsl`
//! holds entry points `{kernel}_$T`; instantiating a family for a device dtype `d`
//! (`f32`, `f16`, `i32`, `i16`, `i8`, `u8`, `bool`, or `u32` for raw words) prepends
//! the helper file, the dtype prelude (`T`, `t_norm`, ...) and the declarations it shares
//! with other families (`INCLUDES`), and names the entries `{kernel}_{d}`. Generated
//! fused kernels go through the same cache, keyed by source.

use super::context::Context;
use crate::base::dtype::DType;
use crate::base::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// Every WGSL source, loaded in one place.
pub const SHADERS: &[(&str, &str)] = &[
    (
        "elementwise",
        include_str!("../../../shaders/elementwise.wgsl"),
    ),
    ("movement", include_str!("../../../shaders/movement.wgsl")),
    ("reduce", include_str!("../../../shaders/reduce.wgsl")),
    ("scatter", include_str!("../../../shaders/scatter.wgsl")),
    ("matmul", include_str!("../../../shaders/matmul.wgsl")),
    ("random", include_str!("../../../shaders/random.wgsl")),
    ("conv", include_str!("../../../shaders/conv.wgsl")),
    ("pool", include_str!("../../../shaders/pool.wgsl")),
    ("window", include_str!("../../../shaders/window.wgsl")),
];

/// Declarations a family shares with others, prepended to its source in this order.
const INCLUDES: &[(&str, &[&str])] = &[("conv", &["window"]), ("pool", &["window"])];

fn shader(family: &str) -> &'static str {
    SHADERS
        .iter()
        .find(|(n, _)| *n == family)
        .map(|(_, s)| *s)
        .expect("family is in the shader table")
}

/// The kernel-name suffix of a dtype in the hand-written kernels; `None` for f64 (no WGSL
/// type) and for int64, which only the generated kernels compute, as pairs of words
/// (`fusion`), besides the indices arg-reductions write.
pub fn dtag(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::I32 => "i32",
        DType::I16 => "i16",
        DType::I8 => "i8",
        DType::U8 => "u8",
        DType::Bool => "bool",
        DType::F64 | DType::I64 => return None,
    })
}

/// Whether a dtype computes in f32 on the device (else i32).
pub fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::F64)
}

/// WGSL that rounds a value of the compute type to dtype `d` (identity for f32, i32, bool).
pub fn norm_fn(d: DType, has_f16: bool) -> &'static str {
    match d {
        DType::F16 if has_f16 => "fk_q16h",
        DType::F16 => "fk_q16",
        DType::I16 => "fk_wrap_i16",
        DType::I8 => "fk_wrap_i8",
        DType::U8 => "fk_wrap_u8",
        DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::Bool => "",
    }
}

/// `enable f16;` and the native f16 rounding helper, when the adapter has shader-f16.
pub fn f16_header(has_f16: bool) -> &'static str {
    if has_f16 {
        "enable f16;\n"
    } else {
        ""
    }
}
const F16_NATIVE: &str = "fn fk_q16h(x: f32) -> f32 {\n    if (fk_isnan(x)) { return x; }\n    if (abs(x) >= 65520.0) { return select(fk_inf(), -fk_inf(), x < 0.0); }\n    return f32(f16(x));\n}\n";

/// Helpers every module starts with.
pub fn common(has_f16: bool) -> String {
    let mut s = String::from(f16_header(has_f16));
    s.push_str(shader("elementwise"));
    if has_f16 {
        s.push_str(F16_NATIVE);
    }
    s
}

fn prelude(tag: &str, has_f16: bool) -> String {
    let (ty, lowest, highest, isnan) = match tag {
        "f32" | "f16" => ("f32", "-fk_inf()", "fk_inf()", "fk_isnan(x)"),
        "u32" => ("u32", "0u", "0xffffffffu", "false"),
        _ => ("i32", "-2147483647 - 1", "2147483647", "false"),
    };
    // The extreme finite values of the stored dtype (argmax and argmin start from them).
    let max_finite = match tag {
        "f32" => "3.40282347e+38",
        "f16" => "65504.0",
        _ => highest,
    };
    let min_finite = match tag {
        "f32" | "f16" => format!("-{max_finite}"),
        _ => lowest.to_string(),
    };
    let norm = match tag {
        "f16" if has_f16 => "fk_q16h(x)",
        "f16" => "fk_q16(x)",
        "i16" => "fk_wrap_i16(x)",
        "i8" => "fk_wrap_i8(x)",
        "u8" => "fk_wrap_u8(x)",
        _ => "x",
    };
    format!(
        "alias T = {ty};\nfn t_norm(x: T) -> T {{ return {norm}; }}\nfn t_lowest() -> T {{ return {lowest}; }}\n\
         fn t_highest() -> T {{ return {highest}; }}\nfn t_isnan(x: T) -> bool {{ return {isnan}; }}\n\
         fn t_min_finite() -> T {{ return {min_finite}; }}\nfn t_max_finite() -> T {{ return {max_finite}; }}\n"
    )
}

pub struct Pipe {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// The entry point (`FERROKERAS_LOOP_DEBUG` lists a loop step's dispatches by it).
    pub entry: String,
}

#[derive(Default)]
pub struct PipelineCache {
    by_key: HashMap<String, Arc<Pipe>>,
    pub compiled: usize,
}

/// The pipeline of entry `{kernel}_{tag}` of a hand-written family.
pub fn family(ctx: &Arc<Context>, fam: &str, kernel: &str, tag: &str) -> Result<Arc<Pipe>> {
    let entry = format!("{kernel}_{tag}");
    let key = format!("{fam}/{entry}");
    if let Some(p) = ctx
        .pipelines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .by_key
        .get(&key)
    {
        return Ok(p.clone());
    }
    build(ctx, key, &family_source(fam, tag, ctx.has_f16), &entry)
}

/// The WGSL module of family `fam` instantiated for dtype tag `tag`.
pub fn family_source(fam: &str, tag: &str, has_f16: bool) -> String {
    let mut s = common(has_f16);
    s.push_str(&prelude(tag, has_f16));
    for &(_, shared) in INCLUDES.iter().filter(|(f, _)| *f == fam) {
        for inc in shared {
            s.push_str(shader(inc));
        }
    }
    s.push_str(&shader(fam).replace("$T", tag));
    s
}

/// The pipeline of a generated kernel (cached by its source).
pub fn generated(ctx: &Arc<Context>, src: &str, entry: &str) -> Result<Arc<Pipe>> {
    if let Some(p) = ctx
        .pipelines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .by_key
        .get(src)
    {
        return Ok(p.clone());
    }
    build(ctx, src.to_string(), src, entry)
}

/// Compiles WGSL into a compute pipeline; a compile or validation failure is an
/// `Error::Device` naming the entry point.
pub fn build(ctx: &Arc<Context>, key: String, src: &str, entry: &str) -> Result<Arc<Pipe>> {
    let _phase = crate::base::progress::enter(crate::base::progress::Phase::GpuKernels);
    ctx.check("compiling a shader")?;
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = ctx
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(entry),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
    let pipeline = ctx
        .device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(Error::Device(format!(
            "GPU shader compile failed for kernel '{entry}': {e}"
        )));
    }
    let layout = pipeline.get_bind_group_layout(0);
    let pipe = Arc::new(Pipe {
        pipeline,
        layout,
        entry: entry.to_string(),
    });
    let mut c = ctx.pipelines.lock().unwrap_or_else(|e| e.into_inner());
    c.compiled += 1;
    c.by_key.insert(key, pipe.clone());
    Ok(pipe)
}
