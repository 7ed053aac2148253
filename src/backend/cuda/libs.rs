//! cuBLAS and NVRTC, loaded with `dlopen` when the backend first needs them, through a
//! table of the few functions Tolk calls.
//!
//! Why not cudarc's bindings for these two (cudarc still drives the GPU through `libcuda`,
//! whose ABI every driver keeps): they are built for one CUDA major version and look only
//! for its file names (`libcublas.so.12`), and they resolve every symbol of that version
//! when the library opens, panicking on one that is missing. A machine with CUDA 13 (the
//! current toolkits, PyTorch's cu13 wheels) has `libcublas.so.13` and `libnvrtc.so.13`
//! only. The calls below have had the same C signatures since CUDA 11, so one table serves
//! CUDA 12 and 13, and a library without one of them is an error naming it.
//!
//! Where they are looked for, in order, for each major version the driver can run (newest
//! first: a runtime newer than the driver cannot run on it; an NVRTC newer than the driver,
//! even by a minor version, makes PTX it cannot load and is passed over): the dynamic linker's own
//! search (`LD_LIBRARY_PATH`, the ld.so cache), then the directories of
//! `TOLK_CUDA_LIBRARY_PATH` (colon-separated), `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`,
//! `/usr/local/cuda/lib64` and `/usr/local/cuda/targets/x86_64-linux/lib`.
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// CUDA major versions whose cuBLAS and NVRTC this table fits, newest first.
const MAJORS: [u32; 2] = [13, 12];

/// A library opened with `dlopen`, kept open for the life of the process (the function
/// pointers taken from it must stay valid).
struct Library {
    handle: *mut c_void,
    path: String,
}

// SAFETY: a dlopen handle may be used from any thread (dlsym is thread-safe).
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

impl Library {
    fn open(path: &str) -> Option<Library> {
        let name = CString::new(path).ok()?;
        // SAFETY: dlopen with a valid C string; RTLD_LOCAL keeps its symbols out of the
        // global namespace (the host application may load another CUDA version).
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        (!handle.is_null()).then(|| Library { handle, path: path.to_string() })
    }

    /// The address of `symbol`, or an error naming it and the library.
    fn symbol(&self, symbol: &str) -> Result<*mut c_void, String> {
        let name = CString::new(symbol).map_err(|_| format!("bad symbol name {symbol:?}"))?;
        // SAFETY: the handle is open; dlsym only looks the name up.
        let address = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        if address.is_null() {
            return Err(format!("{} has no function {symbol} (not a CUDA 12 or 13 library?)", self.path));
        }
        Ok(address)
    }
}

