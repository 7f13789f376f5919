//! What `grove mount` and `grove raif mount` share. Once they run in the
//! background: from the ready line on, the copy no longer writes to the
//! pipes of the parent that waits for it (the parent exits once it reads
//! that line); its log goes to the file the user named with `--log`
//! (appended), or nowhere. And in either mode: serving until the file
//! system is unmounted, by a signal or from outside.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};

/// Points stderr (where tracing writes) at `log` or /dev/null, prints
/// `ready_line` for the waiting parent, then points stdout at /dev/null.
/// Stderr moves first: the mount serves requests already, the parent
/// exits as soon as it reads the ready line, and a log line written after
/// that into its pipe fails with EPIPE (which used to panic the request's
/// thread: an EIO for whoever asked).
pub fn announce_and_detach(ready_line: &str, log: Option<&Path>) -> Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .context("cannot open /dev/null")?;
    match log {
        Some(path) => {
            let file = open_log(path)?;
            rustix::stdio::dup2_stderr(&file).context("cannot redirect the log")?;
        }
        None => rustix::stdio::dup2_stderr(&null).context("cannot detach stderr")?,
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{ready_line}")?;
    out.flush()?;
    drop(out);
    rustix::stdio::dup2_stdout(&null).context("cannot detach stdout")?;
    Ok(())
}

/// Opens (creating) a log file for appending; checked before mounting, so
/// that a bad path is an error the user sees rather than a silent log.
pub fn open_log(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open log file {}", path.display()))
}

/// What the main thread of a mount waits for.
pub enum MountEvent {
    Signal(i32),
    /// The file system is gone (unmounted from outside, or after a signal).
    Unmounted,
}

/// What a signal does to a mount that is busy (files open on it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum WhenBusy {
    /// Warn and keep serving; the next signal detaches it (`grove mount`).
    WarnFirst,
    /// Detach it at once (`grove raif mount`).
    Detach,
}

/// Serves until the file system is unmounted. Every signal asks to
/// unmount it; one that cannot detaches it lazily, and the wait ends
/// (see [`WhenBusy`]). `events` is where the mount's end is announced too.
/// Returns whether the mount was detached rather than unmounted.
pub fn serve_until_unmounted(
    mount: &grove_fuse::Mount,
    mountpoint: &Path,
    mut signals: signal_hook::iterator::Signals,
    events: std::sync::mpsc::Sender<MountEvent>,
    received: &std::sync::mpsc::Receiver<MountEvent>,
    when_busy: WhenBusy,
) -> Result<bool> {
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("grove-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if events.send(MountEvent::Signal(signal)).is_err() {
                    break;
                }
            }
        })
        .context("cannot start the signal thread")?;
    let mut warned_busy = false;
    let mut detached = false;
    while let Ok(MountEvent::Signal(signal)) = received.recv() {
        tracing::info!(signal, "unmounting {}", mountpoint.display());
        match mount.unmount() {
            Ok(()) => {}
            Err(e @ grove_fuse::MountError::Busy(_))
                if when_busy == WhenBusy::WarnFirst && !warned_busy =>
            {
                tracing::warn!("{e}; still serving it: unmount it, or signal again to detach it");
                warned_busy = true;
            }
            Err(e) => {
                tracing::warn!("{e}; detaching it");
                let _ = mount.unmount_lazily();
                detached = true;
                break;
            }
        }
    }
    handle.close();
    Ok(detached)
}

/// Log filter when $GROVE_LOG does not say (tracing's EnvFilter syntax).
const LOG_FILTER_DEFAULT: &str = "info";

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GROVE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(LOG_FILTER_DEFAULT));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        // A log line that cannot be written (a full disk, a parent gone
        // from the other end of a pipe) is dropped: reporting it on the
        // same stderr would panic the thread that logged, a FUSE request's.
        .log_internal_errors(false)
        .try_init();
}
