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

use crate::cli::Command;
use crate::commands::{reclaim_with_progress, say};
use crate::control::ControlClient;
use crate::output::format_size;

/// Buffer between the engine and a pipe, file or socket it writes.
const STREAM_BUFFER_BYTES: usize = 1 << 20;
/// Buffer over the stream a receive reads: small, since what sits in it
/// is lost when the receive is killed and sent again by the resume
/// (frames of data, up to 1 MiB, are read past it).
const INPUT_BUFFER_BYTES: usize = 256 << 10;
/// Capacity asked of a pipe on stdin or stdout: Linux's default 64 KiB
/// makes the sender and receiver take turns a few bytes at a time (the
/// sender spent most of its time in pipe wake-ups); 1 MiB is the most an
/// unprivileged process may ask for by default.
const PIPE_BYTES: usize = 1 << 20;

/// Widens a pipe; anything that is not a pipe is left as it is.
fn widen_pipe(fd: impl std::os::fd::AsFd) {
    let _ = rustix::pipe::fcntl_setpipe_size(fd, PIPE_BYTES);
}

/// Where the pool is open: here, or in the daemon that holds it.
pub enum Place<'a> {
    Here(&'a Pool),
    Daemon(&'a ControlClient),
}

/// Runs `grove send`, `grove receive` or `grove hash` where the pool is.
pub fn run(place: Place, command: Command) -> Result<()> {
    match command {
        Command::Send {
            snapshot,
            from,
            range_from,
            cursor,
            output,
            to,
            resume,
        } => {
            let args = SendArgs {
                snapshot,
                from,
                range_from,
                cursor,
                resume,
                continue_at: None,
            };
            send(place, &args, output.as_deref(), to.as_deref())
        }
        Command::Receive {
            name,
            file,
            from,
            abort,
            status,
        } => {
            if abort {
                return abort_receive(place, &name);
            }
            if status {
                let token = match place {
                    Place::Here(pool) => self::status(pool, &name)?,
                    Place::Daemon(daemon) => daemon.receive_status(&name)?,
                };
                return say(format_args!("{token}"));
            }
            let summary = match (place, from) {
                (Place::Here(pool), Some(url)) => {
                    crate::objects::receive_from_url(pool, &name, &url)?
                }
                (Place::Daemon(daemon), Some(url)) => {
                    crate::objects::receive_from_url_through(daemon, &name, &url)?
                }
                (Place::Here(pool), None) => {
                    receive_into_pool(pool, &name, open_input(file.as_deref())?)?
                }
                (Place::Daemon(daemon), None) => {
                    daemon.receive_stream(&name, open_input(file.as_deref())?)?
                }
            };
            say(format_args!("{}", describe_receive(&summary)))
        }
        Command::Hash { name } => {
            let digest = match place {
                Place::Here(pool) => hash(pool, &name)?,
                Place::Daemon(daemon) => daemon.hash(&name)?,
            };
            say(format_args!("{digest}  {name}"))
        }
        _ => unreachable!("only send, receive and hash are replication commands"),
    }
}

fn send(place: Place, args: &SendArgs, output: Option<&Path>, to: Option<&str>) -> Result<()> {
    match (place, to) {
        (Place::Here(pool), Some(url)) => {
            let summary = crate::objects::send_to_url(pool, args, url)?;
            eprintln!("{}", describe_send(&summary));
        }
        (Place::Daemon(daemon), Some(url)) => {
            crate::objects::send_to_url_through(daemon, args, url)?;
        }
        (Place::Here(pool), None) => {
            let mut out = open_output(output)?;
            let summary = send_from_pool(pool, args, &mut out)?;
            out.flush().context("cannot write the stream")?;
            eprintln!("{}", describe_send(&summary));
        }
        (Place::Daemon(daemon), None) => {
            let mut out = open_output(output)?;
            daemon.send_stream(args, &mut |stream| copy_whole_stream(stream, &mut out))?;
            out.flush().context("cannot write the stream")?;
        }
    }
    Ok(())
}

fn abort_receive(place: Place, name: &str) -> Result<()> {
    match place {
        Place::Here(pool) => {
            let freed = grove_send::abort(pool, name)?;
            say(format_args!(
                "dropped the partial receive {name:?}; it gives back {}",
                format_size(freed)
            ))?;
            // Here nothing else would reclaim: give the space back now.
            reclaim_with_progress(pool).map(drop)
        }
        Place::Daemon(daemon) => {
            daemon.receive_abort(name)?;
            say(format_args!("dropped the partial receive {name:?}"))
        }
    }
}

/// Copies a daemon's stream to `out`, checking frame by frame that it is
/// whole: a stream cut short by a failure (which the daemon logged) is an
/// error here, not a truncated file.
fn copy_whole_stream(stream: &mut dyn Read, out: &mut dyn Write) -> Result<()> {
    let mut reader = grove_send::format::FrameReader::new(stream);
    let mut writer = grove_send::format::FrameWriter::new(out);
    loop {
        let frame = reader.next_frame().map_err(|e| {
            anyhow::anyhow!(
                "the daemon's stream stopped ({e}; its log says why): the output is incomplete"
            )
        })?;
        writer.write(&frame).context("cannot write the stream")?;
        if matches!(frame, grove_send::format::Frame::End { .. }) {
            return Ok(());
        }
    }
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
            Ok(Box::new(BufReader::with_capacity(INPUT_BUFFER_BYTES, file)))
        }
        _ => {
            if io::stdin().is_terminal() {
                bail!("no stream to read: pipe one in (grove send ... | grove receive NAME) or name a FILE");
            }
            widen_pipe(io::stdin());
            Ok(Box::new(BufReader::with_capacity(
                INPUT_BUFFER_BYTES,
                io::stdin(),
            )))
        }
    }
}

/// One line on what a send carried. A full stream leaves a volume's
/// unmapped space out (the receiver's new volume reads it as zeros); an
/// incremental one marks what the target unmapped as Hole records.
pub fn describe_send(summary: &SendSummary) -> String {
    let carried = if summary.full && summary.sections == 1 {
        let unmapped = summary
            .target_size_bytes
            .saturating_sub(summary.data_bytes + summary.zero_bytes);
        format!(
            "a full stream of a {} volume: {} of data, {} of zeros as records, {} unmapped left out",
            format_size(summary.target_size_bytes),
            format_size(summary.data_bytes),
            format_size(summary.zero_bytes),
            format_size(unmapped)
        )
    } else {
        format!(
            "{} of data, {} of zeros and {} unmapped since the base, as records",
            format_size(summary.data_bytes),
            format_size(summary.zero_bytes),
            format_size(summary.hole_bytes)
        )
    };
    format!(
        "sent {:?} ({} snapshot{}), {carried}; {} stream bytes",
        summary.target,
        summary.sections,
        if summary.sections == 1 { "" } else { "s" },
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
    Ok(hex::encode(digest.finish(volume.size_bytes()?)))
}

/// `grove receive --status`: the token that resumes a partial receive.
pub fn status(pool: &Pool, name: &str) -> Result<String> {
    Ok(grove_send::resume_token(pool, name)?.encode())
}
