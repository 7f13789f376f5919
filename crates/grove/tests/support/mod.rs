//! What the tests of `grove serve` against hostile clients share: a daemon
//! as a child process, a raw NBD client, certificates made with openssl.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use grove_nbd::codec::{Command as NbdCommand, *};
use tempfile::TempDir;

pub const GROVE: &str = env!("CARGO_BIN_EXE_grove");

/// The `grove` that serves: this build's, or the one $GROVE_TEST_SERVE_BIN
/// names, so that the same probes measure another build (main before a
/// change, say). Only the daemon is swapped; commands stay this build's.
pub fn serve_bin() -> String {
    std::env::var("GROVE_TEST_SERVE_BIN").unwrap_or_else(|_| GROVE.to_string())
}
/// How long a server may take to start listening.
pub const STARTUP_TIMEOUT_MS: u64 = 20_000;
/// Longest a test waits for any one reply before calling the server stuck.
pub const REPLY_TIMEOUT_MS: u64 = 30_000;
pub const MIB: u64 = 1 << 20;

/// How a test's pool runs `grove` on itself: `grove --pool POOL ARGS`,
/// with no GROVE_POOL from the test's environment and nothing on stdin,
/// from the pool's own directory where it names one.
pub trait GroveOnPool {
    /// The pool's directory, as `--pool` takes it.
    fn pool_path(&self) -> PathBuf;

    /// Where commands run (relative paths resolve there); the test's own
    /// directory if None.
    fn working_dir(&self) -> Option<&Path> {
        None
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(GROVE);
        command
            .arg("--pool")
            .arg(self.pool_path())
            .args(args)
            .env_remove("GROVE_POOL")
            .stdin(std::process::Stdio::null());
        if let Some(dir) = self.working_dir() {
            command.current_dir(dir);
        }
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "grove {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }
}

/// A pool in a temporary directory of its own, which also holds the files
/// a test makes; removed on drop.
pub struct TempPool {
    pub dir: TempDir,
    pub path: PathBuf,
}

impl GroveOnPool for TempPool {
    fn pool_path(&self) -> PathBuf {
        self.path.clone()
    }

    fn working_dir(&self) -> Option<&Path> {
        Some(self.dir.path())
    }
}

impl TempPool {
    /// A temp directory with a pool made by `grove init` plus `init_args`.
    pub fn init(init_args: &[&str]) -> TempPool {
        let pool = TempPool::uninitialized();
        let mut args = vec!["init"];
        args.extend_from_slice(init_args);
        pool.ok(&args);
        pool
    }

    /// A temp directory where the pool would go, with nothing in it yet.
    pub fn uninitialized() -> TempPool {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("pool");
        TempPool { dir, path }
    }

