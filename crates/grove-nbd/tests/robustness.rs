//! A raw client sends what real clients never do: malformed handshakes,
//! unknown options, over-long names, requests out of range or too long,
//! unknown commands and flags, truncated requests and disconnects in the
//! middle of data. Each gets the answer proto.md requires, and a second
//! connection opened at the start keeps being served throughout.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{pattern, RawClient, Reply, TestServer};
use grove_nbd::codec::*;
use grove_nbd::{
    ExportFilter, ServerOptions, IN_FLIGHT_MAX_BYTES, OPTION_DATA_MAX_BYTES, PAYLOAD_MAX_BYTES,
    REQUEST_OVERHEAD_BYTES,
};

const SIZE_BYTES: u64 = 4 * 1024 * 1024;

/// A connection in transmission that the tests check between abuses.
struct Witness {
    client: RawClient,
    cookie: u64,
}

impl Witness {
    fn open(t: &TestServer) -> Witness {
        let mut client = t.connect();
        client.handshake("disk", true);
        Witness {
            client,
            cookie: 1000,
        }
    }

    /// A write and a read back through the witness connection.
    fn check(&mut self) {
        self.cookie += 1;
        let data = pattern(4096, self.cookie);
        let offset = 2 * 1024 * 1024;
        self.client
            .request(Command::Write, 0, self.cookie, offset, data.len() as u32);
        self.client.send(&data);
        assert_eq!(self.client.reply(None).error(), 0, "witness write");
        self.cookie += 1;
        self.client
            .request(Command::Read, 0, self.cookie, offset, data.len() as u32);
        match self.client.reply(None) {
            Reply::Structured { cookie, chunks } => {
                assert_eq!(cookie, self.cookie);
                assert_eq!(chunks.len(), 1);
                assert_eq!(chunks[0].0, REPLY_TYPE_OFFSET_DATA);
                assert_eq!(&chunks[0].1[8..], &data[..], "witness reads its write");
            }
            other => panic!("witness read got {other:?}"),
        }
    }
}

fn server() -> TestServer {
    let t = TestServer::start(&[("disk", SIZE_BYTES)], ServerOptions::default());
    t.pool.snapshot("disk", "snap").unwrap();
    t
}

#[test]
fn malformed_handshakes_end_only_their_connection() {
    let t = server();
    let mut witness = Witness::open(&t);

    // Unknown client flags: the server MUST close.
    let mut c = t.connect();
    c.greet(1 << 7);
    assert!(c.is_closed(), "unknown client flags close the connection");
    witness.check();

    // An option without the IHAVEOPT magic: framing is lost, so close.
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send(&[0x55; OPTION_HEADER_BYTES]);
    assert!(c.is_closed(), "a bad option magic closes the connection");
    witness.check();

    // Half an option header, then gone.
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send(
        &encode_option_header(OptionHeader {
            option: OPT_GO,
            length: 100,
        })[..9],
    );
    drop(c);
    // Option data cut short.
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send(&encode_option_header(OptionHeader {
        option: OPT_GO,
        length: 100,
    }));
    c.send(&[0; 10]);
    drop(c);
    // Gone before even the client flags.
    let mut c = t.connect();
    let _ = c.recv(GREETING_BYTES);
    drop(c);
    witness.check();

    // Clients without NBD_FLAG_C_NO_ZEROES get the 124 zero bytes after
    // NBD_OPT_EXPORT_NAME; clients with it do not.
    for (flags, expected_len) in [
        (FLAG_C_FIXED_NEWSTYLE, 134),
        (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES, 10),
    ] {
        let mut c = t.connect();
        c.greet(flags);
        c.send_option(OPT_EXPORT_NAME, b"disk");
        let reply = c.recv(expected_len);
        assert_eq!(&reply[..8], &SIZE_BYTES.to_be_bytes());
        assert!(reply[10..].iter().all(|&b| b == 0));
        c.request(Command::Read, 0, 1, 0, 512);
        assert_eq!(c.reply(Some(512)).error(), 0);
    }
    witness.check();
}

