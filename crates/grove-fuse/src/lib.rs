//! grove-fuse: a pool's volumes as regular files through FUSE.
//!
//! `MOUNTPOINT/NAME` is a regular file of the volume's exact size for every
//! volume, snapshot and clone. Snapshots (and every file, on a read-only
//! mount) have mode 0444 and refuse writes with EROFS. The directory is read
//! from the pool on every lookup, so volumes created, resized or removed
//! while mounted (for example through `grove`'s control socket) appear,
//! change and disappear at once: attributes and entries are never cached
//! by the kernel.
//!
//! Every file is opened in direct-I/O mode: reads and writes go straight to
//! the engine, never through the kernel's page cache. That keeps the files
//! coherent with NBD clients writing the same volumes from the same process,
//! and makes a snapshot hold every write the file acknowledged. fsync and
//! close flush the engine; FALLOC_FL_PUNCH_HOLE and FALLOC_FL_ZERO_RANGE
//! unmap; SEEK_DATA and SEEK_HOLE come from the radix tree.
//!
//! With [`MountOptions::archived`], `MOUNTPOINT/archive/` holds read-only
//! files the binary provides that are not volumes (archived snapshots),
//! through [`ReadOnlyFiles`]; damage reads as EIO.
//!
//! Limits, each a named constant: [`MAX_WRITE_BYTES`] (largest read or write
//! request the kernel sends), [`SESSION_THREADS`] (requests served at once)
//! and [`MAX_BACKGROUND_REQUESTS`] (asynchronous requests the kernel queues).
//!
//! ```no_run
//! let pool = grove_store::Pool::open("pool".as_ref())?;
//! let mount = grove_fuse::mount(pool, "/mnt/grove".as_ref(), &Default::default(), || {})?;
//! // ... later:
//! mount.unmount()?;
//! mount.join()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod answer;
mod archived;
mod errno;
mod fs;
mod kernel;
mod mount;
pub mod raif;
pub mod seek;

pub use archived::{ReadOnlyFile, ReadOnlyFiles, ARCHIVE_DIR_NAME};
pub use errno::{data_errno, errno_for};
pub use kernel::{MAX_BACKGROUND_REQUESTS, MAX_WRITE_BYTES, SESSION_THREADS};
pub use mount::{check_mount_possible, mount, Mount, MountError, MountOptions, FUSE_DEVICE_PATH};
