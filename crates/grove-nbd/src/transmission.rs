//! The transmission phase of one connection: a reader that decodes
//! requests and hands them to a few workers, which run them against the
//! volume and send replies in whatever order they finish. Replies go out
//! whole, one at a time, through a mutex on the socket.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::Duration;

use crate::block_status::{
    allocation_descriptors, changed_descriptors, BLOCK_STATUS_DESCRIPTORS_MAX,
};
use crate::buffers::{Buffer, BufferPool};
use crate::codec::*;
use crate::deadline::{transfer_allowance, Deadlines, Slot};
use crate::error::nbd_error_for;
use crate::handshake::{Session, BASE_ALLOCATION_CONTEXT_ID};
use crate::jobs::{JobQueue, Refused};
use crate::source::Source;
use crate::stream::{discard, is_timeout, Stream};
use crate::validate::{validate_request, Negotiated, Rejection, PAYLOAD_MAX_BYTES};

/// Bytes of requests one connection may have in the server at once: write
/// data read but not yet written, read buffers not yet sent. When a client
/// sends faster than storage takes it, the reader stops reading until
/// workers catch up, so the server's memory stays bounded.
pub const IN_FLIGHT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// What every request counts against the in-flight limit besides its data,
/// so that a flood of requests without data (trims, flushes) is bounded too.
pub const REQUEST_OVERHEAD_BYTES: u64 = 4096;

/// Smallest server-wide in-flight limit: one request of the largest
/// payload must fit, or it could never be read.
pub const INFLIGHT_LIMIT_MIN_BYTES: u64 = PAYLOAD_MAX_BYTES as u64 + REQUEST_OVERHEAD_BYTES;

/// Fair shares: one connection holds at most this fraction of the
/// server's in-flight limit, and the connections of one peer (a uid, an
/// address) together at most an equal share among the peers connected
/// (all of it when there is one), so a client that drains its replies
/// slowly cannot hold the budget while others wait.
pub const CONNECTION_SHARE_DIVISOR: u64 = 8;

/// A connection's cap on bytes in flight, for a server-wide `limit_bytes`:
/// its fair share, but room for one request of the largest payload.
pub fn connection_share_bytes(limit_bytes: u64) -> u64 {
    (limit_bytes / CONNECTION_SHARE_DIVISOR).clamp(INFLIGHT_LIMIT_MIN_BYTES, IN_FLIGHT_MAX_BYTES)
}

/// The cap of all the connections of one peer together, when `peers`
/// peers are connected.
pub fn peer_share_bytes(limit_bytes: u64, peers: usize) -> u64 {
    (limit_bytes / peers.max(1) as u64).max(INFLIGHT_LIMIT_MIN_BYTES)
}

/// Bytes read per engine call for NBD_CMD_CACHE, which reads ahead in
/// pieces of this size rather than all at once.
const CACHE_CHUNK_BYTES: usize = 1024 * 1024;

/// The largest block status chunk: every descriptor, with its headers. A
/// reply has one chunk per selected metadata context.
const BLOCK_STATUS_CHUNK_MAX_BYTES: u64 = (STRUCTURED_REPLY_HEADER_BYTES
    + 4
    + BLOCK_STATUS_DESCRIPTORS_MAX * BLOCK_STATUS_DESCRIPTOR_BYTES)
    as u64;

/// How often a reader waiting for room in a budget checks whether its
/// connection or the server is stopping.
const BUDGET_POLL_MS: u64 = 100;

/// Zeros written per engine call for NBD_CMD_WRITE_ZEROES with NO_HOLE.
const ZERO_CHUNK_BYTES: usize = 1024 * 1024;
static ZEROS: [u8; ZERO_CHUNK_BYTES] = [0; ZERO_CHUNK_BYTES];

const _: () = assert!(IN_FLIGHT_MAX_BYTES >= PAYLOAD_MAX_BYTES as u64 + REQUEST_OVERHEAD_BYTES);

/// Requests queued for a connection's workers at most. Every queued
/// request holds at least [`REQUEST_OVERHEAD_BYTES`] of a connection's
/// budget, which is at most [`IN_FLIGHT_MAX_BYTES`] (and one request may
/// go past an empty budget), so the budget stops the reader first.
const JOBS_QUEUED_MAX: usize = (IN_FLIGHT_MAX_BYTES / REQUEST_OVERHEAD_BYTES) as usize + 1;

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
    /// A request's header or data did not arrive by its deadline.
    TimedOut(io::Error),
    /// The server is shutting down, or the connection broke, while the
    /// reader waited for room in the in-flight budget.
    Stopped,
    Io(io::Error),
}

