//! The server: listeners, one thread per connection, and a clean shutdown
//! (stop accepting, let in-flight requests finish, flush the pool).

use std::collections::HashMap;
use std::io::{self, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use grove_store::Pool;

use crate::buffers::BufferPool;
use crate::deadline::{Deadlines, Slot, WATCHDOG_TICK_MS};
use crate::error::{NbdError, NbdErrorKind};
use crate::export::ServerOptions;
use crate::handshake::{self, Context, HandshakeError, Outcome, Session};
use crate::peers::{admit, peer_of, Admission, Occupant, Peer};
use crate::stream::{DeadlineReader, Stream};
use crate::transmission::{self, Budget, End, Limits};

/// The port IANA reserved for NBD.
pub const DEFAULT_TCP_PORT: u16 = 10809;

/// TCP keepalive: a connection silent this long is probed, every
/// KEEPALIVE_INTERVAL_MS, and dropped after KEEPALIVE_PROBES unanswered
/// probes. An idle client is legitimate; a dead peer (a crashed or
/// unplugged machine) is found in about two minutes this way.
const KEEPALIVE_IDLE_MS: u64 = 60_000;
const KEEPALIVE_INTERVAL_MS: u64 = 10_000;
const KEEPALIVE_PROBES: u32 = 6;

/// Pause after a failed accept (out of file descriptors, say) before the
/// next, so a persistent failure does not spin a core.
const ACCEPT_ERROR_BACKOFF_MS: u64 = 100;

/// Buffer of a connection's reader: many small request headers per read
/// (a request's data past what is buffered is read straight into its own
/// buffer). The reader touches all of it, so a host's thousand idle
/// connections hold a thousand of these: 256 KiB each was 250 MiB.
const READ_BUFFER_BYTES: usize = 8 * 1024;

/// Parses a TCP listen address for `grove serve --listen`: "PORT" or
/// ":PORT" binds to loopback, "HOST:PORT" to that host.
pub fn parse_listen_addr(text: &str) -> Result<SocketAddr, NbdError> {
    let invalid = |why: &str| {
        NbdError::new(
            NbdErrorKind::InvalidArgument,
            format!("invalid listen address {text:?}: {why}"),
        )
    };
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|e| invalid(&e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| invalid("it resolves to no address"))
}

/// An NBD server over one pool. Cheap to clone; every clone controls the
/// same server.
///
/// ```no_run
/// use grove_nbd::{Server, ServerOptions};
/// let pool = grove_store::Pool::open("pool".as_ref())?;
/// let server = Server::new(pool, ServerOptions::default());
/// server.serve_unix("pool/nbd.sock".as_ref())?;
/// let stop = server.shutdown_handle(); // e.g. for a signal handler
/// # stop.shutdown()?;
/// server.wait();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

/// Stops a server from another thread (a signal handler, say).
#[derive(Clone)]
pub struct ShutdownHandle {
    server: Server,
}

impl ShutdownHandle {
    /// See [`Server::shutdown`].
    pub fn shutdown(&self) -> Result<(), NbdError> {
        self.server.shutdown()
    }
}

struct Inner {
    pool: Pool,
    options: Arc<ServerOptions>,
    control: Arc<Control>,
}

/// What connection threads share with the server. It holds no pool handle:
/// a connection thread lets go of the pool before it unregisters, so once
/// shutdown has seen every connection leave, dropping the server closes
/// the pool.
struct Control {
    stopping: AtomicBool,
    /// What connection deadlines count from.
    epoch: Instant,
    /// Peers with connections now (`State::peers`' length), read by the
    /// connections without the lock.
    peers_connected: AtomicUsize,
    /// Request payloads and replies in flight across all connections.
    budget: Budget,
    /// Buffers of request data and replies, reused across connections.
    buffers: BufferPool,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    listeners: Vec<Listener>,
    /// Live connections, so shutdown can end reads and the watchdog can
    /// cut off those past a deadline.
    connections: HashMap<u64, Registered>,
    /// Connections and in-flight budget per peer.
    peers: HashMap<Peer, PeerShare>,
    next_connection_id: u64,
    /// The watchdog thread, started with the first listener.
    watchdog: Option<JoinHandle<()>>,
    stopped: bool,
}

/// A live connection as the server sees it.
struct Registered {
    /// A clone of its socket.
    stream: Stream,
    occupant: Occupant,
    deadlines: Arc<Deadlines>,
}

/// What the connections of one peer share.
struct PeerShare {
    connections: usize,
    /// What the peer's connections hold of the in-flight budget (at most
    /// [`transmission::peer_share_bytes`]).
    budget: Arc<Budget>,
}

struct Listener {
    thread: JoinHandle<()>,
    /// Where to connect to wake the accept loop at shutdown.
    wake: WakeTarget,
    /// A unix socket file to remove at shutdown.
    socket_path: Option<PathBuf>,
}

enum WakeTarget {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl Server {
    pub fn new(pool: Pool, options: ServerOptions) -> Server {
        let budget = Budget::new(options.inflight_limit_bytes);
        Server {
            inner: Arc::new(Inner {
                pool,
                options: Arc::new(options),
                control: Arc::new(Control {
                    stopping: AtomicBool::new(false),
                    epoch: Instant::now(),
                    peers_connected: AtomicUsize::new(0),
                    budget,
                    buffers: BufferPool::default(),
                    state: Mutex::new(State::default()),
                    changed: Condvar::new(),
                }),
            }),
        }
    }

    pub fn options(&self) -> &ServerOptions {
        &self.inner.options
    }

    /// Listens on a unix socket at `path`, created with the permissions of
    /// [`ServerOptions::socket_mode`]. A stale socket file left by a server
    /// that died is replaced; a live one is an error. The file is removed
    /// at shutdown.
    pub fn serve_unix(&self, path: &Path) -> Result<(), NbdError> {
        self.check_running()?;
        remove_stale_socket(path)?;
        let listener = bind_unix_socket(path, self.inner.options.socket_mode).map_err(|e| {
            NbdError::io(
                NbdErrorKind::Listen,
                format!("cannot listen on unix socket {}", path.display()),
                e,
            )
        })?;
        self.start_listener(
            ListenerSocket::Unix(listener),
            WakeTarget::Unix(path.to_path_buf()),
            Some(path.to_path_buf()),
        )?;
        tracing::info!(socket = %path.display(), "NBD server listening");
        Ok(())
    }

    /// Listens on TCP at `addr` (see [`parse_listen_addr`]). Returns the
    /// address bound, which tells the port when `addr` asked for port 0.
    pub fn serve_tcp(&self, addr: SocketAddr) -> Result<SocketAddr, NbdError> {
        self.check_running()?;
        let listener = TcpListener::bind(addr).map_err(|e| {
            let kind = if e.kind() == io::ErrorKind::AddrInUse {
                NbdErrorKind::AddressInUse
            } else {
                NbdErrorKind::Listen
            };
            NbdError::io(kind, format!("cannot listen on {addr}"), e)
        })?;
        self.serve_tcp_listener(listener)
    }

    /// Serves on a unix listener the caller bound (socket activation,
    /// tests). The socket file is left alone at shutdown.
    pub fn serve_unix_listener(&self, listener: UnixListener) -> Result<(), NbdError> {
        self.check_running()?;
        let path = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_path_buf))
            .ok_or_else(|| {
                NbdError::new(
                    NbdErrorKind::InvalidArgument,
                    "a unix listener must be bound to a path",
                )
            })?;
        self.start_listener(ListenerSocket::Unix(listener), WakeTarget::Unix(path), None)
    }

    /// Serves on a TCP listener the caller bound. Returns its address.
    pub fn serve_tcp_listener(&self, listener: TcpListener) -> Result<SocketAddr, NbdError> {
        self.check_running()?;
        let addr = listener.local_addr().map_err(|e| {
            NbdError::io(
                NbdErrorKind::Listen,
                "cannot read the listener's address",
                e,
            )
        })?;
        // A listener on the wildcard address is woken through loopback.
        let wake = match addr {
            SocketAddr::V4(a) if a.ip().is_unspecified() => {
                SocketAddr::from(([127, 0, 0, 1], a.port()))
            }
            SocketAddr::V6(a) if a.ip().is_unspecified() => {
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
            }
            other => other,
        };
        self.start_listener(ListenerSocket::Tcp(listener), WakeTarget::Tcp(wake), None)?;
        tracing::info!(address = %addr, "NBD server listening");
        Ok(addr)
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle {
            server: self.clone(),
        }
    }

    /// Connections being served now.
    pub fn connection_count(&self) -> usize {
        self.inner.control.lock().connections.len()
    }

    /// Bytes of request payloads and replies in flight now, across all
    /// connections (at most [`ServerOptions::inflight_limit_bytes`], but
    /// for one request alone).
    pub fn inflight_bytes(&self) -> u64 {
        self.inner.control.budget.used_bytes()
    }

    /// Stops the server: closes the listeners, lets every connection finish
    /// the requests it has read (no new ones are read), then flushes the
    /// pool. Returns when all of that is done. Calling it again, from any
    /// clone, waits for the first call to finish.
    pub fn shutdown(&self) -> Result<(), NbdError> {
        let inner = &self.inner;
        if inner.control.stopping.swap(true, Ordering::SeqCst) {
            self.wait();
            return Ok(());
        }
        tracing::info!("NBD server shutting down");
        let listeners = std::mem::take(&mut inner.control.lock().listeners);
        for listener in listeners {
            stop_listener(listener);
        }
        let state = self.close_connections();
        drop(state);
        let flushed = inner.pool.flush().map_err(|e| {
            NbdError::engine(NbdErrorKind::Flush, "cannot flush the pool at shutdown", e)
        });
        let mut state = inner.control.lock();
        state.stopped = true;
        let watchdog = state.watchdog.take();
        inner.control.changed.notify_all();
        drop(state);
        if let Some(watchdog) = watchdog {
            let _ = watchdog.join();
        }
        tracing::info!("NBD server stopped");
        flushed
    }

    /// Ends every connection's reads: readers see end-of-file, workers
    /// answer what was already read, and the connections close. Those
    /// still busy after the grace period are cut off. Returns the state,
    /// locked, with no connection left.
    fn close_connections(&self) -> MutexGuard<'_, State> {
        let control = &self.inner.control;
        let mut state = control.lock();
        for connection in state.connections.values() {
            let _ = connection.stream.shutdown(Shutdown::Read);
        }
        let grace = Duration::from_millis(self.inner.options.shutdown_grace_ms);
        let deadline = Instant::now() + grace;
        while !state.connections.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    connections = state.connections.len(),
                    "connections still busy after the grace period; closing them"
                );
                for connection in state.connections.values() {
                    let _ = connection.stream.shutdown(Shutdown::Both);
                }
                while !state.connections.is_empty() {
                    state = control
                        .changed
                        .wait(state)
                        .unwrap_or_else(|e| e.into_inner());
                }
                break;
            }
            state = control
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        state
    }

    /// Blocks until the server has shut down.
    pub fn wait(&self) {
        let mut state = self.inner.control.lock();
        while !state.stopped {
            state = self
                .inner
                .control
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn check_running(&self) -> Result<(), NbdError> {
        if self.inner.control.stopping.load(Ordering::SeqCst) {
            return Err(NbdError::new(
                NbdErrorKind::ShutDown,
                "the NBD server is shut down",
            ));
        }
        Ok(())
    }

    fn start_listener(
        &self,
        socket: ListenerSocket,
        wake: WakeTarget,
        socket_path: Option<PathBuf>,
    ) -> Result<(), NbdError> {
        self.start_watchdog()?;
        let inner = self.inner.clone();
        let thread = thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept_loop(&inner, socket))
            .map_err(|e| NbdError::io(NbdErrorKind::Listen, "cannot start the accept thread", e))?;
        self.inner.control.lock().listeners.push(Listener {
            thread,
            wake,
            socket_path,
        });
        Ok(())
    }
}

