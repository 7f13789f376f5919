//! `grove serve`: the pool's volumes over NBD, plus the control socket that
//! lets the other grove commands work on the pool meanwhile. It runs until
//! SIGINT or SIGTERM, then shuts down in order: stop accepting, finish the
//! requests in flight, flush, close the pool.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use grove_nbd::{
    parse_listen_addr, ExportFilter, Server, ServerOptions, TlsMode, TlsOptions,
    INFLIGHT_LIMIT_MIN_BYTES,
};
use grove_store::Pool;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::archive_exports::ArchivedSnapshots;
use crate::background::BackgroundWork;
use crate::cli::serve::ServeArgs;
use crate::control::ControlServer;

/// The NBD socket's file name in the pool directory, when none is given.
pub const NBD_SOCKET_NAME: &str = "nbd.sock";

/// Exit code when a second SIGINT or SIGTERM cuts the shutdown short.
const EXIT_CODE_FORCED: i32 = 130;

impl ServeArgs {
    fn server_options(&self) -> Result<ServerOptions> {
        let inflight_limit_bytes =
            crate::size::parse_size(&self.inflight_limit, "--inflight-limit")?;
        if inflight_limit_bytes < INFLIGHT_LIMIT_MIN_BYTES {
            bail!(
                "--inflight-limit {} is below {INFLIGHT_LIMIT_MIN_BYTES} bytes: one request of the largest size must fit",
                self.inflight_limit
            );
        }
        if self.max_connections == 0 {
            bail!("--max-connections must be at least 1");
        }
        if self.max_connections_per_client == 0 {
            bail!("--max-connections-per-client must be at least 1");
        }
        let min_rate_bytes_per_s = crate::size::parse_size(&self.min_rate, "--min-rate")?;
        if min_rate_bytes_per_s == 0 {
            bail!("--min-rate must be at least 1 byte per second");
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let mode = if self.tls == "allow" {
                    TlsMode::Allow
                } else {
                    TlsMode::Require
                };
                Some(TlsOptions::load(cert, key, self.tls_ca.as_deref(), mode)?)
            }
            _ => None,
        };
        Ok(ServerOptions {
            inflight_limit_bytes,
            connections_max: self.max_connections,
            connections_per_client_max: self.max_connections_per_client,
            request_timeout_ms: self.request_timeout.saturating_mul(1000),
            min_rate_bytes_per_s,
            on_idle: Some(crate::memory::give_back_free_memory),
            socket_mode: self.socket_mode,
            tls,
            ..ServerOptions::default()
        })
    }
}

/// Where to listen.
pub struct Listen {
    pub socket: Option<PathBuf>,
    pub tcp: Option<String>,
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    dir: &Path,
    degraded: bool,
    listen: Listen,
    read_only: bool,
    exports: Vec<String>,
    default_export: Option<String>,
    limits: ServeArgs,
    mount: Option<PathBuf>,
) -> Result<()> {
    let base_options = prepare(&listen, &limits, mount.as_deref())?;
    let (opened, archived) =
        open_for_serving(dir, degraded, &limits, &exports, default_export.as_deref())?;
    let pool = opened.pool.clone();
    let tcp = listen.tcp.as_deref().map(parse_listen_addr).transpose()?;
    let socket = unix_socket_path(dir, listen.socket, tcp.is_some());

    // Signals are caught before anything listens, so none is lost.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install signal handlers")?;
    crate::branch_pool::log_if_degraded(&opened);
    let watcher = crate::branch_pool::start_watcher(&opened)?;
    let control = ControlServer::start(opened.clone(), base_options.socket_mode)?;
    let shutdown_grace_ms = base_options.shutdown_grace_ms;
    let background = BackgroundWork::start(&pool)?;
    let options = ServerOptions {
        read_only,
        workers_per_connection: workers_per_connection(&pool, &base_options),
        default_export: default_export.clone(),
        exports: export_filter(&exports),
        extra_exports: archived.clone().map(ArchivedSnapshots::as_exports),
        ..base_options
    };
    let server = Server::new(pool.clone(), options);
    if let Some(path) = &socket {
        server.serve_unix(path)?;
    }
    let tcp_bound = tcp.map(|addr| server.serve_tcp(addr)).transpose()?;
    print_how_to_connect(
        &pool,
        socket.as_deref(),
        tcp_bound,
        &exports,
        default_export.as_deref(),
    )?;

    // FUSE files next to NBD, over the same pool (grove serve --mount).
    let mounted = mount
        .map(|mountpoint| crate::mount::mount_for_serve(&pool, &mountpoint, read_only, archived))
        .transpose()?;

    let signal = signals.forever().next();
    tracing::info!(
        ?signal,
        "shutting down: no new connections, finishing requests in flight"
    );
    exit_on_a_second_signal(signals)?;
    // Both servers stop within one grace period, whatever clients do.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(shutdown_grace_ms);
    control.begin_stop();
    if let Some(mounted) = mounted {
        crate::mount::unmount_for_shutdown(mounted);
    }
    server.shutdown()?;
    background.stop_with(control, deadline, watcher);
    pool.close()
        .with_context(|| format!("cannot close pool {}", dir.display()))?;
    tracing::info!("pool flushed and closed");
    Ok(())
}