#[test]
fn options_get_the_replies_the_protocol_requires() {
    let t = server();
    let mut witness = Witness::open(&t);
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);

    // Unknown options, and STARTTLS on a server without TLS.
    for option in [42, OPT_STARTTLS, 4, u32::MAX] {
        c.send_option(option, b"some data");
        assert_eq!(c.option_reply(option).0, REP_ERR_UNSUP, "option {option}");
    }
    // Options that take no data, with data.
    for option in [OPT_LIST, OPT_STRUCTURED_REPLY] {
        c.send_option(option, b"x");
        assert_eq!(
            c.option_reply(option).0,
            REP_ERR_INVALID,
            "option {option} with data"
        );
    }
    // Metadata contexts before structured replies.
    let meta = encode_meta_context_request(&MetaContextRequest {
        name: "disk".into(),
        queries: vec![META_CONTEXT_BASE_ALLOCATION.into()],
    });
    c.send_option(OPT_SET_META_CONTEXT, &meta);
    assert_eq!(c.option_reply(OPT_SET_META_CONTEXT).0, REP_ERR_INVALID);

    // Names: unknown, over the protocol's 4096 bytes, lying about their length.
    let go = |name: &str| {
        encode_info_request(&InfoRequest {
            name: name.into(),
            info_types: vec![],
        })
    };
    c.send_option(OPT_GO, &go("nope"));
    assert_eq!(c.option_reply(OPT_GO).0, REP_ERR_UNKNOWN);
    c.send_option(OPT_INFO, &go(""));
    assert_eq!(
        c.option_reply(OPT_INFO).0,
        REP_ERR_UNKNOWN,
        "no default export was configured"
    );
    let mut long_name = 5000u32.to_be_bytes().to_vec();
    long_name.extend(std::iter::repeat_n(b'a', 5000));
    long_name.extend_from_slice(&0u16.to_be_bytes());
    c.send_option(OPT_GO, &long_name);
    assert_eq!(
        c.option_reply(OPT_GO).0,
        REP_ERR_INVALID,
        "a name over 4096 bytes"
    );
    let mut lying = go("disk");
    lying[..4].copy_from_slice(&1000u32.to_be_bytes());
    c.send_option(OPT_GO, &lying);
    assert_eq!(
        c.option_reply(OPT_GO).0,
        REP_ERR_INVALID,
        "a name length past the data"
    );
    c.send_option(OPT_GO, &[0, 0]);
    assert_eq!(
        c.option_reply(OPT_GO).0,
        REP_ERR_INVALID,
        "data too short for a name length"
    );

    // An option longer than the server reads into memory: its data is read
    // past and refused, and the next option works.
    let huge = vec![0u8; OPTION_DATA_MAX_BYTES as usize + 1];
    c.send_option(OPT_GO, &huge);
    assert_eq!(c.option_reply(OPT_GO).0, REP_ERR_TOO_BIG);
    witness.check();

    // After all that, a normal negotiation on the same connection.
    c.send_option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
    let list = |name: &str, queries: &[&str]| {
        encode_meta_context_request(&MetaContextRequest {
            name: name.into(),
            queries: queries.iter().map(|q| q.to_string()).collect(),
        })
    };
    // LIST with no query, with the namespace wildcard, and with unknown names.
    for queries in [
        &[][..],
        &["base:"],
        &["base:allocation", "qemu:dirty-bitmap:x"],
    ] {
        c.send_option(OPT_LIST_META_CONTEXT, &list("disk", queries));
        let replies = c.option_replies(OPT_LIST_META_CONTEXT);
        assert_eq!(replies.len(), 2, "{queries:?}: {replies:?}");
        assert_eq!(replies[0].0, REP_META_CONTEXT);
        assert_eq!(&replies[0].1[4..], META_CONTEXT_BASE_ALLOCATION.as_bytes());
        assert_eq!(replies[1].0, REP_ACK);
    }
    c.send_option(OPT_LIST_META_CONTEXT, &list("disk", &["x-unknown:thing"]));
    assert_eq!(
        c.option_replies(OPT_LIST_META_CONTEXT),
        vec![(REP_ACK, vec![])]
    );
    c.send_option(OPT_SET_META_CONTEXT, &list("disk", &["no-colon"]));
    assert_eq!(c.option_reply(OPT_SET_META_CONTEXT).0, REP_ERR_INVALID);
    c.send_option(OPT_SET_META_CONTEXT, &list("nope", &["base:allocation"]));
    assert_eq!(c.option_reply(OPT_SET_META_CONTEXT).0, REP_ERR_UNKNOWN);
    // "base:" selects nothing in SET.
    c.send_option(OPT_SET_META_CONTEXT, &list("disk", &["base:"]));
    assert_eq!(
        c.option_replies(OPT_SET_META_CONTEXT),
        vec![(REP_ACK, vec![])]
    );
    c.send_option(OPT_SET_META_CONTEXT, &list("disk", &["base:allocation"]));
    let replies = c.option_replies(OPT_SET_META_CONTEXT);
    assert_eq!(replies[0].0, REP_META_CONTEXT);
    assert_eq!(replies.len(), 2);

    // LIST shows every export, then ACK.
    c.send_option(OPT_LIST, &[]);
    let replies = c.option_replies(OPT_LIST);
    let names: Vec<String> = replies
        .iter()
        .filter(|(t, _)| *t == REP_SERVER)
        .map(|(_, p)| {
            let len = u32::from_be_bytes(p[..4].try_into().unwrap()) as usize;
            String::from_utf8(p[4..4 + len].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, vec!["disk", "snap"]);
    assert_eq!(replies.last().unwrap().0, REP_ACK);

    let (size, flags) = c.go("disk").unwrap();
    assert_eq!(size, SIZE_BYTES);
    for flag in [
        FLAG_HAS_FLAGS,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_CAN_MULTI_CONN,
        FLAG_SEND_DF,
    ] {
        assert_ne!(flags & flag, 0, "flag {flag:#x}");
    }
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    c.structured = true;
    c.request(Command::BlockStatus, 0, 7, 0, 4096);
    assert_eq!(c.reply(None).error(), 0);
    witness.check();
}

#[test]
fn abort_and_over_long_export_name_end_the_session() {
    let t = server();
    let mut witness = Witness::open(&t);
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send_option(OPT_ABORT, &[]);
    assert_eq!(c.option_reply(OPT_ABORT).0, REP_ACK);
    assert!(c.is_closed());

    // NBD_OPT_EXPORT_NAME has no error reply: an unknown or absurd name
    // can only end the session.
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send_option(OPT_EXPORT_NAME, b"nope");
    assert!(c.is_closed());
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send(&encode_option_header(OptionHeader {
        option: OPT_EXPORT_NAME,
        length: u32::MAX,
    }));
    assert!(
        c.is_closed(),
        "a 4 GiB export name is refused without reading it"
    );
    witness.check();
}

/// Requests the protocol says to refuse, on simple and structured replies.
#[test]
fn bad_requests_get_the_errors_the_protocol_requires() {
    let t = server();
    let mut witness = Witness::open(&t);
    for structured in [false, true] {
        let mut c = t.connect();
        let (size, _) = c.handshake("disk", structured);
        let mut cookie = 0u64;
        let mut expect = |c: &mut RawClient,
                          command: Command,
                          flags: u16,
                          offset: u64,
                          length: u32,
                          error: u32| {
            cookie += 1;
            c.request(command, flags, cookie, offset, length);
            if command == Command::Write && length <= PAYLOAD_MAX_BYTES {
                c.send(&vec![0x99; length as usize]);
            }
            let reply = c.reply((command == Command::Read).then_some(length as usize));
            assert_eq!(reply.cookie(), cookie);
            assert_eq!(
                reply.error(),
                error,
                "{command} flags {flags:#x} offset {offset} length {length} (structured {structured})"
            );
            if structured && command == Command::Read {
                assert!(
                    matches!(reply, Reply::Structured { .. }),
                    "reads always get structured replies"
                );
            }
        };
        // Past the end: EINVAL, except ENOSPC for writes.
        expect(&mut c, Command::Read, 0, size, 1, NBD_EINVAL);
        expect(&mut c, Command::Read, 0, size - 100, 512, NBD_EINVAL);
        expect(&mut c, Command::Read, 0, u64::MAX - 10, 512, NBD_EINVAL);
        expect(&mut c, Command::Write, 0, size - 1, 2, NBD_ENOSPC);
        expect(&mut c, Command::WriteZeroes, 0, size, 512, NBD_ENOSPC);
        expect(&mut c, Command::Trim, 0, size, 512, NBD_EINVAL);
        // Length 0.
        expect(&mut c, Command::Read, 0, 0, 0, NBD_EINVAL);
        expect(&mut c, Command::Write, 0, 0, 0, NBD_EINVAL);
        expect(&mut c, Command::Trim, 0, 0, 0, NBD_EINVAL);
        // Over the maximum payload: a read may be refused with EOVERFLOW
        // under structured replies; a write's data is still read past.
        let too_long = PAYLOAD_MAX_BYTES + 512;
        let read_error = if structured {
            NBD_EOVERFLOW
        } else {
            NBD_EINVAL
        };
        expect(&mut c, Command::Read, 0, 0, too_long, read_error);
        c.request(Command::Write, 0, 5000, 0, too_long);
        c.send(&vec![0x42; too_long as usize]);
        let reply = c.reply(None);
        assert_eq!((reply.cookie(), reply.error()), (5000, NBD_EINVAL));
        // Unknown commands and flags; CACHE is checked like a read.
        expect(&mut c, Command::Unknown(99), 0, 0, 512, NBD_EINVAL);
        expect(&mut c, Command::Cache, 0, 0, 512, 0);
        expect(&mut c, Command::Cache, 0, size - 1, 2, NBD_EINVAL);
        expect(&mut c, Command::Cache, CMD_FLAG_DF, 0, 512, NBD_EINVAL);
        expect(&mut c, Command::Read, 1 << 12, 0, 512, NBD_EINVAL);
        expect(&mut c, Command::Write, CMD_FLAG_REQ_ONE, 0, 512, NBD_EINVAL);
        expect(&mut c, Command::Flush, 0, 0, 512, NBD_EINVAL);
        if structured {
            // NO_HOLE with FAST_ZERO cannot be fast: ENOTSUP, quickly.
            expect(
                &mut c,
                Command::WriteZeroes,
                CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                0,
                512,
                NBD_ENOTSUP,
            );
            expect(&mut c, Command::BlockStatus, 0, size, 512, NBD_EINVAL);
        } else {
            // No metadata context selected (none can be without structured replies).
            expect(&mut c, Command::BlockStatus, 0, 0, 512, NBD_EINVAL);
            // DF was not advertised without structured replies.
            expect(&mut c, Command::Read, CMD_FLAG_DF, 0, 512, NBD_EINVAL);
        }
        // The connection is still in step: good requests work.
        expect(&mut c, Command::Write, CMD_FLAG_FUA, 0, 512, 0);
        expect(&mut c, Command::Read, 0, 0, 512, 0);
        expect(&mut c, Command::Flush, 0, 0, 0, 0);
        witness.check();
    }
}

#[test]
fn read_only_exports_refuse_writes_with_eperm() {
    let t = TestServer::start(&[("disk", SIZE_BYTES)], ServerOptions::default());
    t.pool
        .volume("disk")
        .unwrap()
        .write_at(&[7; 4096], 0)
        .unwrap();
    t.pool.snapshot("disk", "snap").unwrap();
    for structured in [false, true] {
        let mut c = t.connect();
        let (_, flags) = c.handshake("snap", structured);
        assert_ne!(flags & FLAG_READ_ONLY, 0, "snapshots are read-only exports");
        c.request(Command::Write, 0, 1, 0, 4096);
        c.send(&[1; 4096]);
        assert_eq!(c.reply(None).error(), NBD_EPERM);
        c.request(Command::Trim, 0, 2, 0, 4096);
        assert_eq!(c.reply(None).error(), NBD_EPERM);
        c.request(Command::WriteZeroes, 0, 3, 0, 4096);
        assert_eq!(c.reply(None).error(), NBD_EPERM);
        c.request(Command::Read, 0, 4, 0, 4096);
        assert_eq!(c.reply(Some(4096)).error(), 0);
    }
    assert!(t.read_volume("snap", 0, 4096).iter().all(|&b| b == 7));

    // The server-wide switch makes every export read-only.
    let t = TestServer::start(
        &[("disk", SIZE_BYTES)],
        ServerOptions {
            read_only: true,
            ..Default::default()
        },
    );
    let mut c = t.connect();
    let (_, flags) = c.handshake("disk", true);
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    c.request(Command::Write, 0, 1, 0, 512);
    c.send(&[1; 512]);
    assert_eq!(c.reply(None).error(), NBD_EPERM);
}

#[test]
fn export_filter_and_default_export() {
    let t = TestServer::start(
        &[("disk", SIZE_BYTES), ("hidden", SIZE_BYTES)],
        ServerOptions {
            default_export: Some("disk".into()),
            exports: ExportFilter::Only(["disk".to_string()].into()),
            ..Default::default()
        },
    );
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE);
    c.send_option(
        OPT_GO,
        &encode_info_request(&InfoRequest {
            name: "hidden".into(),
            info_types: vec![],
        }),
    );
    assert_eq!(c.option_reply(OPT_GO).0, REP_ERR_UNKNOWN);
    c.send_option(OPT_LIST, &[]);
    assert_eq!(c.option_replies(OPT_LIST).len(), 2, "one export then ACK");
    // The empty name is the default export, and its canonical name is told.
    c.send_option(
        OPT_GO,
        &encode_info_request(&InfoRequest {
            name: String::new(),
            info_types: vec![INFO_NAME],
        }),
    );
    let replies = c.option_replies(OPT_GO);
    assert!(replies
        .iter()
        .any(|(t, p)| *t == REP_INFO && p[..2] == INFO_NAME.to_be_bytes() && &p[2..] == b"disk"));
    assert_eq!(replies.last().unwrap().0, REP_ACK);
}