/// A counter of in-flight bytes with a limit; takers wait for room. One
/// per connection, and one for the whole server.
pub(crate) struct Budget {
    usage: Mutex<Usage>,
    freed: Condvar,
    max_bytes: u64,
}

struct Usage {
    used_bytes: u64,
    /// Takers waiting for room: a release wakes them only if there are
    /// any, since a notify is a system call whether anyone waits or not,
    /// and every request releases three budgets.
    waiting: usize,
}

impl Budget {
    pub fn new(max_bytes: u64) -> Self {
        Budget {
            usage: Mutex::new(Usage {
                used_bytes: 0,
                waiting: 0,
            }),
            freed: Condvar::new(),
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Usage> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `bytes` fit, and takes them. A request alone always
    /// fits, even one over the limit, so that the reader can never wait for
    /// itself. Gives up, taking nothing, and returns false once `cancelled`
    /// says so.
    fn acquire(&self, bytes: u64, cancelled: &dyn Fn() -> bool) -> bool {
        self.acquire_within(bytes, &|| self.max_bytes, cancelled)
    }

    /// [`Budget::acquire`] under a limit that may change while it waits
    /// (a peer's share, as peers come and go), looked at every poll.
    fn acquire_within(
        &self,
        bytes: u64,
        max_bytes: &dyn Fn() -> u64,
        cancelled: &dyn Fn() -> bool,
    ) -> bool {
        let mut usage = self.lock();
        while usage.used_bytes > 0 && usage.used_bytes + bytes > max_bytes().min(self.max_bytes) {
            if cancelled() {
                return false;
            }
            usage.waiting += 1;
            usage = self
                .freed
                .wait_timeout(usage, Duration::from_millis(BUDGET_POLL_MS))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            assert!(usage.waiting > 0, "a waiter was counted");
            usage.waiting -= 1;
        }
        usage.used_bytes += bytes;
        true
    }

    /// Bytes taken now.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes
    }

    fn release(&self, bytes: u64) {
        let mut usage = self.lock();
        assert!(usage.used_bytes >= bytes, "released more than was acquired");
        let before = usage.used_bytes;
        usage.used_bytes -= bytes;
        assert_eq!(usage.used_bytes + bytes, before);
        if usage.waiting > 0 {
            self.freed.notify_all();
        }
    }
}

/// The budgets a connection's in-flight bytes count against: its own
/// (at most [`connection_share_bytes`]), its peer's (at most
/// [`peer_share_bytes`] for the peers connected now) and the server's.
struct Shares<'a> {
    connection: &'a Budget,
    peer: &'a Budget,
    /// Peers with connections to the server now: they split the budget.
    peers_connected: &'a AtomicUsize,
    server: &'a Budget,
}

impl Shares<'_> {
    /// Waits until `bytes` fit in all three budgets, and takes them; takes
    /// nothing and returns false once `cancelled` says so.
    fn acquire(&self, bytes: u64, cancelled: &dyn Fn() -> bool) -> bool {
        // Always in this order (connection, peer, server), so waiters for
        // the same budgets never hold them crosswise.
        if !self.connection.acquire(bytes, cancelled) {
            return false;
        }
        let peer_share = || {
            let peers = self.peers_connected.load(Ordering::SeqCst);
            peer_share_bytes(self.server.max_bytes, peers)
        };
        if !self.peer.acquire_within(bytes, &peer_share, cancelled) {
            self.connection.release(bytes);
            return false;
        }
        if !self.server.acquire(bytes, cancelled) {
            self.peer.release(bytes);
            self.connection.release(bytes);
            return false;
        }
        true
    }

    fn release(&self, bytes: u64) {
        self.server.release(bytes);
        self.peer.release(bytes);
        self.connection.release(bytes);
    }
}

/// One decoded request on its way to a worker.
struct Job {
    request: Request,
    /// Data of an accepted WRITE, in a buffer of the server's pool.
    payload: Option<Buffer>,
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
    /// The budget the connections of this peer share.
    peer_budget: &'a Budget,
    /// Peers with connections to the server now: they split the budget.
    peers_connected: &'a AtomicUsize,
    /// The budget all connections of the server share.
    server_budget: &'a Budget,
    /// Deadlines of the reader and of the reply being sent.
    deadlines: &'a Deadlines,
    /// What a request's data or reply may take besides its bytes at the
    /// minimum rate; None: no deadlines.
    request_timeout: Option<Duration>,
    min_rate_bytes_per_s: u64,
    /// Buffers all connections of the server reuse.
    buffers: &'a BufferPool,
    /// Set when the server shuts down.
    stopping: &'a AtomicBool,
    label: &'a str,
}