/// Logging and the allocator set up for a daemon, and the flags checked
/// before the pool is opened: the server's options from them.
fn prepare(listen: &Listen, limits: &ServeArgs, mount: Option<&Path>) -> Result<ServerOptions> {
    crate::daemon::init_logging();
    crate::memory::keep_large_buffers_apart();
    let base_options = limits.server_options()?;
    if base_options.tls.is_some() && listen.tcp.is_none() {
        bail!("--tls-cert applies to TCP connections: give --listen too");
    }
    if let Some(mountpoint) = mount {
        grove_fuse::check_mount_possible(mountpoint)?;
    }
    Ok(base_options)
}

/// As many requests per connection as the pool's device takes at once
/// (RADOS: more than a file), never fewer than the server's own default.
fn workers_per_connection(pool: &Pool, base: &ServerOptions) -> usize {
    pool.queue_depth().max(base.workers_per_connection)
}

/// The exports named on the command line, or all of them.
fn export_filter(exports: &[String]) -> ExportFilter {
    if exports.is_empty() {
        ExportFilter::All
    } else {
        ExportFilter::Only(exports.iter().cloned().collect::<BTreeSet<_>>())
    }
}

/// Opens the pool for `grove serve` (nobody else may hold it), with the
/// cache size asked for, and its archived snapshots (if the archive can be
/// listed); checks that every export named exists: a volume of the pool
/// or, failing that, an archived snapshot (exported read-only).
fn open_for_serving(
    dir: &Path,
    degraded: bool,
    limits: &ServeArgs,
    exports: &[String],
    default_export: Option<&str>,
) -> Result<(
    crate::open::OpenedPool,
    Option<std::sync::Arc<ArchivedSnapshots>>,
)> {
    let cache_size = limits
        .cache_size
        .as_deref()
        .map(|text| crate::size::parse_size(text, "cache size"))
        .transpose()?;
    let opened = crate::control::open_pool_exclusive(dir, degraded)?;
    let pool = &opened.pool;
    if let Some(bytes) = cache_size {
        pool.set_cache_size(bytes);
    }
    let archived = ArchivedSnapshots::for_pool(dir);
    for name in exports.iter().map(String::as_str).chain(default_export) {
        match pool.volume_info(name) {
            Err(e)
                if e.kind() == grove_store::ErrorKind::NotFound
                    && archived.as_ref().is_some_and(|a| a.holds(name)) => {}
            found => {
                found.with_context(|| format!("cannot export {name:?}"))?;
            }
        }
    }
    Ok((opened, archived))
}

/// The unix socket to listen on: the one given, else POOL/grove.sock
/// unless only TCP was asked for. Absolute, so that the connection strings
/// printed work from anywhere.
fn unix_socket_path(dir: &Path, given: Option<PathBuf>, tcp: bool) -> Option<PathBuf> {
    match (given, tcp) {
        (Some(path), _) => Some(path),
        (None, false) => Some(dir.join(NBD_SOCKET_NAME)),
        (None, true) => None,
    }
    .map(|path| std::path::absolute(&path).unwrap_or(path))
}

