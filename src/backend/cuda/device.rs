//! One GPU as the backend holds it: its context and stream, a cuBLAS handle, the compiled
//! kernels. Opened once per device and process (`mod.rs` caches it).
use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdevice_attribute, CUresult};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig};

use super::kernels;
use super::memory::DeviceBuffer;
use super::libs::{self, CublasHandle};
use super::DeviceInfo;
use crate::error::{Error, Result};

/// Index arrays kept on the device with their host values, most recent first.
pub(crate) type KeptUploads = VecDeque<(Vec<u32>, Arc<CudaSlice<u32>>)>;

pub(crate) struct Device {
    pub info: DeviceInfo,
    pub ctx: Arc<CudaContext>,
    /// The one stream every operation runs on, in the order they are called: no two
    /// operations of the backend ever run concurrently on the device, so buffers need no
    /// events (cudarc's event tracking is off).
    pub stream: Arc<CudaStream>,
    /// cuBLAS handles are not meant for concurrent calls from several threads.
    pub blas: Mutex<Blas>,
    /// float16 copies of the activations a float16 product reads (grow-only; used under
    /// the `blas` lock, and only by work queued on `stream`, in order).
    pub half_scratch: Mutex<Option<CudaSlice<u16>>>,
    /// The last index arrays uploaded, most recent first (see `CudaBackend::upload_u32`).
    pub uploads: Mutex<KeptUploads>,
    /// The logits of a step whose candidates are found on the device (`top_logits`).
    pub logits_scratch: Mutex<DeviceBuffer>,
    functions: HashMap<&'static str, CudaFunction>,
    /// Passed for pointer arguments a kernel does not read.
    pub dummy_u32: CudaSlice<u32>,
    pub dummy_f32: CudaSlice<f32>,
}

/// Unwraps the result of a CUDA call made by an operation of the backend (which returns
/// no `Result`): a failure panics with what failed, and the C API reports the panic.
pub(crate) fn check<T, E: Display>(result: std::result::Result<T, E>, what: &str) -> T {
    match result {
        Ok(v) => v,
        Err(e) => panic!("CUDA backend: {what} failed: {e}"),
    }
}

fn driver_error(what: &str, e: DriverError) -> Error {
    Error::unsupported(format!("{what}: {e}"))
}

/// Checks that the three CUDA libraries the backend loads can be found (cudarc panics on
/// the first call into a missing driver; see `libs` for cuBLAS and NVRTC).
pub(crate) fn check_libraries() -> Result<()> {
    // One after the other, so that a machine without a driver loads nothing else.
    // SAFETY: only tries to load the library (dlopen), calling nothing in it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::unsupported(
            "no CUDA driver found (libcuda.so could not be loaded): install the NVIDIA driver, or run on the CPU",
        ));
    }
    libs::cublas().map_err(|e| {
        Error::unsupported(format!(
            "{e}. Install the CUDA 12 or 13 runtime libraries (the CUDA toolkit, or `pip install nvidia-cublas-cu12`) \
             and put their lib directory on LD_LIBRARY_PATH or TOLK_CUDA_LIBRARY_PATH"
        ))
    })?;
    libs::nvrtc().map_err(|e| {
        Error::unsupported(format!(
            "{e}. Install the CUDA 12 or 13 runtime compiler (the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12`) \
             and put its lib directory on LD_LIBRARY_PATH or TOLK_CUDA_LIBRARY_PATH"
        ))
    })?;
    Ok(())
}

/// A cuBLAS handle bound to the device's stream, destroyed with its context current.
pub(crate) struct Blas {
    pub handle: CublasHandle,
    ctx: Arc<CudaContext>,
}

// SAFETY: the handle is used under the device's mutex, one thread at a time.
unsafe impl Send for Blas {}

impl Blas {
    fn new(stream: &CudaStream) -> std::result::Result<Blas, String> {
        let cublas = libs::cublas()?;
        stream.context().bind_to_thread().map_err(|e| e.to_string())?;
        let mut handle: CublasHandle = std::ptr::null_mut();
        // SAFETY: writes a handle; set_stream takes the live stream of this context.
        unsafe {
            cublas.check((cublas.create)(&mut handle))?;
            if let Err(e) = cublas.check((cublas.set_stream)(handle, stream.cu_stream().cast())) {
                (cublas.destroy)(handle);
                return Err(e);
            }
        }
        Ok(Blas { handle, ctx: stream.context().clone() })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        if let Ok(cublas) = libs::cublas() {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: the handle was created by `Blas::new` and is destroyed once.
            unsafe { (cublas.destroy)(self.handle) };
        }
    }
}

/// Sets the device's default memory pool (the one cudarc's stream-ordered allocations use)
/// to keep the memory freed into it instead of returning it to the driver at every
/// synchronization: buffers freed and reallocated between decoding steps then reuse it.
/// Only an optimization: a device or driver that refuses it (no memory pools) is left as
/// it is.
fn keep_freed_memory(ctx: &CudaContext) {
    use cudarc::driver::sys::{cuDeviceGetDefaultMemPool, cuMemPoolSetAttribute, CUmemPool_attribute, CUmemoryPool};
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the device handle comes from the live context; `pool` is written by the call.
    if unsafe { cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) } != CUresult::CUDA_SUCCESS || pool.is_null() {
        return;
    }
    let mut threshold = u64::MAX;
    // SAFETY: the pool is the device's own; the release threshold attribute takes a
    // pointer to a `cuuint64_t`, read during the call.
    let _ = unsafe {
        cuMemPoolSetAttribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast::<std::ffi::c_void>(),
        )
    };
}

