//! TLS for NBD over TCP (NBD_OPT_STARTTLS), with rustls.
//!
//! A TLS connection is one rustls session shared by the connection's reader
//! and its workers, which send replies while the reader waits for the next
//! request. The session sits behind a mutex; the reader reads ciphertext
//! from the socket without holding it, and takes it only to hand rustls
//! what arrived. A writer holds it while its reply goes out, as the plain
//! connection holds its writer mutex.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

use crate::error::{NbdError, NbdErrorKind};

/// Ciphertext read from the socket at once: a little more than one TLS
/// record (16 KiB of data plus its overhead).
const TLS_READ_BUFFER_BYTES: usize = 17 * 1024;

/// Whether a TLS-capable server also takes plaintext clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// Clients must NBD_OPT_STARTTLS before anything else; others get
    /// NBD_REP_ERR_TLS_REQD.
    Require,
    /// TLS is offered; plaintext clients are served too.
    Allow,
}

/// A server's TLS settings: its certificate and key, and, when client
/// certificates are checked, the CA that signs them.
#[derive(Clone)]
pub struct TlsOptions {
    pub mode: TlsMode,
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl TlsOptions {
    /// Loads a certificate chain and its private key (PEM files) and, with
    /// `ca`, the CA certificates client certificates must chain to: then a
    /// client without a valid certificate is refused.
    pub fn load(
        cert: &Path,
        key: &Path,
        ca: Option<&Path>,
        mode: TlsMode,
    ) -> Result<TlsOptions, NbdError> {
        let invalid = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
            NbdError::new(
                NbdErrorKind::InvalidArgument,
                format!("cannot load the TLS {what} {}: {e}", path.display()),
            )
        };
        let certs = read_certificates(cert).map_err(|e| invalid("certificate", cert, &e))?;
        if certs.is_empty() {
            return Err(invalid("certificate", cert, &"no certificate in it"));
        }
        let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid("key", key, &e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("settings for", cert, &e))?;
        let builder = match ca {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in read_certificates(ca).map_err(|e| invalid("CA", ca, &e))? {
                    roots.add(c).map_err(|e| invalid("CA", ca, &e))?;
                }
                if roots.is_empty() {
                    return Err(invalid("CA", ca, &"no certificate in it"));
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| invalid("CA", ca, &e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let config = builder
            .with_single_cert(certs, key_der)
            .map_err(|e| invalid("certificate and key", cert, &e))?;
        Ok(TlsOptions {
            mode,
            config: Arc::new(config),
        })
    }

    pub(crate) fn accept(&self, socket: TcpStream) -> io::Result<TlsStream> {
        let conn = ServerConnection::new(self.config.clone()).map_err(io::Error::other)?;
        let stream = TlsStream {
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                socket,
            }),
            pending: Vec::new(),
            pending_start: 0,
            socket_eof: false,
        };
        Ok(stream)
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

struct Shared {
    conn: Mutex<ServerConnection>,
    socket: TcpStream,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ServerConnection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One end of a TLS connection. Clones share the session; only one clone
/// may read (the connection's reader), any may write.
pub(crate) struct TlsStream {
    shared: Arc<Shared>,
    /// Ciphertext from the socket that rustls has not taken yet.
    pending: Vec<u8>,
    pending_start: usize,
    socket_eof: bool,
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("socket", &self.shared.socket)
            .finish_non_exhaustive()
    }
}

impl TlsStream {
    pub fn socket(&self) -> &TcpStream {
        &self.shared.socket
    }

    pub fn try_clone(&self) -> TlsStream {
        TlsStream {
            shared: self.shared.clone(),
            pending: Vec::new(),
            pending_start: 0,
            socket_eof: false,
        }
    }

    /// Runs the TLS handshake to its end (the socket's timeouts bound it).
    pub fn handshake(&mut self) -> io::Result<()> {
        loop {
            {
                let shared = self.shared.clone();
                let mut conn = shared.lock();
                self.feed(&mut conn)?;
                flush_tls(&mut conn, &shared.socket)?;
                if !conn.is_handshaking() {
                    return Ok(());
                }
                if self.socket_eof {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client closed during the TLS handshake",
                    ));
                }
            }
            self.fill()?;
        }
    }

    /// Hands rustls the ciphertext read so far, as much as it takes.
    fn feed(&mut self, conn: &mut ServerConnection) -> io::Result<()> {
        while self.pending_start < self.pending.len() {
            let mut rest = &self.pending[self.pending_start..];
            let before = rest.len();
            let taken = conn.read_tls(&mut rest);
            self.pending_start += before - rest.len();
            let processed = taken.and_then(|_| {
                conn.process_new_packets()
                    .map(drop)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
            });
            if let Err(e) = processed {
                // Tell the client why (an alert), if it still listens.
                let _ = flush_tls(conn, &self.shared.socket);
                return Err(e);
            }
            if conn.wants_read() && self.pending_start < self.pending.len() {
                continue;
            }
            break;
        }
        if self.socket_eof && self.pending_start >= self.pending.len() {
            let _ = conn.read_tls(&mut &[][..]);
            conn.process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
        Ok(())
    }

    /// Reads ciphertext from the socket, without holding the session.
    fn fill(&mut self) -> io::Result<()> {
        if self.pending_start < self.pending.len() {
            return Ok(());
        }
        self.pending.resize(TLS_READ_BUFFER_BYTES, 0);
        self.pending_start = 0;
        let read = (&self.shared.socket).read(&mut self.pending);
        let n = match read {
            Ok(n) => n,
            Err(e) => {
                self.pending.clear();
                return Err(e);
            }
        };
        self.pending.truncate(n);
        if n == 0 {
            self.socket_eof = true;
        }
        Ok(())
    }
}

/// Sends what rustls has queued for the socket.
fn flush_tls(conn: &mut ServerConnection, socket: &TcpStream) -> io::Result<()> {
    let mut socket = socket;
    while conn.wants_write() {
        conn.write_tls(&mut socket)?;
    }
    Ok(())
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let shared = self.shared.clone();
                let mut conn = shared.lock();
                match conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // The peer closed without close_notify. NBD frames its
                    // messages, so the caller tells a clean end between
                    // requests from a cut inside one.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) => return Err(e),
                }
                if self.socket_eof && self.pending_start >= self.pending.len() {
                    return Ok(0);
                }
                if self.pending_start < self.pending.len() {
                    self.feed(&mut conn)?;
                    // Key updates and alerts are answered at once.
                    flush_tls(&mut conn, &shared.socket)?;
                    continue;
                }
            }
            self.fill()?;
            if self.socket_eof {
                let shared = self.shared.clone();
                let mut conn = shared.lock();
                self.feed(&mut conn)?;
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut conn = self.shared.lock();
        let mut n = conn.writer().write(buf)?;
        if n == 0 && !buf.is_empty() {
            // The session's send buffer was full: empty it and try again.
            flush_tls(&mut conn, &self.shared.socket)?;
            n = conn.writer().write(buf)?;
        }
        flush_tls(&mut conn, &self.shared.socket)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut conn = self.shared.lock();
        flush_tls(&mut conn, &self.shared.socket)
    }
}
