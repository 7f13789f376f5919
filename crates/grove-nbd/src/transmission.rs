//! The transmission phase of one connection: a reader that decodes
//! requests and hands them to a few workers, which run them against the
//! volume and send replies in whatever order they finish. Replies go out
//! whole, one at a time, through a mutex on the socket.

use std::io::{self, BufReader, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::thread;

use crate::block_status::{allocation_descriptors, BLOCK_STATUS_DESCRIPTORS_MAX};
use crate::codec::*;
use crate::error::nbd_error_for;
use crate::handshake::{Session, BASE_ALLOCATION_CONTEXT_ID};
use crate::stream::{discard, read_exact_or_eof, Stream};
use crate::validate::{validate_request, Negotiated, Rejection, PAYLOAD_MAX_BYTES};

/// Bytes of requests one connection may have in the server at once: write
/// data read but not yet written, read buffers not yet sent. When a client
/// sends faster than storage takes it, the reader stops reading until
/// workers catch up, so the server's memory stays bounded.
pub const IN_FLIGHT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// What every request counts against the in-flight limit besides its data,
/// so that a flood of requests without data (trims, flushes) is bounded too.
pub const REQUEST_OVERHEAD_BYTES: u64 = 4096;

/// Zeros written per engine call for NBD_CMD_WRITE_ZEROES with NO_HOLE.
const ZERO_CHUNK_BYTES: usize = 1024 * 1024;
static ZEROS: [u8; ZERO_CHUNK_BYTES] = [0; ZERO_CHUNK_BYTES];

const _: () = assert!(IN_FLIGHT_MAX_BYTES >= PAYLOAD_MAX_BYTES as u64 + REQUEST_OVERHEAD_BYTES);

/// How a connection's transmission phase ended.
#[derive(Debug)]
pub(crate) enum End {
    /// NBD_CMD_DISC: the client's clean goodbye.
    Disconnect,
    /// The client closed between requests (or the server shut reads).
    Closed,
    /// The client closed inside a request or its data.
    Truncated(io::Error),
    /// The stream lost its framing; nothing after can be trusted.
    Protocol(String),
    Io(io::Error),
}

/// A counter of in-flight bytes with a limit; takers wait for room.
struct Budget {
    used_bytes: Mutex<u64>,
    freed: Condvar,
    max_bytes: u64,
}

impl Budget {
    fn new(max_bytes: u64) -> Self {
        Budget {
            used_bytes: Mutex::new(0),
            freed: Condvar::new(),
            max_bytes,
        }
    }

    /// Waits until `bytes` fit. A request alone always fits, even one over
    /// the limit, so that the reader can never wait for itself.
    fn acquire(&self, bytes: u64) {
        let mut used = self.used_bytes.lock().unwrap_or_else(|e| e.into_inner());
        while *used > 0 && *used + bytes > self.max_bytes {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += bytes;
    }

    fn release(&self, bytes: u64) {
        let mut used = self.used_bytes.lock().unwrap_or_else(|e| e.into_inner());
        assert!(*used >= bytes, "released more than was acquired");
        *used -= bytes;
        self.freed.notify_all();
    }
}

/// One decoded request on its way to a worker.
struct Job {
    request: Request,
    /// Data of an accepted WRITE.
    payload: Option<Vec<u8>>,
    rejection: Option<Rejection>,
    cost_bytes: u64,
}

/// What the reader and the workers of one connection share.
struct Connection<'a> {
    session: &'a Session,
    negotiated: Negotiated,
    writer: Mutex<Stream>,
    /// Set when a reply could not be sent: the client is gone.
    broken: AtomicBool,
    /// Set once a request changed the volume; the connection then flushes
    /// when it ends.
    wrote: AtomicBool,
    budget: Budget,
    label: &'a str,
}

/// Serves requests until the client disconnects or breaks the protocol.
/// Returns after every request read has been answered (or the client is
/// gone).
pub(crate) fn serve(
    reader: &mut BufReader<Stream>,
    writer: Stream,
    session: &Session,
    workers: usize,
    label: &str,
) -> End {
    let export = &session.export;
    let negotiated = Negotiated {
        size_bytes: export.size_bytes,
        transmission_flags: crate::export::transmission_flags(
            export.read_only,
            session.structured_replies,
        ),
        structured_replies: session.structured_replies,
        base_allocation: session.base_allocation,
        payload_max_bytes: PAYLOAD_MAX_BYTES,
    };
    let connection = Connection {
        session,
        negotiated,
        writer: Mutex::new(writer),
        broken: AtomicBool::new(false),
        wrote: AtomicBool::new(false),
        budget: Budget::new(IN_FLIGHT_MAX_BYTES),
        label,
    };
    let (sender, receiver) = mpsc::channel::<Job>();
    let receiver = Mutex::new(receiver);
    let end = thread::scope(|scope| {
        let mut started = 0;
        for index in 0..workers.max(1) {
            let connection = &connection;
            let receiver = &receiver;
            let spawned = thread::Builder::new()
                .name(format!("nbd-worker-{index}"))
                .spawn_scoped(scope, move || worker(connection, receiver));
            match spawned {
                Ok(_) => started += 1,
                // Out of threads: serve with the workers there are.
                Err(e) => {
                    tracing::warn!(connection = label, error = %e, "cannot start an NBD worker thread")
                }
            }
        }
        if started == 0 {
            return End::Io(io::Error::other("no worker thread could be started"));
        }
        let end = read_requests(reader, &connection, &sender);
        // Closing the queue lets the workers finish what is queued and stop.
        drop(sender);
        end
    });
    if connection.wrote.load(Ordering::SeqCst) {
        // Not required by the protocol, but a client that leaves without a
        // flush should not lose its writes to a crash soon after.
        if let Err(e) = export.volume.flush() {
            tracing::warn!(connection = label, error = %e, "flush at disconnect failed");
        }
    }
    end
}

fn read_requests(
    reader: &mut BufReader<Stream>,
    connection: &Connection<'_>,
    sender: &mpsc::Sender<Job>,
) -> End {
    loop {
        let mut header = [0u8; REQUEST_BYTES];
        match read_exact_or_eof(reader, &mut header) {
            Ok(true) => {}
            Ok(false) => return End::Closed,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return End::Truncated(e),
            Err(e) => return End::Io(e),
        }
        let request = match decode_request(&header) {
            Ok(request) => request,
            Err(e) => return End::Protocol(e.to_string()),
        };
        tracing::trace!(connection = connection.label, ?request, "request");
        if request.command == Command::Disc {
            return End::Disconnect;
        }
        let rejection = validate_request(&request, &connection.negotiated).err();
        let carries_data =
            rejection.is_none() && matches!(request.command, Command::Read | Command::Write);
        let cost_bytes = REQUEST_OVERHEAD_BYTES
            + if carries_data {
                u64::from(request.length)
            } else {
                0
            };
        connection.budget.acquire(cost_bytes);
        let payload_bytes = request.payload_bytes();
        let payload = if payload_bytes == 0 {
            None
        } else if rejection.is_some() {
            // A refused write's data still follows its header; read past it
            // (without keeping it) to stay in step with the client.
            if let Err(e) = discard(reader, u64::from(payload_bytes)) {
                connection.budget.release(cost_bytes);
                return End::Truncated(e);
            }
            None
        } else {
            let mut data = vec![0u8; payload_bytes as usize];
            if let Err(e) = reader.read_exact(&mut data) {
                connection.budget.release(cost_bytes);
                return End::Truncated(e);
            }
            Some(data)
        };
        let job = Job {
            request,
            payload,
            rejection,
            cost_bytes,
        };
        if sender.send(job).is_err() {
            // Every worker is gone, which only happens if one panicked.
            return End::Protocol("the connection's workers stopped".to_string());
        }
    }
}

fn worker(connection: &Connection<'_>, receiver: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let job = {
            let receiver = receiver.lock().unwrap_or_else(|e| e.into_inner());
            match receiver.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let cost_bytes = job.cost_bytes;
        run(connection, job);
        connection.budget.release(cost_bytes);
    }
}

