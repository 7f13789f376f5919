//! Send and receive between two real pools, checked byte for byte against
//! a model of every snapshot's contents: full streams, incrementals,
//! ranges, from a bookmark and from a cursor, across block sizes.

use std::collections::BTreeMap;

use grove_send::{receive, send, volume_digest, SendRequest};
use grove_store::{DiffFrom, Pool, PoolOptions};

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn pool(dir: &std::path::Path, block_size_bytes: u32) -> Pool {
    Pool::create(
        dir,
        &PoolOptions {
            block_size_bytes,
            ..PoolOptions::default()
        },
    )
    .unwrap()
}

fn read_all(pool: &Pool, name: &str) -> Vec<u8> {
    let volume = pool.volume(name).unwrap();
    let mut buf = vec![0u8; volume.size_bytes().unwrap() as usize];
    volume.read_at(&mut buf, 0).unwrap();
    buf
}

/// Random writes, zero writes and discards, at unaligned offsets.
fn scribble(rng: &mut Rng, pool: &Pool, name: &str, model: &mut [u8]) {
    let volume = pool.volume(name).unwrap();
    for _ in 0..1 + rng.below(6) {
        let size = model.len() as u64;
        let offset = rng.below(size - 1);
        let len = 1 + rng.below((size - offset).min(40_000));
        let (start, end) = (offset as usize, (offset + len) as usize);
        match rng.below(4) {
            0 => {
                volume.write_at(&vec![0u8; len as usize], offset).unwrap();
                model[start..end].fill(0);
            }
            1 => {
                volume.discard(offset, len).unwrap();
                model[start..end].fill(0);
            }
            _ => {
                let byte = 1 + rng.below(255) as u8;
                let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                volume.write_at(&data, offset).unwrap();
                model[start..end].copy_from_slice(&data);
            }
        }
    }
}

fn transfer(from: &Pool, request: &SendRequest, to: &Pool, name: &str) -> Vec<String> {
    let mut stream = Vec::new();
    send(from, request, &mut stream, &mut |_| {}).unwrap();
    receive(to, name, &stream[..], &mut |_| {})
        .unwrap_or_else(|e| panic!("receive {name}: {e}"))
        .snapshots
}

fn run_family(seed: u64, sender_block: u32, receiver_block: u32) {
    let mut rng = Rng(seed);
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (
        pool(dirs.0.path(), sender_block),
        pool(dirs.1.path(), receiver_block),
    );
    let size = (64 + rng.below(512)) * 1024 + 512 * rng.below(2);
    a.create_volume("v", size).unwrap();
    let mut model = vec![0u8; size as usize];
    let mut snapshots: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for i in 1..=8 {
        scribble(&mut rng, &a, "v", &mut model);
        a.snapshot("v", &format!("v@{i}")).unwrap();
        snapshots.insert(format!("r@{i}"), model.clone());
    }
    let full = SendRequest {
        target: "v@1".into(),
        ..SendRequest::default()
    };
    assert_eq!(transfer(&a, &full, &b, "r@1"), ["r@1"]);
    let incremental = SendRequest {
        target: "v@2".into(),
        from: Some(DiffFrom::Name("v@1".into())),
        ..SendRequest::default()
    };
    assert_eq!(transfer(&a, &incremental, &b, "r@2"), ["r@2"]);
    let range = SendRequest {
        target: "v@5".into(),
        from: Some(DiffFrom::Name("v@2".into())),
        range: true,
        ..SendRequest::default()
    };
    assert_eq!(transfer(&a, &range, &b, "r@5"), ["r@3", "r@4", "r@5"]);
    // From a bookmark: v@5 removed on the sender, kept on the receiver.
    a.remove_volume("v@5").unwrap();
    let from_bookmark = SendRequest {
        target: "v@6".into(),
        from: Some(DiffFrom::Name("v@5".into())),
        ..SendRequest::default()
    };
    assert_eq!(transfer(&a, &from_bookmark, &b, "r@6"), ["r@6"]);
    // Through a cursor that outlives its snapshot (which it holds: only a
    // forced removal takes it).
    a.set_cursor("b", "v@6").unwrap();
    assert!(a.remove_volume("v@6").is_err());
    let forced = grove_store::RemoveOptions {
        force: true,
        ..grove_store::RemoveOptions::default()
    };
    a.remove("v@6", forced).unwrap();
    a.reclaim_all(|_| {}).unwrap();
    let from_cursor = SendRequest {
        target: "v@8".into(),
        from: Some(DiffFrom::Cursor("b".into())),
        range: true,
        ..SendRequest::default()
    };
    assert_eq!(transfer(&a, &from_cursor, &b, "r@8"), ["r@7", "r@8"]);
    for (name, expected) in &snapshots {
        assert!(
            read_all(&b, name) == *expected,
            "seed {seed}: {name} differs"
        );
        let sender = name.replace("r@", "v@");
        if a.identity(&sender).is_ok() {
            assert_eq!(
                volume_digest(&a.volume(&sender).unwrap()).unwrap(),
                volume_digest(&b.volume(name).unwrap()).unwrap(),
                "seed {seed}: digests of {sender} and {name}"
            );
        }
    }
    let report = b.check(false).unwrap();
    assert!(report.is_clean(), "seed {seed}: {report:?}");
}

