//! `grove serve` against clients that misbehave, as a process: greedy
//! writers against the in-flight budget (RSS read from /proc), clients that
//! never read their replies during shutdown, socket permissions, the
//! connection limit, and TLS with real clients (libnbd's nbdinfo, qemu-img
//! and qemu-io) on certificates made here with openssl.
//!
//! Tools that are missing make a test skip, visibly; under scripts/test.sh
//! ($GROVE_REQUIRE_TOOLS) they make it fail.

mod support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use grove_nbd::codec::{Command as NbdCommand, *};
use support::*;

#[test]
fn greedy_writers_stay_within_the_inflight_budget_and_stalled_ones_are_cut_off() {
    const CLIENTS: usize = 20;
    const LIMIT_MIB: u64 = 100;
    let daemon = Daemon::start(
        "1G",
        &[
            "--inflight-limit",
            &format!("{LIMIT_MIB}M"),
            "--request-timeout",
            "2",
            // 32 MiB at 16 MiB/s: a deadline 4 s after the data began.
            "--min-rate",
            "16M",
            // All from this uid: every one is let in.
            "--max-connections-per-client",
            "20",
        ],
    );
    let baseline_kib = daemon.memory_kib("VmRSS");
    // Each client asks to write 32 MiB and sends all of it but one byte,
    // then waits: the server must hold at most the budget, and cut each
    // one off once its data stops arriving.
    let length = (32 * MIB) as u32;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let socket = daemon.socket();
            std::thread::spawn(move || {
                let mut c = unix_client(&socket);
                assert_eq!(*c.go("disk").last().unwrap(), REP_ACK);
                c.request(
                    NbdCommand::Write,
                    i as u64,
                    i as u64 * u64::from(length),
                    length,
                );
                // The server reads this as budget allows; once it cuts the
                // client off, the rest fails to send, which is the point.
                let _ = c.s.write_all(&vec![0xab; length as usize - 1]);
                let started = Instant::now();
                assert!(closed(&mut c.s), "client {i} was never cut off");
                started.elapsed()
            })
        })
        .collect();
    for client in clients {
        client.join().expect("a greedy client");
    }
    let peak_kib = daemon.memory_kib("VmHWM");
    let grown_mib = peak_kib.saturating_sub(baseline_kib) / 1024;
    eprintln!(
        "{CLIENTS} greedy clients: RSS {} MiB before, peak {} MiB, budget {LIMIT_MIB} MiB",
        baseline_kib / 1024,
        peak_kib / 1024
    );
    // The budget, plus room for buffers and thread stacks, and no more; and
    // the data really was taken in (the test would pass vacuously otherwise).
    assert!(
        grown_mib <= LIMIT_MIB + 48,
        "RSS grew by {grown_mib} MiB over a {LIMIT_MIB} MiB budget"
    );
    assert!(
        grown_mib >= 32,
        "RSS grew by only {grown_mib} MiB: no data was read"
    );
    let log = daemon.log();
    assert_eq!(
        log.matches("client too slow over a request's data: past its deadline")
            .count(),
        CLIENTS,
        "every stalled client is cut off with a log line:\n{log}"
    );
    // Nothing stalled remains: an honest client is served.
    let mut c = unix_client(&daemon.socket());
    assert_eq!(*c.go("disk").last().unwrap(), REP_ACK);
    c.request(NbdCommand::Read, 99, 0, 4096);
    let reply = decode_simple_reply(&c.recv(SIMPLE_REPLY_BYTES)).unwrap();
    assert_eq!(reply, (0, 99));
    assert_eq!(
        c.recv(4096),
        vec![0u8; 4096],
        "no partial write was applied"
    );
}

#[test]
fn shutdown_ends_within_the_grace_whatever_nbd_and_control_clients_do() {
    // No request timeout: only the shutdown grace can end these clients.
    let mut daemon = Daemon::start("64M", &["--request-timeout", "0"]);
    // Long names make long `list` replies, so the control client's unread
    // replies fill the socket buffers quickly.
    for i in 0..16 {
        daemon.grove_ok(&[
            "create",
            &format!("{i:02}{}", "v".repeat(100)),
            "--size",
            "1M",
        ]);
    }
    // An NBD client that sends reads and never reads the replies.
    let mut deaf = unix_client(&daemon.socket());
    assert_eq!(*deaf.go("disk").last().unwrap(), REP_ACK);
    for cookie in 0..128u64 {
        deaf.request(NbdCommand::Read, cookie, 0, MIB as u32);
    }
    // A control client that sends requests and never reads the replies.
    let control = UnixStream::connect(daemon.pool().join("grove.control")).unwrap();
    control
        .set_write_timeout(Some(Duration::from_millis(2_000)))
        .unwrap();
    let mut writer = control.try_clone().unwrap();
    let feeder = std::thread::spawn(move || {
        let line = b"{\"command\":\"list\"}\n";
        let mut sent = 0;
        while sent < 900 && writer.write_all(line).is_ok() {
            sent += 1;
        }
        sent
    });
    let sent = feeder.join().unwrap();
    assert!(
        sent < 900,
        "the daemon kept reading: its replies never backed up ({sent} requests sent)"
    );
    // The whole stop is promised within 10 s of the signal (an 8 s grace,
    // then the flush and close); without the grace it would never exit.
    let took = daemon.terminate_within(Duration::from_secs(30));
    eprintln!("shutdown with two non-reading clients took {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "shutdown with clients that never read took {took:?}, past 10 s"
    );
    let log = daemon.log();
    // The control client's reply deadline (10 s) may end it first.
    assert!(
        log.contains("connections still busy after the grace period")
            && (log.contains("control clients still busy after the grace period")
                || log.contains("took too long to take its reply")),
        "the grace, or a deadline, ended both clients:\n{log}"
    );
    drop(control);
}

