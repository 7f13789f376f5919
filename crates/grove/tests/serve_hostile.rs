//! `grove serve` against clients that misbehave, as a process: greedy
//! writers against the in-flight budget (RSS read from /proc), clients that
//! never read their replies during shutdown, socket permissions, the
//! connection limit, and TLS with real clients (libnbd's nbdinfo, qemu-img
//! and qemu-io) on certificates made here with openssl.
//!
//! Tools that are missing make a test skip, visibly; under scripts/test.sh
//! ($GROVE_REQUIRE_TOOLS) they make it fail.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use grove_nbd::codec::{Command as NbdCommand, *};

const GROVE: &str = env!("CARGO_BIN_EXE_grove");
/// How long a server may take to start listening.
const STARTUP_TIMEOUT_MS: u64 = 20_000;
/// Longest a test waits for any one reply before calling the server stuck.
const REPLY_TIMEOUT_MS: u64 = 30_000;
const MIB: u64 = 1 << 20;

fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        if std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0") {
            panic!("{tool} is not installed, and GROVE_REQUIRE_TOOLS is set: install it (scripts/test.sh does)");
        }
        eprintln!(
            "SKIP: {tool} is not installed; skipping this test (scripts/test.sh installs it)"
        );
    }
    found
}

/// A pool with a volume "disk", and `grove serve` on it as a child process
/// whose output goes to files in the pool's temporary directory.
struct Daemon {
    dir: tempfile::TempDir,
    child: Option<Child>,
    tcp: Option<std::net::SocketAddr>,
}

impl Daemon {
    fn start(disk_size: &str, args: &[&str]) -> Daemon {
        Daemon::start_with(disk_size, args, None)
    }

    /// `umask`: run under this umask, to show socket modes do not follow it.
    fn start_with(disk_size: &str, args: &[&str], umask: Option<&str>) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut daemon = Daemon {
            dir,
            child: None,
            tcp: None,
        };
        daemon.grove_ok(&["init"]);
        daemon.grove_ok(&["create", "disk", "--size", disk_size]);
        let stdout = std::fs::File::create(daemon.dir.path().join("stdout")).unwrap();
        let stderr = std::fs::File::create(daemon.dir.path().join("stderr")).unwrap();
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!(
                "umask {}; exec \"$0\" \"$@\"",
                umask.unwrap_or("022")
            ))
            .arg(GROVE)
            .arg("--pool")
            .arg(daemon.pool())
            .arg("serve")
            .args(args)
            .env("GROVE_LOG", "info")
            .stdout(stdout)
            .stderr(stderr);
        daemon.child = Some(command.spawn().unwrap());
        let started = Instant::now();
        loop {
            let out = std::fs::read_to_string(daemon.dir.path().join("stdout")).unwrap();
            if out.contains("Stop with Ctrl-C") {
                daemon.tcp = out
                    .lines()
                    .find_map(|l| l.strip_prefix("TCP ")?.split(';').next()?.parse().ok());
                break;
            }
            if let Some(status) = daemon.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("grove serve exited with {status}:\n{}", daemon.log());
            }
            assert!(
                started.elapsed() < Duration::from_millis(STARTUP_TIMEOUT_MS),
                "grove serve did not start:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    fn pool(&self) -> PathBuf {
        self.dir.path().join("pool")
    }

    fn socket(&self) -> PathBuf {
        self.pool().join("nbd.sock")
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    fn grove_ok(&self, args: &[&str]) -> String {
        let output = Command::new(GROVE)
            .arg("--pool")
            .arg(self.pool())
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "grove {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// A field of /proc/PID/status, in KiB (VmRSS, VmHWM).
    fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status"))
    }

    /// Sends SIGTERM; returns how long the server took to exit 0, failing
    /// the test if it is still running after `limit`.
    fn terminate_within(&mut self, limit: Duration) -> Duration {
        let mut child = self.child.take().unwrap();
        let started = Instant::now();
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "grove serve exited with {status} after SIGTERM:\n{}",
                    self.log()
                );
                return started.elapsed();
            }
            if started.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "grove serve still running {limit:?} after SIGTERM:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A client that speaks NBD byte by byte over any socket.
struct Raw<S: Read + Write> {
    s: S,
}

impl<S: Read + Write> Raw<S> {
    fn recv(&mut self, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.s.read_exact(&mut buf).expect("receive");
        buf
    }

    fn greet(&mut self) {
        decode_greeting(&self.recv(GREETING_BYTES)).expect("greeting");
        self.s
            .write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
    }

