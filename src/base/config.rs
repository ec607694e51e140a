//! Every `FERROKERAS_*` environment variable the core reads, read once per process (on the
//! first `get`) into one typed `Config`. `docs/env_vars.md` lists them, each with its type,
//! default and effect.
//!
//! A value that does not parse is an error naming the variable (`Error::Value`, so Python
//! sees a `ValueError`), raised by every `get` of the process rather than falling back to
//! the default. `runtime::device::current`, which every call that runs anything goes
//! through, and loop building call `get` first; readers with no way to report an error
//! (`settings`) run after one of those, so a bad value never reaches them unreported.

use super::error::{Error, Result};
use std::sync::OnceLock;

/// The environment, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `FERROKERAS_DEVICE`: the device name (`auto`, `cpu`, `gpu`, `gpu:N`), as given;
    /// `runtime::device` parses it. Empty when unset (`auto`).
    pub device: String,
    /// `FERROKERAS_REQUIRE_GPU`: a `gpu` device with no adapter is an error instead of
    /// falling back to the CPU.
    pub require_gpu: bool,
    /// `FERROKERAS_GPU_MAX_BINDING`: a lower limit, in bytes, on the buffer a GPU kernel
    /// may bind than the adapter's own.
    pub gpu_max_binding: Option<u64>,
    /// `FERROKERAS_GPU_POOL_MAX_IDLE_MB`, in bytes: idle pooled GPU memory above this is
    /// released.
    pub gpu_pool_max_idle_bytes: u64,
    /// `FERROKERAS_GPU_POOL_MAX_IDLE_SUBMITS`: a pooled GPU buffer not reused within this
    /// many submits is released.
    pub gpu_pool_max_idle_submits: u64,
    /// `FERROKERAS_CPU_FUSION`: CPU plans fuse elementwise chains into one kernel each.
    pub cpu_fusion: bool,
    /// `FERROKERAS_CPU_INPLACE`: CPU training steps write new variable values into the
    /// variables' own buffers.
    pub cpu_inplace: bool,
    /// `FERROKERAS_LOOP_OPT`: a loop's forward pass saves the values its gradient reads, so
    /// the backward loop does not run the cell again.
    pub loop_save_residuals: bool,
    /// `FERROKERAS_LOOP_DEBUG`: loops report on stderr how they are built and run.
    pub loop_debug: bool,
    /// `FERROKERAS_GPU_LOOPS`: a GPU plan records a loop whose body runs on the device
    /// step by step into its submit; off, every loop runs on the CPU inside the plan.
    pub gpu_loops: bool,
    /// `FERROKERAS_COPY_TRANSPOSED`: whether a product with a long contraction copies a
    /// transposed operand before `gemm` packs it (`ops::matmul`); `None` (unset, or
    /// `auto`): as suits the CPU.
    pub copy_transposed: Option<bool>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            device: String::new(),
            require_gpu: false,
            gpu_max_binding: None,
            gpu_pool_max_idle_bytes: 256 << 20,
            gpu_pool_max_idle_submits: 1000,
            cpu_fusion: true,
            cpu_inplace: true,
            loop_save_residuals: true,
            loop_debug: false,
            gpu_loops: true,
            copy_transposed: None,
        }
    }
}

impl Config {
    /// Parses the variables `var` returns (None: unset); the process uses `std::env::var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let d = Config::default();
        let flag = |name: &str, default: bool| match var(name) {
            None => Ok(default),
            Some(v) => parse_bool(name, &v, default),
        };
        let count = |name: &str| var(name).map(|v| parse_u64(name, &v)).transpose();
        let max_binding = match count("FERROKERAS_GPU_MAX_BINDING")? {
            Some(0) => {
                return Err(Error::Value(
                    "FERROKERAS_GPU_MAX_BINDING must be a positive number of bytes, got 0".into(),
                ))
            }
            b => b,
        };
        let idle_bytes = match count("FERROKERAS_GPU_POOL_MAX_IDLE_MB")? {
            None => d.gpu_pool_max_idle_bytes,
            Some(mb) => mb.checked_mul(1 << 20).ok_or_else(|| {
                Error::Value(format!(
                    "FERROKERAS_GPU_POOL_MAX_IDLE_MB: {mb} MiB is more bytes than fit in 64 bits"
                ))
            })?,
        };
        Ok(Config {
            device: var("FERROKERAS_DEVICE").unwrap_or_default(),
            require_gpu: flag("FERROKERAS_REQUIRE_GPU", d.require_gpu)?,
            gpu_max_binding: max_binding,
            gpu_pool_max_idle_bytes: idle_bytes,
            gpu_pool_max_idle_submits: count("FERROKERAS_GPU_POOL_MAX_IDLE_SUBMITS")?
                .unwrap_or(d.gpu_pool_max_idle_submits),
            cpu_fusion: flag("FERROKERAS_CPU_FUSION", d.cpu_fusion)?,
            cpu_inplace: flag("FERROKERAS_CPU_INPLACE", d.cpu_inplace)?,
            loop_save_residuals: flag("FERROKERAS_LOOP_OPT", d.loop_save_residuals)?,
            loop_debug: flag("FERROKERAS_LOOP_DEBUG", d.loop_debug)?,
            gpu_loops: flag("FERROKERAS_GPU_LOOPS", d.gpu_loops)?,
            copy_transposed: match var("FERROKERAS_COPY_TRANSPOSED") {
                None => None,
                Some(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("auto") => None,
                Some(v) => Some(parse_bool("FERROKERAS_COPY_TRANSPOSED", &v, false)?),
            },
        })
    }
}

