//! The pool's settings (grove.toml's text) kept beside the device's objects,
//! in `NAME.settings`, so that another host opens the pool from its
//! `rados://` location alone. The holder of the lock writes it; anyone
//! reads it.

use crate::cluster::{self, errno, io_error, ENOENT};
use crate::device::RadosDevice;
use crate::target::RadosTarget;
use std::io;

/// grove.toml is a few KiB; more than this is not one.
const SETTINGS_BYTES_MAX: usize = 1 << 20;

fn settings_object(target: &RadosTarget) -> String {
    format!("{}.settings", target.name)
}

/// The settings stored for `target`, or None if none are.
pub fn read_settings(target: &RadosTarget) -> io::Result<Option<Vec<u8>>> {
    let ioctx = cluster::io_context(target)?;
    let name = settings_object(target);
    let mut bytes = Vec::with_capacity(SETTINGS_BYTES_MAX);
    match ioctx.rados_object_read(&name, &mut bytes, 0) {
        Ok(_) => {
            bytes.truncate(SETTINGS_BYTES_MAX);
            Ok(Some(bytes))
        }
        Err(e) if errno(&e) == Some(ENOENT) => Ok(None),
        Err(e) => Err(io_error(&format!("cannot read RADOS object {name}"), &e)),
    }
}

impl RadosDevice {
    /// Replaces the stored settings (atomically: one full-object write).
    pub fn write_settings(&self, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() > SETTINGS_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "settings of {} bytes are larger than {SETTINGS_BYTES_MAX}",
                    bytes.len()
                ),
            ));
        }
        self.shared.fence.check()?;
        let name = settings_object(&self.shared.target);
        self.shared
            .ioctx
            .rados_object_write_full(&name, bytes)
            .map_err(|e| self.shared.failed("cannot write", &name, &e))
    }
}
