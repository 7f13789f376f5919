//! Pools whose store lives in RADOS (`--pool rados://CEPHPOOL/NAME`): the
//! store is a grove-rados `RadosDevice` under the engine, as a branch pool's
//! is a `BranchDevice`. What is local to a host (grove.toml's copy, the
//! control and NBD sockets) lives in a directory named after the location,
//! under `$GROVE_RADOS_DIR` (default /var/tmp/grove-rados): a host that has
//! none yet makes it from the settings kept in RADOS, so the location alone
//! opens the pool anywhere. The device's exclusive lock makes the process
//! holding it the pool's one writer; `grove serve --takeover` fences the
//! old holder first.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use grove_rados::{Claim, RadosDevice, RadosTarget, OBJECT_SIZE_DEFAULT};
use grove_store::config::{PoolConfig, CONFIG_FILE_NAME};
use grove_store::{Error, ErrorKind, Pool, PoolOptions, SpaceSettings};

/// Where the host-local directories of RADOS pools live.
const LOCAL_DIR_ENV: &str = "GROVE_RADOS_DIR";
const LOCAL_DIR_DEFAULT: &str = "/var/tmp/grove-rados";

/// Set by `grove serve --takeover`: this process's open fences the holder.
static TAKEOVER: AtomicBool = AtomicBool::new(false);

/// Makes the next opens of RADOS pools in this process take them over from
/// their holder (fencing it) instead of being refused.
pub fn take_over_on_open() {
    TAKEOVER.store(true, Ordering::Release);
}

/// For `--pool`: a `rados://` location becomes its host-local directory
/// (made if missing) and its target; anything else stays a directory.
pub fn resolve(pool: PathBuf) -> grove_store::Result<(PathBuf, Option<RadosTarget>)> {
    let text = pool.to_string_lossy();
    if !text.starts_with(grove_rados::SCHEME) {
        return Ok((pool, None));
    }
    let target = RadosTarget::parse(&text)
        .map_err(|e| Error::new(ErrorKind::InvalidArgument, e.to_string()))?;
    let base = std::env::var_os(LOCAL_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(LOCAL_DIR_DEFAULT), PathBuf::from);
    let dir = base.join(&target.pool).join(&target.name);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("cannot make {}", dir.display()), e))?;
    Ok((dir, Some(target)))
}

/// Brings the settings kept in RADOS into `dir`'s grove.toml when the host
/// has none (a pool made on another host). Nothing there: not a pool yet.
pub fn fetch_settings(dir: &Path, target: &RadosTarget) -> grove_store::Result<()> {
    if dir.join(CONFIG_FILE_NAME).exists() {
        return Ok(());
    }
    let location = target.location();
    let Some(bytes) = grove_rados::read_settings(target).map_err(|e| rados_error(&location, e))?
    else {
        return Ok(());
    };
    // Written whole under another name, then renamed: a crash leaves no
    // half grove.toml; PoolConfig::load checks it like any other.
    let path = dir.join(CONFIG_FILE_NAME);
    let temp = dir.join(format!("{CONFIG_FILE_NAME}.fetched"));
    std::fs::write(&temp, &bytes)
        .and_then(|()| std::fs::rename(&temp, &path))
        .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
}

/// `grove init --pool rados://...`: a new device, formatted, its settings
/// stored beside it.
pub fn create_pool(
    dir: &Path,
    target: &RadosTarget,
    options: &PoolOptions,
    space: &SpaceSettings,
) -> grove_store::Result<(Pool, String)> {
    let location = target.location();
    let claim = Claim::Create {
        object_size: OBJECT_SIZE_DEFAULT,
    };
    let device = Arc::new(
        RadosDevice::open_exclusive(target, claim).map_err(|e| rados_error(&location, e))?,
    );
    let mut config = PoolConfig::new();
    config.rados = Some(location.clone());
    let pool = Pool::create_on_device(dir, device.clone(), options, space, config)?;
    store_settings(dir, &device)?;
    let layout = format!(
        "store in RADOS objects of {} MiB",
        OBJECT_SIZE_DEFAULT >> 20
    );
    Ok((pool, layout))
}

/// Copies `dir`'s grove.toml into RADOS.
fn store_settings(dir: &Path, device: &RadosDevice) -> grove_store::Result<()> {
    let path = dir.join(CONFIG_FILE_NAME);
    let text = std::fs::read(&path)
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    device
        .write_settings(&text)
        .map_err(|e| rados_error(&device_location(device), e))
}

fn device_location(device: &RadosDevice) -> String {
    use grove_store::BlockDevice;
    device.describe()
}

/// Opens the pool in `dir` whose grove.toml (`config`) names `location`.
pub fn open(dir: &Path, location: &str, config: &PoolConfig) -> grove_store::Result<Pool> {
    let target = RadosTarget::parse(location)
        .map_err(|e| Error::new(ErrorKind::InvalidArgument, e.to_string()))?;
    let claim = if TAKEOVER.load(Ordering::Acquire) {
        Claim::Takeover
    } else {
        Claim::Open
    };
    let device =
        RadosDevice::open_exclusive(&target, claim).map_err(|e| rados_error(location, e))?;
    Pool::open_on_device(dir, Arc::new(device), config)
}

/// The engine's error for grove-rados's: a device held elsewhere is Busy
/// (so commands turn to a daemon's control socket, as for a held pool).
fn rados_error(location: &str, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock => Error::new(ErrorKind::Busy, e.to_string()),
        std::io::ErrorKind::NotFound => Error::new(ErrorKind::NotAPool, e.to_string()),
        std::io::ErrorKind::AlreadyExists => Error::new(ErrorKind::AlreadyExists, e.to_string()),
        _ => Error::io(format!("RADOS pool {location}"), e),
    }
}