/// `0`/`1` (also `false`/`true`, `off`/`on`, `no`/`yes`, any case); empty is the default.
fn parse_bool(name: &str, value: &str, default: bool) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" => Ok(default),
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(Error::Value(format!(
            "{name} must be 0 or 1 (or false/true, off/on, no/yes), got {value:?}"
        ))),
    }
}

fn parse_u64(name: &str, value: &str) -> Result<u64> {
    value.trim().parse::<u64>().map_err(|_| {
        Error::Value(format!(
            "{name} must be a non-negative whole number, got {value:?}"
        ))
    })
}

static CONFIG: OnceLock<Result<Config>> = OnceLock::new();

fn read() -> &'static Result<Config> {
    CONFIG.get_or_init(|| Config::from_vars(|name| std::env::var(name).ok()))
}

/// The process's configuration, read from the environment on the first call; the error
/// naming the variable whose value does not parse, on every call.
pub fn get() -> Result<&'static Config> {
    read().as_ref().map_err(Clone::clone)
}

/// The process's configuration for readers that cannot report an error; the defaults when
/// a value does not parse, which `get` (called first on every path that reaches these
/// readers) has reported already.
pub fn settings() -> &'static Config {
    static DEFAULT: OnceLock<Config> = OnceLock::new();
    match read() {
        Ok(c) => c,
        Err(_) => DEFAULT.get_or_init(Config::default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<Config> {
        Config::from_vars(|name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn unset_gives_the_defaults() {
        assert_eq!(from(&[]).unwrap(), Config::default());
        assert_eq!(
            from(&[("FERROKERAS_CPU_FUSION", " ")]).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn values_parse_to_their_types() {
        let c = from(&[
            ("FERROKERAS_DEVICE", "gpu:1"),
            ("FERROKERAS_REQUIRE_GPU", "1"),
            ("FERROKERAS_GPU_MAX_BINDING", "65536"),
            ("FERROKERAS_GPU_POOL_MAX_IDLE_MB", "3"),
            ("FERROKERAS_GPU_POOL_MAX_IDLE_SUBMITS", " 77 "),
            ("FERROKERAS_CPU_FUSION", "0"),
            ("FERROKERAS_CPU_INPLACE", "Off"),
            ("FERROKERAS_LOOP_OPT", "false"),
            ("FERROKERAS_LOOP_DEBUG", "yes"),
            ("FERROKERAS_GPU_LOOPS", "0"),
            ("FERROKERAS_COPY_TRANSPOSED", "1"),
        ])
        .unwrap();
        assert_eq!(
            c,
            Config {
                device: "gpu:1".into(),
                require_gpu: true,
                gpu_max_binding: Some(65536),
                gpu_pool_max_idle_bytes: 3 << 20,
                gpu_pool_max_idle_submits: 77,
                cpu_fusion: false,
                cpu_inplace: false,
                loop_save_residuals: false,
                loop_debug: true,
                gpu_loops: false,
                copy_transposed: Some(true),
            }
        );
        let auto = from(&[("FERROKERAS_COPY_TRANSPOSED", "Auto")]).unwrap();
        assert_eq!(auto.copy_transposed, None);
        let off = from(&[("FERROKERAS_COPY_TRANSPOSED", "off")]).unwrap();
        assert_eq!(off.copy_transposed, Some(false));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("FERROKERAS_CPU_FUSION", "maybe"),
            ("FERROKERAS_LOOP_OPT", "hoist"),
            ("FERROKERAS_REQUIRE_GPU", "2"),
            ("FERROKERAS_GPU_MAX_BINDING", "-1"),
            ("FERROKERAS_GPU_MAX_BINDING", "0"),
            ("FERROKERAS_GPU_POOL_MAX_IDLE_MB", "1.5"),
            ("FERROKERAS_GPU_POOL_MAX_IDLE_MB", "18446744073709551615"),
            ("FERROKERAS_GPU_POOL_MAX_IDLE_SUBMITS", "many"),
            ("FERROKERAS_COPY_TRANSPOSED", "sometimes"),
        ] {
            match from(&[(name, value)]) {
                Err(Error::Value(m)) => assert!(m.starts_with(name), "{m}"),
                other => panic!("{name}={value}: {other:?}"),
            }
        }
    }
}
