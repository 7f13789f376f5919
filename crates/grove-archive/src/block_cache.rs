//! A bounded cache of block versions read from packs, least recently used
//! out first: back-in-time reads of archived snapshots go through it, so
//! that a block read again costs no request.

use std::collections::{BTreeMap, HashMap};

/// A version's place: pack and slot.
pub type SlotKey = (u64, u32);

#[derive(Debug)]
pub struct BlockCache {
    capacity_bytes: u64,
    held_bytes: u64,
    tick: u64,
    blocks: HashMap<SlotKey, (u64, Vec<u8>)>,
    /// Last use → key: the oldest first.
    by_use: BTreeMap<u64, SlotKey>,
}

impl BlockCache {
    pub fn new(capacity_bytes: u64) -> BlockCache {
        BlockCache {
            capacity_bytes,
            held_bytes: 0,
            tick: 0,
            blocks: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// The cached data of `key`, marked used.
    pub fn get(&mut self, key: SlotKey) -> Option<&[u8]> {
        self.tick += 1;
        let tick = self.tick;
        let entry = self.blocks.get_mut(&key)?;
        let removed = self.by_use.remove(&entry.0);
        debug_assert_eq!(removed, Some(key), "every cached block is in the use order");
        entry.0 = tick;
        self.by_use.insert(tick, key);
        Some(&entry.1)
    }

    /// Caches `data` for `key`, dropping the least recently used blocks
    /// to stay within the capacity. A block bigger than the whole cache is
    /// not kept.
    pub fn put(&mut self, key: SlotKey, data: Vec<u8>) {
        let len = data.len() as u64;
        if len > self.capacity_bytes || self.blocks.contains_key(&key) {
            return;
        }
        while self.held_bytes + len > self.capacity_bytes {
            let (_, oldest) = self
                .by_use
                .pop_first()
                .expect("bytes held means blocks held");
            let (_, dropped) = self
                .blocks
                .remove(&oldest)
                .expect("the use order names cached blocks");
            self.held_bytes -= dropped.len() as u64;
        }
        self.tick += 1;
        self.by_use.insert(self.tick, key);
        self.blocks.insert(key, (self.tick, data));
        self.held_bytes += len;
        assert!(
            self.held_bytes <= self.capacity_bytes,
            "the cache stays within its capacity"
        );
        debug_assert_eq!(self.blocks.len(), self.by_use.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recently_used_within_its_capacity() {
        let mut cache = BlockCache::new(3 * 4);
        for slot in 0..3 {
            cache.put((1, slot), vec![slot as u8; 4]);
        }
        assert_eq!(cache.get((1, 0)), Some(&[0u8; 4][..]));
        cache.put((1, 3), vec![3; 4]);
        assert_eq!(cache.get((1, 1)), None, "the least recently used went");
        assert!(cache.get((1, 0)).is_some() && cache.get((1, 3)).is_some());
        assert_eq!(cache.held_bytes(), 12);
        cache.put((2, 0), vec![0; 100]);
        assert_eq!(cache.get((2, 0)), None, "bigger than the cache");
    }
}