impl Server {
    /// Starts the watchdog (once): deadlines, and memory given back when idle.
    fn start_watchdog(&self) -> Result<(), NbdError> {
        let mut state = self.inner.control.lock();
        if state.watchdog.is_some() {
            return Ok(());
        }
        let control = self.inner.control.clone();
        let on_idle = self.inner.options.on_idle;
        let thread = thread::Builder::new()
            .name("nbd-watchdog".into())
            .spawn(move || watchdog(&control, on_idle))
            .map_err(|e| {
                NbdError::io(NbdErrorKind::Listen, "cannot start the watchdog thread", e)
            })?;
        state.watchdog = Some(thread);
        Ok(())
    }
}

/// Cuts off connections past a deadline, and gives idle buffers back,
/// until the server has stopped.
fn watchdog(control: &Control, on_idle: Option<fn()>) {
    let mut state = control.lock();
    while !state.stopped {
        let now = Instant::now();
        for (id, connection) in &state.connections {
            if let Some(slot) = connection.deadlines.check(now) {
                let what = match (slot, connection.occupant.handshaking) {
                    (Slot::Read, true) => "the handshake",
                    (Slot::Read, false) => "a request's data",
                    (Slot::Write, _) => "taking a reply",
                };
                tracing::warn!(
                    connection = id,
                    peer = %connection.occupant.peer,
                    "client too slow over {what}: past its deadline; closing the connection"
                );
                let _ = connection.stream.shutdown(Shutdown::Both);
            }
        }
        drop(state);
        if control.buffers.trim_if_idle(now) {
            if let Some(give_back) = on_idle {
                give_back();
            }
        }
        state = control.lock();
        if !state.stopped {
            state = control
                .changed
                .wait_timeout(state, Duration::from_millis(WATCHDOG_TICK_MS))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

enum ListenerSocket {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl ListenerSocket {
    fn accept(&self) -> io::Result<Stream> {
        match self {
            ListenerSocket::Unix(l) => l.accept().map(|(s, _)| Stream::Unix(s)),
            ListenerSocket::Tcp(l) => {
                let (s, _) = l.accept()?;
                // Replies are whole messages already; Nagle would only
                // delay the last piece of each.
                s.set_nodelay(true)?;
                set_keepalive(&s)?;
                Ok(Stream::Tcp(s))
            }
        }
    }
}

fn set_keepalive(socket: &TcpStream) -> io::Result<()> {
    use rustix::net::sockopt;
    sockopt::set_socket_keepalive(socket, true)?;
    sockopt::set_tcp_keepidle(socket, Duration::from_millis(KEEPALIVE_IDLE_MS))?;
    sockopt::set_tcp_keepintvl(socket, Duration::from_millis(KEEPALIVE_INTERVAL_MS))?;
    sockopt::set_tcp_keepcnt(socket, KEEPALIVE_PROBES)?;
    Ok(())
}

/// Binds a unix socket at `path` whose file has permissions `mode` from
/// the start: it is bound under a temporary name in the same directory,
/// given its mode, and renamed into place, so no client can connect while
/// the umask's permissions are on it.
pub fn bind_unix_socket(path: &Path, mode: u32) -> io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let temporary = dir.join(format!(".grove-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary)?;
    let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode))
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(e);
    }
    Ok(listener)
}

impl Control {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn accept_loop(inner: &Arc<Inner>, socket: ListenerSocket) {
    loop {
        let accepted = socket.accept();
        if inner.control.stopping.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok(stream) => start_connection(inner, stream),
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                thread::sleep(Duration::from_millis(ACCEPT_ERROR_BACKOFF_MS));
            }
        }
    }
}

fn start_connection(inner: &Arc<Inner>, stream: Stream) {
    let mut state = inner.control.lock();
    if inner.control.stopping.load(Ordering::SeqCst) {
        return;
    }
    let peer = peer_of(&stream);
    if !make_room(&mut state, &inner.options, peer) {
        return;
    }
    let control = match stream.try_clone() {
        Ok(control) => control,
        Err(e) => {
            tracing::warn!(error = %e, "cannot clone a connection's socket; dropping it");
            return;
        }
    };
    let deadlines = Arc::new(Deadlines::new(inner.control.epoch));
    // One deadline for the whole handshake, TLS included.
    let handshake_deadline = (inner.options.handshake_timeout_ms > 0)
        .then(|| Duration::from_millis(inner.options.handshake_timeout_ms));
    deadlines.arm(Slot::Read, handshake_deadline);
    let id = state.next_connection_id;
    state.next_connection_id += 1;
    let limit_bytes = inner.options.inflight_limit_bytes;
    let share = state.peers.entry(peer).or_insert_with(|| PeerShare {
        connections: 0,
        budget: Arc::new(Budget::new(limit_bytes)),
    });
    share.connections += 1;
    let peer_budget = share.budget.clone();
    let peers = state.peers.len();
    inner.control.peers_connected.store(peers, Ordering::SeqCst);
    let occupant = Occupant {
        peer,
        handshaking: true,
        evicted: false,
        since: Instant::now(),
    };
    let registered = Registered {
        stream: control,
        occupant,
        deadlines: deadlines.clone(),
    };
    state.connections.insert(id, registered);
    drop(state);
    let control = inner.control.clone();
    let pool = inner.pool.clone();
    let options = inner.options.clone();
    let spawned = thread::Builder::new()
        .name(format!("nbd-conn-{id}"))
        .spawn(move || {
            let guard = ConnectionGuard { control, id };
            let ours = Ours {
                control: &guard.control,
                id,
                deadlines: &deadlines,
                peer_budget: &peer_budget,
            };
            handle_connection(pool, &options, &ours, stream);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a connection thread; dropping the connection");
        unregister(&inner.control, id);
    }
}

/// Whether a new connection from `peer` may have a slot, closing the
/// oldest unfinished handshake when that is what makes room.
fn make_room(state: &mut State, options: &ServerOptions, peer: Peer) -> bool {
    let occupants = state.connections.iter().map(|(id, c)| (*id, &c.occupant));
    let admission = admit(
        occupants,
        peer,
        options.connections_max,
        options.connections_per_client_max,
    );
    match admission {
        Admission::Admit => true,
        Admission::AdmitInPlaceOf(id) => {
            let evicted = state
                .connections
                .get_mut(&id)
                .expect("admit names a live connection");
            assert!(evicted.occupant.handshaking && !evicted.occupant.evicted);
            evicted.occupant.evicted = true;
            let _ = evicted.stream.shutdown(Shutdown::Both);
            tracing::warn!(
                connection = id,
                peer = %evicted.occupant.peer,
                newcomer = %peer,
                "every NBD connection slot is taken: a client still in its handshake gave way"
            );
            true
        }
        Admission::PeerFull => {
            tracing::warn!(
                %peer,
                limit = options.connections_per_client_max,
                "this client has its share of NBD connections; refusing one more"
            );
            false
        }
        Admission::ServerFull => {
            tracing::warn!(
                limit = options.connections_max,
                %peer,
                "too many NBD connections; refusing one"
            );
            false
        }
    }
}

/// What a connection's thread knows of its own registration.
struct Ours<'a> {
    control: &'a Control,
    id: u64,
    deadlines: &'a Deadlines,
    peer_budget: &'a Budget,
}

impl Ours<'_> {
    /// The handshake is over: the connection no longer gives way, and
    /// waiting for requests has no deadline.
    fn finished_handshake(&self) {
        self.deadlines.disarm(Slot::Read);
        if let Some(connection) = self.control.lock().connections.get_mut(&self.id) {
            connection.occupant.handshaking = false;
        }
    }
}

