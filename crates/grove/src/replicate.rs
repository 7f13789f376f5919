//! `grove send`, `grove receive` and `grove hash`: the commands around
//! grove-send's streams. Each runs where the pool is open: here, or in the
//! daemon that holds it (the stream then flows over the control socket,
//! `control.rs`), with the same functions below.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_send::{ReceiveError, ReceiveSummary, ResumeToken, SendRequest, SendSummary};
use grove_store::{DiffFrom, Pool};
use serde::{Deserialize, Serialize};

use crate::output::format_size;

/// Buffer between the engine and a pipe, file or socket.
const STREAM_BUFFER_BYTES: usize = 1 << 20;
/// Capacity asked of a pipe on stdin or stdout: Linux's default 64 KiB
/// makes the sender and receiver take turns a few bytes at a time (the
/// sender spent most of its time in pipe wake-ups); 1 MiB is the most an
/// unprivileged process may ask for by default.
const PIPE_BYTES: usize = 1 << 20;

/// Widens a pipe; anything that is not a pipe is left as it is.
fn widen_pipe(fd: impl std::os::fd::AsFd) {
    let _ = rustix::pipe::fcntl_setpipe_size(fd, PIPE_BYTES);
}

/// `grove send`'s arguments, as the control socket carries them too.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SendArgs {
    pub snapshot: Option<String>,
    pub from: Option<String>,
    pub range_from: Option<String>,
    pub cursor: Option<String>,
    pub resume: Option<String>,
    /// Only the stream's bytes after this position (the rest of an
    /// interrupted upload).
    #[serde(default)]
    pub continue_at: Option<grove_send::Position>,
}

/// What the engine is asked to send for `args`.
pub fn request(pool: &Pool, args: &SendArgs) -> Result<SendRequest> {
    if let Some(text) = &args.resume {
        return Ok(SendRequest {
            resume: Some(ResumeToken::decode(text)?),
            ..SendRequest::default()
        });
    }
    let target = args.snapshot.clone().context("name the snapshot to send")?;
    let (from, range) = match (&args.from, &args.range_from) {
        (Some(base), None) => match base.strip_suffix("..") {
            Some(base) => (Some(DiffFrom::Name(base.to_string())), true),
            None => (Some(DiffFrom::Name(base.clone())), false),
        },
        (None, Some(base)) => (Some(DiffFrom::Name(base.clone())), true),
        (None, None) => match &args.cursor {
            Some(target) if pool.cursors().iter().any(|c| &c.target == target) => {
                (Some(DiffFrom::Cursor(target.clone())), false)
            }
            _ => (None, false),
        },
        (Some(_), Some(_)) => bail!("give the base once: --from BASE or -I BASE"),
    };
    Ok(SendRequest {
        target,
        from,
        range,
        continue_at: args.continue_at,
        ..SendRequest::default()
    })
}

/// Sends from an open pool: the stream goes to `out`, then the cursor
/// (if asked for) moves to the snapshot sent.
pub fn send_from_pool(pool: &Pool, args: &SendArgs, out: impl Write) -> Result<SendSummary> {
    let request = request(pool, args)?;
    let summary = grove_send::send(pool, &request, out, &mut |_| {})?;
    move_cursor(pool, args, &summary)?;
    Ok(summary)
}

/// After a whole stream went out: the cursor asked for points at its last
/// snapshot.
pub fn move_cursor(pool: &Pool, args: &SendArgs, summary: &SendSummary) -> Result<()> {
    if let Some(target) = &args.cursor {
        pool.set_cursor(target, &summary.target)
            .with_context(|| format!("the stream was sent, but moving cursor {target:?} failed"))?;
    }
    Ok(())
}

/// The stream's destination: a file, or standard output if that is not a
/// terminal.
pub fn open_output(path: Option<&Path>) -> Result<Box<dyn Write>> {
    match path {
        Some(path) if path != Path::new("-") => {
            let file =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            Ok(Box::new(BufWriter::with_capacity(
                STREAM_BUFFER_BYTES,
                file,
            )))
        }
        _ => {
            if io::stdout().is_terminal() {
                bail!("refusing to write a binary stream to a terminal: pipe it (grove send ... | grove receive ...) or give -o FILE");
            }
            widen_pipe(io::stdout());
            Ok(Box::new(BufWriter::with_capacity(
                STREAM_BUFFER_BYTES,
                io::stdout().lock(),
            )))
        }
    }
}

/// The stream's source: a file, or standard input.
pub fn open_input(path: Option<&Path>) -> Result<Box<dyn Read + Send>> {
    match path {
        Some(path) if path != Path::new("-") => {
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            Ok(Box::new(BufReader::with_capacity(
                STREAM_BUFFER_BYTES,
                file,
            )))
        }
        _ => {
            if io::stdin().is_terminal() {
                bail!("no stream to read: pipe one in (grove send ... | grove receive NAME) or name a FILE");
            }
            widen_pipe(io::stdin());
            Ok(Box::new(BufReader::with_capacity(
                STREAM_BUFFER_BYTES,
                io::stdin(),
            )))
        }
    }
}

pub fn describe_send(summary: &SendSummary) -> String {
    format!(
        "sent {:?} ({} snapshot{}): {} of data, {} of zeros and {} of holes as records, {} stream bytes",
        summary.target,
        summary.sections,
        if summary.sections == 1 { "" } else { "s" },
        format_size(summary.data_bytes),
        format_size(summary.zero_bytes),
        format_size(summary.hole_bytes),
        summary.stream_bytes
    )
}

pub fn describe_receive(summary: &ReceiveSummary) -> String {
    format!(
        "received {} ({} of data, {} stream bytes), content digest verified",
        summary
            .snapshots
            .iter()
            .map(|s| format!("{s:?}"))
            .collect::<Vec<_>>()
            .join(", "),
        format_size(summary.data_bytes),
        summary.stream_bytes
    )
}

/// A failed receive as one error: its cause, what finished, and how to
/// resume.
pub fn receive_failure(error: ReceiveError) -> anyhow::Error {
    let finished = if error.finished.is_empty() {
        String::new()
    } else {
        format!(
            " (received before it stopped: {})",
            error.finished.join(", ")
        )
    };
    anyhow::anyhow!("cannot receive: {error}{finished}")
}

/// Receives into an open pool.
pub fn receive_into_pool(pool: &Pool, name: &str, input: impl Read) -> Result<ReceiveSummary> {
    grove_send::receive(pool, name, input, &mut |_| {}).map_err(receive_failure)
}

/// `grove hash`: the content digest of a volume, as hex.
pub fn hash(pool: &Pool, name: &str) -> Result<String> {
    let volume = pool.volume(name)?;
    let digest = grove_send::volume_digest(&volume)?;
    Ok(grove_send::digest::hex(
        &digest.finish(volume.size_bytes()?),
    ))
}

/// `grove receive --status`: the token that resumes a partial receive.
pub fn status(pool: &Pool, name: &str) -> Result<String> {
    Ok(grove_send::resume_token(pool, name)?.encode())
}
