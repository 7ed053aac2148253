//! The CUDA backend: [`CudaBackend`] implements [`crate::backend::Backend`] on one NVIDIA
//! GPU. Nothing of CUDA is needed to build Tolk or to run it on the CPU: the driver
//! (`libcuda.so`, through cudarc with dynamic loading), cuBLAS and NVRTC (CUDA 12 or 13,
//! through `libs`) are looked for when [`probe`] runs, and a missing one is an error naming
//! it, never a panic.
//!
//! - `device`: a GPU's context, its one stream, the cuBLAS handle and the kernels, opened
//!   once per device and process (cached here) and shared by every clone of the backend.
//! - `kernels`: the CUDA C source, compiled by NVRTC for the device's architecture when the
//!   device is opened.
//! - `memory`: device buffers (grow-only, so decoder steps do not reallocate), weights,
//!   parameters and the key/value caches.
//! - `libs`: cuBLAS and NVRTC, loaded with `dlopen` (CUDA 12 or 13, whichever the driver
//!   runs), through a table of the functions Tolk calls.
//! - `backend`: the operations.
//!
//! Precision: compute type float32 multiplies through cuBLAS `sgemm` (no TF32); float16
//! keeps the weights in half precision and multiplies with `GemmEx` on the tensor cores,
//! the activations rounded to half first and the sums in float32; everything else (norms,
//! attention, caches) is float32 either way. Weights stored as int8 or int16 are
//! dequantized when uploaded (`w = q * (1 / scale)`, as the CPU backend reads them back);
//! the int8/int16 compute types are the CPU's integer kernels and are refused here.
//! [`FloatOrder`](crate::backend::FloatOrder) is ignored: the GPU sums in its own order, so
//! the last bits of a result (sometimes a word of a translation) may differ from the CPU.
//!
//! Errors: the [`Backend`](crate::backend::Backend) operations return no `Result`; a CUDA
//! failure in one of them (out of memory, a lost device) panics with a message saying what
//! failed, which the C API turns into an error status. Everything that can be checked
//! beforehand is checked by [`probe`], which runs a small product and a kernel and compares
//! them with the CPU before saying a device is usable.
mod backend;
mod device;
mod kernels;
mod libs;
mod memory;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::cell::Cell;
use std::sync::{Arc, Mutex, Once, OnceLock};

use device::Device;
pub use kernels::SOURCE as KERNEL_SOURCE;
pub use memory::{DeviceBuffer, DeviceKvCache, DeviceMatrix, DeviceVector, WeightData};

use crate::error::{Error, Result};

/// What the probe found about a GPU.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
    /// The CUDA libraries in use, for people: "CUDA 13, libcublas.so.13, NVRTC 13.0".
    pub libraries: String,
}

/// The devices opened (and found usable) so far, by index.
fn devices() -> &'static Mutex<HashMap<usize, Arc<Device>>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();
    DEVICES.get_or_init(Default::default)
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// The device `index`, opened, checked and cached on the first call.
fn open_device(index: usize) -> Result<Arc<Device>> {
    // A panic while a device was being opened cannot leave the map half-updated.
    let mut cache = devices().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(device) = cache.get(&index) {
        return Ok(device.clone());
    }
    device::check_libraries()?;
    let opened = catch_unwind(AssertUnwindSafe(|| -> Result<Arc<Device>> {
        let device = Arc::new(Device::open(index)?);
        backend::smoke_test(&CudaBackend { device: device.clone() })?;
        Ok(device)
    }))
    .unwrap_or_else(|payload| Err(Error::unsupported(format!("CUDA device {index} is not usable: {}", panic_message(&*payload)))))?;
    cache.insert(index, opened.clone());
    Ok(opened)
}

/// Checks, without ever panicking, that CUDA can run Tolk on GPU `index`: the libraries
/// load, the device exists, the kernels compile and load, and a small product (cuBLAS) and
/// a kernel give the CPU's results. The first successful probe of a device opens it for
/// the process (the kernels are compiled once); later probes and [`CudaBackend::new`]
/// reuse it.
pub fn probe(index: usize) -> Result<DeviceInfo> {
    quietly(|| {
        catch_unwind(|| open_device(index).map(|d| d.info.clone()))
            .unwrap_or_else(|payload| Err(Error::unsupported(format!("CUDA is not usable: {}", panic_message(&*payload)))))
    })
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (which must not unwind) with this thread's panics unprinted: cudarc panics
/// where a library lacks a symbol (an old or fake driver), the probe turns that into an
/// error, and the host application's stderr should not show a backtrace for it. Other
/// threads' panics print as before.
fn quietly<T>(f: impl FnOnce() -> T) -> T {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info)
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let out = f();
    QUIET.with(|q| q.set(false));
    out
}

/// The CUDA backend of one GPU (cheap to clone: shared context, stream, cuBLAS handle).
#[derive(Clone)]
pub struct CudaBackend {
    device: Arc<Device>,
}

impl CudaBackend {
    /// The backend for GPU `index` (created once per device and shared).
    pub fn new(index: usize) -> Result<CudaBackend> {
        probe(index)?;
        Ok(CudaBackend { device: open_device(index)? })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.device.info
    }
}
