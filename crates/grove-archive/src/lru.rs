//! A bounded cache, least recently used out first, of values that each
//! weigh some bytes: the blocks back-in-time reads fetched, and the index
//! pages and forward tables readers decoded. Whatever is put, it never
//! holds more than its capacity.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

#[derive(Debug)]
pub struct Lru<K, V> {
    capacity_bytes: u64,
    held_bytes: u64,
    tick: u64,
    /// key → (last use, weight, value).
    entries: HashMap<K, (u64, u64, V)>,
    /// Last use → key: the oldest first.
    by_use: BTreeMap<u64, K>,
}

impl<K: Hash + Eq + Copy, V> Lru<K, V> {
    pub fn new(capacity_bytes: u64) -> Lru<K, V> {
        Lru {
            capacity_bytes,
            held_bytes: 0,
            tick: 0,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// The value of `key`, marked used.
    pub fn get(&mut self, key: &K) -> Option<&V> {
        self.tick += 1;
        let tick = self.tick;
        let entry = self.entries.get_mut(key)?;
        let removed = self.by_use.remove(&entry.0);
        debug_assert!(removed.is_some(), "every cached value is in the use order");
        entry.0 = tick;
        self.by_use.insert(tick, *key);
        Some(&entry.2)
    }

    /// Caches `value`, weighing `weight` bytes, dropping the least recently
    /// used to stay within the capacity. A value heavier than the whole
    /// cache is not kept.
    pub fn put(&mut self, key: K, value: V, weight: u64) {
        if weight > self.capacity_bytes || self.entries.contains_key(&key) {
            return;
        }
        while self.held_bytes + weight > self.capacity_bytes {
            let (_, oldest) = self
                .by_use
                .pop_first()
                .expect("bytes held means values held");
            let (_, dropped, _) = self
                .entries
                .remove(&oldest)
                .expect("the use order names cached values");
            self.held_bytes -= dropped;
        }
        self.tick += 1;
        self.by_use.insert(self.tick, key);
        self.entries.insert(key, (self.tick, weight, value));
        self.held_bytes += weight;
        assert!(
            self.held_bytes <= self.capacity_bytes,
            "the cache stays within its capacity"
        );
        debug_assert_eq!(self.entries.len(), self.by_use.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_most_recently_used_within_its_capacity() {
        let mut cache: Lru<(u64, u32), Vec<u8>> = Lru::new(3 * 4);
        for slot in 0..3 {
            cache.put((1, slot), vec![slot as u8; 4], 4);
        }
        assert_eq!(cache.get(&(1, 0)), Some(&vec![0u8; 4]));
        cache.put((1, 3), vec![3; 4], 4);
        assert_eq!(cache.get(&(1, 1)), None, "the least recently used went");
        assert!(cache.get(&(1, 0)).is_some() && cache.get(&(1, 3)).is_some());
        assert_eq!(cache.held_bytes(), 12);
        cache.put((2, 0), vec![0; 100], 100);
        assert_eq!(cache.get(&(2, 0)), None, "bigger than the cache");
    }
}
