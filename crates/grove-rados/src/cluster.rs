//! The connection to the cluster, and what librados's errors mean to us.
//!
//! The binding's connection handle (`ceph::ceph::Rados`) is Sync but not
//! Send, so it cannot live in a device that threads share; and shutting it
//! down while an IoCtx is in use is undefined. So each process keeps one
//! connection per (configuration, client id) for its whole life, leaked on
//! purpose, as a server keeps its one cluster handle: every device borrows
//! it and owns only its IoCtx.

use crate::target::RadosTarget;
use ceph::ceph::{connect_to_ceph, IoCtx, Rados};
use ceph::error::RadosError;
use std::collections::HashMap;
use std::io;
use std::sync::{Mutex, OnceLock};

/// librados's "this client is blocklisted" (EBLOCKLISTED is ESHUTDOWN).
pub(crate) const EBLOCKLISTED: i32 = 108;
pub(crate) const ENOENT: i32 = 2;
pub(crate) const EBUSY: i32 = 16;

type Connections = Mutex<HashMap<(std::path::PathBuf, String), &'static Rados>>;

/// The process's connection for `target`'s configuration and client.
pub(crate) fn connection(target: &RadosTarget) -> io::Result<&'static Rados> {
    static CONNECTIONS: OnceLock<Connections> = OnceLock::new();
    let key = (target.conf.clone(), target.client_id.clone());
    let mut map = CONNECTIONS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(rados) = map.get(&key) {
        return Ok(rados);
    }
    let conf = target.conf.to_string_lossy();
    let rados = connect_to_ceph(&target.client_id, &conf).map_err(|e| {
        io::Error::other(format!(
            "cannot connect to Ceph as client.{} with {conf}: {}",
            target.client_id,
            describe(&e)
        ))
    })?;
    let rados: &'static Rados = Box::leak(Box::new(rados));
    map.insert(key, rados);
    Ok(rados)
}

/// An IoCtx on `target`'s pool.
pub(crate) fn io_context(target: &RadosTarget) -> io::Result<IoCtx> {
    connection(target)?
        .get_rados_ioctx(&target.pool)
        .map_err(|e| {
            io::Error::other(format!(
                "cannot open RADOS pool {}: {}",
                target.pool,
                describe(&e)
            ))
        })
}

/// The errno of a failed librados call, when it was one.
pub(crate) fn errno(error: &RadosError) -> Option<i32> {
    match error {
        RadosError::ApiError(e) => Some(*e as i32),
        _ => None,
    }
}

/// The error in words, with its errno name where there is one.
pub(crate) fn describe(error: &RadosError) -> String {
    match errno(error) {
        Some(n) => format!("{} (errno {n})", io::Error::from_raw_os_error(n)),
        None => error.to_string(),
    }
}

/// An io::Error carrying the errno, so callers can match on its kind, with
/// one line naming what failed.
pub(crate) fn io_error(what: &str, error: &RadosError) -> io::Error {
    let message = format!("{what}: {}", describe(error));
    match errno(error) {
        Some(n) => io::Error::new(io::Error::from_raw_os_error(n).kind(), message),
        None => io::Error::other(message),
    }
}
