//! Device selection, in one place. `FERROKERAS_DEVICE` (read on first use) or
//! `set_device` picks one of:
//!
//! - `auto` (default): the first hardware GPU adapter wgpu finds, else the CPU. Software
//!   adapters (Mesa llvmpipe) are never picked by `auto`.
//! - `cpu`: the CPU.
//! - `gpu`: the first hardware adapter, else the first software one. With none at all,
//!   the environment variable falls back to the CPU with a warning, unless
//!   `FERROKERAS_REQUIRE_GPU=1` (CI's GPU test pass), which makes it an error;
//!   `set_device("gpu")` is an error. `auto` is never an error: it may always be the CPU.
//! - `gpu:N`: adapter number N of `list()`.

use super::gpu::{self, AdapterDesc, Context};
use crate::base::error::{Error, Result};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub enum Device {
    Cpu,
    Gpu(Arc<Context>),
}

impl Device {
    pub fn name(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Gpu(c) => format!("gpu:{}", c.index()),
        }
    }
}

static CURRENT: Mutex<Option<Device>> = Mutex::new(None);

enum Want {
    Auto,
    Cpu,
    AnyGpu,
    Gpu(usize),
}

fn parse(name: &str) -> Result<Want> {
    let n = name.trim().to_ascii_lowercase();
    Ok(match n.as_str() {
        "" | "auto" => Want::Auto,
        "cpu" => Want::Cpu,
        "gpu" => Want::AnyGpu,
        _ => match n.strip_prefix("gpu:").map(|i| i.parse::<usize>()) {
            Some(Ok(i)) => Want::Gpu(i),
            _ => {
                return Err(Error::Value(format!(
                    "unknown device '{name}': expected 'auto', 'cpu', 'gpu' or 'gpu:N' (N an adapter index from ferrokeras.devices())"
                )))
            }
        },
    })
}

fn require_gpu() -> bool {
    crate::base::config::settings().require_gpu
}

/// Resolves a device name. `from_env` softens "gpu with no adapter" to the CPU.
fn resolve(name: &str, from_env: bool) -> Result<Device> {
    let want = parse(name)?;
    if let Want::Cpu = want {
        // No adapter probing: the CPU device never loads a GPU driver.
        return Ok(Device::Cpu);
    }
    let adapters = gpu::adapters();
    let hardware = adapters.iter().find(|a| !a.software).map(|a| a.index);
    let pick = match want {
        Want::Cpu => return Ok(Device::Cpu),
        Want::Auto => match hardware {
            Some(i) => i,
            None => return Ok(Device::Cpu),
        },
        Want::AnyGpu => match hardware.or(adapters.first().map(|a| a.index)) {
            Some(i) => i,
            None if from_env && !require_gpu() => {
                eprintln!(
                    "ferrokeras: FERROKERAS_DEVICE=gpu but {}; running on the CPU",
                    gpu::why_none()
                );
                return Ok(Device::Cpu);
            }
            None => return Err(no_gpu(name, &adapters)),
        },
        Want::Gpu(i) => {
            if i >= adapters.len() {
                return Err(no_gpu(name, &adapters));
            }
            i
        }
    };
    match gpu::open(pick) {
        Ok(ctx) => Ok(Device::Gpu(ctx)),
        Err(e) if matches!(want, Want::Auto) => {
            eprintln!("ferrokeras: could not open GPU adapter {pick} ({e}); running on the CPU");
            Ok(Device::Cpu)
        }
        Err(e) => Err(e),
    }
}

fn no_gpu(name: &str, adapters: &[AdapterDesc]) -> Error {
    if adapters.is_empty() {
        Error::Device(format!("device '{name}': {}", gpu::why_none()))
    } else {
        let list: Vec<String> = adapters
            .iter()
            .map(|a| format!("gpu:{} = {} ({})", a.index, a.name, a.backend))
            .collect();
        Error::Device(format!(
            "device '{name}': no such GPU adapter; found {}",
            list.join(", ")
        ))
    }
}

/// The device calls run on, resolved from `FERROKERAS_DEVICE` on first use.
pub fn current() -> Result<Device> {
    // Reports a bad value of any FERROKERAS_* variable before anything runs.
    let config = crate::base::config::get()?;
    let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = cur.as_ref() {
        return Ok(d.clone());
    }
    let d = resolve(&config.device, true).map_err(|e| match e {
        Error::Value(m) => Error::Value(format!("FERROKERAS_DEVICE: {m}")),
        other => other,
    })?;
    *cur = Some(d.clone());
    Ok(d)
}

/// Switches the device for later calls; returns its name (`cpu` or `gpu:N`).
pub fn set(name: &str) -> Result<String> {
    let d = resolve(name, false)?;
    let n = d.name();
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some(d);
    Ok(n)
}

/// The GPU adapters wgpu can see, in `gpu:N` order (empty without the `gpu` feature).
pub fn list() -> Vec<AdapterDesc> {
    gpu::adapters()
}
