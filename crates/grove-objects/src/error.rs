//! The crate's error: a kind to match on and a one-line message that names
//! the store, the stream or the object.

use std::fmt;

/// What went wrong, for callers that react differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The store URL is malformed or names an unsupported scheme.
    InvalidUrl,
    /// Configuration from the environment is missing or unusable
    /// (credentials, endpoint).
    Config,
    /// A stream or stream name, part, cursor or size the API refuses.
    InvalidInput,
    /// The stream, part or object does not exist.
    NotFound,
    /// A create-only object already exists (a stream already complete).
    AlreadyExists,
    /// What is stored does not make a well-formed stream (a missing part,
    /// a part shorter than listed, a complete marker that disagrees).
    Corrupt,
    /// The store failed: a request or a local file operation.
    Io,
}

/// An error with its kind and a one-line message.
#[derive(Debug, Clone, thiserror::Error)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        // Messages are one line, even when a library's own error had several.
        let message = message.into().replace('\n', "; ");
        Error { kind, message }
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
