//! Errors of the server API, and the mapping from engine errors to the
//! errors the NBD protocol lets a server send.

use std::io;

use grove_store::ErrorKind;

use crate::codec::*;

/// What kind of failure a server call hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NbdErrorKind {
    /// Binding or preparing a listener failed.
    Listen,
    /// The address is taken by a live server.
    AddressInUse,
    /// An argument was malformed: an address, a path.
    InvalidArgument,
    /// The server is shut down and cannot serve again.
    ShutDown,
    /// Flushing the pool at shutdown failed.
    Flush,
}

/// An error from the server API, with its kind and a message that names
/// the object and the reason.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct NbdError {
    kind: NbdErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl NbdError {
    pub(crate) fn new(kind: NbdErrorKind, message: impl Into<String>) -> Self {
        NbdError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn io(kind: NbdErrorKind, context: impl Into<String>, source: io::Error) -> Self {
        NbdError {
            kind,
            message: format!("{}: {source}", context.into()),
            source: Some(Box::new(source)),
        }
    }

    pub(crate) fn engine(
        kind: NbdErrorKind,
        context: impl Into<String>,
        source: grove_store::Error,
    ) -> Self {
        NbdError {
            kind,
            message: format!("{}: {source}", context.into()),
            source: Some(Box::new(source)),
        }
    }

    pub fn kind(&self) -> NbdErrorKind {
        self.kind
    }
}

/// The NBD error for an engine error that `command` ran into. Every engine
/// kind is named, so that a new kind fails to compile here until someone
/// decides what a client should see for it.
pub fn nbd_error_for(kind: ErrorKind, command: Command) -> u32 {
    match kind {
        // Writes to a snapshot; the protocol's answer for read-only exports.
        ErrorKind::ReadOnly => NBD_EPERM,
        // Past the end: proto.md asks for ENOSPC on writes and EINVAL on
        // reads, trims and status queries. The export size is checked
        // before the engine runs, so this means the volume shrank under us.
        ErrorKind::OutOfRange => match command {
            Command::Write | Command::WriteZeroes => NBD_ENOSPC,
            _ => NBD_EINVAL,
        },
        ErrorKind::NoSpace => NBD_ENOSPC,
        ErrorKind::InvalidArgument => NBD_EINVAL,
        // Failures of the storage underneath, and metadata that fails its
        // checks: the client can only know that the I/O failed.
        ErrorKind::Io | ErrorKind::Corrupt => NBD_EIO,
        // The volume was removed (or the pool changed) while it was
        // exported: the data is gone, which is an I/O failure to the client.
        ErrorKind::NotFound | ErrorKind::NotAPool | ErrorKind::UnsupportedVersion => NBD_EIO,
        // Another process holds the pool, or the volume is in a state that
        // refuses the operation: not permitted now.
        ErrorKind::Busy | ErrorKind::InvalidState => NBD_EPERM,
        // Names only clash on create and rename, which NBD never does.
        ErrorKind::AlreadyExists => NBD_EINVAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_protocol_errors() {
        let cases = [
            (ErrorKind::ReadOnly, Command::Write, NBD_EPERM),
            (ErrorKind::OutOfRange, Command::Write, NBD_ENOSPC),
            (ErrorKind::OutOfRange, Command::Read, NBD_EINVAL),
            (ErrorKind::NoSpace, Command::Write, NBD_ENOSPC),
            (ErrorKind::Io, Command::Flush, NBD_EIO),
            (ErrorKind::Corrupt, Command::Read, NBD_EIO),
        ];
        for (kind, command, expected) in cases {
            assert_eq!(
                nbd_error_for(kind, command),
                expected,
                "{kind:?} {command:?}"
            );
        }
    }
}
