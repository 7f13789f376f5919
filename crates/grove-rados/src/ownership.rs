//! One writer at a time: an exclusive RADOS lock on the header object,
//! whose description names the holder (host, pid, since when). Taking over
//! from a holder that is gone or hung fences it first, as RBD's exclusive
//! lock does: its client is blocklisted in the OSD map, so the OSDs refuse
//! whatever it still sends, and only then is its lock broken.

use crate::cluster::{self, describe, errno, io_error, EBUSY};
use crate::lock_info::{self, Locker};
use crate::target::RadosTarget;
use ceph::ceph::{IoCtx, Rados};
use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

/// The lock's name on the header object.
const LOCK_NAME: &str = "grove";

/// What the OSD's `lock` class returns at most; more is -ERANGE.
const LOCK_INFO_BYTES: usize = 64 << 10;

/// Takes the exclusive lock on `header`; returns the cookie it holds it
/// with. A lock held by someone else fails with one line naming them.
pub(crate) fn lock(ioctx: &IoCtx, header: &str, target: &RadosTarget) -> io::Result<String> {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let host = hostname();
    let pid = std::process::id();
    // Unique per opener, so that two opens in one process exclude each other.
    let cookie = format!("{host}/{pid}/{since}/{}", next_serial());
    let description = format!("host={host} pid={pid} since={since}");
    // A zero duration: the lock never expires; a holder is removed only by
    // a takeover, which fences it.
    let mut forever = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    match ioctx.rados_object_lock_exclusive(
        header,
        LOCK_NAME,
        &cookie,
        &description,
        &mut forever,
        0,
    ) {
        Ok(()) => Ok(cookie),
        Err(e) if errno(&e) == Some(EBUSY) => Err(busy(ioctx, header, target)),
        Err(e) => Err(io_error(&format!("cannot lock {}", target.location()), &e)),
    }
}

fn next_serial() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// The error for a lock someone else holds.
fn busy(ioctx: &IoCtx, header: &str, target: &RadosTarget) -> io::Error {
    let holder = match lockers(ioctx, header) {
        Ok(lockers) if !lockers.is_empty() => holder_text(&lockers[0]),
        Ok(_) => "a holder that just let go".to_string(),
        Err(e) => format!("a holder that cannot be named ({e})"),
    };
    io::Error::new(
        io::ErrorKind::WouldBlock,
        format!(
            "{} is in use by {holder}; if that host is gone or hung, take it over (--takeover fences it first)",
            target.location()
        ),
    )
}

/// "host H, pid P, since T (client.N at ADDR)".
fn holder_text(locker: &Locker) -> String {
    let field = |key: &str| {
        locker
            .description
            .split_whitespace()
            .find_map(|word| word.strip_prefix(key))
            .unwrap_or("?")
            .to_string()
    };
    let since = field("since=");
    let since = since
        .parse::<u64>()
        .map(grove_retention::calendar::display)
        .unwrap_or(since);
    format!(
        "host {}, pid {}, since {since} ({} at {})",
        field("host="),
        field("pid="),
        locker.client,
        locker.addr
    )
}

/// Who holds the lock on `header`, through the OSD's lock class.
pub(crate) fn lockers(ioctx: &IoCtx, header: &str) -> io::Result<Vec<Locker>> {
    let mut reply = vec![0u8; LOCK_INFO_BYTES];
    match ioctx.rados_object_exec(
        header,
        "lock",
        "get_info",
        &lock_info::encode_request(LOCK_NAME),
        &mut reply,
    ) {
        Ok(()) => lock_info::decode_reply(&reply),
        Err(e) if errno(&e) == Some(cluster::ENOENT) => Ok(Vec::new()),
        Err(e) => Err(io_error(
            &format!("cannot read the lock on RADOS object {header}"),
            &e,
        )),
    }
}

/// Gives the lock back (a clean close).
pub(crate) fn unlock(ioctx: &IoCtx, header: &str, cookie: &str) -> io::Result<()> {
    ioctx
        .rados_object_unlock(header, LOCK_NAME, cookie)
        .map_err(|e| io_error(&format!("cannot unlock RADOS object {header}"), &e))
}

/// Fences every holder of the lock on `header` and breaks its lock: each
/// holder's client is blocklisted, this client waits for the OSD map that
/// says so, and only then are the locks broken. Returns who was fenced.
pub(crate) fn fence_holders(rados: &Rados, ioctx: &IoCtx, header: &str) -> io::Result<Vec<String>> {
    let started = std::time::Instant::now();
    let holders = lockers(ioctx, header)?;
    tracing::debug!("lockers read after {:?}", started.elapsed());
    for holder in &holders {
        blocklist(rados, &holder.addr)?;
    }
    tracing::debug!("blocklisted after {:?}", started.elapsed());
    if !holders.is_empty() {
        wait_for_latest_osd_map(rados);
    }
    tracing::debug!("osd map after {:?}", started.elapsed());
    let mut fenced = Vec::new();
    for holder in &holders {
        match ioctx.rados_object_break_lock(header, LOCK_NAME, &holder.client, &holder.cookie) {
            Ok(()) => {}
            // Gone already: it unlocked, or another takeover broke it.
            Err(e) if errno(&e) == Some(cluster::ENOENT) => {}
            Err(e) => {
                return Err(io_error(
                    &format!("cannot break {}'s lock on {header}", holder.client),
                    &e,
                ))
            }
        }
        fenced.push(holder_text(holder));
    }
    tracing::debug!("locks broken after {:?}", started.elapsed());
    debug_assert!(lockers(ioctx, header).map_or(true, |l| l.iter().all(|h| !holders.contains(h))));
    Ok(fenced)
}

/// Adds `addr` to the OSD map's blocklist (`ceph osd blocklist add`).
fn blocklist(rados: &Rados, addr: &str) -> io::Result<()> {
    let command = serde_json::json!({
        "prefix": "osd blocklist",
        "blocklistop": "add",
        "addr": addr,
    });
    rados
        .ceph_mon_command_without_data(&command)
        .map(|_| ())
        .map_err(|e| io::Error::other(format!("cannot blocklist client {addr}: {}", describe(&e))))
}

/// Makes this client fetch the newest OSD map, so that its next requests
/// carry an epoch at least the blocklist's, and the OSDs apply the
/// blocklist before they serve them. The binding does not wrap
/// rados_wait_for_latest_osdmap; looking up a pool that does not exist
/// does the same wait inside librados (RadosClient::lookup_pool fetches
/// the latest map before it answers "no such pool").
fn wait_for_latest_osd_map(rados: &Rados) {
    let probe = format!("grove-rados-osdmap-probe-{}", std::process::id());
    let _ = rados.rados_lookup_pool(&probe);
}