#[test]
fn random_families_arrive_byte_for_byte() {
    for seed in 1..=12u64 {
        let blocks = [1024, 4096, 65536];
        let sender = blocks[(seed % 3) as usize];
        let receiver = blocks[((seed / 3) % 3) as usize];
        run_family(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), sender, receiver);
    }
}

#[test]
fn a_sparse_volume_travels_as_what_it_holds() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (pool(dirs.0.path(), 4096), pool(dirs.1.path(), 4096));
    a.create_volume("big", 1 << 40).unwrap();
    let volume = a.volume("big").unwrap();
    for i in 0..64u64 {
        volume
            .write_at(&[i as u8 + 1; 65536], i * (1 << 34))
            .unwrap();
    }
    // Written zeros travel as a zero record, not as bytes.
    volume.write_at(&vec![0u8; 1 << 20], 5 << 20).unwrap();
    a.snapshot("big", "big@1").unwrap();
    let mut stream = Vec::new();
    let request = SendRequest {
        target: "big@1".into(),
        ..SendRequest::default()
    };
    let summary = send(&a, &request, &mut stream, &mut |_| {}).unwrap();
    let data = 64 * 65536;
    assert_eq!(summary.data_bytes, data);
    assert_eq!(summary.zero_bytes, 1 << 20);
    assert!(
        (stream.len() as u64) < data + data / 100,
        "{} stream bytes for {data} bytes of data",
        stream.len()
    );
    receive(&b, "big@1", &stream[..], &mut |_| {}).unwrap();
    assert_eq!(
        volume_digest(&a.volume("big@1").unwrap()).unwrap(),
        volume_digest(&b.volume("big@1").unwrap()).unwrap()
    );
    let got = b.volume("big@1").unwrap();
    let mut buf = vec![0u8; 65536];
    got.read_at(&mut buf, 7 * (1 << 34)).unwrap();
    assert!(buf.iter().all(|&x| x == 8));
    assert_eq!(
        b.volume_info("big@1").unwrap().summary.referenced_bytes,
        data,
        "zeros were not written out"
    );
}

