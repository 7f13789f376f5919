//! One writer at a time: a writer creates the `writer` object (create-only,
//! so two cannot both win) naming itself and since when, and removes it
//! when done. A writer that died leaves it; the next one is refused until
//! someone takes the claim over explicitly. The catalog's create-only
//! commits guard the data even so: a writer that lost its claim cannot
//! commit over a newer generation.

use crate::archive::Archive;
use crate::error::{ArchiveError, Result};
use grove_objects::ErrorKind;
use std::time::{SystemTime, UNIX_EPOCH};

/// The claim's object name.
pub(crate) const WRITER_OBJECT: &str = "writer";

/// The claim on an archive; released when dropped.
#[derive(Debug)]
pub struct WriterLock<'a> {
    archive: &'a Archive,
    released: bool,
}

fn now_unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// Claims `archive` for writing; with `take_over`, an existing claim is
/// removed first (its holder must be gone).
pub fn claim(archive: &Archive, take_over: bool) -> Result<WriterLock<'_>> {
    let me = format!(
        "{} pid {} since {}\n",
        hostname(),
        std::process::id(),
        now_unix_secs()
    );
    if take_over {
        archive.delete_objects(&[WRITER_OBJECT.to_string()])?;
    }
    match archive.create_object(WRITER_OBJECT, me.as_bytes()) {
        Ok(()) => Ok(WriterLock {
            archive,
            released: false,
        }),
        Err(ArchiveError::Store(e)) if e.kind() == ErrorKind::AlreadyExists => {
            Err(ArchiveError::Busy(busy_message(archive)))
        }
        Err(e) => Err(e),
    }
}

fn busy_message(archive: &Archive) -> String {
    let holder = archive
        .get_object(WRITER_OBJECT)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_else(|| "a writer that just finished".into());
    let since = holder
        .rsplit_once(" since ")
        .and_then(|(who, t)| Some((who.to_string(), t.parse::<u64>().ok()?)));
    let holder = match since {
        Some((who, t)) => format!("{who} since {}", grove_retention::calendar::display(t)),
        None => holder,
    };
    format!(
        "archive {} is in use by {holder}; if that writer is gone, run again with --take-over",
        archive.describe()
    )
}

impl WriterLock<'_> {
    /// Gives the claim back.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.archive.delete_objects(&[WRITER_OBJECT.to_string()])
    }
}

impl Drop for WriterLock<'_> {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.archive.delete_objects(&[WRITER_OBJECT.to_string()]);
        }
    }
}