impl Connection<'_> {
    fn shares(&self) -> Shares<'_> {
        Shares {
            connection: &self.budget,
            peer: self.peer_budget,
            peers_connected: self.peers_connected,
            server: self.server_budget,
        }
    }

    fn acquire(&self, bytes: u64) -> bool {
        let cancelled =
            || self.stopping.load(Ordering::SeqCst) || self.broken.load(Ordering::SeqCst);
        self.shares().acquire(bytes, &cancelled)
    }

    fn release(&self, bytes: u64) {
        self.shares().release(bytes)
    }

    /// How long a transfer of `bytes` (a request's data, a reply) may take.
    fn allowance(&self, bytes: u64) -> Option<Duration> {
        transfer_allowance(self.request_timeout, bytes, self.min_rate_bytes_per_s)
    }
}

/// What a connection's transmission phase shares with the server.
pub(crate) struct Limits<'a> {
    pub server_budget: &'a Budget,
    pub peer_budget: &'a Budget,
    pub peers_connected: &'a AtomicUsize,
    pub buffers: &'a BufferPool,
    pub stopping: &'a AtomicBool,
    pub deadlines: &'a Deadlines,
    /// The base of every transfer's deadline; None: no deadlines.
    pub request_timeout: Option<Duration>,
    /// What the rest of a transfer's deadline is counted at.
    pub min_rate_bytes_per_s: u64,
    pub workers: usize,
}

/// Serves requests until the client disconnects or breaks the protocol.
/// Returns after every request read has been answered (or the client is
/// gone).
pub(crate) fn serve(
    reader: &mut BufReader<Stream>,
    writer: Stream,
    session: &Session,
    limits: &Limits<'_>,
    label: &str,
) -> End {
    let workers = limits.workers;
    let export = &session.export;
    let negotiated = Negotiated {
        size_bytes: export.size_bytes,
        transmission_flags: crate::export::transmission_flags(
            export.read_only,
            session.structured_replies,
        ),
        structured_replies: session.structured_replies,
        meta_context: session.meta_contexts.count() > 0,
        payload_max_bytes: PAYLOAD_MAX_BYTES,
    };
    let connection = Connection {
        session,
        negotiated,
        writer: Mutex::new(writer),
        broken: AtomicBool::new(false),
        wrote: AtomicBool::new(false),
        budget: Budget::new(connection_share_bytes(limits.server_budget.max_bytes)),
        peer_budget: limits.peer_budget,
        peers_connected: limits.peers_connected,
        server_budget: limits.server_budget,
        deadlines: limits.deadlines,
        request_timeout: limits.request_timeout,
        min_rate_bytes_per_s: limits.min_rate_bytes_per_s,
        buffers: limits.buffers,
        stopping: limits.stopping,
        label,
    };
    let end = run_workers(reader, &connection, workers);
    if connection.wrote.load(Ordering::SeqCst) {
        // Not required by the protocol, but a client that leaves without a
        // flush should not lose its writes to a crash soon after.
        if let Err(e) = export.source.flush() {
            tracing::warn!(connection = label, error = %e, "flush at disconnect failed");
        }
    }
    end
}

/// Reads requests and runs them on worker threads until the client stops.
/// Workers start as requests need them, up to `workers`: an idle
/// connection (a mounted disk) holds one thread beside its reader, so a
/// host's thousand disks cost a thousand stacks, not five.
fn run_workers(reader: &mut BufReader<Stream>, connection: &Connection<'_>, workers: usize) -> End {
    let queue = JobQueue::new(JOBS_QUEUED_MAX);
    thread::scope(|scope| {
        let mut started = 0;
        let mut start_worker = || {
            if started >= workers.max(1) {
                return false;
            }
            let queue = &queue;
            let spawned = thread::Builder::new()
                .name(format!("nbd-worker-{started}"))
                .spawn_scoped(scope, move || worker(connection, queue));
            match spawned {
                Ok(_) => {
                    started += 1;
                    true
                }
                // Out of threads: serve with the workers there are.
                Err(e) => {
                    tracing::warn!(connection = connection.label, error = %e, "cannot start an NBD worker thread");
                    false
                }
            }
        };
        if !start_worker() {
            return End::Io(io::Error::other("no worker thread could be started"));
        }
        let mut dispatch = |job: Job| match queue.push(job) {
            Ok(true) => Ok(()),
            Ok(false) => {
                // No worker waits: another may take it, if any may start.
                start_worker();
                Ok(())
            }
            Err((refused, job)) => {
                connection.release(job.cost_bytes);
                Err(refused)
            }
        };
        let end = read_requests(reader, connection, &mut dispatch);
        // Closing the queue lets the workers finish what is queued and stop.
        queue.close();
        end
    })
}