/// Removes a connection from the server's books and closes its socket.
fn unregister(control: &Control, id: u64) {
    let mut state = control.lock();
    if let Some(connection) = state.connections.remove(&id) {
        let _ = connection.stream.shutdown(Shutdown::Both);
        let peer = connection.occupant.peer;
        let share = state
            .peers
            .get_mut(&peer)
            .expect("a connection's peer is counted");
        assert!(share.connections > 0);
        share.connections -= 1;
        if share.connections == 0 {
            state.peers.remove(&peer);
        }
        let peers = state.peers.len();
        control.peers_connected.store(peers, Ordering::SeqCst);
    }
    drop(state);
    control.changed.notify_all();
}

/// Unregisters a connection when its thread ends, however it ends.
struct ConnectionGuard {
    control: Arc<Control>,
    id: u64,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        unregister(&self.control, self.id);
    }
}

/// Wakes a listener's accept loop (which checks `stopping` after every
/// accept) with one connection, waits for it, and removes its socket file.
fn stop_listener(listener: Listener) {
    let woke = match &listener.wake {
        WakeTarget::Unix(path) => UnixStream::connect(path).map(drop),
        WakeTarget::Tcp(addr) => TcpStream::connect(addr).map(drop),
    };
    match woke {
        Ok(()) => {
            let _ = listener.thread.join();
        }
        // Left to exit at its next accept.
        Err(e) => {
            tracing::warn!(error = %e, "cannot wake an accept loop; leaving it behind")
        }
    }
    if let Some(path) = &listener.socket_path {
        let _ = std::fs::remove_file(path);
    }
}

