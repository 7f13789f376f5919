//! A chain of 1,000 nested writable snapshots (plus read-only snapshots
//! woven into it) reads back correctly, and reading through it costs exactly
//! the radix-tree nodes that reading the original volume costs: lookup cost
//! depends only on the volume's size, never on its ancestry. This is the
//! property that sets grove apart from qcow2 backing chains.

use grove_store::{Pool, PoolOptions, Volume};

const BLOCK_SIZE_BYTES: u32 = 4096;
const BLOCK: u64 = BLOCK_SIZE_BYTES as u64;
const VOLUME_BYTES: u64 = 64 << 20;
/// Radix levels of a 64 MiB volume at 4 KiB blocks: 16384 blocks, 512
/// entries per node.
const VOLUME_HEIGHT: u64 = 2;
/// Entries of a radix leaf: a 4 KiB node of 8-byte entries.
const BLOCKS_PER_LEAF: u64 = 512;
const DEPTH: u64 = 1000;
/// The base volume is written over this whole region, and every generation
/// writes somewhere inside it.
const REGION_BYTES: u64 = 2 << 20;
/// Blocks written far from the region: the middle and the very last block.
const FAR_OFFSETS: [u64; 2] = [32 << 20, VOLUME_BYTES - BLOCK];
/// Every this many generations, the next clone is made from a read-only
/// snapshot of the previous one, so snapshots sit inside the chain too.
const SNAPSHOT_EVERY: u64 = 10;
/// Depths whose contents are checked after the chain is built.
const CHECKED_DEPTHS: [u64; 8] = [0, 1, 2, 10, 11, 500, 999, 1000];

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect()
}

fn name(depth: u64) -> String {
    if depth == 0 {
        "v".to_string()
    } else {
        format!("c{depth}")
    }
}

/// What generation `depth` writes: about 5-7 KiB, starting 4001 bytes after
/// the previous generation's start, so every write overlaps its neighbours'
/// and straddles block boundaries at changing offsets. Past the region's
/// end the offsets wrap around, so late generations overwrite early ones.
// The writes wrap around the region, so newer generations overwrite older ones.
const _: () = assert!(DEPTH * 4001 > REGION_BYTES);

fn generation_write(depth: u64) -> (u64, Vec<u8>) {
    let len = 5000 + (depth % 3) * 1000;
    let offset = (depth * 4001) % (REGION_BYTES - 8 * 1024);
    (offset, pattern(depth, len as usize))
}

