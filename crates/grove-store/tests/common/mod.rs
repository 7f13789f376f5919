//! Helpers shared by the engine's integration tests.

use std::collections::BTreeMap;

use grove_store::Pool;

/// Every volume's whole contents, by name.
pub fn contents(pool: &Pool) -> BTreeMap<String, Vec<u8>> {
    pool.volumes()
        .into_iter()
        .map(|info| {
            let mut buf = vec![0u8; info.size_bytes as usize];
            pool.volume(&info.name)
                .unwrap()
                .read_at(&mut buf, 0)
                .unwrap();
            (info.name, buf)
        })
        .collect()
}
