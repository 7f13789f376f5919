//! `grove serve`: the pool's volumes over NBD, plus the control socket that
//! lets the other grove commands work on the pool meanwhile. It runs until
//! SIGINT or SIGTERM, then shuts down in order: stop accepting, finish the
//! requests in flight, flush, close the pool.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use grove_nbd::{parse_listen_addr, ExportFilter, Server, ServerOptions};
use grove_store::Pool;
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::control::ControlServer;

/// The NBD socket's file name in the pool directory, when none is given.
pub const NBD_SOCKET_NAME: &str = "nbd.sock";
/// Log filter when $GROVE_LOG does not say (tracing's EnvFilter syntax).
const LOG_FILTER_DEFAULT: &str = "info";

/// Where to listen.
pub struct Listen {
    pub socket: Option<PathBuf>,
    pub tcp: Option<String>,
}

pub fn run(
    dir: &Path,
    listen: Listen,
    read_only: bool,
    exports: Vec<String>,
    default_export: Option<String>,
    mount: Option<PathBuf>,
) -> Result<()> {
    init_logging();
    if let Some(mountpoint) = &mount {
        grove_fuse::check_mount_possible(mountpoint)?;
    }
    let pool = crate::control::open_pool_exclusive(dir)?;
    for name in exports.iter().chain(&default_export) {
        pool.volume_info(name)
            .with_context(|| format!("cannot export {name:?}"))?;
    }
    let tcp = listen.tcp.as_deref().map(parse_listen_addr).transpose()?;
    // Absolute, so that the connection strings printed work from anywhere.
    let socket = match (listen.socket, &tcp) {
        (Some(path), _) => Some(path),
        (None, None) => Some(dir.join(NBD_SOCKET_NAME)),
        (None, Some(_)) => None,
    }
    .map(|path| std::path::absolute(&path).unwrap_or(path));

    // Signals are caught before anything listens, so none is lost.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install signal handlers")?;
    let control = ControlServer::start(pool.clone())?;
    let exports_filter = if exports.is_empty() {
        ExportFilter::All
    } else {
        ExportFilter::Only(exports.iter().cloned().collect::<BTreeSet<_>>())
    };
    let server = Server::new(
        pool.clone(),
        ServerOptions {
            read_only,
            default_export: default_export.clone(),
            exports: exports_filter,
            ..ServerOptions::default()
        },
    );
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
        .map(|mountpoint| crate::mount::mount_for_serve(&pool, &mountpoint, read_only))
        .transpose()?;

    let signal = signals.forever().next();
    tracing::info!(
        ?signal,
        "shutting down: no new connections, finishing requests in flight"
    );
    if let Some(mounted) = mounted {
        crate::mount::unmount_for_shutdown(mounted);
    }
    server.shutdown()?;
    control.stop();
    pool.close()
        .with_context(|| format!("cannot close pool {}", dir.display()))?;
    tracing::info!("pool flushed and closed");
    Ok(())
}

pub(crate) fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GROVE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(LOG_FILTER_DEFAULT));
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .try_init();
}

fn print_how_to_connect(
    pool: &Pool,
    socket: Option<&Path>,
    tcp: Option<std::net::SocketAddr>,
    exports: &[String],
    default_export: Option<&str>,
) -> Result<()> {
    let names: Vec<String> = if exports.is_empty() {
        pool.volumes().into_iter().map(|v| v.name).collect()
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
        "serving pool {} over NBD: {} exports ({})",
        pool.dir().display(),
        names.len(),
        if names.is_empty() {
            "none yet".to_string()
        } else {
            names.join(", ")
        }
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
