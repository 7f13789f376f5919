//! grove's store in RADOS objects: a [`RadosDevice`] is a grove
//! `BlockDevice` whose bytes are striped over RADOS objects of a fixed size
//! (4 MiB by default, as RBD's), owned by one process at a time under an
//! exclusive RADOS lock, and taken over from a gone or hung owner by
//! fencing it (blocklisting its client) before breaking its lock.
//!
//! The cluster is reached through librados with the `ceph` crate, as the
//! `rados` tool reaches it: `$CEPH_CONF` and the keyring it names.

mod batch;
mod cluster;
mod device;
mod fence;
mod header;
mod io_pool;
mod layout;
mod lock_info;
mod open;
mod ownership;
mod settings;
mod space;
mod target;
mod written;

pub use device::RadosDevice;
pub use layout::OBJECT_SIZE_DEFAULT;
pub use open::Claim;
pub use settings::read_settings;
pub use target::{RadosTarget, SCHEME};
