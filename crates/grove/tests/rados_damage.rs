//! Damage to a pool in RADOS, on scripts/ceph.sh's cluster, through the real
//! binary: a data object holding radix nodes of a written volume is
//! removed (`rados rm`), or has a byte flipped (`rados get`, flip, `rados
//! put`). The nodes' checksums catch both: `grove check` and `grove read`
//! fail with one line naming the RADOS object and why, and nothing panics.
//! With the object put back the pool checks clean again.
//!
//! Data blocks carry no checksum, so a flipped byte in one goes unseen
//! (docs/design.md). But an object of data that is missing or cut short
//! is found: the pool maps data there, so the object must hold it. `grove
//! check` stats every object under mapped data, and a read refuses rather
//! than return zeros, each naming the object.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use grove_store::format::node::{Node, NodeKind};
use grove_store::types::BlockAddr;
use support::{have, GROVE};

const BLOCK_BYTES: usize = 4096;
/// grove-rados's default object size, which `grove init` uses.
const OBJECT_BYTES: u64 = grove_rados::OBJECT_SIZE_DEFAULT;
const WRITTEN_BYTES: usize = 12 << 20;

fn tools_required() -> bool {
    std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0")
}

/// A pool name in the test pool no other test uses, or None after a SKIP.
fn fresh_name(test: &str) -> Option<(String, String)> {
    let pool = std::env::var("GROVE_TEST_RADOS_POOL")
        .ok()
        .filter(|p| !p.is_empty());
    match (pool, std::env::var_os("CEPH_CONF")) {
        (Some(pool), Some(_)) if have("rados") => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            Some((pool, format!("{test}-{}-{nanos}", std::process::id())))
        }
        (Some(_), Some(_)) => None,
        _ => {
            let why = "no Ceph cluster: CEPH_CONF or GROVE_TEST_RADOS_POOL is not set (scripts/ceph.sh start)";
            assert!(!tools_required(), "{why}, and GROVE_REQUIRE_TOOLS is set");
            eprintln!("SKIP: {why}");
            None
        }
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A pool in RADOS, run from a local directory of its own.
struct RadosPool {
    pool: String,
    name: String,
    local: PathBuf,
}

impl RadosPool {
    fn location(&self) -> String {
        format!("rados://{}/{}", self.pool, self.name)
    }

    fn grove(&self, args: &[&str]) -> Output {
        Command::new(GROVE)
            .env("GROVE_RADOS_DIR", &self.local)
            .arg("--pool")
            .arg(self.location())
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.grove(args);
        assert!(out.status.success(), "grove {args:?}: {}", text(&out));
        text(&out)
    }

    fn rados(&self, args: &[&str]) -> Output {
        let out = Command::new("rados")
            .args(["-p", &self.pool])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "rados {args:?}: {}", text(&out));
        out
    }

    fn object(&self, index: u64) -> String {
        format!("{}.{index:016x}", self.name)
    }

    fn get(&self, index: u64, dir: &Path) -> Vec<u8> {
        let file = dir.join(self.object(index));
        self.rados(&["get", &self.object(index), file.to_str().unwrap()]);
        std::fs::read(&file).unwrap()
    }

    fn put(&self, index: u64, bytes: &[u8], dir: &Path) {
        let file = dir.join(format!("{}.put", self.object(index)));
        std::fs::write(&file, bytes).unwrap();
        self.rados(&["put", &self.object(index), file.to_str().unwrap()]);
    }

    /// The indexes of the data objects that exist.
    fn data_objects(&self) -> Vec<u64> {
        let out = self.rados(&["ls"]);
        let prefix = format!("{}.", self.name);
        let mut found: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.strip_prefix(&prefix))
            .filter(|rest| rest.len() == 16)
            .filter_map(|hex| u64::from_str_radix(hex, 16).ok())
            .collect();
        found.sort_unstable();
        found
    }
}

/// Where in `object` (bytes of data object `index`) a radix node of a
/// volume's tree lies, if one does; None too if the object holds a node of
/// the volume table, whose loss would stop the pool from opening at all.
fn volume_node_in(index: u64, object: &[u8]) -> Option<usize> {
    let mut found = None;
    for (k, block) in object.chunks_exact(BLOCK_BYTES).enumerate() {
        let addr = BlockAddr((index * OBJECT_BYTES) / BLOCK_BYTES as u64 + k as u64);
        let decodes = |kind| {
            (0..4)
                .any(|level| Node::decode(block, addr, kind, level, 0..u64::MAX, u64::MAX).is_ok())
        };
        if decodes(NodeKind::VolumeTable) {
            return None;
        }
        if found.is_none() && decodes(NodeKind::VolumeData) {
            found = Some(k * BLOCK_BYTES);
        }
    }
    found
}

/// A new pool in RADOS with an empty 64 MiB volume "disk", in 4K blocks,
/// or None after a SKIP.
fn empty_pool(test: &str, dir: &Path) -> Option<RadosPool> {
    let (pool, name) = fresh_name(test)?;
    let pool = RadosPool {
        pool,
        name,
        local: dir.join("local"),
    };
    pool.ok(&["init", "--block-size", "4K", "--capacity", "256M"]);
    pool.ok(&["create", "disk", "--size", "64M"]);
    Some(pool)
}

