//! Adapters and devices. One `Context` per opened adapter, kept for the life of the
//! process so buffers, pipelines and resident variables survive device switches.
//! wgpu errors never panic: uncaptured errors are collected and turned into
//! `Error::Device` after each submit, and device loss is recorded by a callback. A lost
//! device stays lost (every call on it fails); opening its adapter again, as
//! `set_device` does, replaces it with a fresh device.

use super::pipelines::PipelineCache;
use super::pool::Pool;
use crate::base::error::{Error, Result};
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Clone, Debug)]
pub struct AdapterDesc {
    pub index: usize,
    pub name: String,
    /// Vulkan, Metal, Dx12 or Gl.
    pub backend: String,
    /// discrete, integrated, virtual, cpu or other.
    pub kind: String,
    /// A software rasteriser (llvmpipe, WARP): never picked by `auto`.
    pub software: bool,
}

pub struct Context {
    pub id: u64,
    pub desc: AdapterDesc,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub limits: wgpu::Limits,
    /// The adapter has `shader-f16`; f16 rounding then uses native f16 conversions.
    pub has_f16: bool,
    /// Largest buffer a kernel may bind (adapter limit, or `FERROKERAS_GPU_MAX_BINDING`).
    pub max_binding: u64,
    pub(crate) pool: Mutex<Pool>,
    pub(crate) pipelines: Mutex<PipelineCache>,
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
}

impl Context {
    pub fn index(&self) -> usize {
        self.desc.index
    }

    /// Fails if the device was lost or wgpu reported an error since the last check.
    pub fn check(&self, what: &str) -> Result<()> {
        if let Some(m) = self.lost.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Err(Error::Device(format!(
                "GPU device lost ({}): {m}; values that lived only on it are gone. \
                 ferrokeras.set_device('gpu') opens a fresh device, ferrokeras.set_device('cpu') runs on the CPU",
                self.desc.name
            )));
        }
        let mut errs = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if !errs.is_empty() {
            let msg = errs.join("; ");
            errs.clear();
            return Err(Error::Device(format!("GPU error during {what}: {msg}")));
        }
        Ok(())
    }

    pub fn is_lost(&self) -> bool {
        self.lost
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Destroys the device, which makes it lost (tests of the device-loss path). wgpu
    /// reports the loss through the callback when it next maintains the device.
    pub fn destroy(&self) {
        self.device.destroy();
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }
}

struct Registry {
    instance: wgpu::Instance,
    adapters: Vec<(AdapterDesc, wgpu::Adapter)>,
    open: Mutex<Vec<Option<Arc<Context>>>>,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::PRIMARY;
        let (instance, found) = without_llvm_drivers_next_to_foreign_llvm(|| {
            without_display_probe(|| {
                let instance = wgpu::Instance::new(desc);
                let found =
                    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
                (instance, found)
            })
        });
        let adapters: Vec<(AdapterDesc, wgpu::Adapter)> = found
            .into_iter()
            .enumerate()
            .map(|(index, a)| {
                let info = a.get_info();
                let (kind, software) = match info.device_type {
                    wgpu::DeviceType::DiscreteGpu => ("discrete", false),
                    wgpu::DeviceType::IntegratedGpu => ("integrated", false),
                    wgpu::DeviceType::VirtualGpu => ("virtual", false),
                    wgpu::DeviceType::Cpu => ("cpu", true),
                    wgpu::DeviceType::Other => ("other", false),
                };
                let backend = format!("{:?}", info.backend);
                (
                    AdapterDesc {
                        index,
                        name: info.name.clone(),
                        backend,
                        kind: kind.into(),
                        software,
                    },
                    a,
                )
            })
            .collect();
        let n = adapters.len();
        Registry {
            instance,
            adapters,
            open: Mutex::new(vec![None; n]),
        }
    })
}

/// Runs `f` (creating the Vulkan instance and enumerating adapters) with Mesa's implicit
/// `VK_LAYER_MESA_device_select` layer off when there is no Wayland display session. That
/// layer connects to the Wayland display while adapters are enumerated, and without one
/// libwayland prints "error: XDG_RUNTIME_DIR is invalid or not set in the environment."
/// for every probe. It only moves the display's GPU first, and there is no display then.
/// `NODEVICE_SELECT` (the layer's own switch) is set for the enumeration and removed after;
/// a user who set it, or chose a device with `MESA_VK_DEVICE_SELECT`, keeps the layer as set.
fn without_display_probe<T>(f: impl FnOnce() -> T) -> T {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    let absolute = |k: &str| std::env::var(k).is_ok_and(|v| v.starts_with('/'));
    let no_display =
        !set("WAYLAND_SOCKET") && !absolute("WAYLAND_DISPLAY") && !absolute("XDG_RUNTIME_DIR");
    let switch_off = no_display && !set("NODEVICE_SELECT") && !set("MESA_VK_DEVICE_SELECT");
    if !switch_off {
        return f();
    }
    std::env::set_var("NODEVICE_SELECT", "1");
    let out = f();
    std::env::remove_var("NODEVICE_SELECT");
    out
}