/// The region as generation `depth` sees it: the base pattern overwritten
/// by generations 1..=depth in order (newest wins).
fn expected_region(depth: u64) -> Vec<u8> {
    let mut region = pattern(0, REGION_BYTES as usize);
    for generation in 1..=depth {
        let (offset, data) = generation_write(generation);
        region[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
    }
    region
}

fn read(volume: &Volume, offset: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    volume.read_at(&mut buf, offset).unwrap();
    buf
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Checks the region and the far blocks of the volume at `depth` against
/// the expected region contents.
fn check_contents(pool: &Pool, depth: u64, expected: &[u8]) {
    let volume = pool.volume(&name(depth)).unwrap();
    let region = read(&volume, 0, REGION_BYTES);
    assert!(
        region == expected,
        "depth {depth}: region differs at byte {:?}",
        first_difference(&region, expected)
    );
    for (i, &offset) in FAR_OFFSETS.iter().enumerate() {
        assert_eq!(
            read(&volume, offset, BLOCK),
            pattern(1_000_000 + i as u64, BLOCK as usize),
            "depth {depth}: far block at {offset}"
        );
    }
    // A hole far from every write still reads as zeros.
    assert!(read(&volume, 48 << 20, 3 * BLOCK).iter().all(|&b| b == 0));
}

/// Node visits spent reading `len` bytes at `offset` from `volume`.
fn visits_for_read(pool: &Pool, volume: &Volume, offset: u64, len: u64) -> u64 {
    let before = pool.node_visits();
    read(volume, offset, len);
    pool.node_visits() - before
}

/// Reads every mapped block of the base volume, and a hole, from depth 0
/// and from the deepest clone: both must cost the same node visits.
fn check_lookup_cost(pool: &Pool) {
    let base = pool.volume(&name(0)).unwrap();
    let deepest = pool.volume(&name(DEPTH)).unwrap();
    let extents = base.mapped_extents().unwrap();
    // The chain's writes all land inside the base's mapped region, so the
    // deepest clone maps exactly the same blocks.
    assert_eq!(deepest.mapped_extents().unwrap(), extents);
    let mapped_blocks: u64 = extents.iter().map(|&(_, len)| len.div_ceil(BLOCK)).sum();
    assert_eq!(
        mapped_blocks,
        REGION_BYTES / BLOCK + FAR_OFFSETS.len() as u64
    );

    let mut base_visits = 0;
    let mut deep_visits = 0;
    for &(offset, len) in &extents {
        base_visits += visits_for_read(pool, &base, offset, len);
        deep_visits += visits_for_read(pool, &deepest, offset, len);
    }
    // A read walks the tree once per leaf it covers (State::lookup_run).
    let leaves: u64 = extents
        .iter()
        .map(|&(offset, len)| {
            let first = offset / BLOCK / BLOCKS_PER_LEAF;
            let last = (offset + len - 1) / BLOCK / BLOCKS_PER_LEAF;
            last - first + 1
        })
        .sum();
    assert_eq!(base_visits, leaves * VOLUME_HEIGHT);
    assert_eq!(
        deep_visits, base_visits,
        "reading through {DEPTH} ancestors must visit as many nodes as depth 0"
    );

    // A hole stops at the root, also at depth 1000: 16 blocks in one
    // leaf's range are one walk, one visit.
    let hole = (40 << 20, 16 * BLOCK);
    let base_hole = visits_for_read(pool, &base, hole.0, hole.1);
    let deep_hole = visits_for_read(pool, &deepest, hole.0, hole.1);
    assert_eq!(base_hole, 1);
    assert_eq!(deep_hole, base_hole);
}

fn check_all(pool: &Pool) {
    for depth in CHECKED_DEPTHS {
        check_contents(pool, depth, &expected_region(depth));
    }
    // A read-only snapshot inside the chain is frozen at its source's state.
    let snapshot = pool.volume("s499").unwrap();
    assert!(snapshot.is_read_only().unwrap());
    assert!(read(&snapshot, 0, REGION_BYTES) == expected_region(499));
}

#[test]
fn a_chain_of_1000_clones_reads_correctly_at_depth_0_cost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let options = PoolOptions {
        block_size_bytes: BLOCK_SIZE_BYTES,
        ..PoolOptions::default()
    };
    let pool = Pool::create(&path, &options).unwrap();
    pool.create_volume(&name(0), VOLUME_BYTES).unwrap();
    let base = pool.volume(&name(0)).unwrap();
    base.write_at(&expected_region(0), 0).unwrap();
    for (i, &offset) in FAR_OFFSETS.iter().enumerate() {
        base.write_at(&pattern(1_000_000 + i as u64, BLOCK as usize), offset)
            .unwrap();
    }
    drop(base);

    for depth in 1..=DEPTH {
        let parent = name(depth - 1);
        let source = if depth % SNAPSHOT_EVERY == 0 {
            let snapshot = format!("s{}", depth - 1);
            pool.snapshot(&parent, &snapshot).unwrap();
            snapshot
        } else {
            parent
        };
        let info = pool.clone_volume(&source, &name(depth)).unwrap();
        assert_eq!(info.summary.parent.as_deref(), Some(source.as_str()));
        let (offset, data) = generation_write(depth);
        pool.volume(&name(depth))
            .unwrap()
            .write_at(&data, offset)
            .unwrap();
    }

    check_all(&pool);
    check_lookup_cost(&pool);

    pool.close().unwrap();
    let pool = Pool::open(&path).unwrap();
    assert_eq!(
        pool.volumes().unwrap().len() as u64,
        DEPTH + 1 + DEPTH / SNAPSHOT_EVERY
    );
    check_all(&pool);
    check_lookup_cost(&pool);
    let report = pool.check(false).unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}