#[test]
fn truncated_requests_and_disconnects_mid_payload_end_only_that_connection() {
    let t = server();
    let mut witness = Witness::open(&t);

    // Half a request header, then gone.
    let mut c = t.connect();
    c.handshake("disk", false);
    c.send(
        &encode_request(&Request {
            flags: 0,
            command: Command::Read,
            cookie: 1,
            offset: 0,
            length: 512,
        })[..13],
    );
    drop(c);
    witness.check();

    // A write whose data stops halfway.
    let mut c = t.connect();
    c.handshake("disk", true);
    c.request(Command::Write, 0, 1, 0, 65536);
    c.send(&[1; 1000]);
    drop(c);
    witness.check();

    // A request with a bad magic: framing lost, the server hangs up.
    let mut c = t.connect();
    c.handshake("disk", true);
    c.send(&[0xee; REQUEST_BYTES]);
    assert!(c.is_closed());
    witness.check();

    // Requests answered before DISC closes the connection, none after.
    let mut c = t.connect();
    c.handshake("disk", false);
    for cookie in 1..=8u64 {
        c.request(Command::Write, 0, cookie, cookie * 4096, 4096);
        c.send(&pattern(4096, cookie));
    }
    c.request(Command::Disc, 0, 99, 0, 0);
    let mut cookies: Vec<u64> = (1..=8).map(|_| c.reply(None).cookie()).collect();
    cookies.sort();
    assert_eq!(cookies, (1..=8).collect::<Vec<_>>());
    assert!(c.is_closed());
    for cookie in 1..=8u64 {
        assert_eq!(
            t.read_volume("disk", cookie * 4096, 4096),
            pattern(4096, cookie)
        );
    }
    witness.check();
}

