//! What both file systems (the volume files of `fs.rs` and RAIF's) ask of
//! the kernel alike: the limits of a session, no caching of attributes,
//! how files open, and the session's configuration. Neither file system
//! decides these on its own.

use std::sync::Mutex;
use std::time::Duration;

use fuser::{Config, FopenFlags, InitFlags, KernelConfig, MountOption, SessionACL};

/// Largest read or write one FUSE request carries (the kernel's own cap,
/// 256 pages, on most machines).
pub const MAX_WRITE_BYTES: u32 = 1024 * 1024;
/// Threads reading requests from the kernel, each on its own cloned
/// /dev/fuse descriptor: how many requests are served at once.
pub const SESSION_THREADS: usize = 4;
/// Asynchronous requests (direct I/O, readahead) the kernel keeps queued.
pub const MAX_BACKGROUND_REQUESTS: u16 = 64;

/// stat's st_blocks counts 512-byte units, whatever the file system's
/// block size.
pub(crate) const STAT_BLOCK_BYTES: u64 = 512;

/// Attributes and entries are not cached: a volume resized or removed
/// through the control socket, or a file changed on a branch, must show at
/// once.
pub(crate) const TTL: Duration = Duration::ZERO;

/// How the files of a mount open. Direct I/O keeps the page cache out
/// between a file and what lies under it, and with FUSE_DIRECT_IO_ALLOW_MMAP
/// (Linux 6.6) such files can still be mapped shared: pages written
/// through a mapping arrive as write requests, and msync is an fsync. An
/// older kernel answers ENODEV to a shared mapping of a direct I/O file,
/// so there files use the page cache instead (invalidated at each open)
/// and mapping them works.
pub(crate) fn open_flags(config: &mut KernelConfig) -> FopenFlags {
    match config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
        Ok(()) => FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        Err(_) => {
            tracing::info!("the kernel cannot map direct I/O files: files use the page cache");
            FopenFlags::empty()
        }
    }
}

/// A session's configuration: its name as mount(8) shows it
/// (`fuse.NAME`), the kernel checking mode bits, `options` besides, and
/// who may reach the files.
pub(crate) fn session_config(name: &str, options: Vec<MountOption>, allow_other: bool) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(name.into()),
        MountOption::Subtype(name.into()),
        MountOption::DefaultPermissions,
    ];
    config.mount_options.extend(options);
    config.acl = if allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(SESSION_THREADS);
    config.clone_fd = true;
    config
}

/// What to call once when a mount goes away, whichever way it goes.
pub(crate) struct OnEnd(Mutex<Option<Box<dyn FnOnce() + Send>>>);

impl OnEnd {
    pub(crate) fn new(on_end: Box<dyn FnOnce() + Send>) -> OnEnd {
        OnEnd(Mutex::new(Some(on_end)))
    }

    /// Calls it, the first time only.
    pub(crate) fn run(&self) {
        let on_end = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(on_end) = on_end {
            on_end();
        }
    }
}
