//! What a holder does once the cluster fenced it: it learns so from the
//! first write the OSDs refuse (EBLOCKLISTED), and from then on refuses
//! every write itself, with one line, instead of sending more.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) struct Fence {
    tripped: AtomicBool,
    location: String,
}

impl Fence {
    pub(crate) fn new(location: String) -> Fence {
        Fence {
            tripped: AtomicBool::new(false),
            location,
        }
    }

    pub(crate) fn is_tripped(&self) -> bool {
        self.tripped.load(Ordering::Acquire)
    }

    /// Fails once the device is fenced; callers check before every write.
    pub(crate) fn check(&self) -> io::Result<()> {
        if self.is_tripped() {
            return Err(self.error());
        }
        Ok(())
    }

    /// Records that the OSDs refused this client, and returns the error
    /// every later write gets too.
    pub(crate) fn trip(&self) -> io::Error {
        if !self.tripped.swap(true, Ordering::AcqRel) {
            tracing::error!("{}", self.error());
        }
        debug_assert!(self.is_tripped());
        self.error()
    }

    fn error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "this host was fenced: {} was taken over by another host (the cluster blocklisted this client; it writes nothing more)",
                self.location
            ),
        )
    }
}
