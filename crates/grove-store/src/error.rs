//! The engine's error type: a kind that callers can match on (and map to
//! exit codes, errnos and NBD errors) plus a message naming the object.

use std::io;

/// What went wrong, independent of the wording.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ErrorKind {
    /// A volume or pool that does not exist.
    NotFound,
    /// A name that is already taken, or a pool that already exists.
    AlreadyExists,
    /// A write or change to a read-only snapshot.
    ReadOnly,
    /// An offset or length outside a volume.
    OutOfRange,
    /// A malformed argument: a bad size, name or block size.
    InvalidArgument,
    /// A directory or file that is not a grove pool.
    NotAPool,
    /// A pool written by a newer grove.
    UnsupportedVersion,
    /// Metadata that fails its checksum or its structural checks.
    Corrupt,
    /// The store cannot grow: the pool's capacity or the host file system is full.
    NoSpace,
    /// Another process holds the pool.
    Busy,
    /// The operation needs something a volume does not allow (for example
    /// removing a volume that still has dependents where that is refused).
    InvalidState,
    /// An I/O error from the device underneath.
    Io,
}

/// An engine error: a kind and a one-line message that names the object and
/// the reason.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<io::Error>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Wraps an I/O error with the operation and object it came from. ENOSPC
    /// and EDQUOT become `NoSpace`, so callers can tell a full disk apart.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        let kind = match source.raw_os_error() {
            Some(code) if code == rustix::io::Errno::NOSPC.raw_os_error() => ErrorKind::NoSpace,
            Some(code) if code == rustix::io::Errno::DQUOT.raw_os_error() => ErrorKind::NoSpace,
            _ if source.kind() == io::ErrorKind::StorageFull => ErrorKind::NoSpace,
            _ => ErrorKind::Io,
        };
        Error {
            kind,
            message: format!("{}: {}", context.into(), source),
            source: Some(source),
        }
    }

    pub fn corrupt(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Corrupt, message)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
