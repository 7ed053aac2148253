//! One error type for the whole library; the C API maps each kind to a status code.
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A file could not be opened or read.
    Io,
    /// A model file is malformed, truncated or inconsistent.
    InvalidModel,
    /// The model or option is valid but not supported by Tolk.
    Unsupported,
    /// A caller-provided argument is invalid.
    InvalidArgument,
    /// An index passed by the caller is out of range.
    OutOfRange,
    /// A bug: a panic caught at the API boundary.
    Internal,
    /// The caller asked to stop (a progress callback, a job's cancel, a translator freed
    /// with work in flight).
    Cancelled,
}

#[derive(Debug, Clone)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into() }
    }
    pub fn io(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Io, message)
    }
    pub fn invalid_model(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidModel, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn out_of_range(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::OutOfRange, message)
    }
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Cancelled, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