/// Runs one request and sends its reply.
fn run(connection: &Connection<'_>, job: Job) {
    let request = job.request;
    if let Some(rejection) = job.rejection {
        tracing::debug!(connection = connection.label, %request.command, error = rejection.error, message = rejection.message, "request refused");
        send_error(connection, &request, rejection.error, &rejection.message);
        return;
    }
    let volume = &connection.session.export.volume;
    let fua = request.flags & CMD_FLAG_FUA != 0;
    let result = match request.command {
        Command::Read => return read(connection, &request),
        Command::BlockStatus => return block_status(connection, &request),
        Command::Write => {
            let data = job
                .payload
                .as_deref()
                .expect("accepted writes carry their data");
            volume.write_at(data, request.offset)
        }
        Command::Flush => volume.flush(),
        Command::Trim => volume.discard(request.offset, u64::from(request.length)),
        Command::WriteZeroes if request.flags & CMD_FLAG_NO_HOLE != 0 => {
            if request.flags & CMD_FLAG_FAST_ZERO != 0 {
                // Writing real zeros costs as much as a write, and the
                // protocol wants such a request refused quickly instead.
                send_error(
                    connection,
                    &request,
                    NBD_ENOTSUP,
                    "zeroing without holes is not faster than writing",
                );
                return;
            }
            write_zeros(volume, request.offset, u64::from(request.length))
        }
        // Unmapping reads back as zeros and frees space: the fast way.
        Command::WriteZeroes => volume.discard(request.offset, u64::from(request.length)),
        Command::Disc | Command::Cache | Command::Unknown(_) => {
            unreachable!("validate_request refuses {}", request.command)
        }
    };
    let writes = matches!(
        request.command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    let result = result.and_then(|()| {
        if writes {
            connection.wrote.store(true, Ordering::SeqCst);
            if fua {
                return volume.flush();
            }
        }
        Ok(())
    });
    match result {
        Ok(()) => send(connection, &encode_simple_reply(request.cookie, 0)),
        Err(e) => send_engine_error(connection, &request, &e),
    }
}

fn write_zeros(volume: &grove_store::Volume, offset: u64, len: u64) -> grove_store::Result<()> {
    let mut done = 0u64;
    while done < len {
        let chunk = (len - done).min(ZERO_CHUNK_BYTES as u64) as usize;
        volume.write_at(&ZEROS[..chunk], offset + done)?;
        done += chunk as u64;
    }
    Ok(())
}

fn read(connection: &Connection<'_>, request: &Request) {
    let structured = connection.negotiated.structured_replies;
    let prefix = read_reply_prefix_bytes(structured);
    // Header and data in one buffer, so the reply is one write.
    let mut buf = vec![0u8; prefix + request.length as usize];
    let volume = &connection.session.export.volume;
    match volume.read_at(&mut buf[prefix..], request.offset) {
        Ok(()) => {
            encode_read_reply_prefix(&mut buf, structured, request.cookie, request.offset);
            send(connection, &buf);
        }
        Err(e) => send_engine_error(connection, request, &e),
    }
}

fn block_status(connection: &Connection<'_>, request: &Request) {
    let volume = &connection.session.export.volume;
    // Only the queried window: the cost follows the request, not the volume.
    let extents = match volume.mapped_extents_in(request.offset, u64::from(request.length)) {
        Ok(extents) => extents,
        Err(e) => return send_engine_error(connection, request, &e),
    };
    let req_one = request.flags & CMD_FLAG_REQ_ONE != 0;
    let descriptors = allocation_descriptors(
        &extents,
        request.offset,
        request.length,
        req_one,
        BLOCK_STATUS_DESCRIPTORS_MAX,
    );
    let chunk = encode_block_status_chunk(
        request.cookie,
        true,
        BASE_ALLOCATION_CONTEXT_ID,
        &descriptors,
    );
    send(connection, &chunk);
}

fn send_engine_error(connection: &Connection<'_>, request: &Request, error: &grove_store::Error) {
    let code = nbd_error_for(error.kind(), request.command);
    match error.kind() {
        grove_store::ErrorKind::Io | grove_store::ErrorKind::Corrupt => {
            tracing::error!(connection = connection.label, command = %request.command, offset = request.offset, length = request.length, error = %error, "request failed")
        }
        _ => {
            tracing::debug!(connection = connection.label, command = %request.command, error = %error, "request failed")
        }
    }
    send_error(connection, request, code, &error.to_string());
}

/// An error reply: an error chunk with a message when structured replies
/// were negotiated (required for READ, preferred for the rest), else a
/// simple reply.
fn send_error(connection: &Connection<'_>, request: &Request, error: u32, message: &str) {
    if connection.negotiated.structured_replies {
        send(
            connection,
            &encode_error_chunk(request.cookie, error, message),
        );
    } else {
        send(connection, &encode_simple_reply(request.cookie, error));
    }
}

/// Sends one whole reply. If the client is gone, marks the connection
/// broken and shuts the socket, which also wakes the reader.
fn send(connection: &Connection<'_>, bytes: &[u8]) {
    if connection.broken.load(Ordering::SeqCst) {
        return;
    }
    let mut writer = connection.writer.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = writer.write_all(bytes).and_then(|()| writer.flush()) {
        if !connection.broken.swap(true, Ordering::SeqCst) {
            tracing::debug!(connection = connection.label, error = %e, "cannot send reply; dropping the connection");
            let _ = writer.shutdown(Shutdown::Both);
        }
    }
}
