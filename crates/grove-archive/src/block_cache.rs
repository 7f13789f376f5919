//! The cache of block versions back-in-time reads go through, shared by
//! every archived snapshot a process has open (`grove serve`'s exports,
//! `grove mount`'s files), so that its bound holds over all of them
//! together and a snapshot opened again finds what was read before.

use crate::format::pack::Address;
use crate::lru::Lru;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A version's place in the cache: its archive (a number per archive
/// seen) and its address there.
type Key = (u32, u64, u32);

#[derive(Debug)]
pub struct BlockCache {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Archive (store and volume) → its number in the keys.
    archives: HashMap<String, u32>,
    blocks: Lru<Key, Vec<u8>>,
}

impl BlockCache {
    /// A cache holding at most `capacity_bytes` of blocks.
    pub fn new(capacity_bytes: u64) -> Arc<BlockCache> {
        Arc::new(BlockCache {
            inner: Mutex::new(Inner {
                archives: HashMap::new(),
                blocks: Lru::new(capacity_bytes),
            }),
        })
    }

    /// Bytes of blocks held now, never more than the capacity.
    pub fn held_bytes(&self) -> u64 {
        self.lock().blocks.held_bytes()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The number of archive `archive` (as `Archive::describe` names it).
    pub(crate) fn archive_number(&self, archive: &str) -> u32 {
        let mut inner = self.lock();
        let next = inner.archives.len() as u32;
        *inner.archives.entry(archive.to_string()).or_insert(next)
    }

    /// Copies bytes `within..` of the cached version at `address` of
    /// archive `number` into `out`; false if it is not cached.
    pub(crate) fn copy_out(
        &self,
        number: u32,
        address: Address,
        within: usize,
        out: &mut [u8],
    ) -> bool {
        let mut inner = self.lock();
        match inner.blocks.get(&(number, address.0, address.1)) {
            Some(data) => {
                out.copy_from_slice(&data[within..within + out.len()]);
                true
            }
            None => false,
        }
    }

    pub(crate) fn put(&self, number: u32, address: Address, data: Vec<u8>) {
        let weight = data.len() as u64;
        self.lock()
            .blocks
            .put((number, address.0, address.1), data, weight);
    }
}
