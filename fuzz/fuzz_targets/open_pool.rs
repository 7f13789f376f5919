//! Opens a pool from arbitrary bytes: the result is an error or a pool that
//! checks, reads and writes without panicking. Run with
//! `cargo +nightly fuzz run open_pool` from this directory.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use grove_store::{MemDevice, Pool};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let device = Arc::new(MemDevice::from_bytes(data.to_vec()));
    let Ok(pool) = Pool::open_device(device, Path::new("fuzz"), None) else {
        return;
    };
    let _ = pool.check(false);
    let _ = pool.volumes();
    let _ = pool.info();
    for name in pool.volume_names() {
        if let Ok(volume) = pool.volume(&name) {
            let mut buf = vec![0u8; 4096];
            let _ = volume.read_at(&mut buf, 0);
            let _ = volume.write_at(&buf, 0);
        }
        // Removing and reclaiming walk whatever the store says.
        let _ = pool.remove_volume(&name);
    }
    let _ = pool.reclaim_all(|_| {});
    let _ = pool.flush();
});