#[test]
fn pipelined_requests_on_many_connections_all_get_their_replies() {
    let t = server();
    let connections = 8u64;
    let requests = 32u64;
    let block = 16 * 1024u64;
    std::thread::scope(|s| {
        for n in 0..connections {
            let t = &t;
            s.spawn(move || {
                let mut c = t.connect();
                c.handshake("disk", n % 2 == 0);
                let base = n * requests * block;
                // Everything sent before any reply is read.
                for i in 0..requests {
                    c.request(Command::Write, 0, i, base + i * block, block as u32);
                    c.send(&pattern(block as usize, base + i));
                }
                let mut seen = vec![false; requests as usize];
                for _ in 0..requests {
                    let reply = c.reply(None);
                    assert_eq!(reply.error(), 0);
                    assert!(
                        !std::mem::replace(&mut seen[reply.cookie() as usize], true),
                        "one reply per cookie"
                    );
                }
                for i in 0..requests {
                    c.request(Command::Read, 0, i, base + i * block, block as u32);
                }
                for _ in 0..requests {
                    let reply = c.reply(Some(block as usize));
                    let i = reply.cookie();
                    match reply {
                        Reply::Structured { chunks, .. } => {
                            assert_eq!(&chunks[0].1[8..], &pattern(block as usize, base + i)[..])
                        }
                        Reply::Simple { error, .. } => assert_eq!(error, 0),
                    }
                }
            });
        }
    });
    for n in 0..connections {
        let base = n * requests * block;
        for i in [0, requests - 1] {
            assert_eq!(
                t.read_volume("disk", base + i * block, block as usize),
                pattern(block as usize, base + i)
            );
        }
    }
}

