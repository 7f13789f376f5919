//! One connected socket, unix, TCP or TLS over TCP, behind one type so the
//! protocol code does not care which.

use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use crate::tls::TlsStream;

#[derive(Debug)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(TlsStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Tls(s) => Stream::Tls(s.try_clone()),
        })
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }

    /// Shuts one or both directions. Reading after `Shutdown::Read` (from
    /// any clone, in any thread) returns end-of-file at once, which is how
    /// the server tells a connection's reader to stop.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Tls(s) => s.socket().shutdown(how),
        }
    }

    /// Limits how long a read waits (None: forever). Applies to the socket,
    /// so to every clone of it.
    pub fn set_read_timeout(&self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Tls(s) => s.socket().set_read_timeout(timeout),
        }
    }

    pub fn peer(&self) -> String {
        match self {
            Stream::Unix(_) => "unix socket".to_string(),
            Stream::Tcp(s) => s
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp".to_string()),
            Stream::Tls(s) => s
                .socket()
                .peer_addr()
                .map(|a| format!("{a}, TLS"))
                .unwrap_or_else(|_| "tls".to_string()),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// Fills `buf`, or returns Ok(false) if the peer closed before sending a
/// single byte: the clean end between two messages. A close inside a
/// message is an `UnexpectedEof` error.
pub(crate) fn read_exact_or_eof(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("peer closed after {filled} of {} bytes", buf.len()),
                ))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads and drops `len` bytes without holding them: how a server stays in
/// step with a client whose data it will not use.
pub(crate) fn discard(reader: &mut impl Read, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut reader.take(len), &mut io::sink())?;
    if copied < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("peer closed after {copied} of {len} bytes"),
        ));
    }
    Ok(())
}

/// Reads from a connection until a deadline, however the reads are spread:
/// the socket's timeout is set to what is left before each read that has
/// to wait. Past the deadline, reads fail with `TimedOut`.
pub(crate) struct DeadlineReader<'a> {
    pub reader: &'a mut BufReader<Stream>,
    pub deadline: Option<Instant>,
    /// What the client was too slow with, for the error.
    pub what: &'static str,
}

/// Whether an I/O error is a socket timeout (Linux reports EAGAIN).
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let (Some(deadline), true) = (self.deadline, self.reader.buffer().is_empty()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took too long over {}", self.what),
                ));
            }
            self.reader.get_ref().set_read_timeout(Some(left))?;
        }
        self.reader.read(buf).map_err(|e| {
            if is_timeout(&e) {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took too long over {}", self.what),
                )
            } else {
                e
            }
        })
    }
}