/// The directories searched after the dynamic linker's own search.
fn extra_directories() -> Vec<String> {
    let mut dirs: Vec<String> = std::env::var("TOLK_CUDA_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(root) = std::env::var(var) {
            if !root.is_empty() {
                dirs.push(format!("{root}/lib64"));
            }
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    dirs
}

/// The CUDA version the driver runs (`cuDriverGetVersion`: 1000 x major + 10 x minor),
/// when a driver is there.
fn driver_version() -> Option<u32> {
    // SAFETY: only loads libcuda (dlopen); nothing is called when it is absent.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    let mut version: c_int = 0;
    // SAFETY: cuDriverGetVersion needs no cuInit and writes one int.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    (status == cudarc::driver::sys::CUresult::CUDA_SUCCESS && version > 0).then_some(version as u32)
}

/// Opens `lib<stem>.so.<major>` for the newest major version the driver runs (any of them
/// when there is no driver: NVRTC alone compiles without one), else the unversioned
/// `lib<stem>.so`, skipping a library `check` refuses (given the driver's version). The
/// error says what was looked for, where, and what was refused.
fn open_newest(stem: &str, check: impl Fn(&Library, Option<u32>) -> Result<(), String>) -> Result<Library, String> {
    let driver = driver_version();
    let majors: Vec<u32> = MAJORS.iter().copied().filter(|&m| driver.is_none_or(|d| m <= d / 1000)).collect();
    let dirs = extra_directories();
    let mut names: Vec<String> = majors.iter().map(|m| format!("lib{stem}.so.{m}")).collect();
    names.push(format!("lib{stem}.so"));
    let mut refused = Vec::new();
    for name in &names {
        let paths = std::iter::once(name.clone()).chain(dirs.iter().map(|dir| format!("{dir}/{name}")));
        for lib in paths.filter_map(|path| Library::open(&path)) {
            match check(&lib, driver) {
                Ok(()) => return Ok(lib),
                Err(why) => refused.push(format!("{} ({why})", lib.path)),
            }
        }
    }
    let wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    let driver = driver.map_or("no driver found".to_string(), |d| format!("the driver runs CUDA {}.{}", d / 1000, d % 1000 / 10));
    let refused = if refused.is_empty() { String::new() } else { format!("; refused: {}", refused.join(", ")) };
    Err(format!(
        "none of {} could be loaded ({driver}; searched the dynamic linker's path, then {}; TOLK_CUDA_LIBRARY_PATH adds directories{refused})",
        wanted.join(", "),
        dirs.join(", ")
    ))
}

/// Takes `symbol` from `lib` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the function's C signature.
unsafe fn function<F: Copy>(lib: &Library, symbol: &str) -> Result<F, String> {
    let address = lib.symbol(symbol)?;
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    Ok(std::mem::transmute_copy::<*mut c_void, F>(&address))
}

pub(crate) type CublasHandle = *mut c_void;
type Status = c_int;

/// `cublasOperation_t`.
pub(crate) const CUBLAS_OP_N: c_int = 0;
pub(crate) const CUBLAS_OP_T: c_int = 1;
/// `cudaDataType_t`.
pub(crate) const CUDA_R_32F: c_int = 0;
pub(crate) const CUDA_R_16F: c_int = 2;
/// `cublasComputeType_t`: float32 accumulation.
pub(crate) const CUBLAS_COMPUTE_32F: c_int = 68;
/// `cublasGemmAlgo_t`: cuBLAS's choice (tensor cores where the types allow).
pub(crate) const CUBLAS_GEMM_DEFAULT: c_int = -1;

/// The cuBLAS functions the backend calls.
pub(crate) struct Cublas {
    lib: Library,
    pub create: unsafe extern "C" fn(*mut CublasHandle) -> Status,
    pub destroy: unsafe extern "C" fn(CublasHandle) -> Status,
    pub set_stream: unsafe extern "C" fn(CublasHandle, *mut c_void) -> Status,
    #[allow(clippy::type_complexity)]
    pub sgemm: unsafe extern "C" fn(
        CublasHandle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const f32,
        *const f32,
        c_int,
        *const f32,
        c_int,
        *const f32,
        *mut f32,
        c_int,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub gemm_ex: unsafe extern "C" fn(
        CublasHandle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const c_void,
        *const c_void,
        c_int,
        c_int,
        *const c_void,
        c_int,
        c_int,
        *const c_void,
        *mut c_void,
        c_int,
        c_int,
        c_int,
        c_int,
    ) -> Status,
    get_status_string: unsafe extern "C" fn(Status) -> *const c_char,
}

impl Cublas {
    fn load() -> Result<Cublas, String> {
        let lib = open_newest("cublas", |_, _| Ok(())).map_err(|e| format!("cuBLAS not found: {e}"))?;
        // SAFETY: the types are the C signatures of cuBLAS 11-13 (cublas_api.h).
        unsafe {
            Ok(Cublas {
                create: function(&lib, "cublasCreate_v2")?,
                destroy: function(&lib, "cublasDestroy_v2")?,
                set_stream: function(&lib, "cublasSetStream_v2")?,
                sgemm: function(&lib, "cublasSgemm_v2")?,
                gemm_ex: function(&lib, "cublasGemmEx")?,
                get_status_string: function(&lib, "cublasGetStatusString")?,
                lib,
            })
        }
    }

    pub fn path(&self) -> &str {
        &self.lib.path
    }

    /// `Ok` for `CUBLAS_STATUS_SUCCESS`, else the status's name.
    pub fn check(&self, status: Status) -> Result<(), String> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: returns a static string for any status.
        let text = unsafe { (self.get_status_string)(status) };
        let text = if text.is_null() { "unknown".into() } else { unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned() };
        Err(format!("{text} ({status})"))
    }
}

/// cuBLAS, loaded once per process (the error is kept too: it will not change).
pub(crate) fn cublas() -> Result<&'static Cublas, String> {
    static CUBLAS: OnceLock<Result<Cublas, String>> = OnceLock::new();
    CUBLAS.get_or_init(Cublas::load).as_ref().map_err(Clone::clone)
}

type NvrtcProgram = *mut c_void;