#[test]
fn block_status_reports_holes_and_data() {
    let t = server();
    let v = t.pool.volume("disk").unwrap();
    v.write_at(&[1; 8192], 8192).unwrap();
    let mut c = t.connect();
    c.handshake("disk", true);
    c.request(Command::BlockStatus, 0, 1, 0, 65536);
    let Reply::Structured { chunks, .. } = c.reply(None) else {
        panic!("structured")
    };
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0].0, REPLY_TYPE_BLOCK_STATUS);
    let (_, descriptors) = decode_block_status_payload(&chunks[0].1).unwrap();
    let got: Vec<(u32, u32)> = descriptors.iter().map(|d| (d.length, d.flags)).collect();
    assert_eq!(
        got,
        vec![
            (8192, STATE_HOLE | STATE_ZERO),
            (8192, 0),
            (49152, STATE_HOLE | STATE_ZERO)
        ]
    );
    // REQ_ONE: a single descriptor, no longer than asked.
    c.request(Command::BlockStatus, CMD_FLAG_REQ_ONE, 2, 0, 4096);
    let Reply::Structured { chunks, .. } = c.reply(None) else {
        panic!("structured")
    };
    let (_, descriptors) = decode_block_status_payload(&chunks[0].1).unwrap();
    assert_eq!(descriptors.len(), 1);
    assert_eq!(
        (descriptors[0].length, descriptors[0].flags),
        (4096, STATE_HOLE | STATE_ZERO)
    );
    // Trimming and zeroing make holes; zeroing with NO_HOLE keeps data.
    c.request(Command::Trim, 0, 3, 8192, 4096);
    assert_eq!(c.reply(None).error(), 0);
    c.request(Command::WriteZeroes, CMD_FLAG_NO_HOLE, 4, 32768, 4096);
    assert_eq!(c.reply(None).error(), 0);
    c.request(Command::BlockStatus, 0, 5, 0, 65536);
    let Reply::Structured { chunks, .. } = c.reply(None) else {
        panic!("structured")
    };
    let (_, descriptors) = decode_block_status_payload(&chunks[0].1).unwrap();
    let got: Vec<(u32, u32)> = descriptors.iter().map(|d| (d.length, d.flags)).collect();
    let hole = STATE_HOLE | STATE_ZERO;
    assert_eq!(
        got,
        vec![
            (12288, hole),
            (4096, 0),
            (16384, hole),
            (4096, 0),
            (28672, hole)
        ]
    );
    assert!(t.read_volume("disk", 32768, 4096).iter().all(|&b| b == 0));
}

