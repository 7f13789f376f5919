//! `grove send`, `grove receive` and `grove hash`: the commands around
//! grove-send's streams. Each runs where the pool is open: here, or in the
//! daemon that holds it (the stream then flows over the control socket,
//! `control.rs`), with the same functions (stream.rs).

use std::fs::File;
use std::io::{self, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_store::Pool;

use crate::cli::Command;
use crate::control::ControlClient;
use crate::output::{format_size, say};
use crate::progress::reclaim_with_progress;
use crate::stream::{
    describe_receive, describe_send, hash, receive_into_pool, send_from_pool, SendArgs,
};

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
                    Place::Here(pool) => crate::stream::status(pool, &name)?,
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
