//! The control socket's defences against its own clients: who gets a
//! connection (per-uid limits, with slots only root and the pool's owner
//! may take, so an admin command always gets through), deadlines for a
//! request line and its reply (not inactivity timers: a client that
//! trickles a byte now and then is cut off all the same), and long
//! requests cancelled at a safe point when the daemon stops.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use grove_store::{Error, Pool};

/// Control connections served at once for other users.
pub const CONNECTIONS_MAX: usize = 64;
/// Connections one uid other than root and the pool's owner may hold.
pub const CONNECTIONS_PER_UID_MAX: usize = 8;
/// Slots past [`CONNECTIONS_MAX`] that only root and the pool's owner
/// may take: however others flood the socket, their commands get in.
pub const PRIVILEGED_RESERVE: usize = 16;
/// How long a connection may wait before its request's first byte: a
/// command may work a while between two requests of its own.
pub const IDLE_TIMEOUT_MS: u64 = 30_000;
/// Once a request line has begun, all of it must arrive within this.
pub const REQUEST_LINE_DEADLINE_MS: u64 = 10_000;
/// A reply must be taken within this, plus its size at
/// [`REPLY_MIN_RATE_BYTES_PER_S`].
pub const REPLY_DEADLINE_MS: u64 = 10_000;
pub const REPLY_MIN_RATE_BYTES_PER_S: u64 = 256 * 1024;
/// Reply bytes written per system call, so each write gets what is left
/// of the reply's deadline rather than a fresh timeout.
const REPLY_PIECE_BYTES: usize = 64 * 1024;

/// Who a control client is, as the kernel says (SO_PEERCRED).
pub fn peer_uid(stream: &UnixStream) -> Option<u32> {
    rustix::net::sockopt::socket_peercred(stream)
        .ok()
        .map(|cred| cred.uid.as_raw())
}

/// Whether a client from `uid` gets a connection, given the uids of the
/// connections open now. `owner` is the pool directory's owner.
pub fn admit(uid: Option<u32>, owner: u32, open: &[Option<u32>]) -> Result<(), String> {
    let privileged = matches!(uid, Some(0)) || uid == Some(owner);
    let total_max = if privileged {
        CONNECTIONS_MAX + PRIVILEGED_RESERVE
    } else {
        CONNECTIONS_MAX
    };
    if open.len() >= total_max {
        return Err(format!(
            "the daemon has {} control connections open; try again",
            open.len()
        ));
    }
    let of_uid = open.iter().filter(|u| **u == uid).count();
    if !privileged && of_uid >= CONNECTIONS_PER_UID_MAX {
        return Err(format!(
            "uid {} already has {CONNECTIONS_PER_UID_MAX} control connections open",
            uid.map_or("unknown".into(), |u| u.to_string())
        ));
    }
    Ok(())
}

/// Reads one request line of at most `max_bytes` (its newline included):
/// the first byte may take [`IDLE_TIMEOUT_MS`], the whole line then
/// [`REQUEST_LINE_DEADLINE_MS`]. Ok(None) when the client closed between
/// requests; a line without its newline was cut at `max_bytes`.
pub fn read_request_line(
    reader: &mut BufReader<UnixStream>,
    max_bytes: usize,
) -> io::Result<Option<String>> {
    reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(IDLE_TIMEOUT_MS)))?;
    if reader.fill_buf()?.is_empty() {
        return Ok(None);
    }
    let deadline = Instant::now() + Duration::from_millis(REQUEST_LINE_DEADLINE_MS);
    let mut line = Vec::new();
    while line.len() < max_bytes && line.last() != Some(&b'\n') {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(too_slow("send its request line"));
        }
        reader.get_ref().set_read_timeout(Some(left))?;
        let available = match reader.fill_buf() {
            Ok([]) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(bytes) => bytes,
            Err(e) if is_timeout(&e) => return Err(too_slow("send its request line")),
            Err(e) => return Err(e),
        };
        let wanted = available.len().min(max_bytes - line.len());
        let taken = match available[..wanted].iter().position(|b| *b == b'\n') {
            Some(end) => end + 1,
            None => wanted,
        };
        line.extend_from_slice(&available[..taken]);
        reader.consume(taken);
    }
    debug_assert!(line.len() <= max_bytes);
    String::from_utf8(line).map(Some).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "a request line that is not UTF-8",
        )
    })
}

/// Writes a reply, all of it within its deadline (see [`REPLY_DEADLINE_MS`]).
pub fn write_reply(writer: &mut UnixStream, bytes: &[u8]) -> io::Result<()> {
    let allowance_ms = REPLY_DEADLINE_MS + bytes.len() as u64 * 1000 / REPLY_MIN_RATE_BYTES_PER_S;
    let deadline = Instant::now() + Duration::from_millis(allowance_ms);
    for piece in bytes.chunks(REPLY_PIECE_BYTES) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(too_slow("take its reply"));
        }
        writer.set_write_timeout(Some(left))?;
        writer.write_all(piece).map_err(|e| {
            if is_timeout(&e) {
                too_slow("take its reply")
            } else {
                e
            }
        })?;
    }
    Ok(())
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn too_slow(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("the control client took too long to {what}"),
    )
}

/// `check` in the daemon: stopped (nothing repaired) when the daemon
/// stops, and the client told why.
pub fn check_until_stopped(
    pool: &Pool,
    repair: bool,
    stopping: &AtomicBool,
) -> grove_store::Result<grove_store::CheckReport> {
    pool.check_cancellable(repair, stopping).map_err(|e| {
        if stopping.load(Ordering::SeqCst) {
            Error::new(
                e.kind(),
                format!("the daemon is shutting down: {}", e.message()),
            )
        } else {
            e
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_users_get_their_share_and_root_and_the_owner_always_get_in() {
        let owner = 1000;
        let flood = vec![Some(65534); CONNECTIONS_PER_UID_MAX];
        assert!(admit(Some(65534), owner, &flood).is_err(), "per-uid cap");
        assert!(admit(Some(65533), owner, &flood).is_ok());
        let full: Vec<Option<u32>> = (0..CONNECTIONS_MAX as u32).map(Some).collect();
        assert!(admit(Some(5000), owner, &full).is_err(), "server full");
        assert!(admit(Some(0), owner, &full).is_ok(), "root gets in");
        assert!(
            admit(Some(owner), owner, &full).is_ok(),
            "the owner gets in"
        );
        let past_reserve = vec![Some(0); CONNECTIONS_MAX + PRIVILEGED_RESERVE];
        assert!(
            admit(Some(0), owner, &past_reserve).is_err(),
            "bounded all the same"
        );
        assert!(admit(None, owner, &[]).is_ok());
    }

    #[test]
    fn a_request_line_that_trickles_is_cut_off_at_its_deadline() {
        let (client, server) = UnixStream::pair().unwrap();
        let mut reader = BufReader::new(server);
        let mut writer = client.try_clone().unwrap();
        writer.write_all(b"{\"command\":\"info\"}\n").unwrap();
        assert_eq!(
            read_request_line(&mut reader, 1024).unwrap().as_deref(),
            Some("{\"command\":\"info\"}\n")
        );
        writer.write_all(b"0123456789").unwrap();
        assert_eq!(
            read_request_line(&mut reader, 4).unwrap().as_deref(),
            Some("0123"),
            "cut at the limit"
        );
        drop(writer);
        drop(client);
        let rest = read_request_line(&mut reader, 1024);
        assert!(rest.is_err(), "closed inside a line: {rest:?}");
        assert!(read_request_line(&mut reader, 1024).unwrap().is_none());
    }
}