impl Device {
    /// Opens GPU `index`: context, stream, cuBLAS, kernels compiled for its architecture.
    /// The libraries must have been checked ([`check_libraries`]).
    pub fn open(index: usize) -> Result<Device> {
        let count = CudaContext::device_count().map_err(|e| match e.0 {
            CUresult::CUDA_ERROR_NO_DEVICE => Error::unsupported("no CUDA device found (the driver reports none)"),
            _ => driver_error("the CUDA driver could not be initialized", e),
        })?;
        let count = usize::try_from(count).unwrap_or(0);
        if index >= count {
            let plural = if count == 1 { "" } else { "s" };
            return Err(Error::unsupported(format!("CUDA device {index} does not exist ({count} device{plural} found)")));
        }
        let ctx = CudaContext::new(index).map_err(|e| driver_error(&format!("could not create a CUDA context on device {index}"), e))?;
        // SAFETY: everything runs on one stream, in order (see `stream`), and this is done
        // before any allocation.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(|e| driver_error("could not read the CUDA device's name", e))?;
        let attribute = |a| ctx.attribute(a).map_err(|e| driver_error("could not read the CUDA device's attributes", e));
        let major = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        // SAFETY: the device handle comes from the live context.
        let total_memory = unsafe { cudarc::driver::result::device::total_mem(ctx.cu_device()) }
            .map_err(|e| driver_error("could not read the CUDA device's memory size", e))?;
        let libraries = match (libs::cublas(), libs::nvrtc()) {
            (Ok(cublas), Ok(nvrtc)) => {
                let (nvrtc_major, nvrtc_minor) = nvrtc.version();
                format!("cuBLAS {}, NVRTC {nvrtc_major}.{nvrtc_minor} {}", cublas.path(), nvrtc.path())
            }
            _ => String::new(),
        };
        let info = DeviceInfo { index, name, compute_capability: (major, minor), total_memory, libraries };
        keep_freed_memory(&ctx);

        if major < kernels::MIN_COMPUTE_CAPABILITY.0 {
            let (min_major, min_minor) = kernels::MIN_COMPUTE_CAPABILITY;
            return Err(Error::unsupported(format!(
                "CUDA device {index} ({}) has compute capability {major}.{minor}; Tolk needs {min_major}.{min_minor} or later",
                info.name
            )));
        }
        let arch = kernels::arch_for(info.compute_capability);
        let ptx = kernels::compile(arch)?;
        let module = ctx.load_module(ptx).map_err(|e| match e.0 {
            CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => Error::unsupported(format!(
                "the CUDA driver is older than the NVRTC library (it cannot load the PTX NVRTC produced): update the driver \
                 or use an NVRTC as old as the driver ({e})"
            )),
            _ => driver_error("could not load Tolk's compiled CUDA kernels", e),
        })?;
        let functions = kernels::KERNEL_NAMES
            .iter()
            .map(|&name| {
                let f = module.load_function(name).map_err(|e| driver_error(&format!("CUDA kernel {name} is missing"), e))?;
                Ok((name, f))
            })
            .collect::<Result<HashMap<_, _>>>()?;
        let stream = ctx.default_stream();
        let blas = Blas::new(&stream).map_err(|e| Error::unsupported(format!("could not create a cuBLAS handle: {e}")))?;
        let dummy_u32 = stream.alloc_zeros::<u32>(1).map_err(|e| driver_error("could not allocate CUDA memory", e))?;
        let dummy_f32 = stream.alloc_zeros::<f32>(1).map_err(|e| driver_error("could not allocate CUDA memory", e))?;
        Ok(Device {
            info,
            ctx,
            stream,
            blas: Mutex::new(blas),
            half_scratch: Mutex::new(None),
            uploads: Mutex::new(VecDeque::new()),
            logits_scratch: Mutex::new(DeviceBuffer::default()),
            functions,
            dummy_u32,
            dummy_f32,
        })
    }

    pub fn function(&self, name: &str) -> &CudaFunction {
        self.functions.get(name).unwrap_or_else(|| panic!("CUDA backend: no kernel {name}"))
    }

    /// Launch shape of an element-wise kernel over `n` elements (grid-stride loops).
    pub fn elementwise(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(kernels::ELEMENT_THREADS as usize).clamp(1, 65_535) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (kernels::ELEMENT_THREADS, 1, 1), shared_mem_bytes: 0 }
    }

    /// One block per row (`rows` blocks of [`kernels::ROW_THREADS`]).
    pub fn per_row(rows: usize) -> LaunchConfig {
        LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (kernels::ROW_THREADS, 1, 1), shared_mem_bytes: 0 }
    }
}