/// Serves one connection. Takes the pool by value so that it is let go
/// before the connection unregisters.
fn handle_connection(pool: Pool, options: &ServerOptions, ours: &Ours<'_>, stream: Stream) {
    let label = format!("{} ({})", ours.id, stream.peer());
    let Some((mut reader, writer, session)) = handshake(&pool, options, ours, stream, &label)
    else {
        return;
    };
    tracing::info!(
        connection = label,
        export = session.export.name,
        read_only = session.export.read_only,
        structured_replies = session.structured_replies,
        base_allocation = session.meta_contexts.base_allocation,
        changed_bases = ?session.meta_contexts.changed.iter().map(|c| c.base.as_str()).collect::<Vec<_>>(),
        tls = reader.get_ref().is_tls(),
        "serving export"
    );
    let control = ours.control;
    let limits = Limits {
        server_budget: &control.budget,
        peer_budget: ours.peer_budget,
        peers_connected: &control.peers_connected,
        buffers: &control.buffers,
        stopping: &control.stopping,
        deadlines: ours.deadlines,
        request_timeout: (options.request_timeout_ms > 0)
            .then(|| Duration::from_millis(options.request_timeout_ms)),
        min_rate_bytes_per_s: options.min_rate_bytes_per_s,
        workers: options.workers_per_connection,
    };
    let end = transmission::serve(&mut reader, writer, &session, &limits, &label);
    log_end(&label, end);
}