/// Mesa's Vulkan drivers that link `libLLVM`: llvmpipe (`lvp`) and RADV (`radeon`), as
/// `VK_LOADER_DRIVERS_DISABLE` globs over their manifest file names.
const LLVM_DRIVERS: &str = "*lvp_icd*,*radeon_icd*";

/// Whether a library in the process's global symbol scope defines LLVM's symbols, as
/// TensorFlow's `libtensorflow_framework.so.2` does (it exports its own LLVM). A Mesa
/// driver loaded after it brings `libLLVM`, whose references to its global objects then
/// bind to that library's copies: the two LLVMs' command-line option registries are
/// mixed, and the process aborts at exit (`free(): invalid pointer` in an
/// `llvm::cl::opt` destructor). Loaded in the other order, each keeps its own.
fn foreign_llvm_loaded() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the
        // symbol up in the global scope.
        let sym = unsafe {
            libc::dlsym(
                libc::RTLD_DEFAULT,
                c"_ZN4llvm2cl6Option11addArgumentEv".as_ptr(),
            )
        };
        !sym.is_null()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Runs `f` (the adapter enumeration) with Mesa's LLVM-based Vulkan drivers left unloaded
/// when another LLVM is already in the global symbol scope (`foreign_llvm_loaded`), and
/// says so once: their adapters are then not listed. `VK_LOADER_DRIVERS_DISABLE` (the
/// Vulkan loader's switch, loader 1.3.234 and later) is set for the enumeration and removed
/// after; a user who set it (even empty) decides alone.
fn without_llvm_drivers_next_to_foreign_llvm<T>(f: impl FnOnce() -> T) -> T {
    const VAR: &str = "VK_LOADER_DRIVERS_DISABLE";
    if std::env::var_os(VAR).is_some() || !foreign_llvm_loaded() {
        return f();
    }
    eprintln!(
        "ferrokeras: another copy of LLVM is loaded (TensorFlow's?), so Mesa's LLVM-based Vulkan \
         drivers (llvmpipe, RADV) are skipped: loading them next to it aborts the process at exit. \
         Use them by importing ferrokeras and calling ferrokeras.devices() before importing \
         TensorFlow, or choose with {VAR}."
    );
    std::env::set_var(VAR, LLVM_DRIVERS);
    let out = f();
    std::env::remove_var(VAR);
    out
}

pub fn adapters() -> Vec<AdapterDesc> {
    registry().adapters.iter().map(|(d, _)| d.clone()).collect()
}

pub fn why_none() -> String {
    let _ = &registry().instance;
    "wgpu found no GPU adapter (Vulkan, Metal or DX12); on Linux install a Vulkan driver, e.g. Debian's mesa-vulkan-drivers".into()
}

/// The devices opened so far (lost ones included until replaced).
pub fn opened() -> Vec<Arc<Context>> {
    registry()
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .flatten()
        .cloned()
        .collect()
}

/// Opens (once) the device of adapter `index`; a lost device is replaced by a new one.
pub fn open(index: usize) -> Result<Arc<Context>> {
    let reg = registry();
    let mut open = reg.open.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(Some(c)) = open.get(index) {
        if !c.is_lost() {
            return Ok(c.clone());
        }
    }
    let (desc, adapter) = reg.adapters.get(index).ok_or_else(|| {
        Error::Device(format!(
            "no GPU adapter number {index} ({} found)",
            reg.adapters.len()
        ))
    })?;
    let has_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
    let limits = adapter.limits();
    let mut features = if has_f16 {
        wgpu::Features::SHADER_F16
    } else {
        wgpu::Features::empty()
    };
    // For the profiler's GPU pass times (`timestamps`), where the adapter has them.
    features |= adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
    let dd = wgpu::DeviceDescriptor {
        label: Some("ferrokeras"),
        required_features: features,
        required_limits: limits.clone(),
        ..Default::default()
    };
    let (device, queue) = pollster::block_on(adapter.request_device(&dd)).map_err(|e| {
        Error::Device(format!(
            "cannot open GPU adapter {index} ({}): {e}",
            desc.name
        ))
    })?;
    let errors = Arc::new(Mutex::new(Vec::new()));
    let lost = Arc::new(Mutex::new(None));
    {
        let errors = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.to_string());
        }));
        let lost = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            let m = if msg.is_empty() {
                format!("{reason:?}")
            } else {
                format!("{reason:?}: {msg}")
            };
            *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
        });
    }
    let mut max_binding = limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size);
    if let Some(cap) = crate::base::config::settings().gpu_max_binding {
        max_binding = max_binding.min(cap);
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let ctx = Arc::new(Context {
        id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        desc: desc.clone(),
        device,
        queue,
        limits,
        has_f16,
        max_binding,
        pool: Mutex::new(Pool::default()),
        pipelines: Mutex::new(PipelineCache::default()),
        errors,
        lost,
    });
    open[index] = Some(ctx.clone());
    Ok(ctx)
}
