//! grove-nbd: an NBD server over grove's volume API.
//!
//! Every volume of a pool is an export under its own name; snapshots (and
//! everything, with [`ServerOptions::read_only`]) are read-only exports.
//! [`ServerOptions::extra_exports`] adds read-only exports that are not
//! volumes ([`ReadOnlySources`]: the binary's archived snapshots) under
//! names the pool does not use.
//! The server speaks fixed newstyle negotiation with NBD_OPT_GO, INFO, LIST,
//! EXPORT_NAME, ABORT, STRUCTURED_REPLY and two metadata contexts,
//! `base:allocation` and `grove:changed:BASE` (where the export differs
//! from BASE, a volume or removed snapshot of its line), and serves READ, WRITE, FLUSH, TRIM, WRITE_ZEROES, CACHE, DISC
//! and BLOCK_STATUS with FUA, on many connections at once (CAN_MULTI_CONN),
//! with the requests of each connection running concurrently. TCP
//! connections can be encrypted with NBD_OPT_STARTTLS ([`TlsOptions`]).
//!
//! Layout: [`codec`] is the wire format as pure functions over bytes (what a
//! fuzz target drives); [`validate`] decides what the protocol allows of a
//! request; [`block_status`] turns mapped extents into `base:allocation`
//! answers and diff extents into `grove:changed:BASE` answers; the handshake, transmission and server modules are the glue
//! that does I/O.
//!
//! Limits, each a named constant: option data read into memory
//! ([`OPTION_DATA_MAX_BYTES`], longer options are read past and refused
//! with NBD_REP_ERR_TOO_BIG), the READ/WRITE payload ([`PAYLOAD_MAX_BYTES`],
//! advertised in NBD_INFO_BLOCK_SIZE), bytes in flight per connection
//! ([`IN_FLIGHT_MAX_BYTES`]: past it the connection's reader stops reading),
//! descriptors per block status chunk
//! ([`block_status::BLOCK_STATUS_DESCRIPTORS_MAX`]), `grove:changed:`
//! contexts per connection ([`CHANGED_CONTEXTS_MAX`]), fair shares of the
//! in-flight budget per connection ([`CONNECTION_SHARE_DIVISOR`]) and per
//! peer (an equal share among the peers connected), and, in
//! [`ServerOptions`], bytes in flight across the whole server, connections
//! (and per peer: uid on a unix socket, address over TCP; unfinished
//! handshakes give way when slots run out), workers per connection, the
//! handshake deadline (TLS included), the request deadlines (a started
//! request's data, or a reply, gets the request timeout plus its bytes at
//! the minimum rate, however it trickles; a watchdog closes connections
//! past them) and the shutdown grace.
//!
//! ```no_run
//! use grove_nbd::{Server, ServerOptions};
//! let pool = grove_store::Pool::open("pool".as_ref())?;
//! let server = Server::new(pool, ServerOptions { default_export: Some("disk".into()), ..Default::default() });
//! server.serve_unix("/run/grove.sock".as_ref())?;
//! server.serve_tcp(grove_nbd::parse_listen_addr("10809")?)?;
//! // ... later, from any thread:
//! server.shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod block_status;
mod buffers;
pub mod codec;
mod deadline;
mod error;
mod export;
mod handshake;
mod jobs;
mod peers;
mod server;
mod source;
mod stream;
mod tls;
mod transmission;
pub mod validate;

pub use error::{nbd_error_for, NbdError, NbdErrorKind};
pub use export::{
    ExportFilter, ServerOptions, CONNECTIONS_MAX_DEFAULT, CONNECTIONS_PER_CLIENT_MAX_DEFAULT,
    HANDSHAKE_TIMEOUT_MS_DEFAULT, INFLIGHT_LIMIT_BYTES_DEFAULT, MIN_RATE_BYTES_PER_S_DEFAULT,
    REQUEST_TIMEOUT_MS_DEFAULT, SHUTDOWN_GRACE_MS_DEFAULT, SOCKET_MODE_DEFAULT,
    WORKERS_PER_CONNECTION_DEFAULT,
};
pub use handshake::{BLOCK_SIZE_MINIMUM_BYTES, CHANGED_CONTEXTS_MAX, OPTION_DATA_MAX_BYTES};
pub use server::{bind_unix_socket, parse_listen_addr, Server, ShutdownHandle, DEFAULT_TCP_PORT};
pub use source::{ReadOnlySource, ReadOnlySources};
pub use tls::{TlsMode, TlsOptions};
pub use transmission::{
    connection_share_bytes, peer_share_bytes, CONNECTION_SHARE_DIVISOR, INFLIGHT_LIMIT_MIN_BYTES,
    IN_FLIGHT_MAX_BYTES, REQUEST_OVERHEAD_BYTES,
};
pub use validate::PAYLOAD_MAX_BYTES;
