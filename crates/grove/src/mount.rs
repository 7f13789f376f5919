//! `grove mount`: the pool's volumes as files through FUSE, plus the
//! control socket that lets the other grove commands work on the pool
//! meanwhile. By default the mount goes to the background once it is ready:
//! `grove mount` starts itself again with --foreground in a new session,
//! waits for it to say it is mounted (or to fail, and then reports its
//! error), and exits. Unmounting (`umount`, `fusermount3 -u`) or SIGINT or
//! SIGTERM end it: the session stops, the pool is flushed and closed.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};

use anyhow::{anyhow, bail, Context, Result};
use grove_fuse::MountOptions;
use grove_store::Pool;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::archive_exports::ArchivedSnapshots;
use crate::control::{open_pool_exclusive, ControlServer};
use crate::daemon::{serve_until_unmounted, MountEvent, WhenBusy};

/// Set by a backgrounding `grove mount` for the foreground copy it starts:
/// that copy prints READY_LINE on stdout once mounted, then detaches.
const DAEMON_ENV: &str = "GROVE_MOUNT_DAEMON";
/// What the background copy prints when the mount is ready.
const READY_LINE: &str = "grove-mount-ready";
/// How an error line of grove starts (see main.rs).
const ERROR_PREFIX: &str = "grove: error: ";

pub fn run(
    dir: &Path,
    degraded: bool,
    mountpoint: &Path,
    foreground: bool,
    log: Option<&Path>,
    options: MountOptions,
) -> Result<()> {
    grove_fuse::check_mount_possible(mountpoint)?;
    // Absolute before the background copy leaves the working directory.
    let log = log.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()));
    if let Some(log) = &log {
        crate::daemon::open_log(log)?;
    }
    let log = log.as_deref();
    let daemon = std::env::var_os(DAEMON_ENV).is_some();
    if !foreground && !daemon {
        return start_in_background(dir, degraded, mountpoint, log, &options);
    }
    let (dir, mountpoint) = settle(daemon, dir, mountpoint);
    let opened = open_pool_exclusive(&dir, degraded)?;
    let options = crate::archive_exports::with_archived_files(options, &opened.pool);
    let pool = opened.pool.clone();
    let branches = opened.clone();
    // Signals are caught before anything is mounted, so none is lost.
    let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install signal handlers")?;
    let watcher = crate::branch_pool::start_watcher(&opened)?;
    let control = ControlServer::start(opened, grove_nbd::SOCKET_MODE_DEFAULT)?;
    let background = crate::background::BackgroundWork::start(&pool)?;
    let (events, received) = mpsc::channel();
    let ended = events.clone();
    let mount = match grove_fuse::mount(pool.clone(), &mountpoint, &options, move || {
        let _ = ended.send(MountEvent::Unmounted);
    }) {
        Ok(mount) => mount,
        Err(e) => {
            background.stop_with(control, control_deadline(), watcher);
            return Err(anyhow!(e).context(format!(
                "cannot mount pool {} on {}",
                dir.display(),
                mountpoint.display()
            )));
        }
    };
    announce(&pool, &mountpoint, daemon, log)?;
    // After the announcement: a background mount's log is its file by now.
    crate::branch_pool::log_if_degraded(&branches);

    let detached = serve_until_unmounted(
        &mount,
        &mountpoint,
        signals,
        events,
        &received,
        WhenBusy::WarnFirst,
    )?;
    if detached {
        drop(mount);
    } else {
        mount.join()?;
    }
    background.stop_with(control, control_deadline(), watcher);
    pool.close()
        .with_context(|| format!("cannot close pool {}", dir.display()))?;
    tracing::info!("unmounted; pool flushed and closed");
    Ok(())
}

/// The copy that serves the mount settles in: as the background copy, a
/// session of its own (the terminal's hang-up and Ctrl-C no longer reach
/// it) and the working directory let go so it holds no mount. Returns the
/// pool directory and the mount point as absolute paths.
fn settle(daemon: bool, dir: &Path, mountpoint: &Path) -> (PathBuf, PathBuf) {
    if daemon {
        let _ = rustix::process::setsid();
    }
    crate::daemon::init_logging();
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mountpoint = std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    if daemon {
        let _ = std::env::set_current_dir("/");
    }
    (dir, mountpoint)
}

