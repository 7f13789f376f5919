//! The server's life: TCP and unix listeners, the connection limit, stale
//! socket files, and a shutdown that stops accepting, answers what was
//! already sent, and flushes the pool.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use common::{pattern, RawClient, TestServer};
use grove_nbd::codec::*;
use grove_nbd::{parse_listen_addr, NbdErrorKind, Server, ServerOptions};
use grove_store::{Pool, PoolOptions};

#[test]
fn serves_over_tcp_on_loopback() {
    let t = TestServer::start(&[("disk", 1 << 20)], ServerOptions::default());
    let addr = t
        .server
        .serve_tcp(parse_listen_addr(":0").unwrap())
        .unwrap();
    assert!(addr.ip().is_loopback(), "a bare port binds to loopback");
    let mut c = RawClient::connect_tcp(addr);
    c.handshake("disk", true);
    c.request(Command::Write, CMD_FLAG_FUA, 1, 4096, 4096);
    c.send(&pattern(4096, 1));
    assert_eq!(c.reply(None).error(), 0);
    assert_eq!(t.read_volume("disk", 4096, 4096), pattern(4096, 1));
}

#[test]
fn shutdown_answers_what_was_sent_flushes_and_stops_accepting() {
    let dir = tempfile::tempdir().unwrap();
    let pool_dir = dir.path().join("pool");
    let socket = dir.path().join("nbd.sock");
    {
        let pool = Pool::create(&pool_dir, &PoolOptions::default()).unwrap();
        pool.create_volume("disk", 1 << 20).unwrap();
        let server = Server::new(pool, ServerOptions::default());
        server.serve_unix(&socket).unwrap();

        // One client mid-handshake, one idle in transmission, one with
        // writes in flight: none may hold up the shutdown.
        let mut idle_in_handshake = RawClient::connect(&socket);
        let _ = idle_in_handshake.recv(GREETING_BYTES);
        let mut idle = RawClient::connect(&socket);
        idle.handshake("disk", false);
        let mut busy = RawClient::connect(&socket);
        busy.handshake("disk", true);
        let writes = 16u64;
        for cookie in 0..writes {
            // No FUA and no FLUSH: only the shutdown's flush makes these durable.
            busy.request(Command::Write, 0, cookie, cookie * 4096, 4096);
            busy.send(&pattern(4096, cookie));
        }

        let waiter = {
            let server = server.clone();
            std::thread::spawn(move || server.wait())
        };
        let started = Instant::now();
        server.shutdown_handle().shutdown().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "shutdown did not wait for the grace period"
        );
        waiter.join().unwrap();

        // Every write sent before the shutdown was answered, then EOF.
        let mut answered: Vec<u64> = (0..writes)
            .map(|_| {
                let reply = busy.reply(None);
                assert_eq!(reply.error(), 0);
                reply.cookie()
            })
            .collect();
        answered.sort();
        assert_eq!(answered, (0..writes).collect::<Vec<_>>());
        assert!(busy.is_closed());
        assert!(idle.is_closed());
        assert!(idle_in_handshake.is_closed());

        // No more connections, and no serving again.
        assert!(!socket.exists(), "the socket file is removed");
        assert!(UnixStream::connect(&socket).is_err());
        let again = server.serve_unix(&socket).unwrap_err();
        assert_eq!(again.kind(), NbdErrorKind::ShutDown);
        // A second shutdown is harmless.
        server.shutdown().unwrap();
    }
    // Reopened from disk (the server let go of the pool), the writes are there.
    let pool = Pool::open(&pool_dir).unwrap();
    let disk = pool.volume("disk").unwrap();
    for cookie in 0..16u64 {
        let mut buf = vec![0u8; 4096];
        disk.read_at(&mut buf, cookie * 4096).unwrap();
        assert_eq!(buf, pattern(4096, cookie), "write {cookie} survived");
    }
}

#[test]
fn connections_over_the_limit_are_closed() {
    let t = TestServer::start(
        &[("disk", 1 << 20)],
        ServerOptions {
            connections_max: 2,
            ..Default::default()
        },
    );
    // Clients past their handshake keep their slots (one still in its
    // handshake would give way: see the TLS slow-loris test of grove).
    let mut a = t.connect();
    a.handshake("disk", false);
    let mut b = t.connect();
    b.handshake("disk", false);
    let mut c = t.connect();
    assert!(c.is_closed(), "the third connection is refused");
    drop(a);
    // Once a connection ends there is room again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.server.connection_count() > 1 {
        assert!(
            Instant::now() < deadline,
            "the closed connection was not unregistered"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut d = t.connect();
    d.handshake("disk", false);
    b.request(Command::Flush, 0, 9, 0, 0);
    let reply = b.reply(None);
    assert_eq!((reply.cookie(), reply.error()), (9, 0), "b is still served");
}

#[test]
fn stale_socket_files_are_replaced_and_live_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(&dir.path().join("pool"), &PoolOptions::default()).unwrap();
    let server = Server::new(pool, ServerOptions::default());

    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(stale.exists());
    server.serve_unix(&stale).unwrap();

    let live = dir.path().join("live.sock");
    let _listener = UnixListener::bind(&live).unwrap();
    assert_eq!(
        server.serve_unix(&live).unwrap_err().kind(),
        NbdErrorKind::AddressInUse
    );

    let file = dir.path().join("file");
    std::fs::write(&file, b"not a socket").unwrap();
    assert_eq!(
        server.serve_unix(&file).unwrap_err().kind(),
        NbdErrorKind::InvalidArgument
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"not a socket",
        "a file is never removed"
    );
    server.shutdown().unwrap();
}