/// A pool with a volume "disk" written 12 MiB deep, closed; the data
/// object (not the first, which holds the superblock and the journal)
/// that holds one of disk's radix nodes, its bytes, and where the node is.
fn written_pool(test: &str, dir: &Path) -> Option<(RadosPool, u64, Vec<u8>, usize)> {
    let pool = empty_pool(test, dir)?;
    let data: Vec<u8> = (0..WRITTEN_BYTES).map(|i| (i % 251) as u8 | 1).collect();
    let file = dir.join("data");
    std::fs::write(&file, &data).unwrap();
    pool.ok(&["write", "disk", file.to_str().unwrap()]);
    let check = pool.ok(&["check"]);
    assert!(check.contains("the pool is clean"), "{check}");
    let objects = pool.data_objects();
    let (index, bytes, node_at) = objects
        .iter()
        .filter(|&&index| index > 0)
        .find_map(|&index| {
            let bytes = pool.get(index, dir);
            volume_node_in(index, &bytes).map(|at| (index, bytes, at))
        })
        .unwrap_or_else(|| panic!("no object of {objects:?} holds a radix node of disk alone"));
    Some((pool, index, bytes, node_at))
}

/// `grove check` and `grove read` of the damaged pool both fail, each
/// with a line naming the object and saying why; nothing panics.
fn assert_named(pool: &RadosPool, index: u64, why: &str) {
    let object = pool.object(index);
    let reads = format!("{WRITTEN_BYTES}");
    for args in [
        vec!["check"],
        vec!["read", "disk", "--length", reads.as_str()],
    ] {
        let out = pool.grove(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "grove {args:?} passed: {}",
            text(&out)
        );
        assert!(!stderr.contains("panicked"), "grove {args:?}: {stderr}");
        let all = text(&out);
        let line = all.lines().find(|line| line.contains(&object));
        let line = line.unwrap_or_else(|| panic!("grove {args:?} names no {object}: {all}"));
        assert!(line.contains(why), "grove {args:?}: {line}");
        eprintln!("grove {args:?}: {line}");
    }
}

#[test]
fn a_missing_object_of_radix_nodes_is_named_by_check_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let Some((pool, index, bytes, _)) = written_pool("missing", dir.path()) else {
        return;
    };
    pool.rados(&["rm", &pool.object(index)]);
    assert_named(&pool, index, "no node magic");
    pool.put(index, &bytes, dir.path());
    let check = pool.ok(&["check"]);
    assert!(check.contains("the pool is clean"), "{check}");
}

#[test]
fn a_damaged_object_of_radix_nodes_is_named_by_check_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let Some((pool, index, bytes, node_at)) = written_pool("damaged", dir.path()) else {
        return;
    };
    let mut damaged = bytes.clone();
    damaged[node_at + 1000] ^= 0x10;
    pool.put(index, &damaged, dir.path());
    assert_named(&pool, index, "checksum mismatch");
    pool.put(index, &bytes, dir.path());
    let check = pool.ok(&["check"]);
    assert!(check.contains("the pool is clean"), "{check}");
}

/// The first data object past object 0 that holds nothing but the volume's
/// data (every block of it whole, each a block of `data`): no node, no
/// map, whose loss the checksums would catch anyway.
fn data_only_object(pool: &RadosPool, data: &[u8], dir: &Path) -> (u64, Vec<u8>) {
    let blocks: std::collections::HashSet<&[u8]> = data.chunks_exact(BLOCK_BYTES).collect();
    let objects = pool.data_objects();
    objects
        .iter()
        .filter(|&&index| index > 0)
        .find_map(|&index| {
            let bytes = pool.get(index, dir);
            let only_data = bytes.len() as u64 == OBJECT_BYTES
                && bytes.chunks_exact(BLOCK_BYTES).all(|b| blocks.contains(b));
            only_data.then_some((index, bytes))
        })
        .unwrap_or_else(|| panic!("no object of {objects:?} holds only disk's data"))
}

/// A pool whose volume "disk" holds `data`, written so that whole objects
/// hold nothing else: one block of every 2 MiB first, so the leaves that
/// map them are placed then, and then the rest, placed after them.
fn data_pool(dir: &Path, data: &[u8]) -> Option<RadosPool> {
    let pool = empty_pool("data", dir)?;
    let file = dir.join("data");
    for at in (0..data.len()).step_by(2 << 20) {
        std::fs::write(&file, &data[at..at + BLOCK_BYTES]).unwrap();
        let offset = at.to_string();
        pool.ok(&["write", "disk", file.to_str().unwrap(), "--offset", &offset]);
    }
    std::fs::write(&file, data).unwrap();
    pool.ok(&["write", "disk", file.to_str().unwrap()]);
    Some(pool)
}

#[test]
fn a_missing_or_cut_short_object_of_data_is_named_by_check_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..WRITTEN_BYTES).map(|i| (i % 251) as u8 | 1).collect();
    let Some(pool) = data_pool(dir.path(), &data) else {
        return;
    };
    let check = pool.ok(&["check"]);
    assert!(check.contains("the pool is clean"), "{check}");
    let (index, bytes) = data_only_object(&pool, &data, dir.path());
    pool.rados(&["rm", &pool.object(index)]);
    assert_named(&pool, index, "is missing, yet the pool maps data in it");
    pool.put(index, &bytes[..bytes.len() / 2], dir.path());
    assert_named(&pool, index, "cut short");
    pool.put(index, &bytes, dir.path());
    let check = pool.ok(&["check"]);
    assert!(check.contains("the pool is clean"), "{check}");
    let read = pool.grove(&["read", "disk", "--length", &WRITTEN_BYTES.to_string()]);
    assert!(read.status.success(), "{}", text(&read));
    assert!(
        read.stdout == data,
        "disk reads back other bytes once the object is back"
    );
}