/// A connection's handshake: its reader (which keeps what the client
/// sent behind its last option), its writer and the export it chose; None
/// when it ends without one, which is logged.
fn handshake(
    pool: &Pool,
    options: &ServerOptions,
    ours: &Ours<'_>,
    stream: Stream,
    label: &str,
) -> Option<(BufReader<Stream>, Stream, Session)> {
    let mut writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(e) => {
            tracing::warn!(connection = label, error = %e, "cannot clone the socket");
            return None;
        }
    };
    tracing::debug!(connection = label, "connected");
    // The deadline covers the whole handshake, not each read: a client
    // that trickles one byte at a time is cut off too.
    let deadline = (options.handshake_timeout_ms > 0)
        .then(|| Instant::now() + Duration::from_millis(options.handshake_timeout_ms));
    // The reader keeps its buffer from the handshake into transmission: a
    // client may send its first request right behind NBD_OPT_GO.
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let context = Context {
        pool,
        options,
        stopping: &ours.control.stopping,
        tls: None,
        tls_active: false,
        entering_transmission: &|| ours.finished_handshake(),
    };
    let negotiated = negotiate(&mut reader, &mut writer, &context, deadline, label);
    if deadline.is_some() {
        if let Err(e) = reader.get_ref().set_read_timeout(None) {
            tracing::warn!(connection = label, error = %e, "cannot clear the handshake timeout");
            return None;
        }
    }
    match negotiated {
        Ok(Outcome::Transmission(session)) => Some((reader, writer, session)),
        Ok(Outcome::Ended | Outcome::StartTls) => {
            tracing::debug!(connection = label, "client left during the handshake");
            None
        }
        Err(e) if ours.deadlines.expired() => {
            tracing::info!(connection = label, error = %e, "handshake cut off at its deadline");
            None
        }
        Err(e) => {
            tracing::info!(connection = label, error = %e, "handshake ended");
            None
        }
    }
}