    fn option(&mut self, option: u32, data: &[u8]) {
        let header = encode_option_header(OptionHeader {
            option,
            length: data.len() as u32,
        });
        self.s.write_all(&header).unwrap();
        self.s.write_all(data).unwrap();
    }

    /// NBD_OPT_GO; the reply types received, the last being ACK or an error.
    fn go(&mut self, export: &str) -> Vec<u32> {
        let data = encode_info_request(&InfoRequest {
            name: export.into(),
            info_types: vec![],
        });
        self.option(OPT_GO, &data);
        let mut types = Vec::new();
        loop {
            let header = decode_option_reply_header(&self.recv(OPTION_REPLY_HEADER_BYTES)).unwrap();
            self.recv(header.length as usize);
            types.push(header.reply_type);
            if header.reply_type == REP_ACK || is_option_error(header.reply_type) {
                return types;
            }
        }
    }

    fn request(&mut self, command: NbdCommand, cookie: u64, offset: u64, length: u32) {
        let bytes = encode_request(&Request {
            flags: 0,
            command,
            cookie,
            offset,
            length,
        });
        self.s.write_all(&bytes).unwrap();
    }
}

fn unix_client(path: &Path) -> Raw<UnixStream> {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
        .unwrap();
    let mut c = Raw { s };
    c.greet();
    c
}

/// Whether the server has closed the connection (end of file or reset).
fn closed(s: &mut impl Read) -> bool {
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
    }
}

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
        log.matches("client stopped sending in the middle of a request")
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
    // The grace is 10 s; 30 s leaves room for a loaded machine, and without
    // the grace the server would never exit.
    let took = daemon.terminate_within(Duration::from_secs(30));
    eprintln!("shutdown with two non-reading clients took {took:?}");
    let log = daemon.log();
    assert!(
        log.contains("connections still busy after the grace period")
            && log.contains("control clients still busy after the grace period"),
        "the grace ended both clients:\n{log}"
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
    let mut first = unix_client(&daemon.socket());
    let _second = unix_client(&daemon.socket());
    let mut third = UnixStream::connect(daemon.socket()).unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
        .unwrap();
    assert!(closed(&mut third), "the third connection is closed");
    // The two within the limit are served.
    assert_eq!(*first.go("disk").last().unwrap(), REP_ACK);
}

/// Makes a CA, a server certificate for 127.0.0.1 and localhost, and a
/// client certificate, with openssl. Returns (server dir, client dir,
/// client dir without a client certificate), laid out as libnbd's
/// tls-certificates and qemu's tls-creds-x509 want them.
fn make_certificates(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"][..],
            &key,
            &[
                "-keyout",
                "ca-key.pem",
                "-out",
                "ca-cert.pem",
                "-days",
                "2",
                "-subj",
                "/CN=grove test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        ]
        .concat(),
    );
    for (name, cn, usage, san) in [
        (
            "server",
            "localhost",
            "serverAuth",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        ),
        ("client", "grove test client", "clientAuth", ""),
    ] {
        openssl(
            &[
                &["req"][..],
                &key,
                &[
                    "-keyout",
                    &format!("{name}-key.pem"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN={cn}"),
                ],
            ]
            .concat(),
        );
        let ext = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n{san}"
        );
        std::fs::write(root.join(format!("{name}.ext")), ext).unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            &format!("{name}-cert.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ]);
    }
    let server = root.to_path_buf();
    let client = root.join("client");
    let anonymous = root.join("anonymous");
    for dir in [&client, &anonymous] {
        std::fs::create_dir(dir).unwrap();
        std::fs::copy(root.join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
    }
    std::fs::copy(root.join("client-cert.pem"), client.join("client-cert.pem")).unwrap();
    std::fs::copy(root.join("client-key.pem"), client.join("client-key.pem")).unwrap();
    (server, client, anonymous)
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn tls_with_client_certificates_serves_libnbd_and_qemu_and_refuses_plaintext() {
    if !(have("openssl") && have("nbdinfo") && have("qemu-io") && have("qemu-img")) {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    let (server, client, anonymous) = make_certificates(certs.path());
    let path = |name: &str| server.join(name).to_str().unwrap().to_string();
    let daemon = Daemon::start(
        "64M",
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &path("server-cert.pem"),
            "--tls-key",
            &path("server-key.pem"),
            "--tls-ca",
            &path("ca-cert.pem"),
        ],
    );
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
    let path = |name: &str| server.join(name).to_str().unwrap().to_string();
    let daemon = Daemon::start(
        "8M",
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &path("server-cert.pem"),
            "--tls-key",
            &path("server-key.pem"),
            "--tls",
            "allow",
        ],
    );
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
