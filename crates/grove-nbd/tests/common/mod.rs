//! Shared by the integration tests: a pool with a server on a unix socket in
//! a temporary directory, a raw protocol client, and tool detection.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{self, Output};
use std::time::Duration;

use grove_nbd::codec::*;
use grove_nbd::{Server, ServerOptions};
use grove_store::{Pool, PoolOptions};

/// Longest a test waits for one reply before calling the server stuck.
pub const REPLY_TIMEOUT_MS: u64 = 20_000;

pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub pool: Pool,
    pub server: Server,
    pub socket: PathBuf,
}

impl TestServer {
    /// A fresh pool with the given volumes, served on `dir/nbd.sock`.
    pub fn start(volumes: &[(&str, u64)], options: ServerOptions) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let pool =
            Pool::create(&dir.path().join("pool"), &PoolOptions::default()).expect("create pool");
        for (name, size) in volumes {
            pool.create_volume(name, *size).expect("create volume");
        }
        let server = Server::new(pool.clone(), options);
        let socket = dir.path().join("nbd.sock");
        server.serve_unix(&socket).expect("serve");
        TestServer {
            dir,
            pool,
            server,
            socket,
        }
    }

    /// The NBD URI of an export, as libnbd and qemu take it.
    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    pub fn connect(&self) -> RawClient {
        RawClient::connect(&self.socket)
    }

    pub fn read_volume(&self, name: &str, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.pool
            .volume(name)
            .unwrap()
            .read_at(&mut buf, offset)
            .unwrap();
        buf
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.server.shutdown();
    }
}

/// Set (to anything but "0") by scripts/test.sh: a test whose tool is
/// missing then fails, naming the tool, instead of passing after a "SKIP".
pub const REQUIRE_TOOLS_ENV: &str = "GROVE_REQUIRE_TOOLS";

/// Whether missing tools fail tests ($GROVE_REQUIRE_TOOLS).
pub fn tools_required() -> bool {
    std::env::var_os(REQUIRE_TOOLS_ENV).is_some_and(|v| v != "0")
}

/// Skips a test for a missing prerequisite: prints why and returns, or,
/// under scripts/test.sh ($GROVE_REQUIRE_TOOLS), fails the test.
pub fn skip(why: &str) {
    if tools_required() {
        panic!("{why}, and {REQUIRE_TOOLS_ENV} is set: install it (scripts/test.sh does)");
    }
    eprintln!("SKIP: {why}; skipping this test (scripts/test.sh installs it)");
}

/// Whether a command-line tool is installed. Tests that need a missing one
/// print why they skip and return; scripts/test.sh installs them and sets
/// $GROVE_REQUIRE_TOOLS, so there a missing tool fails the test.
pub fn have(tool: &str) -> bool {
    let found = process::Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        skip(&format!("{tool} is not installed"));
    }
    found
}