/// The handshake limit in the stall test: long enough that a loaded 2-core
/// machine finishes an honest handshake well inside it.
const STALL_HANDSHAKE_TIMEOUT_MS: u64 = 3_000;

/// Whether an I/O result shows the server closed the connection (end of
/// file, reset, broken pipe), as opposed to any other failure, such as the
/// test's own read timeout.
fn closed_by_server<T>(result: &std::io::Result<T>) -> bool {
    match result {
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        ),
    }
}

#[test]
fn a_client_that_stalls_in_the_handshake_is_cut_off() {
    let t = TestServer::start(
        &[("disk", 1 << 20)],
        ServerOptions {
            handshake_timeout_ms: STALL_HANDSHAKE_TIMEOUT_MS,
            ..Default::default()
        },
    );
    // Says nothing after the greeting.
    let mut silent = t.connect();
    silent.recv(GREETING_BYTES);
    // Trickles valid options, each well inside the limit but together past it.
    let mut trickle = t.connect();
    trickle.greet(FLAG_C_FIXED_NEWSTYLE);
    let started = Instant::now();
    let mut answered_options = 0;
    let cut_off = loop {
        assert!(
            started.elapsed() < Duration::from_millis(10 * STALL_HANDSHAKE_TIMEOUT_MS),
            "a trickling client was never cut off ({answered_options} options answered)"
        );
        std::thread::sleep(Duration::from_millis(STALL_HANDSHAKE_TIMEOUT_MS / 10));
        let option = encode_option_header(OptionHeader {
            option: OPT_STRUCTURED_REPLY,
            length: 0,
        });
        let mut header = [0u8; OPTION_REPLY_HEADER_BYTES];
        let answered = trickle
            .stream
            .write_all(&option)
            .and_then(|()| trickle.stream.read_exact(&mut header));
        if answered.is_err() {
            break answered;
        }
        answered_options += 1;
    };
    assert!(
        closed_by_server(&cut_off),
        "the trickling client must be cut off by the server, not fail otherwise: {cut_off:?}"
    );
    assert!(
        answered_options >= 1,
        "options inside the limit are answered"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(STALL_HANDSHAKE_TIMEOUT_MS / 2),
        "cut off before the limit"
    );
    assert!(silent.is_closed(), "a silent client is cut off");
    // A client that completes in time is served, and the limit does not
    // apply once transmission starts.
    let mut c = t.connect();
    c.handshake("disk", true);
    std::thread::sleep(Duration::from_millis(STALL_HANDSHAKE_TIMEOUT_MS + 500));
    c.request(Command::Read, 0, 1, 0, 512);
    assert_eq!(c.reply(None).error(), 0);
}

/// The request timeout in the timeout tests: short, so the tests are quick,
/// but far above what any step of an honest client takes.
const TEST_REQUEST_TIMEOUT_MS: u64 = 1_500;

