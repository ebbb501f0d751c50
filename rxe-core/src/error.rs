//! Errors of the verbs-level calls into the engine.
//!
//! Every variant maps to the errno the kernel's verbs return, and its message
//! says what was wrong and what to do about it. Kernel rxe mostly says EINVAL;
//! we say why.

use std::fmt;

use crate::qp_attr::ModifyQpError;

/// An error from a verbs-level call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A parameter is invalid (EINVAL). The message names it.
    Invalid(String),
    /// A modify_qp was refused (EINVAL); see [`ModifyQpError`].
    ModifyQp(ModifyQpError),
    /// A queue is full or a resource limit is reached (ENOMEM).
    NoMemory(String),
    /// The object does not exist (ENOENT in messages; EINVAL to callers, like the kernel).
    NotFound(String),
    /// The object is still in use (EBUSY).
    Busy(String),
    /// The operation is not supported on this object (EOPNOTSUPP).
    NotSupported(String),
    /// The CQ overflowed and lost completions; it must be destroyed (EIO).
    CqOverrun(String),
}

impl Error {
    /// The errno a C caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            Error::ModifyQp(e) => e.errno(),
            Error::Invalid(_) | Error::NotFound(_) => 22,
            Error::NoMemory(_) => 12,
            Error::Busy(_) => 16,
            Error::NotSupported(_) => 95,
            Error::CqOverrun(_) => 5,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(m) => write!(f, "invalid argument: {m}"),
            Error::ModifyQp(e) => write!(f, "{e}"),
            Error::NoMemory(m) => write!(f, "out of resources: {m}"),
            Error::NotFound(m) => write!(f, "no such object: {m}"),
            Error::Busy(m) => write!(f, "busy: {m}"),
            Error::NotSupported(m) => write!(f, "not supported: {m}"),
            Error::CqOverrun(m) => write!(f, "CQ overrun: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ModifyQpError> for Error {
    fn from(e: ModifyQpError) -> Self {
        Error::ModifyQp(e)
    }
}

/// Result of a verbs-level call.
pub type Result<T> = std::result::Result<T, Error>;