/// The handshake: the greeting, then options until the client picks an
/// export or leaves, starting TLS on the way if it asks.
/// `base` is the context but for TLS, which this works out.
fn negotiate(
    reader: &mut BufReader<Stream>,
    writer: &mut Stream,
    base: &Context<'_>,
    deadline: Option<Instant>,
    label: &str,
) -> Result<Outcome, HandshakeError> {
    // TLS is offered on TCP connections only: a unix socket is guarded by
    // its file's permissions.
    let tls = match reader.get_ref() {
        Stream::Tcp(_) => base.options.tls.as_ref(),
        _ => None,
    };
    let mut client_flags = None;
    loop {
        let tls_active = reader.get_ref().is_tls();
        let mut timed = DeadlineReader {
            reader,
            deadline,
            what: "the handshake",
        };
        let flags = match client_flags {
            Some(flags) => flags,
            None => match handshake::greet(&mut timed, writer) {
                Ok(Some(flags)) => *client_flags.insert(flags),
                Ok(None) => break Ok(Outcome::Ended),
                Err(e) => break Err(e),
            },
        };
        let context = Context {
            tls,
            tls_active,
            ..*base
        };
        match handshake::negotiate_options(&mut timed, writer, &context, flags) {
            Ok(Outcome::StartTls) => {}
            other => break other,
        }
        match start_tls(reader, tls) {
            Ok(tls_stream) => {
                *writer = tls_stream;
                tracing::debug!(connection = label, "TLS started");
            }
            Err(e) => break Err(e),
        }
    }
}