/// Says the mount is ready: on stdout for a user, or to the waiting parent,
/// after which the background copy stops writing to the parent's pipes.
fn announce(pool: &Pool, mountpoint: &Path, daemon: bool, log: Option<&Path>) -> Result<()> {
    let names: Vec<String> = pool.volume_names();
    if daemon {
        return crate::daemon::announce_and_detach(READY_LINE, log);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "mounted pool {} on {}: {} files ({})",
        pool.dir().display(),
        mountpoint.display(),
        names.len(),
        if names.is_empty() {
            "none yet".to_string()
        } else {
            names.join(", ")
        }
    )?;
    writeln!(
        out,
        "Unmount with `umount {0}` or `fusermount3 -u {0}`, or Ctrl-C.",
        mountpoint.display()
    )?;
    out.flush()?;
    Ok(())
}

/// Starts `grove mount --foreground` as a background process and waits
/// until it is mounted or has failed.
fn start_in_background(
    dir: &Path,
    degraded: bool,
    mountpoint: &Path,
    log: Option<&Path>,
    options: &MountOptions,
) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the grove executable")?;
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mountpoint = std::path::absolute(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
    let mut command = Command::new(exe);
    command
        .arg("--pool")
        .arg(&dir)
        .arg("mount")
        .arg(&mountpoint)
        .arg("--foreground");
    if let Some(log) = log {
        command.arg("--log").arg(log);
    }
    if options.read_only {
        command.arg("--read-only");
    }
    if degraded {
        command.arg("--degraded");
    }
    if options.allow_other {
        command.arg("--allow-other");
    }
    let mut child = command
        .env(DAEMON_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start the background grove mount")?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(|line| line.ok())
        .any(|line| line == READY_LINE);
    if ready {
        warn_if_degraded(&dir);
        say_mounted(&dir, &mountpoint, child.id())
    } else {
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        let status = child.wait()?;
        match stderr
            .lines()
            .find_map(|line| line.strip_prefix(ERROR_PREFIX))
        {
            Some(message) => bail!("{message}"),
            None => bail!("the background grove mount exited with {status} before mounting"),
        }
    }
}

/// Tells the user on the terminal what the background mount's log says:
/// the pool runs without some of its branches.
fn warn_if_degraded(dir: &Path) {
    use crate::branch_pool::BranchAdmin;
    let report = crate::control::ControlClient::connect(dir)
        .and_then(|daemon| daemon.branch_report().ok().flatten());
    if let Some(line) = report.and_then(|r| crate::branch_pool::degraded_line(dir, &r)) {
        eprintln!("grove: warning: {line}");
    }
}

fn say_mounted(dir: &Path, mountpoint: &Path, pid: u32) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "mounted pool {} on {} (grove mount, pid {pid})",
        dir.display(),
        mountpoint.display()
    )?;
    writeln!(
        out,
        "Unmount with `umount {0}` or `fusermount3 -u {0}`.",
        mountpoint.display()
    )?;
    out.flush()?;
    Ok(())
}

/// `grove serve --mount`: the FUSE files over the pool the server holds.
pub fn mount_for_serve(
    pool: &Pool,
    mountpoint: &Path,
    read_only: bool,
    archived: Option<Arc<ArchivedSnapshots>>,
) -> Result<grove_fuse::Mount> {
    let options = MountOptions {
        read_only,
        allow_other: false,
        archived: crate::archive_exports::archived_files(pool, archived),
    };
    let shown = mountpoint.display().to_string();
    let mount = grove_fuse::mount(pool.clone(), mountpoint, &options, move || {
        tracing::info!("FUSE mount on {shown} ended")
    })
    .with_context(|| {
        format!(
            "cannot mount pool {} on {}",
            pool.dir().display(),
            mountpoint.display()
        )
    })?;
    println!(
        "FUSE: every volume is a file under {}; unmounted when the server stops.",
        mount.mountpoint().display()
    );
    Ok(mount)
}

/// Unmounts at shutdown; a busy mount is detached lazily rather than hold
/// the server up.
pub fn unmount_for_shutdown(mount: grove_fuse::Mount) {
    match mount.unmount() {
        Ok(()) => {
            if let Err(e) = mount.join() {
                tracing::warn!("{e}");
            }
        }
        Err(e) => {
            tracing::warn!("{e}; detaching it");
            let _ = mount.unmount_lazily();
        }
    }
}

/// When control clients are hung up on at shutdown: the NBD server's grace.
fn control_deadline() -> std::time::Instant {
    std::time::Instant::now()
        + std::time::Duration::from_millis(grove_nbd::SHUTDOWN_GRACE_MS_DEFAULT)
}
