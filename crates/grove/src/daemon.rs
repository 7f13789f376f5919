//! What `grove mount` and `grove raif mount` share once they run in the
//! background: from the ready line on, the copy no longer writes to the
//! pipes of the parent that waits for it (the parent exits once it reads
//! that line); its log goes to the file the user named with `--log`
//! (appended), or nowhere.

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
