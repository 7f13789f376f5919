//! Which volumes are exports, how an export name resolves to a volume, and
//! what each export advertises.

use std::collections::BTreeSet;

use grove_store::{ErrorKind, Pool, VolumeKind, VolumeSummary};

use crate::codec::*;
use crate::source::{ReadOnlySources, Source};

/// Requests one connection runs at once, by default.
pub const WORKERS_PER_CONNECTION_DEFAULT: usize = 4;
/// Connections served at once, by default; more are closed at accept.
/// Room for a VM host's 1,000 disks on one socket, one connection each,
/// and more than 63 clients' full shares (63 x 16 = 1,008): no set of
/// fewer than 64 clients can lock another out. An idle connection costs
/// its threads' touched stacks and buffer pages, tens of KiB.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Connections one client (a process on a unix socket, an address over
/// TCP) may hold at once, by default: room for multi-conn clients
/// (nbdcopy opens 4).
pub const CONNECTIONS_PER_CLIENT_MAX_DEFAULT: usize = 16;
/// Clients that together cannot take every slot with the defaults.
pub const CLIENTS_THAT_CANNOT_LOCK_OUT_DEFAULT: usize = 63;
const _: () = assert!(
    CLIENTS_THAT_CANNOT_LOCK_OUT_DEFAULT * CONNECTIONS_PER_CLIENT_MAX_DEFAULT
        < CONNECTIONS_MAX_DEFAULT
);
/// The rate below which a client is too slow, by default: a request's
/// data and a reply get the request timeout plus their bytes at this
/// rate. A 32 MiB read may take 30 s + 128 s.
pub const MIN_RATE_BYTES_PER_S_DEFAULT: u64 = 256 * 1024;
/// How long a client may take over the whole handshake, by default. A
/// client that connects and says nothing would otherwise hold a connection
/// slot forever (qemu-nbd's limit is the same).
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Bytes of request payloads and replies the whole server holds at once, by
/// default. Past it, connections stop reading new requests until replies
/// drain; nothing fails.
pub const INFLIGHT_LIMIT_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// The base of a request's deadlines, by default: its header has this
/// long to arrive once begun, its data and its reply this plus their
/// bytes at the minimum rate. A client idle between requests is not
/// limited.
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// How long shutdown waits for connections to finish their in-flight
/// requests before it closes their sockets outright, by default. The
/// whole stop is promised within 10 s of the signal: the rest is for
/// closing the connections, the final flush and closing the pool.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 8_000;
/// Permissions of the unix socket files the server creates, by default:
/// owner and group may connect, nobody else.
pub const SOCKET_MODE_DEFAULT: u32 = 0o660;

/// Which volumes the server exports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ExportFilter {
    /// Every volume and snapshot in the pool, including ones created while
    /// the server runs.
    #[default]
    All,
    /// Only these names.
    Only(BTreeSet<String>),
}

impl ExportFilter {
    pub fn allows(&self, name: &str) -> bool {
        match self {
            ExportFilter::All => true,
            ExportFilter::Only(names) => names.contains(name),
        }
    }
}

/// How a server exports a pool.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Export everything read-only, whatever the volume allows.
    pub read_only: bool,
    /// The volume a client gets when it asks for the empty export name.
    pub default_export: Option<String>,
    pub exports: ExportFilter,
    /// Requests of one connection that run at once.
    pub workers_per_connection: usize,
    /// Connections served at once; past it, a client still in its
    /// handshake gives way to a new one, else the new one is disconnected.
    pub connections_max: usize,
    /// Connections one peer (uid, address) holds at once.
    pub connections_per_client_max: usize,
    /// Time a client has to finish negotiating; 0 means no limit.
    pub handshake_timeout_ms: u64,
    /// Bytes of request payloads and replies held by the whole server at
    /// once (see [`INFLIGHT_LIMIT_BYTES_DEFAULT`]).
    pub inflight_limit_bytes: u64,
    /// The base of a started request's deadlines (its header; its data
    /// and its reply, with their bytes at `min_rate_bytes_per_s`); 0
    /// means no limit. Past a deadline the connection is closed.
    pub request_timeout_ms: u64,
    /// The rate a client must at least keep up with its data and replies.
    pub min_rate_bytes_per_s: u64,
    /// Time shutdown waits for connections before closing them.
    pub shutdown_grace_ms: u64,
    /// Permissions of unix socket files the server creates.
    pub socket_mode: u32,
    /// TLS for TCP connections (NBD_OPT_STARTTLS); None: plaintext only.
    pub tls: Option<crate::tls::TlsOptions>,
    /// Called once each time the server goes idle, after it let go of its
    /// kept buffers: where a binary gives the allocator's free memory
    /// back to the system (malloc_trim), which this crate cannot do
    /// without unsafe code.
    pub on_idle: Option<fn()>,
    /// Read-only exports beside the pool's volumes (archived snapshots),
    /// under names the pool does not use.
    pub extra_exports: Option<std::sync::Arc<dyn ReadOnlySources>>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            read_only: false,
            default_export: None,
            exports: ExportFilter::All,
            workers_per_connection: WORKERS_PER_CONNECTION_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_client_max: CONNECTIONS_PER_CLIENT_MAX_DEFAULT,
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS_DEFAULT,
            inflight_limit_bytes: INFLIGHT_LIMIT_BYTES_DEFAULT,
            request_timeout_ms: REQUEST_TIMEOUT_MS_DEFAULT,
            min_rate_bytes_per_s: MIN_RATE_BYTES_PER_S_DEFAULT,
            shutdown_grace_ms: SHUTDOWN_GRACE_MS_DEFAULT,
            socket_mode: SOCKET_MODE_DEFAULT,
            tls: None,
            on_idle: None,
            extra_exports: None,
        }
    }
}

