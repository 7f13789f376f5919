//! Who a connection comes from, and whether a new one gets a slot. No
//! client may lock the others out: slots are limited per peer (per
//! process on a unix socket, from the kernel's SO_PEERCRED; per address
//! over TCP), and when the server is full a connection still in its
//! handshake (TLS included) gives way to the newcomer. Clients that
//! finished their handshake are never evicted: an idle one is a mounted
//! disk. A process, not a uid: every qemu of a VM host runs as one user,
//! and one stalled qemu must not lock its siblings out.

use std::net::IpAddr;
use std::time::Instant;

use crate::stream::Stream;

/// The party a connection belongs to, for per-client limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Peer {
    /// A process on the unix socket: its pid, and its uid for the logs.
    Process {
        pid: u32,
        uid: u32,
    },
    Address(IpAddr),
    /// The kernel would not say (a socket already closed): such
    /// connections share one set of limits.
    Unknown,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Process { pid, uid } => write!(f, "process {pid} (uid {uid})"),
            Peer::Address(ip) => write!(f, "{ip}"),
            Peer::Unknown => write!(f, "an unknown peer"),
        }
    }
}

/// The peer of a freshly accepted connection.
pub(crate) fn peer_of(stream: &Stream) -> Peer {
    match stream {
        Stream::Unix(s) => {
            rustix::net::sockopt::socket_peercred(s).map_or(Peer::Unknown, |cred| Peer::Process {
                pid: cred.pid.as_raw_nonzero().get() as u32,
                uid: cred.uid.as_raw(),
            })
        }
        Stream::Tcp(s) => s
            .peer_addr()
            .map_or(Peer::Unknown, |a| Peer::Address(a.ip())),
        Stream::Tls(s) => s
            .socket()
            .peer_addr()
            .map_or(Peer::Unknown, |a| Peer::Address(a.ip())),
    }
}

/// What admission needs to know of a connection already in the server.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Occupant {
    pub peer: Peer,
    /// Still negotiating (TLS included): the first to give way.
    pub handshaking: bool,
    /// Already told to give way; it leaves on its own, its slot is free.
    pub evicted: bool,
    pub since: Instant,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    Admit,
    /// Admit once this connection (the oldest unfinished handshake) is
    /// closed.
    AdmitInPlaceOf(u64),
    /// The peer has its share of the slots.
    PeerFull,
    /// Every slot is held by a client past its handshake.
    ServerFull,
}

/// Whether a new connection from `peer` gets a slot, given the occupants.
pub(crate) fn admit<'a>(
    occupants: impl Iterator<Item = (u64, &'a Occupant)>,
    peer: Peer,
    connections_max: usize,
    per_client_max: usize,
) -> Admission {
    let mut total = 0;
    let mut of_peer = 0;
    let mut oldest_handshake: Option<(u64, Instant)> = None;
    for (id, occupant) in occupants.filter(|(_, o)| !o.evicted) {
        total += 1;
        if occupant.peer == peer {
            of_peer += 1;
        }
        let older = oldest_handshake.is_none_or(|(_, since)| occupant.since < since);
        if occupant.handshaking && older {
            oldest_handshake = Some((id, occupant.since));
        }
    }
    if of_peer >= per_client_max {
        return Admission::PeerFull;
    }
    if total < connections_max {
        return Admission::Admit;
    }
    match oldest_handshake {
        Some((id, _)) => Admission::AdmitInPlaceOf(id),
        None => Admission::ServerFull,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn occupant(peer: Peer, handshaking: bool, age_s: u64, now: Instant) -> Occupant {
        Occupant {
            peer,
            handshaking,
            evicted: false,
            since: now - Duration::from_secs(age_s),
        }
    }

    #[test]
    fn a_full_server_evicts_its_oldest_unfinished_handshake_and_never_a_served_client() {
        let now = Instant::now();
        let a = Peer::Address([127, 0, 0, 2].into());
        let b = Peer::Process { pid: 7, uid: 1000 };
        let mut occupants = vec![
            (1, occupant(a, false, 50, now)),
            (2, occupant(a, true, 10, now)),
            (3, occupant(a, true, 20, now)),
        ];
        let decide =
            |o: &[(u64, Occupant)], max| admit(o.iter().map(|(id, o)| (*id, o)), b, max, 8);
        assert_eq!(decide(&occupants, 3), Admission::AdmitInPlaceOf(3));
        assert_eq!(decide(&occupants, 4), Admission::Admit);
        // Once told to give way, a connection's slot counts as free.
        occupants[2].1.evicted = true;
        assert_eq!(decide(&occupants, 3), Admission::Admit);
        occupants[1].1.handshaking = false;
        occupants[2].1.evicted = false;
        occupants[2].1.handshaking = false;
        assert_eq!(decide(&occupants, 3), Admission::ServerFull);
    }

    /// With the defaults, 63 processes of one user holding their full
    /// share, all past their handshake, leave a slot for a 64th; and one
    /// process per disk fits 1,000 disks.
    #[test]
    fn fewer_than_64_peers_cannot_lock_another_out_with_the_defaults() {
        use crate::export::{
            CLIENTS_THAT_CANNOT_LOCK_OUT_DEFAULT, CONNECTIONS_MAX_DEFAULT,
            CONNECTIONS_PER_CLIENT_MAX_DEFAULT,
        };
        let now = Instant::now();
        let process = |pid| Peer::Process { pid, uid: 1000 };
        let mut occupants = Vec::new();
        for pid in 0..CLIENTS_THAT_CANNOT_LOCK_OUT_DEFAULT as u32 {
            for _ in 0..CONNECTIONS_PER_CLIENT_MAX_DEFAULT {
                let id = occupants.len() as u64;
                occupants.push((id, occupant(process(pid), false, 1, now)));
            }
        }
        let view = || occupants.iter().map(|(id, o)| (*id, o));
        let (max, per) = (CONNECTIONS_MAX_DEFAULT, CONNECTIONS_PER_CLIENT_MAX_DEFAULT);
        assert_eq!(admit(view(), process(10_000), max, per), Admission::Admit);
        // A greedy process is held to its share, its siblings are not.
        assert_eq!(admit(view(), process(0), max, per), Admission::PeerFull);
        let disks: Vec<_> = (0..1000u32)
            .map(|pid| (u64::from(pid), occupant(process(pid), false, 1, now)))
            .collect();
        let view = || disks.iter().map(|(id, o)| (*id, o));
        assert_eq!(admit(view(), process(5_000), max, per), Admission::Admit);
    }

    #[test]
    fn a_peer_gets_at_most_its_share_of_the_slots() {
        let now = Instant::now();
        let a = Peer::Process { pid: 1, uid: 0 };
        let occupants: Vec<_> = (0..4).map(|id| (id, occupant(a, false, 1, now))).collect();
        let view = || occupants.iter().map(|(id, o)| (*id, o));
        assert_eq!(admit(view(), a, 128, 4), Admission::PeerFull);
        assert_eq!(
            admit(view(), Peer::Process { pid: 2, uid: 0 }, 128, 4),
            Admission::Admit
        );
        assert_eq!(admit(view(), a, 128, 5), Admission::Admit);
    }
}