/// A second signal means "now": exit without waiting for the grace period.
/// What clients had flushed is on disk; the journal covers the rest.
fn exit_on_a_second_signal(mut signals: signal_hook::iterator::Signals) -> Result<()> {
    std::thread::Builder::new()
        .name("grove-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                tracing::warn!(signal, "second signal: exiting without a clean shutdown");
                std::process::exit(EXIT_CODE_FORCED);
            }
        })
        .context("cannot start the signal thread")?;
    Ok(())
}

/// Exports named in the startup line at most; past them the line counts
/// the rest and points to `nbdinfo --list`, so 1,000 exports stay one
/// readable line.
const EXPORTS_NAMED_MAX: usize = 8;

/// "3 exports (a, b, c)", or "63 exports (a, b, ... and 55 more: nbdinfo --list shows all)".
fn exports_summary(names: &[String]) -> String {
    let count = match names.len() {
        1 => "1 export".to_string(),
        n => format!("{n} exports"),
    };
    if names.is_empty() {
        return format!("{count} (none yet)");
    }
    let shown = names[..names.len().min(EXPORTS_NAMED_MAX)].join(", ");
    match names.len().checked_sub(EXPORTS_NAMED_MAX) {
        Some(more) if more > 0 => {
            format!("{count} ({shown}, and {more} more: nbdinfo --list shows them all)")
        }
        _ => format!("{count} ({shown})"),
    }
}

fn print_how_to_connect(
    pool: &Pool,
    socket: Option<&Path>,
    tcp: Option<std::net::SocketAddr>,
    exports: &[String],
    default_export: Option<&str>,
) -> Result<()> {
    let names: Vec<String> = if exports.is_empty() {
        pool.volume_names()
    } else {
        exports.to_vec()
    };
    let example = default_export
        .map(str::to_string)
        .or_else(|| names.first().cloned())
        .unwrap_or_else(|| "VOLUME".to_string());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "serving pool {} over NBD: {}",
        pool.dir().display(),
        exports_summary(&names)
    )?;
    if let Some(path) = socket {
        let path = path.display();
        writeln!(out, "unix socket {path}; connect with:")?;
        writeln!(out, "  nbdinfo --list 'nbd+unix:///?socket={path}'")?;
        writeln!(out, "  qemu-img info 'nbd+unix:///{example}?socket={path}'")?;
        writeln!(
            out,
            "  nbd-client -unix {path} -N {example} /dev/nbd0    (needs the nbd kernel module)"
        )?;
    }
    if let Some(addr) = tcp {
        writeln!(out, "TCP {addr}; connect with:")?;
        writeln!(out, "  qemu-img info nbd://{addr}/{example}")?;
        writeln!(
            out,
            "  nbd-client {} {} -N {example} /dev/nbd0",
            addr.ip(),
            addr.port()
        )?;
    }
    writeln!(
        out,
        "grove create, snapshot, clone, rm, list, tree and info work on this pool while it is served."
    )?;
    writeln!(
        out,
        "Stop with Ctrl-C (SIGINT) or SIGTERM: requests in flight finish and the pool is flushed."
    )?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::exports_summary;

    #[test]
    fn many_exports_are_counted_not_listed() {
        let names = |n: usize| (0..n).map(|i| format!("v{i}")).collect::<Vec<_>>();
        assert_eq!(exports_summary(&names(0)), "0 exports (none yet)");
        assert_eq!(exports_summary(&names(1)), "1 export (v0)");
        assert_eq!(exports_summary(&names(3)), "3 exports (v0, v1, v2)");
        let line = exports_summary(&names(63));
        assert!(
            line.starts_with("63 exports (v0, v1, v2, v3, v4, v5, v6, v7, and 55 more"),
            "{line}"
        );
        assert!(!line.contains("v8"), "{line}");
    }
}