/// A resolved export: what it reads from and what the client is told
/// about it.
#[derive(Clone)]
pub(crate) struct Export {
    pub name: String,
    pub source: Source,
    pub size_bytes: u64,
    pub read_only: bool,
    pub description: String,
    pub block_size_bytes: u32,
}

/// Why an export name does not resolve: an option reply error and a message.
pub(crate) struct Refusal {
    pub reply_type: u32,
    pub message: String,
}

pub(crate) fn describe(info: &VolumeSummary, read_only: bool) -> String {
    let what = match (info.kind, &info.parent) {
        (VolumeKind::Volume, _) => "volume".to_string(),
        (kind, Some(parent)) => format!("{} of {parent}", kind.as_str()),
        (kind, None) => kind.as_str().to_string(),
    };
    if read_only {
        format!("grove {what}, read-only")
    } else {
        format!("grove {what}")
    }
}

/// Resolves a client's export name ("" is the default export).
pub(crate) fn resolve(
    pool: &Pool,
    options: &ServerOptions,
    requested: &str,
) -> Result<Export, Refusal> {
    let unknown = |message: String| Refusal {
        reply_type: REP_ERR_UNKNOWN,
        message,
    };
    let name = if requested.is_empty() {
        match &options.default_export {
            Some(name) => name.as_str(),
            None => {
                return Err(unknown(
                    "this server has no default export: name one (NBD_OPT_LIST shows them)".into(),
                ))
            }
        }
    } else {
        requested
    };
    if !options.exports.allows(name) {
        return Err(unknown(format!("no export named {name:?}")));
    }
    let lookup = pool.volume(name).and_then(|volume| {
        let info = volume.summary()?;
        Ok((volume, info))
    });
    let (volume, info) = match lookup {
        Ok(found) => found,
        Err(e) if e.kind() == ErrorKind::NotFound => return resolve_extra(options, name),
        Err(e) => {
            tracing::warn!(export = name, error = %e, "cannot open export");
            return Err(Refusal {
                reply_type: REP_ERR_UNKNOWN,
                message: format!("export {name:?} cannot be opened: {e}"),
            });
        }
    };
    let read_only = options.read_only || info.read_only;
    Ok(Export {
        name: info.name.clone(),
        description: describe(&info, read_only),
        size_bytes: info.size_bytes,
        read_only,
        source: Source::Pool {
            _claim: std::sync::Arc::new(volume.claim()),
            volume,
        },
        block_size_bytes: pool.block_size_bytes(),
    })
}

/// Resolves a name the pool does not have among the extra exports.
fn resolve_extra(options: &ServerOptions, name: &str) -> Result<Export, Refusal> {
    let refusal = |message: String| Refusal {
        reply_type: REP_ERR_UNKNOWN,
        message,
    };
    let opened = options
        .extra_exports
        .as_ref()
        .and_then(|extra| extra.open(name));
    match opened {
        None => Err(refusal(format!("no export named {name:?}"))),
        Some(Err(e)) => {
            tracing::warn!(export = name, error = %e, "cannot open export");
            Err(refusal(format!("export {name:?} cannot be opened: {e}")))
        }
        Some(Ok((source, description))) => Ok(Export {
            name: name.to_string(),
            description,
            size_bytes: source.size_bytes(),
            read_only: true,
            block_size_bytes: source.block_bytes(),
            source: Source::ReadOnly(source),
        }),
    }
}

/// The exports NBD_OPT_LIST shows, as (name, description).
/// Extra exports follow the pool's, less any whose name a pool volume has.
pub(crate) fn list(pool: &Pool, options: &ServerOptions) -> Vec<(String, String)> {
    let mut listed: Vec<(String, String)> = pool
        .volume_summaries()
        .into_iter()
        .filter(|info| options.exports.allows(&info.name))
        .map(|info| {
            let read_only = options.read_only || info.read_only;
            (info.name.clone(), describe(&info, read_only))
        })
        .collect();
    if let Some(extra) = &options.extra_exports {
        let taken: BTreeSet<String> = pool.volume_names().into_iter().collect();
        listed.extend(
            extra
                .list()
                .into_iter()
                .filter(|(name, _)| options.exports.allows(name) && !taken.contains(name)),
        );
    }
    listed
}

/// The transmission flags of an export. Read-only exports leave out the
/// write features, so clients do not offer them to their users.
pub(crate) fn transmission_flags(read_only: bool, structured_replies: bool) -> u16 {
    // CACHE is a read-ahead, which read-only exports take as well.
    let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN | FLAG_SEND_CACHE;
    // Every connection goes through the same engine, whose flush commits
    // the whole pool: what one connection flushes is durable for all, which
    // is what CAN_MULTI_CONN promises.
    if read_only {
        flags |= FLAG_READ_ONLY;
    } else {
        flags |= FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
    }
    if structured_replies {
        // A read is always answered in one chunk, so "don't fragment" costs
        // nothing; the flag must stay clear without structured replies.
        flags |= FLAG_SEND_DF;
    }
    flags
}