    /// A path beside the pool, in its temp directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts `serve` (a `grove serve` on this pool) with its output
    /// dropped; returns once each of `sockets`, named in the pool's
    /// directory, accepts a connection, which must be within `timeout`.
    pub fn spawn_serving(&self, mut serve: Command, sockets: &[&str], timeout: Duration) -> Reaped {
        let child = serve
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let server = Reaped(child);
        let started = Instant::now();
        let accepts = |name: &&str| UnixStream::connect(self.path.join(name)).is_ok();
        while !sockets.iter().all(accepts) {
            assert!(started.elapsed() < timeout, "grove serve did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// `grove list --json`: every volume's object. (The trait's `ok` by
    /// name: a test may give its pool an `ok` of its own.)
    pub fn list(&self) -> Vec<serde_json::Value> {
        let out = GroveOnPool::ok(self, &["list", "--json"]);
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }
}

/// qemu-io ran clean: it succeeded, and no read or pattern check failed.
#[track_caller]
pub fn assert_qemu_io_ok(output: &Output, what: &str) {
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success()
            && !text.contains("failed")
            && !text.contains("Pattern verification"),
        "{what}: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A command refused because the volume is in use: exit code 1 and one
/// line that says so and names --force.
#[track_caller]
pub fn assert_refused_in_use(output: Output) {
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("in use") && stderr.contains("--force"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// Whether `tool` is on the PATH, without a word either way.
pub fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Why a test of FUSE mounts cannot run here, if it cannot: it needs root
/// (mounts for other users, loop devices, other uids), /dev/fuse and
/// `tools`.
pub fn fuse_skip_reason(tools: &[&str]) -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root (FUSE mounts, loop devices, other uids)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    tools
        .iter()
        .find(|tool| !installed(tool))
        .map(|tool| format!("{tool} is not installed (scripts/test.sh installs it)"))
}

/// Returns from a test of FUSE mounts that cannot run here, saying why;
/// under scripts/test.sh (GROVE_REQUIRE_TOOLS) the test fails instead.
#[macro_export]
macro_rules! require_fuse {
    ($($tool:expr),* $(,)?) => {
        if let Some(reason) = $crate::support::fuse_skip_reason(&[$($tool),*]) {
            if std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0") {
                panic!("cannot run: {reason}");
            }
            eprintln!("SKIP: {reason}");
            return;
        }
    };
}

pub fn have(tool: &str) -> bool {
    let found = installed(tool);
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
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
    pub tcp: Option<std::net::SocketAddr>,
}

impl Daemon {
    pub fn start(disk_size: &str, args: &[&str]) -> Daemon {
        Daemon::start_with(disk_size, args, None)
    }

    /// `umask`: run under this umask, to show socket modes do not follow it.
    pub fn start_with(disk_size: &str, args: &[&str], umask: Option<&str>) -> Daemon {
        Daemon::start_full(disk_size, args, umask, &[])
    }

    /// With these variables in the daemon's environment (test hooks).
    pub fn start_env(disk_size: &str, args: &[&str], env: &[(&str, &str)]) -> Daemon {
        Daemon::start_full(disk_size, args, None, env)
    }

    fn start_full(
        disk_size: &str,
        args: &[&str],
        umask: Option<&str>,
        env: &[(&str, &str)],
    ) -> Daemon {
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
            .arg(serve_bin())
            .arg("--pool")
            .arg(daemon.pool())
            .arg("serve")
            .args(args)
            .env("GROVE_LOG", "info")
            .envs(env.iter().copied())
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

    pub fn pool(&self) -> PathBuf {
        self.dir.path().join("pool")
    }

    pub fn socket(&self) -> PathBuf {
        self.pool().join("nbd.sock")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    pub fn grove_ok(&self, args: &[&str]) -> String {
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
    pub fn memory_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status"))
    }

    /// Sends SIGTERM; returns how long the server took to exit 0, failing
    /// the test if it is still running after `limit`.
    pub fn terminate_within(&mut self, limit: Duration) -> Duration {
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
pub struct Raw<S: Read + Write> {
    pub s: S,
}

impl<S: Read + Write> Raw<S> {
    pub fn recv(&mut self, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.s.read_exact(&mut buf).expect("receive");
        buf
    }

    pub fn greet(&mut self) {
        decode_greeting(&self.recv(GREETING_BYTES)).expect("greeting");
        self.s
            .write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
    }

    pub fn option(&mut self, option: u32, data: &[u8]) {
        let header = encode_option_header(OptionHeader {
            option,
            length: data.len() as u32,
        });
        self.s.write_all(&header).unwrap();
        self.s.write_all(data).unwrap();
    }

    /// NBD_OPT_GO; the reply types received, the last being ACK or an error.
    pub fn go(&mut self, export: &str) -> Vec<u32> {
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

    pub fn request(&mut self, command: NbdCommand, cookie: u64, offset: u64, length: u32) {
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

pub fn unix_client(path: &Path) -> Raw<UnixStream> {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
        .unwrap();
    let mut c = Raw { s };
    c.greet();
    c
}

/// Whether the server has closed the connection (end of file or reset).
pub fn closed(s: &mut impl Read) -> bool {
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

/// A daemon on a TCP port of its own with the server certificate and key
/// in `server` (as `make_certificates` lays it out), and `more` arguments.
pub fn start_tls_daemon(disk_size: &str, server: &Path, more: &[&str]) -> Daemon {
    let cert = server.join("server-cert.pem");
    let key = server.join("server-key.pem");
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    Daemon::start(disk_size, &args)
}

/// Makes a CA, a server certificate for 127.0.0.1 and localhost, and a
/// client certificate, with openssl. Returns (server dir, client dir,
/// client dir without a client certificate), laid out as libnbd's
/// tls-certificates and qemu's tls-creds-x509 want them.
pub fn make_certificates(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
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

pub fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

pub fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

impl Daemon {
    /// Lets other users reach the sockets: the temporary directories become
    /// traversable (the sockets' own mode still decides who may connect).
    pub fn open_to_all(&self) {
        use std::os::unix::fs::PermissionsExt;
        for dir in [self.dir.path().to_path_buf(), self.pool()] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
}

/// The uid and gid the tests use for "another user" (nobody).
pub const OTHER_UID: u32 = 65534;

/// Whether the tests run as root, which "another user" needs (setpriv).
pub fn is_root() -> bool {
    let root = rustix::process::getuid().is_root();
    if !root {
        eprintln!("SKIP: not root; this test runs a client as another user");
    }
    root
}

/// `program` run as [`OTHER_UID`] through setpriv.
pub fn as_other_user(program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command.args([
        &format!("--reuid={OTHER_UID}"),
        &format!("--regid={OTHER_UID}"),
        "--clear-groups",
        "--",
        program,
    ]);
    command
}

/// A TCP connection to `to` from `source` (another loopback address such
/// as 127.0.0.2 is another peer to the server).
pub fn tcp_from(source: [u8; 4], to: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use rustix::net::{AddressFamily, SocketType};
    let socket = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
    rustix::net::bind(&socket, &std::net::SocketAddr::from((source, 0)))?;
    rustix::net::connect(&socket, &to)?;
    let stream = std::net::TcpStream::from(socket);
    stream.set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))?;
    Ok(stream)
}

/// Runs `command`, returning whether it succeeded and how long it took.
pub fn timed(command: &mut Command) -> (bool, Duration, String) {
    let started = Instant::now();
    let output = run(command);
    (output.status.success(), started.elapsed(), text(&output))
}

/// Ends a child process started by a test, even when the test fails.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