/// The NVRTC functions that compile the kernels.
pub(crate) struct Nvrtc {
    lib: Library,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    create_program:
        unsafe extern "C" fn(*mut NvrtcProgram, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> Status,
    compile_program: unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> Status,
    get_ptx_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> Status,
    get_ptx: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> Status,
    get_log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> Status,
    get_log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> Status,
    destroy_program: unsafe extern "C" fn(*mut NvrtcProgram) -> Status,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

impl Nvrtc {
    fn load() -> Result<Nvrtc, String> {
        // PTX from an NVRTC newer than the driver (13.2 on a 13.0 driver) does not load:
        // such a library is passed over for an older one.
        let lib = open_newest("nvrtc", |lib, driver| {
            // SAFETY: nvrtcVersion(int*, int*) writes two ints.
            let version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status = unsafe { function(lib, "nvrtcVersion")? };
            let (mut major, mut minor) = (0, 0);
            unsafe { version(&mut major, &mut minor) };
            let own = (major.max(0) as u32) * 1000 + (minor.max(0) as u32) * 10;
            match driver {
                Some(d) if own > d => Err(format!("NVRTC {major}.{minor} is newer than the driver's CUDA {}.{}", d / 1000, d % 1000 / 10)),
                _ => Ok(()),
            }
        })
        .map_err(|e| format!("NVRTC (the CUDA runtime compiler) not found: {e}"))?;
        // SAFETY: the types are the C signatures of NVRTC 11-13 (nvrtc.h).
        unsafe {
            Ok(Nvrtc {
                version: function(&lib, "nvrtcVersion")?,
                create_program: function(&lib, "nvrtcCreateProgram")?,
                compile_program: function(&lib, "nvrtcCompileProgram")?,
                get_ptx_size: function(&lib, "nvrtcGetPTXSize")?,
                get_ptx: function(&lib, "nvrtcGetPTX")?,
                get_log_size: function(&lib, "nvrtcGetProgramLogSize")?,
                get_log: function(&lib, "nvrtcGetProgramLog")?,
                destroy_program: function(&lib, "nvrtcDestroyProgram")?,
                get_error_string: function(&lib, "nvrtcGetErrorString")?,
                lib,
            })
        }
    }

    pub fn path(&self) -> &str {
        &self.lib.path
    }

    /// (major, minor) of this NVRTC.
    pub fn version(&self) -> (i32, i32) {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        unsafe { (self.version)(&mut major, &mut minor) };
        (major, minor)
    }

    fn error(&self, what: &str, status: Status) -> String {
        // SAFETY: returns a static string for any status.
        let text = unsafe { (self.get_error_string)(status) };
        let text = if text.is_null() { "unknown".into() } else { unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned() };
        format!("{what}: {text}")
    }

    /// Compiles CUDA C `source` with `options` to PTX text; a failure carries the log.
    pub fn compile(&self, source: &str, name: &str, options: &[&str]) -> Result<String, String> {
        let source = CString::new(source).map_err(|_| "the CUDA source holds a NUL".to_string())?;
        let name = CString::new(name).map_err(|_| "the CUDA source's name holds a NUL".to_string())?;
        let options: Vec<CString> = options.iter().map(|o| CString::new(*o)).collect::<Result<_, _>>().map_err(|_| "an option holds a NUL")?;
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let mut program: NvrtcProgram = std::ptr::null_mut();
        // SAFETY: valid C strings, no headers; the program is destroyed below.
        let status = unsafe { (self.create_program)(&mut program, source.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
        if status != 0 {
            return Err(self.error("nvrtcCreateProgram", status));
        }
        // SAFETY: `program` was created above; the buffers are sized by the size calls.
        let result = unsafe {
            let status = (self.compile_program)(program, option_ptrs.len() as c_int, option_ptrs.as_ptr());
            if status != 0 {
                let mut size = 0usize;
                let mut log = String::new();
                if (self.get_log_size)(program, &mut size) == 0 && size > 1 {
                    let mut buffer = vec![0u8; size];
                    if (self.get_log)(program, buffer.as_mut_ptr().cast()) == 0 {
                        log = String::from_utf8_lossy(&buffer[..size - 1]).trim().to_string();
                    }
                }
                Err(format!("{}\n{log}", self.error("nvrtcCompileProgram", status)))
            } else {
                let mut size = 0usize;
                let status = (self.get_ptx_size)(program, &mut size);
                if status != 0 {
                    Err(self.error("nvrtcGetPTXSize", status))
                } else {
                    let mut buffer = vec![0u8; size.max(1)];
                    let status = (self.get_ptx)(program, buffer.as_mut_ptr().cast());
                    if status != 0 {
                        Err(self.error("nvrtcGetPTX", status))
                    } else {
                        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
                        Ok(String::from_utf8_lossy(&buffer[..end]).into_owned())
                    }
                }
            }
        };
        // SAFETY: destroys the program created above.
        unsafe { (self.destroy_program)(&mut program) };
        result
    }
}

/// NVRTC, loaded once per process.
pub(crate) fn nvrtc() -> Result<&'static Nvrtc, String> {
    static NVRTC: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
    NVRTC.get_or_init(Nvrtc::load).as_ref().map_err(Clone::clone)
}
