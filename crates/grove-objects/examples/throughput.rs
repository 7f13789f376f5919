//! Stores a stream of SIZE MiB (default 256) through the API in parts of
//! 64 MiB, reads it back through `reader`, prints both rates, removes it.
//!
//!   . /var/tmp/grove-ceph/env.sh
//!   cargo run --release -p grove-objects --example throughput -- s3://grove-test/bench [SIZE_MIB]

use grove_objects::{StreamStore, DEFAULT_PART_SIZE_BYTES};
use std::io::Read;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: throughput URL [SIZE_MIB]");
    let size_mib: usize = args.next().map_or(256, |s| s.parse().expect("SIZE_MIB"));
    let store = StreamStore::open(&url).unwrap_or_else(|e| panic!("{e}"));
    let part = DEFAULT_PART_SIZE_BYTES as usize;
    let mut data = vec![0u8; size_mib << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let name = "throughput";
    store.remove(name).unwrap();

    let start = Instant::now();
    let mut upload = store.upload(name).unwrap();
    for (i, bytes) in data.chunks(part).enumerate() {
        upload.put_part(bytes, &(i as u64).to_le_bytes()).unwrap();
    }
    upload.finish().unwrap();
    let put_s = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut back = Vec::with_capacity(data.len());
    store
        .reader(name, 0)
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    let get_s = start.elapsed().as_secs_f64();
    assert!(back == data, "read back differs");
    store.remove(name).unwrap();
    println!(
        "{}: {size_mib} MiB in parts of {} MiB: store {:.0} MiB/s ({put_s:.2} s), read back {:.0} MiB/s ({get_s:.2} s)",
        store.describe(),
        part >> 20,
        size_mib as f64 / put_s,
        size_mib as f64 / get_s
    );
}