/// Years of rolling replication must not pile up digest cache entries:
/// each send and receive forgets those of snapshots the pool no longer
/// knows (removed, their bookmark rolled off), on both sides.
#[test]
fn digest_cache_entries_go_with_their_snapshots() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (pool(dirs.0.path(), 4096), pool(dirs.1.path(), 4096));
    let entries = |dir: &std::path::Path| {
        std::fs::read_dir(dir.join("grove.digests")).map_or(0, |entries| entries.count())
    };
    a.create_volume("vm", 1 << 20).unwrap();
    let volume = a.volume("vm").unwrap();
    let mut previous: Option<String> = None;
    for round in 0..40u32 {
        volume
            .write_at(&round.to_le_bytes(), 4096 * u64::from(round))
            .unwrap();
        let name = format!("vm@{round}");
        a.snapshot("vm", &name).unwrap();
        let request = SendRequest {
            target: name.clone(),
            from: previous.as_ref().map(|p| DiffFrom::Name(p.clone())),
            ..SendRequest::default()
        };
        transfer(&a, &request, &b, &name);
        // Keep the newest two on each side, as a rolling policy would.
        if round >= 2 {
            let old = format!("vm@{}", round - 2);
            a.remove(&old, Default::default()).unwrap();
            b.remove(&old, Default::default()).unwrap();
            // As a daemon's reclaimer would: a record goes once its
            // blocks are back and its bookmark rolled off.
            a.reclaim_all(|_| {}).unwrap();
            b.reclaim_all(|_| {}).unwrap();
        }
        previous = Some(name);
    }
    let known = |pool: &Pool| pool.known_guids().len();
    for (pool, dir) in [(&a, dirs.0.path()), (&b, dirs.1.path())] {
        let kept = entries(dir);
        assert!(kept > 0, "the cache is used");
        assert!(
            kept <= known(pool),
            "{kept} cache entries for {} records the pool knows",
            known(pool)
        );
    }
    // On the sender the removed snapshots' bookmarks roll off, so the
    // cache shrinks with them. (On the receiver each snapshot is made from
    // the one before, and removed records stay while a later one's lineage
    // goes through them.)
    assert!(
        // The two kept, the bookmarks, and the one removed since the last
        // send forgot.
        entries(dirs.0.path()) <= 3 + grove_store::BOOKMARKS_PER_PARENT_MAX,
        "the sender's cache holds {} entries",
        entries(dirs.0.path())
    );
}

/// Reads frames from `bytes` as a receiver does; each decoded frame must
/// encode back to exactly the bytes it came from. Returns the frames read.
fn decode_all(bytes: &[u8]) -> usize {
    use grove_send::format::{Frame, FrameReader, FrameWriter};
    let mut reader = FrameReader::new(bytes);
    let mut consumed = 0usize;
    let mut frames = 0;
    while let Ok(frame) = reader.next_frame() {
        let end = reader.bytes_read as usize;
        let mut encoded = Vec::new();
        FrameWriter::new(&mut encoded).write(&frame).unwrap();
        assert_eq!(&encoded[..], &bytes[consumed..end], "frame {frames}");
        if let Frame::Begin(begin) = &frame {
            let _ = begin.check(1_800_000_000);
        }
        consumed = end;
        frames += 1;
    }
    frames
}

/// The stream decoder never panics: real streams with bits flipped, cut,
/// spliced and their length fields forged, and random bytes, each decode
/// to frames that re-encode exactly, then a clean error (the fuzz target
/// fuzz/fuzz_targets/send_stream.rs explores the same further). Receiving
/// them refuses each without a panic.
#[test]
fn the_stream_decoder_never_panics_on_damaged_or_forged_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let a = pool(&dir.path().join("a"), 4096);
    a.create_volume("v", 1 << 20).unwrap();
    let volume = a.volume("v").unwrap();
    volume.write_at(&[7u8; 20_000], 3000).unwrap();
    volume.write_at(&[0u8; 8192], 40_960).unwrap();
    a.snapshot("v", "v@1").unwrap();
    let mut full = Vec::new();
    let request = SendRequest {
        target: "v@1".into(),
        ..SendRequest::default()
    };
    send(&a, &request, &mut full, &mut |_| {}).unwrap();
    assert!(decode_all(&full) >= 5);
    let b = pool(&dir.path().join("b"), 4096);
    let mut rng = Rng(0x5eed_0035);
    for round in 0..3000 {
        let mut bytes = full.clone();
        match rng.below(4) {
            0 => {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << rng.below(8);
            }
            1 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
            2 => {
                // A frame's length field forged (at a frame start or not).
                let at = rng.below(bytes.len() as u64 - 5) as usize;
                let length: u32 = [0, 1, 8, 4095, 1 << 20, u32::MAX][rng.below(6) as usize];
                bytes[at + 1..at + 5].copy_from_slice(&length.to_le_bytes());
            }
            _ => {
                bytes = (0..rng.below(9000)).map(|_| rng.below(256) as u8).collect();
            }
        }
        decode_all(&bytes);
        if round % 100 == 0 {
            let name = format!("r{round}@1");
            if receive(&b, &name, &bytes[..], &mut |_| {}).is_err() {
                let _ = grove_send::receive::abort(&b, &name);
            }
        }
    }
}