/// Waits (at most `limit`) until the server serves `count` connections.
fn wait_for_connections(t: &TestServer, count: usize, limit: Duration) {
    let started = Instant::now();
    while t.server.connection_count() != count {
        assert!(
            started.elapsed() < limit,
            "{} connections, not {count}, after {limit:?}",
            t.server.connection_count()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stalled_requests_and_unread_replies_time_out_but_idle_clients_stay() {
    let t = TestServer::start(
        &[("disk", 64 << 20)],
        ServerOptions {
            request_timeout_ms: TEST_REQUEST_TIMEOUT_MS,
            ..Default::default()
        },
    );
    // Idle between requests, for longer than the timeout: legitimate.
    let mut idle = t.connect();
    idle.handshake("disk", true);
    // Half a request header, then nothing.
    let mut half_header = t.connect();
    half_header.handshake("disk", false);
    let header = encode_request(&Request {
        flags: 0,
        command: Command::Write,
        cookie: 1,
        offset: 0,
        length: 4096,
    });
    half_header.send(&header[..10]);
    // A whole write header, then half its data.
    let mut half_payload = t.connect();
    half_payload.handshake("disk", false);
    half_payload.send(&header);
    half_payload.send(&[0x55; 2048]);
    // Many reads whose replies are never read: the server's writes block.
    let mut deaf = t.connect();
    deaf.handshake("disk", false);
    for cookie in 0..200u64 {
        deaf.request(Command::Read, 0, cookie, 0, 1 << 20);
    }
    // The server reads those requests on threads of its own: give them
    // time (less than the request timeout, which would release them).
    let started = Instant::now();
    while t.server.inflight_bytes() == 0
        && started.elapsed() < Duration::from_millis(TEST_REQUEST_TIMEOUT_MS / 3)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        t.server.inflight_bytes() > 0,
        "the unread replies are in flight"
    );
    // The three misbehaving clients are closed; the idle one stays.
    wait_for_connections(&t, 1, Duration::from_millis(20 * TEST_REQUEST_TIMEOUT_MS));
    assert!(half_header.is_closed(), "a stalled header is cut off");
    assert!(half_payload.is_closed(), "stalled data is cut off");
    wait_for_inflight_zero(&t);
    assert_eq!(
        t.read_volume("disk", 0, 4096),
        vec![0u8; 4096],
        "a write whose data never all came is not applied"
    );
    idle.request(Command::Read, 0, 7, 0, 4096);
    let reply = idle.reply(Some(4096));
    assert_eq!((reply.cookie(), reply.error()), (7, 0));
}

#[test]
fn greedy_clients_wait_for_the_server_wide_budget_and_are_not_failed() {
    const LIMIT_BYTES: u64 = 40 << 20;
    let t = TestServer::start(
        &[("disk", 64 << 20)],
        ServerOptions {
            inflight_limit_bytes: LIMIT_BYTES,
            ..Default::default()
        },
    );
    // Three clients each send a 16 MiB write header, and the first two
    // part of their data: those two fit in the budget and their readers
    // wait for the rest; the third's reader must wait for room before it
    // takes any of its data.
    let mut greedy: Vec<RawClient> = (0..3).map(|_| t.connect()).collect();
    for (i, c) in greedy.iter_mut().enumerate() {
        c.handshake("disk", false);
        c.request(Command::Write, 0, i as u64, (i as u64) << 24, 16 << 20);
        if i < 2 {
            c.send(&vec![0x60 + i as u8; 1 << 20]);
        }
    }
    let started = Instant::now();
    while t.server.inflight_bytes() < 2 * (16 << 20) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the writes never got room: {} bytes in flight",
            t.server.inflight_bytes()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        t.server.inflight_bytes() <= LIMIT_BYTES,
        "{} bytes in flight over a {LIMIT_BYTES}-byte budget",
        t.server.inflight_bytes()
    );
    // Finishing the first two writes makes room for the third, which is
    // then read; none fails.
    for c in greedy.iter_mut().take(2) {
        c.send(&vec![0x70; (16 << 20) - (1 << 20)]);
    }
    greedy[2].send(&vec![0x72; 16 << 20]);
    for (i, c) in greedy.iter_mut().enumerate() {
        let reply = c.reply(None);
        assert_eq!((reply.cookie(), reply.error()), (i as u64, 0));
    }
    assert_eq!(t.read_volume("disk", 2 << 24, 4), vec![0x72; 4]);
    // A worker gives its budget back just after its reply has gone.
    wait_for_inflight_zero(&t);
}

fn wait_for_inflight_zero(t: &TestServer) {
    let started = Instant::now();
    while t.server.inflight_bytes() != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} bytes still in flight",
            t.server.inflight_bytes()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn trickled_data_and_trickled_reads_are_cut_off_at_their_deadlines_whatever_progress() {
    // 1 MiB at 1 MiB/s plus the base: a deadline about 2.5 s away.
    let t = TestServer::start(
        &[("disk", 64 << 20)],
        ServerOptions {
            request_timeout_ms: TEST_REQUEST_TIMEOUT_MS,
            min_rate_bytes_per_s: 1 << 20,
            ..Default::default()
        },
    );
    let deadline = Duration::from_millis(TEST_REQUEST_TIMEOUT_MS + 1_000);
    // A write whose data comes one byte every 50 ms: an inactivity timer
    // would never fire.
    let mut writer = t.connect();
    writer.handshake("disk", false);
    writer.request(Command::Write, 0, 1, 0, 1 << 20);
    // A read of 1 MiB whose reply is taken 1 KiB every 50 ms.
    let mut reader = t.connect();
    reader.handshake("disk", false);
    reader.request(Command::Read, 0, 2, 0, 1 << 20);
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    // Until the server has closed both (what the clients still read from
    // their socket buffers after that does not matter).
    while t.server.connection_count() > 0 && started.elapsed() < 10 * deadline {
        writer.try_send(&[0x33]);
        reader.try_recv(&mut buf);
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    assert_eq!(t.server.connection_count(), 0, "both were cut off");
    assert!(
        took >= deadline - Duration::from_millis(200),
        "not before their deadline: {took:?}"
    );
    wait_for_connections(&t, 0, Duration::from_millis(10 * TEST_REQUEST_TIMEOUT_MS));
    wait_for_inflight_zero(&t);
    assert_eq!(
        t.read_volume("disk", 0, 4),
        vec![0u8; 4],
        "the trickled write is not applied"
    );
}
