//! The archive's error: what went wrong, in one line naming the archive,
//! the snapshot or the object.

/// An archive command's failure.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The object store failed or refused.
    #[error("{0}")]
    Store(#[from] grove_objects::Error),
    /// The pool failed or refused.
    #[error("{0}")]
    Pool(#[from] grove_store::Error),
    /// What the archive holds is damaged: a missing, truncated or foreign
    /// object, or a checksum that does not match.
    #[error("{0}")]
    Damaged(String),
    /// Another writer holds the archive.
    #[error("{0}")]
    Busy(String),
    /// The request cannot be done as asked.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, ArchiveError>;
