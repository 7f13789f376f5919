//! `grove serve`'s limits, timeouts, socket permissions and TLS flags.

use std::path::PathBuf;

use grove_nbd::{CONNECTIONS_MAX_DEFAULT, CONNECTIONS_PER_CLIENT_MAX_DEFAULT};

/// `grove serve`'s limits, timeouts, socket permissions and TLS.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Bytes of request data and replies held at once over all connections;
    /// past it the server stops reading requests until replies drain
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "256M",
        allow_hyphen_values = true
    )]
    pub inflight_limit: String,
    /// Connections served at once; when all are taken, a client still in
    /// its handshake gives way to a new one, else the new one is closed
    #[arg(long, value_name = "N", default_value_t = CONNECTIONS_MAX_DEFAULT)]
    pub max_connections: usize,
    /// Connections one client may hold at once: a process on the unix socket,
    /// an address over TCP
    #[arg(long, value_name = "N", default_value_t = CONNECTIONS_PER_CLIENT_MAX_DEFAULT)]
    pub max_connections_per_client: usize,
    /// Seconds a started request's header may take, and the base of its
    /// data's and its reply's deadlines (0: no deadlines). A client idle
    /// between requests is not limited
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub request_timeout: u64,
    /// Bytes per second a client must keep up with: a request's data and
    /// its reply get the request timeout plus their size at this rate,
    /// however the client trickles
    #[arg(long, value_name = "SIZE", default_value = "256K")]
    pub min_rate: String,
    /// Permissions of the NBD and control sockets, in octal
    #[arg(long, value_name = "MODE", default_value = "0660", value_parser = parse_socket_mode)]
    pub socket_mode: u32,
    /// TLS certificate chain (PEM) for TCP connections (NBD_OPT_STARTTLS)
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM): TCP clients must show a certificate it signed
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// With --tls-cert: require TLS of every TCP client, or allow plaintext too
    #[arg(long, value_name = "MODE", value_parser = ["require", "allow"], default_value = "require")]
    pub tls: String,
    /// Memory for decoded metadata (the cache of radix nodes); clean nodes
    /// past it are evicted [default: cache_size in grove.toml, else 64M]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub cache_size: Option<String>,
}

/// Socket permissions for --socket-mode: octal, at most 0777.
fn parse_socket_mode(text: &str) -> std::result::Result<u32, String> {
    let mode = u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{text:?} is not an octal mode such as 0660"))?;
    if mode > 0o777 {
        return Err(format!("{text:?} is more than 0777"));
    }
    Ok(mode)
}