/// Logs how a connection's transmission phase ended.
fn log_end(label: &str, end: End) {
    match end {
        End::Disconnect | End::Closed => tracing::debug!(connection = label, "disconnected"),
        End::Stopped => tracing::debug!(connection = label, "stopped while waiting for room"),
        End::Truncated(e) => {
            tracing::info!(connection = label, error = %e, "client left in the middle of a request")
        }
        End::TimedOut(e) => tracing::info!(
            connection = label,
            error = %e,
            "client too slow in the middle of a request; connection closed"
        ),
        End::Protocol(e) => tracing::warn!(
            connection = label,
            error = e,
            "client broke the protocol; dropping it"
        ),
        End::Io(e) => tracing::info!(connection = label, error = %e, "connection failed"),
    }
}

/// Runs the TLS handshake after NBD_OPT_STARTTLS was acknowledged, and
/// puts the reader on the TLS stream. Returns the writer's end.
fn start_tls(
    reader: &mut BufReader<Stream>,
    tls: Option<&crate::tls::TlsOptions>,
) -> Result<Stream, HandshakeError> {
    // A client must wait for the ACK before it starts TLS; bytes already
    // here were sent in plaintext behind the option, and would be read as
    // if they came over TLS (the STARTTLS injection attack).
    if !reader.buffer().is_empty() {
        return Err(HandshakeError::Protocol(
            "the client sent data behind NBD_OPT_STARTTLS before the reply".into(),
        ));
    }
    let (Some(tls), Stream::Tcp(socket)) = (tls, reader.get_ref()) else {
        return Err(HandshakeError::Protocol(
            "NBD_OPT_STARTTLS on a connection without TLS".into(),
        ));
    };
    let mut stream = tls.accept(socket.try_clone()?)?;
    stream.handshake()?;
    let writer = Stream::Tls(stream.try_clone());
    *reader = BufReader::with_capacity(READ_BUFFER_BYTES, Stream::Tls(stream));
    Ok(writer)
}

/// Makes room for a unix socket at `path`: nothing there is fine; a socket
/// nobody answers on is stale and removed; anything else is an error.
fn remove_stale_socket(path: &Path) -> Result<(), NbdError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(NbdError::io(
                NbdErrorKind::Listen,
                format!("cannot inspect {}", path.display()),
                e,
            ))
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(NbdError::new(
            NbdErrorKind::InvalidArgument,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(NbdError::new(
            NbdErrorKind::AddressInUse,
            format!("another server is listening on {}", path.display()),
        ));
    }
    std::fs::remove_file(path).map_err(|e| {
        NbdError::io(
            NbdErrorKind::Listen,
            format!("cannot remove the stale socket {}", path.display()),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen_addr("10809").unwrap(),
            "127.0.0.1:10809".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr(":2000").unwrap(),
            "127.0.0.1:2000".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("0.0.0.0:1").unwrap(),
            "0.0.0.0:1".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("[::1]:5").unwrap(),
            "[::1]:5".parse().unwrap()
        );
        assert!(parse_listen_addr("not an address").is_err());
    }
}
