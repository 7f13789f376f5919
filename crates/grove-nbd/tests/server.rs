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
    let mut a = t.connect();
    a.greet(FLAG_C_FIXED_NEWSTYLE);
    let mut b = t.connect();
    b.greet(FLAG_C_FIXED_NEWSTYLE);
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
    b.send_option(OPT_ABORT, &[]);
    assert_eq!(b.option_reply(OPT_ABORT).0, REP_ACK);
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