/// Runs a command and fails the test, showing its output, if it fails.
pub fn run(command: &mut process::Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    if !output.status.success() {
        panic!(
            "{command:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Bytes that differ from block to block and from seed to seed.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A reply as the raw client saw it.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Simple {
        cookie: u64,
        error: u32,
    },
    /// All chunks of one structured reply, up to the one marked DONE.
    Structured {
        cookie: u64,
        chunks: Vec<(u16, Vec<u8>)>,
    },
}

impl Reply {
    pub fn cookie(&self) -> u64 {
        match self {
            Reply::Simple { cookie, .. } | Reply::Structured { cookie, .. } => *cookie,
        }
    }

    /// The NBD error, 0 for success.
    pub fn error(&self) -> u32 {
        match self {
            Reply::Simple { error, .. } => *error,
            Reply::Structured { chunks, .. } => chunks
                .iter()
                .find(|(t, _)| *t == REPLY_TYPE_ERROR)
                .map(|(_, p)| decode_error_payload(p).unwrap().0)
                .unwrap_or(0),
        }
    }
}

/// A client that speaks the protocol byte by byte, so tests can also send
/// what no real client would.
pub struct RawClient {
    pub stream: Box<dyn Conn>,
    pub structured: bool,
}

/// A socket the raw client can talk over.
pub trait Conn: Read + Write + Send {
    /// A second handle on the same socket, for a reader and a writer in
    /// two threads.
    fn try_clone_conn(&self) -> std::io::Result<Box<dyn Conn>>;
}

impl Conn for UnixStream {
    fn try_clone_conn(&self) -> std::io::Result<Box<dyn Conn>> {
        Ok(Box::new(self.try_clone()?))
    }
}

impl Conn for std::net::TcpStream {
    fn try_clone_conn(&self) -> std::io::Result<Box<dyn Conn>> {
        Ok(Box::new(self.try_clone()?))
    }
}

impl RawClient {
    pub fn connect(path: &Path) -> RawClient {
        let stream = UnixStream::connect(path).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
            .unwrap();
        RawClient::over(Box::new(stream))
    }

    pub fn connect_tcp(addr: std::net::SocketAddr) -> RawClient {
        let stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_millis(REPLY_TIMEOUT_MS)))
            .unwrap();
        RawClient::over(Box::new(stream))
    }

    pub fn over(stream: Box<dyn Conn>) -> RawClient {
        RawClient {
            stream,
            structured: false,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    pub fn recv(&mut self, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.stream.read_exact(&mut buf).expect("receive");
        buf
    }

    /// Reads the greeting and answers with `client_flags`.
    pub fn greet(&mut self, client_flags: u32) -> u16 {
        let greeting = self.recv(GREETING_BYTES);
        let flags = decode_greeting(&greeting).expect("greeting");
        self.send(&client_flags.to_be_bytes());
        flags
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let header = encode_option_header(OptionHeader {
            option,
            length: data.len() as u32,
        });
        self.send(&header);
        self.send(data);
    }

    /// One option reply: (reply type, payload).
    pub fn option_reply(&mut self, option: u32) -> (u32, Vec<u8>) {
        let header = decode_option_reply_header(&self.recv(OPTION_REPLY_HEADER_BYTES))
            .expect("option reply");
        assert_eq!(header.option, option, "reply is for the option sent");
        let payload = self.recv(header.length as usize);
        (header.reply_type, payload)
    }

    /// Replies to one option up to the final ACK or error.
    pub fn option_replies(&mut self, option: u32) -> Vec<(u32, Vec<u8>)> {
        let mut replies = Vec::new();
        loop {
            let (reply_type, payload) = self.option_reply(option);
            let last = reply_type == REP_ACK || is_option_error(reply_type);
            replies.push((reply_type, payload));
            if last {
                return replies;
            }
        }
    }

    /// The whole handshake of a modern client: structured replies,
    /// base:allocation, then NBD_OPT_GO. Returns (size, transmission flags).
    pub fn handshake(&mut self, export: &str, structured: bool) -> (u64, u16) {
        self.greet(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        if structured {
            self.send_option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(self.option_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
            self.structured = true;
            let data = encode_meta_context_request(&MetaContextRequest {
                name: export.into(),
                queries: vec![META_CONTEXT_BASE_ALLOCATION.into()],
            });
            self.send_option(OPT_SET_META_CONTEXT, &data);
            let replies = self.option_replies(OPT_SET_META_CONTEXT);
            assert_eq!(replies.len(), 2, "one context then ACK: {replies:?}");
        }
        self.go(export).expect("NBD_OPT_GO succeeds")
    }

    /// NBD_OPT_GO; Ok((size, flags)) or Err(option error reply type).
    pub fn go(&mut self, export: &str) -> Result<(u64, u16), u32> {
        let data = encode_info_request(&InfoRequest {
            name: export.into(),
            info_types: vec![INFO_BLOCK_SIZE],
        });
        self.send_option(OPT_GO, &data);
        let mut export_info = None;
        for (reply_type, payload) in self.option_replies(OPT_GO) {
            if is_option_error(reply_type) {
                return Err(reply_type);
            }
            if reply_type == REP_INFO && payload[..2] == INFO_EXPORT.to_be_bytes() {
                let size = u64::from_be_bytes(payload[2..10].try_into().unwrap());
                let flags = u16::from_be_bytes(payload[10..12].try_into().unwrap());
                export_info = Some((size, flags));
            }
        }
        Ok(export_info.expect("NBD_INFO_EXPORT before ACK"))
    }

    pub fn request(&mut self, command: Command, flags: u16, cookie: u64, offset: u64, length: u32) {
        let bytes = encode_request(&Request {
            flags,
            command,
            cookie,
            offset,
            length,
        });
        self.send(&bytes);
    }

    /// Reads one reply. For a simple READ reply with no error, `read_len`
    /// bytes of data follow and are returned as a chunk of type OFFSET_DATA.
    pub fn reply(&mut self, read_len: Option<usize>) -> Reply {
        if !self.structured {
            let (error, cookie) =
                decode_simple_reply(&self.recv(SIMPLE_REPLY_BYTES)).expect("simple reply");
            if let (0, Some(len)) = (error, read_len) {
                let _ = self.recv(len);
            }
            return Reply::Simple { cookie, error };
        }
        let mut chunks = Vec::new();
        loop {
            let header = self.recv(4);
            let magic = u32::from_be_bytes(header[..4].try_into().unwrap());
            if magic == SIMPLE_REPLY_MAGIC {
                // Allowed for commands other than READ.
                let rest = self.recv(SIMPLE_REPLY_BYTES - 4);
                let (error, cookie) = decode_simple_reply(&[header, rest].concat()).unwrap();
                assert!(chunks.is_empty(), "a simple reply between chunks");
                return Reply::Simple { cookie, error };
            }
            let rest = self.recv(STRUCTURED_REPLY_HEADER_BYTES - 4);
            let chunk = decode_chunk_header(&[header, rest].concat()).expect("structured chunk");
            let payload = self.recv(chunk.length as usize);
            chunks.push((chunk.reply_type, payload));
            if chunk.flags & REPLY_FLAG_DONE != 0 {
                return Reply::Structured {
                    cookie: chunk.cookie,
                    chunks,
                };
            }
        }
    }

    /// Sends what it can; false once the connection is closed.
    pub fn try_send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).is_ok()
    }

    /// Reads some bytes; false at end-of-file or on an error.
    pub fn try_recv(&mut self, buf: &mut [u8]) -> bool {
        matches!(self.stream.read(buf), Ok(n) if n > 0)
    }

    /// Whether the server closed the connection: the next read sees
    /// end-of-file (or a reset) rather than data or a timeout.
    pub fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
        }
    }
}
