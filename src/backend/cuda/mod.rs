//! The CUDA backend (being written): found at run time through cudarc's dynamic loading.
//! This stub fixes the interface the rest of the library uses.
use crate::error::{Error, Result};

/// What the probe found about a GPU.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
}

/// Checks, without ever panicking, that CUDA can run Tolk on GPU `index`.
pub fn probe(index: usize) -> Result<DeviceInfo> {
    let _ = index;
    Err(Error::unsupported("the CUDA backend is not built yet"))
}

/// The CUDA backend of one GPU (cheap to clone: shared context, stream, cuBLAS handle).
#[derive(Clone)]
pub struct CudaBackend {
    info: DeviceInfo,
}

impl CudaBackend {
    /// The backend for GPU `index` (created once per device and shared).
    pub fn new(index: usize) -> Result<CudaBackend> {
        let info = probe(index)?;
        Ok(CudaBackend { info })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
}