/// What a request holds in the budgets while it is in the server: its data
/// or its reply, plus a fixed overhead. `meta_contexts` is how many chunks
/// a block status reply has.
fn cost_bytes(request: &Request, accepted: bool, meta_contexts: usize) -> u64 {
    let data_bytes = match request.command {
        _ if !accepted => 0,
        Command::Read | Command::Write => u64::from(request.length),
        Command::Cache => CACHE_CHUNK_BYTES as u64,
        // Reserved at its largest; the worker gives back what the real
        // reply does not use as soon as it has built it.
        Command::BlockStatus => BLOCK_STATUS_CHUNK_MAX_BYTES * meta_contexts as u64,
        _ => 0,
    };
    REQUEST_OVERHEAD_BYTES + data_bytes
}

/// Reads requests and hands each to `dispatch`, which queues it for a
/// worker.
fn read_requests(
    reader: &mut BufReader<Stream>,
    connection: &Connection<'_>,
    dispatch: &mut dyn FnMut(Job) -> Result<(), Refused>,
) -> End {
    let deadlines = connection.deadlines;
    loop {
        // Waiting for the next request has no deadline: a client idle
        // between requests (a mounted disk) is legitimate. Once its first
        // byte is in, the header has the base allowance.
        if reader.buffer().is_empty() {
            match reader.fill_buf() {
                Ok([]) => return End::Closed,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return End::Io(e),
            }
        }
        let mut header = [0u8; REQUEST_BYTES];
        deadlines.arm(Slot::Read, connection.allowance(0));
        let read = reader.read_exact(&mut header);
        // Waiting for room in the budget below is the server's doing.
        deadlines.disarm(Slot::Read);
        if let Err(e) = read {
            return truncated(e, deadlines);
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
        let cost_bytes = cost_bytes(
            &request,
            rejection.is_none(),
            connection.session.meta_contexts.count(),
        );
        if !connection.acquire(cost_bytes) {
            return End::Stopped;
        }
        let payload = match read_payload(reader, connection, &request, rejection.is_some()) {
            Ok(payload) => payload,
            Err(e) => {
                connection.release(cost_bytes);
                return truncated(e, deadlines);
            }
        };
        let job = Job {
            request,
            payload,
            rejection,
            cost_bytes,
        };
        if let Err(refused) = dispatch(job) {
            // The budget bounds the queue below its capacity, so neither
            // happens unless a worker panicked or the bound is wrong.
            return End::Protocol(format!(
                "the connection's job queue refused a request: {refused:?}"
            ));
        }
    }
}

/// Reads a request's data by its deadline, which starts once there is
/// room for it and grows with its size at the minimum rate. A refused
/// write's data is read past (without keeping it) to stay in step.
fn read_payload(
    reader: &mut BufReader<Stream>,
    connection: &Connection<'_>,
    request: &Request,
    refused: bool,
) -> io::Result<Option<Buffer>> {
    let payload_bytes = request.payload_bytes();
    if payload_bytes == 0 {
        return Ok(None);
    }
    let deadlines = connection.deadlines;
    deadlines.arm(Slot::Read, connection.allowance(u64::from(payload_bytes)));
    let payload = if refused {
        discard(reader, u64::from(payload_bytes)).map(|()| None)
    } else {
        let mut data = connection.buffers.take(payload_bytes as usize);
        match reader.read_exact(data.as_mut_slice()) {
            Ok(()) => Ok(Some(data)),
            Err(e) => {
                connection.buffers.give(data);
                Err(e)
            }
        }
    };
    deadlines.disarm(Slot::Read);
    payload
}

/// How a read inside a request failed.
fn truncated(e: io::Error, deadlines: &Deadlines) -> End {
    if deadlines.expired() {
        End::TimedOut(io::Error::new(
            io::ErrorKind::TimedOut,
            "the request did not arrive by its deadline",
        ))
    } else if is_timeout(&e) {
        End::TimedOut(e)
    } else if e.kind() == io::ErrorKind::UnexpectedEof {
        End::Truncated(e)
    } else {
        End::Io(e)
    }
}

/// Runs queued requests until the queue closes and is empty.
fn worker(connection: &Connection<'_>, queue: &JobQueue<Job>) {
    while let Some(job) = queue.pop() {
        let cost_bytes = job.cost_bytes;
        let released_early_bytes = run(connection, job);
        connection.release(cost_bytes - released_early_bytes);
    }
}

/// Runs one request and sends its reply. Returns the bytes of its budget
/// it gave back early.
fn run(connection: &Connection<'_>, job: Job) -> u64 {
    let request = job.request;
    if let Some(rejection) = job.rejection {
        tracing::debug!(connection = connection.label, %request.command, error = rejection.error, message = rejection.message, "request refused");
        send_error(connection, &request, rejection.error, &rejection.message);
        return 0;
    }
    let volume = &connection.session.export.source;
    let fua = request.flags & CMD_FLAG_FUA != 0;
    let result = match request.command {
        Command::Read => {
            read(connection, &request);
            return 0;
        }
        Command::BlockStatus => return block_status(connection, &request),
        Command::Cache => cache(volume, request.offset, u64::from(request.length)),
        Command::Write => {
            let data = job.payload.expect("accepted writes carry their data");
            let written = volume.write_at(data.as_slice(), request.offset);
            connection.buffers.give(data);
            written
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
                return 0;
            }
            write_zeros(volume, request.offset, u64::from(request.length))
        }
        // Unmapping reads back as zeros and frees space: the fast way.
        Command::WriteZeroes => volume.discard(request.offset, u64::from(request.length)),
        Command::Disc | Command::Unknown(_) => {
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
    0
}

/// NBD_CMD_CACHE: reads the mapped parts of a range ahead of use, so that
/// the engine's metadata and the host's page cache hold them. Holes read
/// as zeros without I/O and are skipped.
fn cache(volume: &Source, offset: u64, len: u64) -> grove_store::Result<()> {
    let mut scratch = vec![0u8; CACHE_CHUNK_BYTES];
    for (start, extent_len) in volume.mapped_extents_in(offset, len)? {
        let from = start.max(offset);
        let to = (start + extent_len).min(offset + len);
        let mut at = from;
        while at < to {
            let chunk = (to - at).min(CACHE_CHUNK_BYTES as u64) as usize;
            volume.read_at(&mut scratch[..chunk], at)?;
            at += chunk as u64;
        }
    }
    Ok(())
}

fn write_zeros(volume: &Source, offset: u64, len: u64) -> grove_store::Result<()> {
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
    let mut buf = connection.buffers.take(prefix + request.length as usize);
    let volume = &connection.session.export.source;
    match volume.read_at(&mut buf.as_mut_slice()[prefix..], request.offset) {
        Ok(()) => {
            encode_read_reply_prefix(
                buf.as_mut_slice(),
                structured,
                request.cookie,
                request.offset,
            );
            send(connection, buf.as_slice());
        }
        Err(e) => send_engine_error(connection, request, &e),
    }
    connection.buffers.give(buf);
}

/// Answers BLOCK_STATUS: one chunk per selected metadata context, in the
/// order they were selected. Returns the part of its reserved budget that
/// the real reply did not need, which it gave back before sending.
fn block_status(connection: &Connection<'_>, request: &Request) -> u64 {
    let contexts = &connection.session.meta_contexts;
    let reserved_bytes = BLOCK_STATUS_CHUNK_MAX_BYTES * contexts.count() as u64;
    // Every context is worked out before anything is sent: an engine error
    // is then the whole reply, not a chunk after others.
    let chunks = match descriptors_per_context(connection, request) {
        Ok(chunks) => chunks,
        Err(e) => {
            send_engine_error(connection, request, &e);
            return 0;
        }
    };
    let last = chunks.len().saturating_sub(1);
    let mut reply = Vec::new();
    for (index, (id, descriptors)) in chunks.iter().enumerate() {
        reply.extend(encode_block_status_chunk(
            request.cookie,
            index == last,
            *id,
            descriptors,
        ));
    }
    let unused_bytes = reserved_bytes.saturating_sub(reply.len() as u64);
    connection.release(unused_bytes);
    send(connection, &reply);
    unused_bytes
}

/// The descriptors of a BLOCK_STATUS request for each selected context, as
/// (context id, descriptors).
fn descriptors_per_context(
    connection: &Connection<'_>,
    request: &Request,
) -> grove_store::Result<Vec<(u32, Vec<Descriptor>)>> {
    let contexts = &connection.session.meta_contexts;
    let mut chunks = Vec::with_capacity(contexts.count());
    if contexts.base_allocation {
        chunks.push((BASE_ALLOCATION_CONTEXT_ID, allocation(connection, request)?));
    }
    for changed in &contexts.changed {
        chunks.push((changed.id, changes(connection, request, &changed.base)?));
    }
    Ok(chunks)
}

/// `base:allocation` descriptors of a BLOCK_STATUS request.
fn allocation(
    connection: &Connection<'_>,
    request: &Request,
) -> grove_store::Result<Vec<Descriptor>> {
    let volume = &connection.session.export.source;
    // Only the queried window: the cost follows the request, not the volume.
    let extents = volume.mapped_extents_in(request.offset, u64::from(request.length))?;
    Ok(allocation_descriptors(
        &extents,
        request.offset,
        request.length,
        request.flags & CMD_FLAG_REQ_ONE != 0,
        BLOCK_STATUS_DESCRIPTORS_MAX,
    ))
}

/// `grove:changed:BASE` descriptors of a BLOCK_STATUS request. The diff is
/// worked out afresh for every request, so writes to the export (from any
/// connection) or to a live base show at once; it covers only the queried
/// window, so its cost follows what differs there.
fn changes(
    connection: &Connection<'_>,
    request: &Request,
    base: &str,
) -> grove_store::Result<Vec<Descriptor>> {
    let volume = &connection.session.export.source;
    let changes: Vec<(u64, u64)> = volume
        .diff_in(base, request.offset, u64::from(request.length))?
        .into_iter()
        .map(|extent| (extent.offset_bytes, extent.length_bytes))
        .collect();
    Ok(changed_descriptors(
        &changes,
        request.offset,
        request.length,
        request.flags & CMD_FLAG_REQ_ONE != 0,
        BLOCK_STATUS_DESCRIPTORS_MAX,
    ))
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
    // The reply's time starts once it is its turn to go out.
    let deadlines = connection.deadlines;
    deadlines.arm(Slot::Write, connection.allowance(bytes.len() as u64));
    let sent = writer.write_all(bytes).and_then(|()| writer.flush());
    deadlines.disarm(Slot::Write);
    if let Err(e) = sent {
        if !connection.broken.swap(true, Ordering::SeqCst) {
            if deadlines.expired() {
                tracing::warn!(
                    connection = connection.label,
                    "the client did not take a reply by its deadline; closing the connection"
                );
            } else {
                tracing::debug!(connection = connection.label, error = %e, "cannot send reply; dropping the connection");
            }
            let _ = writer.shutdown(Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The server-wide in-flight limit of these tests.
    const LIMIT_BYTES: u64 = 256 * 1024 * 1024;
    /// What a 1 MiB write holds while it is in the server.
    const WRITE_COST_BYTES: u64 = 1024 * 1024 + REQUEST_OVERHEAD_BYTES;
    /// How long a test waits for a thread to start waiting before it fails
    /// (a safety net: the wait itself is observed, not timed).
    const WAIT_START_TIMEOUT_MS: u64 = 30_000;

    /// Takes `bytes` if they fit now, without waiting: `cancelled` is only
    /// asked once a budget would have to wait.
    fn try_acquire(shares: &Shares<'_>, bytes: u64) -> bool {
        shares.acquire(bytes, &|| true)
    }

    /// One peer's budget and its connections' budgets.
    struct Peer {
        budget: Budget,
        connections: Vec<Budget>,
    }

    impl Peer {
        fn new(connections: usize) -> Peer {
            Peer {
                budget: Budget::new(LIMIT_BYTES),
                connections: (0..connections)
                    .map(|_| Budget::new(connection_share_bytes(LIMIT_BYTES)))
                    .collect(),
            }
        }

        fn shares<'a>(
            &'a self,
            connection: usize,
            peers: &'a AtomicUsize,
            server: &'a Budget,
        ) -> Shares<'a> {
            Shares {
                connection: &self.connections[connection],
                peer: &self.budget,
                peers_connected: peers,
                server,
            }
        }
    }

    #[test]
    fn the_shares_are_well_under_the_server_budget() {
        assert!(connection_share_bytes(LIMIT_BYTES) <= LIMIT_BYTES / 4);
        assert!(connection_share_bytes(LIMIT_BYTES) >= INFLIGHT_LIMIT_MIN_BYTES);
        assert_eq!(peer_share_bytes(LIMIT_BYTES, 1), LIMIT_BYTES);
        assert_eq!(peer_share_bytes(LIMIT_BYTES, 2), LIMIT_BYTES / 2);
        assert_eq!(peer_share_bytes(LIMIT_BYTES, 0), LIMIT_BYTES);
        // However many peers: one request of the largest payload fits.
        assert_eq!(
            peer_share_bytes(LIMIT_BYTES, 1000),
            INFLIGHT_LIMIT_MIN_BYTES
        );
    }

    /// A connection alone on the server stops at its own share: the rest
    /// of the budget stays free for others.
    #[test]
    fn a_connection_holds_at_most_its_share_of_the_budget() {
        let server = Budget::new(LIMIT_BYTES);
        let peers = AtomicUsize::new(1);
        let peer = Peer::new(2);
        let share = connection_share_bytes(LIMIT_BYTES);
        let first = peer.shares(0, &peers, &server);
        let mut taken = 0;
        while try_acquire(&first, WRITE_COST_BYTES) {
            taken += 1;
            assert!(taken <= share / WRITE_COST_BYTES, "past its share");
        }
        assert_eq!(taken, share / WRITE_COST_BYTES);
        assert_eq!(peer.connections[0].used_bytes(), taken * WRITE_COST_BYTES);
        assert_eq!(server.used_bytes(), taken * WRITE_COST_BYTES);
        assert!(server.used_bytes() <= LIMIT_BYTES / 4);
        // The cap is the connection's: another connection gets its share.
        let second = peer.shares(1, &peers, &server);
        assert!(try_acquire(&second, WRITE_COST_BYTES));
        // A refused request took nothing anywhere.
        assert!(!try_acquire(&first, WRITE_COST_BYTES));
        assert_eq!(peer.connections[0].used_bytes(), taken * WRITE_COST_BYTES);
        assert_eq!(
            server.used_bytes(),
            (taken + 1) * WRITE_COST_BYTES,
            "only the second connection's request was added"
        );
    }

    /// Peer A fills the whole budget while alone; peer B then connects and
    /// waits. What A gives back goes to B, and A gets nothing more until
    /// it holds less than its half, however many of its connections ask.
    #[test]
    fn a_peer_gets_nothing_past_its_share_while_another_peer_waits() {
        let server = Budget::new(LIMIT_BYTES);
        let peers = AtomicUsize::new(1);
        let connections = CONNECTION_SHARE_DIVISOR as usize + 1;
        let a = Peer::new(connections);
        let mut held: Vec<u64> = vec![0; connections];
        for (c, count) in held.iter_mut().enumerate() {
            while try_acquire(&a.shares(c, &peers, &server), WRITE_COST_BYTES) {
                *count += 1;
            }
        }
        assert!(
            server.used_bytes() + WRITE_COST_BYTES > LIMIT_BYTES,
            "alone, A filled the server's budget: {}",
            server.used_bytes()
        );
        let b = Peer::new(1);
        peers.store(2, Ordering::SeqCst);
        let half = peer_share_bytes(LIMIT_BYTES, 2);
        let waiting = AtomicBool::new(false);
        let given_up = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let b_request = scope.spawn(|| {
                let cancelled = || {
                    waiting.store(true, Ordering::SeqCst);
                    given_up.load(Ordering::SeqCst)
                };
                b.shares(0, &peers, &server)
                    .acquire(WRITE_COST_BYTES, &cancelled)
            });
            let started = Instant::now();
            while !waiting.load(Ordering::SeqCst) {
                if started.elapsed() > Duration::from_millis(WAIT_START_TIMEOUT_MS) {
                    given_up.store(true, Ordering::SeqCst);
                    panic!("B's request never waited");
                }
                std::thread::yield_now();
            }
            assert!(!b_request.is_finished(), "B waits: the server is full");
            // A gives one request back and asks again, on the same
            // connection and on every other: refused, it holds past its half.
            a.shares(0, &peers, &server).release(WRITE_COST_BYTES);
            held[0] -= 1;
            for c in 0..connections {
                assert!(
                    !try_acquire(&a.shares(c, &peers, &server), WRITE_COST_BYTES),
                    "A got more while holding {} of its share {half} and B waits",
                    a.budget.used_bytes()
                );
            }
            let acquired = b_request.join().unwrap();
            assert!(acquired, "B got the room A gave back");
        });
        assert_eq!(b.budget.used_bytes(), WRITE_COST_BYTES);
        // A gives back one request at a time: every ask of A is refused
        // until what it holds plus the ask is within its half.
        let mut c = 0;
        loop {
            while held[c] == 0 {
                c = (c + 1) % connections;
            }
            a.shares(c, &peers, &server).release(WRITE_COST_BYTES);
            held[c] -= 1;
            let fits = a.budget.used_bytes() + WRITE_COST_BYTES <= half;
            let got = try_acquire(&a.shares(c, &peers, &server), WRITE_COST_BYTES);
            assert_eq!(got, fits, "A holds {}", a.budget.used_bytes());
            if got {
                held[c] += 1;
                break;
            }
            c = (c + 1) % connections;
        }
        assert!(a.budget.used_bytes() <= half);
        // B goes on to its own connection's share, the server having room.
        let mut b_taken = 1;
        while try_acquire(&b.shares(0, &peers, &server), WRITE_COST_BYTES) {
            b_taken += 1;
        }
        assert_eq!(
            b_taken,
            connection_share_bytes(LIMIT_BYTES) / WRITE_COST_BYTES
        );
        assert!(server.used_bytes() <= LIMIT_BYTES);
    }

    /// Random requests and releases over four peers of three connections:
    /// after every one, no connection, peer or server holds past its cap,
    /// and every refusal had a budget that was really full.
    #[test]
    fn random_requests_never_exceed_a_share_and_are_refused_only_when_one_is_full() {
        const PEERS: usize = 4;
        const CONNECTIONS: usize = 3;
        const STEPS: usize = 20_000;
        let server = Budget::new(LIMIT_BYTES);
        let peers_connected = AtomicUsize::new(PEERS);
        let peers: Vec<Peer> = (0..PEERS).map(|_| Peer::new(CONNECTIONS)).collect();
        let connection_share = connection_share_bytes(LIMIT_BYTES);
        let peer_share = peer_share_bytes(LIMIT_BYTES, PEERS);
        assert!(
            CONNECTIONS as u64 * connection_share > peer_share,
            "the peer's cap binds before its connections' caps do"
        );
        // Requests in the server: (peer, connection, bytes).
        let mut held: Vec<(usize, usize, u64)> = Vec::new();
        let (mut refused, mut accepted) = (0, 0);
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..STEPS {
            if !held.is_empty() && next(3) == 0 {
                let (p, c, bytes) = held.swap_remove(next(held.len() as u64) as usize);
                peers[p].shares(c, &peers_connected, &server).release(bytes);
            } else {
                let (p, c) = (
                    next(PEERS as u64) as usize,
                    next(CONNECTIONS as u64) as usize,
                );
                let bytes = match next(20) {
                    0 => INFLIGHT_LIMIT_MIN_BYTES,
                    1 => REQUEST_OVERHEAD_BYTES,
                    _ => REQUEST_OVERHEAD_BYTES + 1 + next(PAYLOAD_MAX_BYTES as u64 / 16),
                };
                let full = |budget: &Budget, cap: u64| {
                    budget.used_bytes() > 0 && budget.used_bytes() + bytes > cap
                };
                let peer = &peers[p];
                let any_full = full(&peer.connections[c], connection_share)
                    || full(&peer.budget, peer_share)
                    || full(&server, LIMIT_BYTES);
                let got = try_acquire(&peer.shares(c, &peers_connected, &server), bytes);
                assert_eq!(got, !any_full, "a request of {bytes} bytes");
                if got {
                    held.push((p, c, bytes));
                    accepted += 1;
                } else {
                    refused += 1;
                }
            }
            for peer in &peers {
                assert!(peer.budget.used_bytes() <= peer_share);
                for connection in &peer.connections {
                    assert!(connection.used_bytes() <= connection_share);
                }
            }
            assert!(server.used_bytes() <= LIMIT_BYTES);
            let total: u64 = held.iter().map(|h| h.2).sum();
            assert_eq!(server.used_bytes(), total, "the books balance");
        }
        assert!(
            refused > STEPS / 10 && accepted > STEPS / 10,
            "{refused} refused, {accepted} accepted"
        );
    }
}
