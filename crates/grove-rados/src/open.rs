//! Making and opening a RadosDevice: take the exclusive lock (fencing the
//! old holder first on a takeover), then read or write the header.

use crate::cluster::{self, errno, io_error, ENOENT};
use crate::device::{RadosDevice, Shared};
use crate::fence::Fence;
use crate::header::Header;
use crate::layout::{self, OBJECT_SIZE_MAX, OBJECT_SIZE_MIN};
use crate::ownership;
use crate::target::RadosTarget;
use ceph::ceph::IoCtx;
use std::io;
use std::sync::Mutex;

/// How to claim a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Make a new, empty device with objects of this size.
    Create { object_size: u64 },
    /// Open an existing one; refused while another holder has it.
    Open,
    /// Open an existing one held by a host that is gone or hung: fence that
    /// host (blocklist its client), break its lock, take the lock.
    Takeover,
}

/// Bytes read of a header, more than any header takes.
const HEADER_READ_BYTES: usize = 4096;

impl RadosDevice {
    /// Claims the device at `target` for this process alone; see [`Claim`].
    /// A device held by someone else fails with one line naming the holder.
    pub fn open_exclusive(target: &RadosTarget, claim: Claim) -> io::Result<RadosDevice> {
        if let Claim::Create { object_size } = claim {
            check_object_size(object_size)?;
        }
        let ioctx = cluster::io_context(target)?;
        let header_name = layout::header_object(&target.name);
        if claim == Claim::Takeover {
            let rados = cluster::connection(target)?;
            for holder in ownership::fence_holders(rados, &ioctx, &header_name)? {
                tracing::warn!("{}: fenced and took over from {holder}", target.location());
            }
        }
        let cookie = ownership::lock(&ioctx, &header_name, target)?;
        match settle_header(&ioctx, &header_name, target, claim) {
            Ok(header) => RadosDevice::from_shared(Shared {
                ioctx,
                target: target.clone(),
                object_size: header.object_size,
                len_bytes: Mutex::new(header.len_bytes),
                fence: Fence::new(target.location()),
                cookie,
                space: Default::default(),
            }),
            Err(e) => {
                let _ = ownership::unlock(&ioctx, &header_name, &cookie);
                Err(e)
            }
        }
    }
}

fn check_object_size(object_size: u64) -> io::Result<()> {
    if !(OBJECT_SIZE_MIN..=OBJECT_SIZE_MAX).contains(&object_size) || !object_size.is_power_of_two()
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "object size {object_size} must be a power of two from {OBJECT_SIZE_MIN} to {OBJECT_SIZE_MAX}"
            ),
        ));
    }
    Ok(())
}

/// Under the lock: writes a new device's header, or reads an existing one's.
fn settle_header(
    ioctx: &IoCtx,
    name: &str,
    target: &RadosTarget,
    claim: Claim,
) -> io::Result<Header> {
    let existing = read_header(ioctx, name, target)?;
    match (claim, existing) {
        (Claim::Create { object_size }, None) => {
            let header = Header {
                object_size,
                len_bytes: 0,
            };
            ioctx
                .rados_object_write_full(name, &header.encode())
                .map_err(|e| io_error(&format!("cannot write RADOS object {name}"), &e))?;
            Ok(header)
        }
        (Claim::Create { .. }, Some(_)) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} already exists", target.location()),
        )),
        (_, Some(header)) => Ok(header),
        (_, None) => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} does not exist (no header object {name})",
                target.location()
            ),
        )),
    }
}

/// The header, or None if there is none yet. Taking the lock creates the
/// header object empty, so empty counts as none.
fn read_header(ioctx: &IoCtx, name: &str, target: &RadosTarget) -> io::Result<Option<Header>> {
    let mut bytes = Vec::with_capacity(HEADER_READ_BYTES);
    match ioctx.rados_object_read(name, &mut bytes, 0) {
        Ok(_) if bytes.is_empty() => Ok(None),
        Ok(_) => Header::decode(&bytes, name).map(Some),
        Err(e) if errno(&e) == Some(ENOENT) => Ok(None),
        Err(e) => Err(io_error(
            &format!("cannot read the header of {}", target.location()),
            &e,
        )),
    }
}
