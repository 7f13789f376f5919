//! Engine errors as errnos, exhaustively: a new error kind fails to compile
//! here until someone decides what FUSE callers see for it.

use fuser::Errno;
use grove_store::ErrorKind;

/// The errno for an engine error in a metadata request (lookup, getattr,
/// open): a volume that is gone is ENOENT.
pub fn errno_for(kind: ErrorKind) -> Errno {
    match kind {
        ErrorKind::NotFound => Errno::ENOENT,
        ErrorKind::AlreadyExists => Errno::EEXIST,
        ErrorKind::ReadOnly => Errno::EROFS,
        ErrorKind::OutOfRange => Errno::EINVAL,
        ErrorKind::InvalidArgument => Errno::EINVAL,
        ErrorKind::InvalidState => Errno::EINVAL,
        ErrorKind::NoSpace => Errno::ENOSPC,
        ErrorKind::Busy => Errno::EBUSY,
        // Damage and device failures are I/O errors to the caller; the
        // daemon logs the engine's message, which names the object.
        ErrorKind::NotAPool | ErrorKind::UnsupportedVersion | ErrorKind::Corrupt => Errno::EIO,
        ErrorKind::Io => Errno::EIO,
    }
}

/// The errno for an engine error in a data request (read, write, fsync,
/// fallocate, lseek) on an open file. A volume removed under an open file
/// is a disk that went away: EIO, as a block device would say.
pub fn data_errno(kind: ErrorKind) -> Errno {
    match kind {
        ErrorKind::NotFound => Errno::EIO,
        other => errno_for(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_volume_is_enoent_for_metadata_and_eio_for_data() {
        assert_eq!(errno_for(ErrorKind::NotFound), Errno::ENOENT);
        assert_eq!(data_errno(ErrorKind::NotFound), Errno::EIO);
        assert_eq!(data_errno(ErrorKind::ReadOnly), Errno::EROFS);
        assert_eq!(data_errno(ErrorKind::NoSpace), Errno::ENOSPC);
    }
}