/// A client that sends faster than the server answers stops being read
/// once a connection's in-flight bytes reach the cap, so server memory
/// stays bounded; everything completes once it reads its replies.
#[test]
fn the_reader_stops_when_in_flight_bytes_reach_the_cap() {
    let size = 64 * 1024 * 1024u64;
    let t = TestServer::start(&[("disk", size)], ServerOptions::default());
    let mut c = t.connect();
    c.handshake("disk", false);
    // Reads of the maximum payload whose replies the client does not read
    // yet: the first reply blocks its worker on a full socket and its bytes
    // stay charged, so the second read does not fit under the cap and the
    // reader stops right there.
    let big = PAYLOAD_MAX_BYTES;
    assert!(2 * (u64::from(big) + REQUEST_OVERHEAD_BYTES) > IN_FLIGHT_MAX_BYTES);
    let reads = 3u64;
    for cookie in 0..reads {
        c.request(Command::Read, 0, cookie, 0, big);
    }
    // Then 96 MiB of writes. With the reader stopped only socket buffers
    // and the reader's buffer take any of it.
    let total = 96 * 1024 * 1024u64;
    let chunk = 1024 * 1024u32;
    let sent = Arc::new(AtomicU64::new(0));
    let writer = c.stream.try_clone_conn().unwrap();
    let mut reader = c.stream;
    let sender = {
        let sent = sent.clone();
        std::thread::spawn(move || {
            let mut writer = writer;
            let data = vec![0x5a; chunk as usize];
            for i in 0..total / u64::from(chunk) {
                let header = encode_request(&Request {
                    flags: 0,
                    command: Command::Write,
                    cookie: 100 + i,
                    offset: (i * u64::from(chunk)) % size,
                    length: chunk,
                });
                writer.write_all(&header).unwrap();
                writer.write_all(&data).unwrap();
                sent.fetch_add(u64::from(chunk), Ordering::SeqCst);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    let stalled_at = sent.load(Ordering::SeqCst);
    let buffers_bytes = 8 * 1024 * 1024;
    assert!(
        stalled_at < buffers_bytes,
        "the server kept reading ({stalled_at} of {total} bytes sent) while its replies went unread"
    );
    // Now read every reply: the server catches up and nothing is lost.
    let replies = reads + total / u64::from(chunk);
    for _ in 0..replies {
        let mut header = [0u8; SIMPLE_REPLY_BYTES];
        reader.read_exact(&mut header).unwrap();
        let (error, cookie) = decode_simple_reply(&header).unwrap();
        assert_eq!(error, 0);
        if cookie < reads {
            let mut data = vec![0u8; big as usize];
            reader.read_exact(&mut data).unwrap();
        }
    }
    sender.join().unwrap();
    assert!(t
        .read_volume("disk", 0, chunk as usize)
        .iter()
        .all(|&b| b == 0x5a));
}

/// Write data and read replies go through buffers the server reuses: a
/// read of a hole right after large writes must still come back as zeros,
/// not as what a buffer last held.
#[test]
fn reused_buffers_never_carry_one_request_into_another() {
    let t = server();
    let mut c = t.connect();
    c.handshake("disk", true);
    let len = 1024 * 1024;
    for i in 0..3u64 {
        c.request(Command::Write, 0, i, i * len as u64, len as u32);
        c.send(&pattern(len, i + 1));
        assert_eq!(c.reply(None).error(), 0);
    }
    // The last MiB is a hole; the read before it is half data, half hole.
    let half = len as u64 / 2;
    for (cookie, offset) in [(10u64, 3 * len as u64), (11, 2 * len as u64 + half)] {
        c.request(Command::Read, 0, cookie, offset, len as u32);
        let Reply::Structured { chunks, .. } = c.reply(Some(len)) else {
            panic!("structured replies were negotiated")
        };
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].0, REPLY_TYPE_OFFSET_DATA);
        let data = &chunks[0].1[8..];
        let expected = t.read_volume("disk", offset, len);
        assert_eq!(data, &expected[..], "read at {offset}");
        assert!(expected[len - half as usize..].iter().all(|&b| b == 0));
    }
}

/// Negotiates structured replies and the given metadata contexts for
/// "disk"; returns the (id, name) of each context selected.
fn select_contexts(c: &mut RawClient, queries: &[&str]) -> Vec<(u32, String)> {
    c.greet(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    c.send_option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
    c.structured = true;
    let data = encode_meta_context_request(&MetaContextRequest {
        name: "disk".into(),
        queries: queries.iter().map(|q| q.to_string()).collect(),
    });
    c.send_option(OPT_SET_META_CONTEXT, &data);
    let replies = c.option_replies(OPT_SET_META_CONTEXT);
    assert_eq!(replies.last().unwrap().0, REP_ACK, "{replies:?}");
    replies[..replies.len() - 1]
        .iter()
        .map(|(reply_type, payload)| {
            assert_eq!(*reply_type, REP_META_CONTEXT);
            let id = u32::from_be_bytes(payload[..4].try_into().unwrap());
            (id, String::from_utf8(payload[4..].to_vec()).unwrap())
        })
        .collect()
}

/// One BLOCK_STATUS request; its chunks as (context id, (length, flags)).
fn block_status(
    c: &mut RawClient,
    flags: u16,
    offset: u64,
    length: u32,
) -> Vec<(u32, Vec<(u32, u32)>)> {
    c.request(Command::BlockStatus, flags, 9, offset, length);
    let Reply::Structured { chunks, .. } = c.reply(None) else {
        panic!("structured")
    };
    chunks
        .iter()
        .map(|(reply_type, payload)| {
            assert_eq!(*reply_type, REPLY_TYPE_BLOCK_STATUS);
            let (id, descriptors) = decode_block_status_payload(payload).unwrap();
            (
                id,
                descriptors.iter().map(|d| (d.length, d.flags)).collect(),
            )
        })
        .collect()
}

#[test]
fn grove_changed_marks_what_differs_from_the_base() {
    let t = server();
    let v = t.pool.volume("disk").unwrap();
    v.write_at(&[1; 16384], 0).unwrap();
    t.pool.snapshot("disk", "monday").unwrap();
    // After monday: a rewrite, new data, and an unmap of data monday had.
    v.write_at(&[2; 4096], 4096).unwrap();
    v.write_at(&[3; 8192], 40960).unwrap();
    v.discard(12288, 4096).unwrap();
    let changed = STATE_CHANGED;
    let hole = STATE_HOLE | STATE_ZERO;

    // Both contexts, each with its own id, one chunk each per reply.
    let mut c = t.connect();
    let selected = select_contexts(
        &mut c,
        &[
            "base:allocation",
            "grove:changed:monday",
            "grove:changed:nope",
        ],
    );
    let ids: Vec<u32> = selected.iter().map(|(id, _)| *id).collect();
    let names: Vec<&str> = selected.iter().map(|(_, name)| name.as_str()).collect();
    assert_eq!(names, ["base:allocation", "grove:changed:monday"]);
    assert_ne!(ids[0], ids[1]);
    c.go("disk").unwrap();
    let chunks = block_status(&mut c, 0, 0, 65536);
    assert_eq!(
        chunks,
        vec![
            (
                ids[0],
                vec![(12288, 0), (28672, hole), (8192, 0), (16384, hole)]
            ),
            (
                ids[1],
                vec![
                    (4096, 0),
                    (4096, changed),
                    (4096, 0),
                    (4096, changed),
                    (24576, 0),
                    (8192, changed),
                    (16384, 0)
                ]
            ),
        ]
    );
    // A window inside, with REQ_ONE: one descriptor per context.
    let chunks = block_status(&mut c, CMD_FLAG_REQ_ONE, 6000, 10000);
    assert_eq!(
        chunks,
        vec![(ids[0], vec![(6288, 0)]), (ids[1], vec![(2192, changed)])]
    );
    // Writes while connected show in the next reply.
    c.request(Command::Write, 0, 10, 65536, 4096);
    c.send(&[4; 4096]);
    assert_eq!(c.reply(None).error(), 0);
    let chunks = block_status(&mut c, 0, 61440, 12288);
    assert_eq!(
        chunks[1],
        (ids[1], vec![(4096, 0), (4096, changed), (4096, 0)])
    );
    drop(c);

    // From a removed snapshot (a bookmark): the same answer.
    t.pool.remove_volume("monday").unwrap();
    let mut c = t.connect();
    let selected = select_contexts(&mut c, &["grove:changed:monday"]);
    assert_eq!(selected.len(), 1, "{selected:?}");
    c.go("disk").unwrap();
    let chunks = block_status(&mut c, 0, 0, 73728);
    assert_eq!(
        chunks,
        vec![(
            selected[0].0,
            vec![
                (4096, 0),
                (4096, changed),
                (4096, 0),
                (4096, changed),
                (24576, 0),
                (8192, changed),
                (16384, 0),
                (4096, changed),
                (4096, 0)
            ]
        )]
    );
    drop(c);

    // Only unknown or incomparable bases: nothing selected, so BLOCK_STATUS
    // is refused. A volume of another line cannot be compared with the
    // bookmark.
    t.pool.create_volume("stranger", SIZE_BYTES).unwrap();
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    c.send_option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
    c.structured = true;
    let query = |name: &str, queries: &[&str]| {
        encode_meta_context_request(&MetaContextRequest {
            name: name.into(),
            queries: queries.iter().map(|q| q.to_string()).collect(),
        })
    };
    c.send_option(
        OPT_SET_META_CONTEXT,
        &query(
            "stranger",
            &["grove:changed:monday", "grove:changed:no/such"],
        ),
    );
    assert_eq!(
        c.option_replies(OPT_SET_META_CONTEXT),
        vec![(REP_ACK, vec![])]
    );
    // LIST answers an exact base that exists, and nothing for a base that
    // does not; the bare namespace lists the export's live snapshots
    // (snap; monday is a bookmark now, named here).
    c.send_option(
        OPT_LIST_META_CONTEXT,
        &query(
            "disk",
            &[
                "grove:",
                "grove:changed:",
                "grove:changed:monday",
                "grove:changed:nope",
            ],
        ),
    );
    let replies = c.option_replies(OPT_LIST_META_CONTEXT);
    assert_eq!(replies.len(), 3, "{replies:?}");
    assert_eq!(replies[0].0, REP_META_CONTEXT);
    assert_eq!(&replies[0].1[..4], &[0; 4]);
    assert_eq!(&replies[0].1[4..], b"grove:changed:monday");
    assert_eq!(&replies[1].1[4..], b"grove:changed:snap");
    c.go("stranger").unwrap();
    c.request(Command::BlockStatus, 0, 11, 0, 4096);
    assert_eq!(c.reply(None).error(), NBD_EINVAL);
    drop(c);

    // With snapshots of disk, "grove:" lists a context for each, newest
    // first, and selects none of them.
    t.pool.snapshot("disk", "tuesday").unwrap();
    t.pool.snapshot("disk", "wednesday").unwrap();
    let mut c = t.connect();
    c.greet(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    c.send_option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply(OPT_STRUCTURED_REPLY).0, REP_ACK);
    c.structured = true;
    c.send_option(OPT_LIST_META_CONTEXT, &query("disk", &["grove:"]));
    let listed: Vec<Vec<u8>> = c
        .option_replies(OPT_LIST_META_CONTEXT)
        .into_iter()
        .filter(|(kind, _)| *kind == REP_META_CONTEXT)
        .map(|(_, body)| body[4..].to_vec())
        .collect();
    assert_eq!(
        listed,
        [
            b"grove:changed:wednesday".to_vec(),
            b"grove:changed:tuesday".to_vec(),
            b"grove:changed:snap".to_vec(),
        ]
    );
    c.send_option(OPT_SET_META_CONTEXT, &query("disk", &["grove:"]));
    assert_eq!(
        c.option_replies(OPT_SET_META_CONTEXT),
        vec![(REP_ACK, vec![])]
    );
}