#[test]
fn sockets_are_created_0660_whatever_the_umask_and_socket_mode_changes_it() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: PathBuf| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let daemon = Daemon::start_with("1M", &[], Some("000"));
    assert_eq!(mode(daemon.socket()), 0o660);
    assert_eq!(mode(daemon.pool().join("grove.control")), 0o660);
    drop(daemon);
    let daemon = Daemon::start_with("1M", &["--socket-mode", "0600"], Some("000"));
    assert_eq!(mode(daemon.socket()), 0o600);
    assert_eq!(mode(daemon.pool().join("grove.control")), 0o600);
}

#[test]
fn max_connections_closes_the_clients_over_the_limit() {
    let daemon = Daemon::start("1M", &["--max-connections", "2"]);
    // Past their handshakes, the two keep their slots.
    let mut first = unix_client(&daemon.socket());
    assert_eq!(*first.go("disk").last().unwrap(), REP_ACK);
    let mut second = unix_client(&daemon.socket());
    assert_eq!(*second.go("disk").last().unwrap(), REP_ACK);
    let mut third = UnixStream::connect(daemon.socket()).unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
        .unwrap();
    assert!(closed(&mut third), "the third connection is closed");
    // The two within the limit are served.
    first.request(NbdCommand::Flush, 1, 0, 0);
    assert_eq!(
        decode_simple_reply(&first.recv(SIMPLE_REPLY_BYTES)).unwrap(),
        (0, 1)
    );
    drop(second);
}

#[test]
fn tls_with_client_certificates_serves_libnbd_and_qemu_and_refuses_plaintext() {
    if !(have("openssl") && have("nbdinfo") && have("qemu-io") && have("qemu-img")) {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    let (server, client, anonymous) = make_certificates(certs.path());
    let ca = server.join("ca-cert.pem");
    let daemon = start_tls_daemon("64M", &server, &["--tls-ca", ca.to_str().unwrap()]);
    let addr = daemon.tcp.expect("the TCP address is printed");

    // libnbd over TLS with a client certificate.
    let uri = |dir: &Path| {
        format!(
            "nbds://127.0.0.1:{}/disk?tls-certificates={}",
            addr.port(),
            dir.display()
        )
    };
    let info = run(Command::new("nbdinfo").arg(uri(&client)));
    assert!(info.status.success(), "nbdinfo over TLS: {}", text(&info));
    let info_text = text(&info);
    assert!(info_text.contains("export-size: 67108864"), "{info_text}");
    assert!(info_text.contains("can_cache: true"), "{info_text}");
    assert!(
        daemon.log().contains("tls=true"),
        "the export was served over TLS"
    );

    // Without a client certificate, the TLS handshake fails.
    let refused = run(Command::new("nbdinfo").arg(uri(&anonymous)));
    assert!(
        !refused.status.success(),
        "no client certificate: {}",
        text(&refused)
    );

    // qemu over TLS: writes a pattern, reads it back verified.
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        client.display()
    );
    let image = format!(
        "driver=nbd,host=127.0.0.1,port={},export=disk,tls-creds=tls0",
        addr.port()
    );
    let io = run(Command::new("qemu-io")
        .args(["--object", &object, "--image-opts", &image])
        .args([
            "-c",
            "write -P 0x3c 1M 2M",
            "-c",
            "read -P 0x3c 1M 2M",
            "-c",
            "flush",
        ]));
    let io_text = text(&io);
    assert!(
        io.status.success() && !io_text.contains("Pattern verification failed"),
        "qemu-io over TLS: {io_text}"
    );
    let img =
        run(Command::new("qemu-img").args(["info", "--object", &object, "--image-opts", &image]));
    assert!(
        img.status.success(),
        "qemu-img info over TLS: {}",
        text(&img)
    );
    assert!(text(&img).contains("64 MiB"), "{}", text(&img));

    // Plaintext: NBD_OPT_GO gets NBD_REP_ERR_TLS_REQD and nothing else.
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
        .unwrap();
    let mut plain = Raw { s: tcp };
    plain.greet();
    assert_eq!(plain.go("disk"), vec![REP_ERR_TLS_REQD]);
    // NBD_OPT_EXPORT_NAME has no error reply: the connection is closed.
    plain.option(OPT_EXPORT_NAME, b"disk");
    assert!(closed(&mut plain.s), "EXPORT_NAME without TLS closes");
    let plain_nbdinfo =
        run(Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{}/disk", addr.port())));
    assert!(
        !plain_nbdinfo.status.success(),
        "plaintext nbdinfo: {}",
        text(&plain_nbdinfo)
    );
}

#[test]
fn tls_allow_serves_plaintext_and_tls_clients() {
    if !(have("openssl") && have("nbdinfo")) {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    let (server, client, _) = make_certificates(certs.path());
    let daemon = start_tls_daemon("8M", &server, &["--tls", "allow"]);
    let port = daemon.tcp.unwrap().port();
    let tls = run(Command::new("nbdinfo").arg(format!(
        "nbds://127.0.0.1:{port}/disk?tls-certificates={}",
        client.display()
    )));
    assert!(tls.status.success(), "{}", text(&tls));
    let plain = run(Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/disk")));
    assert!(plain.status.success(), "{}", text(&plain));
    let log = daemon.log();
    assert!(
        log.contains("tls=true") && log.contains("tls=false"),
        "{log}"
    );
}
