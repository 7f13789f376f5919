//! The content digest: one value per volume content, whatever the pool,
//! its block size or how the content is stored (a hole and written zeros
//! digest the same).
//!
//! The content is cut into 4 KiB units. Each unit that is not all zeros
//! contributes BLAKE3, keyed with a key derived from `UNIT_CONTEXT`, of
//! (unit ‖ offset), read as eight 64-bit lanes; the
//! digest is the lane-wise sum of the contributions (wrapping), finished
//! by hashing the lanes with the volume size. A sum can be updated: taking
//! away a unit's old contribution and adding its new one gives the digest
//! after a change without reading anything else, so an incremental stream
//! and its receiver verify the whole target at the cost of the delta.
//! (Sums like this are "incremental hashes", Bellare and Micciancio; with
//! 512 bits of lanes, finding two contents with the same sum takes far
//! more work than any accident.)

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::format::UNIT_BYTES;

const LANES: usize = 8;
/// Domain separation for the per-unit hash and the final one.
const UNIT_CONTEXT: &str = "grove content digest v2 unit";
const FINISH_CONTEXT: &str = "grove content digest v2";
/// Which definition of the digest a stored state belongs to: a state of
/// another one is never mixed into a running digest.
const DIGEST_VERSION: u32 = 2;
/// Bytes a stored digest state takes (version, lanes, then the size).
const STATE_BYTES: usize = 4 + LANES * 8 + 8;

/// The per-unit key, derived once: deriving it for every unit cost as
/// much as hashing the unit.
static UNIT_KEY: std::sync::LazyLock<[u8; 32]> =
    std::sync::LazyLock::new(|| blake3::derive_key(UNIT_CONTEXT, &[]));

/// A running content digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ContentDigest {
    lanes: [u64; LANES],
}

impl ContentDigest {
    /// The digest of all zeros (an empty volume).
    pub fn empty() -> Self {
        ContentDigest::default()
    }

    /// Adds the units of `data`, which starts at unit-aligned `offset`.
    pub fn add(&mut self, offset: u64, data: &[u8]) {
        self.apply(offset, data, u64::wrapping_add);
    }

    /// Takes away the units of `data`, which starts at unit-aligned
    /// `offset`: what `add` of the same bytes added.
    pub fn remove(&mut self, offset: u64, data: &[u8]) {
        self.apply(offset, data, u64::wrapping_sub);
    }

    fn apply(&mut self, offset: u64, data: &[u8], op: fn(u64, u64) -> u64) {
        assert_eq!(offset % UNIT_BYTES, 0, "digest units are aligned");
        for (i, unit) in data.chunks(UNIT_BYTES as usize).enumerate() {
            if is_zero(unit) {
                continue;
            }
            let lanes = unit_lanes(offset + i as u64 * UNIT_BYTES, unit);
            for (lane, add) in self.lanes.iter_mut().zip(lanes) {
                *lane = op(*lane, add);
            }
        }
    }

    /// The digest of a volume of `size_bytes` whose units were added.
    pub fn finish(&self, size_bytes: u64) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new_derive_key(FINISH_CONTEXT);
        hasher.update(&size_bytes.to_le_bytes());
        for lane in self.lanes {
            hasher.update(&lane.to_le_bytes());
        }
        *hasher.finalize().as_bytes()
    }

    fn to_bytes(self, size_bytes: u64) -> [u8; STATE_BYTES] {
        let mut out = [0u8; STATE_BYTES];
        out[..4].copy_from_slice(&DIGEST_VERSION.to_le_bytes());
        for (i, lane) in self.lanes.iter().enumerate() {
            out[4 + i * 8..4 + i * 8 + 8].copy_from_slice(&lane.to_le_bytes());
        }
        out[4 + LANES * 8..].copy_from_slice(&size_bytes.to_le_bytes());
        out
    }

    /// None for anything but a state of this digest's version.
    fn from_bytes(bytes: &[u8]) -> Option<(ContentDigest, u64)> {
        if bytes.len() != STATE_BYTES
            || u32::from_le_bytes(bytes[..4].try_into().ok()?) != DIGEST_VERSION
        {
            return None;
        }
        let mut lanes = [0u64; LANES];
        for (i, lane) in lanes.iter_mut().enumerate() {
            *lane = u64::from_le_bytes(bytes[4 + i * 8..4 + i * 8 + 8].try_into().ok()?);
        }
        let size = u64::from_le_bytes(bytes[4 + LANES * 8..].try_into().ok()?);
        Some((ContentDigest { lanes }, size))
    }
}

/// A unit shorter than UNIT_BYTES (at a volume's end) counts as if padded
/// with zeros, which is what lies past the end. The unit comes first, so
/// its four 1 KiB chunks hash side by side (SIMD), the offset after them.
fn unit_lanes(offset: u64, unit: &[u8]) -> [u64; LANES] {
    let mut hasher = blake3::Hasher::new_keyed(&UNIT_KEY);
    hasher.update(unit);
    if unit.len() < UNIT_BYTES as usize {
        hasher.update(&[0u8; UNIT_BYTES as usize][unit.len()..]);
    }
    hasher.update(&offset.to_le_bytes());
    let mut out = [0u8; LANES * 8];
    hasher.finalize_xof().fill(&mut out);
    std::array::from_fn(|i| u64::from_le_bytes(out[i * 8..i * 8 + 8].try_into().expect("8")))
}

pub fn is_zero(bytes: &[u8]) -> bool {
    // Wide strides let the compiler vectorize the test.
    let (chunks, rest) = bytes.as_chunks::<64>();
    chunks
        .iter()
        .all(|c| c.iter().fold(0u8, |acc, b| acc | b) == 0)
        && rest.iter().all(|&b| b == 0)
}

/// 16 bytes that name `bytes` (a mix-up guard, not a secret).
pub fn fingerprint(bytes: &[u8]) -> [u8; 16] {
    blake3::hash(bytes).as_bytes()[..16]
        .try_into()
        .expect("16 bytes")
}

/// Digests of snapshots this pool has computed, by GUID, in
/// `POOL/grove.digests/`: a snapshot never changes, so its digest is
/// computed once, and the next incremental stream from it (sent or
/// received) costs only what changed. Only a cache: a missing or damaged
/// entry is computed again.
pub struct DigestCache {
    dir: PathBuf,
}

impl DigestCache {
    pub fn new(pool_dir: &Path) -> Self {
        DigestCache {
            dir: pool_dir.join("grove.digests"),
        }
    }

    fn path(&self, guid: &[u8; 16]) -> PathBuf {
        self.dir.join(hex::encode(guid))
    }

    /// None for a missing or damaged entry, or one of another digest
    /// version (computed again and replaced).
    pub fn get(&self, guid: &[u8; 16], size_bytes: u64) -> Option<ContentDigest> {
        let bytes = fs::read(self.path(guid)).ok()?;
        if bytes.len() != STATE_BYTES + 4 {
            return None;
        }
        let (state, crc) = bytes.split_at(STATE_BYTES);
        if crc32c::crc32c(state).to_le_bytes() != crc {
            return None;
        }
        let (digest, size) = ContentDigest::from_bytes(state)?;
        (size == size_bytes).then_some(digest)
    }

    /// Removes the entries of snapshots the pool no longer knows (removed,
    /// and their bookmark rolled off), and temporaries a crash left, so
    /// that years of rolling snapshots do not pile up entries. `known`
    /// is asked after the directory is listed: an entry put meanwhile was
    /// not listed, and one listed belongs to a GUID `known` still has.
    /// Best effort, as the cache is; returns how many entries went.
    pub fn forget_unknown(&self, known: impl FnOnce() -> HashSet<[u8; 16]>) -> usize {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let names: Vec<String> = entries
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        let known = known();
        let mut forgotten = 0;
        for name in names {
            let stale = match name.strip_suffix(".new") {
                Some(_) => true,
                None => match unhex(&name).ok().and_then(|b| <[u8; 16]>::try_from(b).ok()) {
                    Some(guid) => !known.contains(&guid),
                    // Not ours: leave it alone.
                    None => false,
                },
            };
            if stale && fs::remove_file(self.dir.join(&name)).is_ok() {
                forgotten += 1;
            }
        }
        forgotten
    }

    /// Best effort: a digest that cannot be kept is computed again later.
    pub fn put(&self, guid: &[u8; 16], size_bytes: u64, digest: &ContentDigest) {
        if let Err(e) = self.try_put(guid, size_bytes, digest) {
            tracing::warn!("cannot keep the content digest of a snapshot: {e:#}");
        }
    }

    fn try_put(&self, guid: &[u8; 16], size_bytes: u64, digest: &ContentDigest) -> Result<()> {
        fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let state = digest.to_bytes(size_bytes);
        let mut bytes = state.to_vec();
        bytes.extend_from_slice(&crc32c::crc32c(&state).to_le_bytes());
        let path = self.path(guid);
        let temporary = path.with_extension("new");
        let mut file = fs::File::create(&temporary)
            .with_context(|| format!("cannot create {}", temporary.display()))?;
        // Not synced: a cache entry lost or cut by a crash fails its
        // length or checksum and is computed again.
        file.write_all(&bytes)?;
        fs::rename(&temporary, &path)?;
        Ok(())
    }
}

/// Bytes of a running digest kept with a partial receive's progress.
pub fn encode_state(digest: &ContentDigest, progress_bytes: u64) -> String {
    hex::encode(digest.to_bytes(progress_bytes))
}

pub fn decode_state(text: &str) -> Result<(ContentDigest, u64)> {
    let bytes = unhex(text)?;
    match ContentDigest::from_bytes(&bytes) {
        Some(found) => Ok(found),
        None => bail!("a digest state of {} bytes", bytes.len()),
    }
}

/// Hex text as bytes; the one refusal every stored hex field gives.
pub fn unhex(text: &str) -> Result<Vec<u8>> {
    hex::decode(text).map_err(|_| anyhow::anyhow!("not hexadecimal"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume_digest(content: &[u8]) -> [u8; 32] {
        let mut digest = ContentDigest::empty();
        digest.add(0, content);
        digest.finish(content.len() as u64)
    }

    #[test]
    fn holes_and_zeros_digest_the_same_and_every_change_shows() {
        let mut content = vec![0u8; 64 * 1024];
        let empty = volume_digest(&content);
        assert_eq!(empty, ContentDigest::empty().finish(content.len() as u64));
        content[5000] = 1;
        let one = volume_digest(&content);
        assert_ne!(one, empty);
        // The same byte elsewhere (another unit) is another content.
        content[5000] = 0;
        content[9000] = 1;
        assert_ne!(volume_digest(&content), one);
        // The size is part of the content.
        let mut digest = ContentDigest::empty();
        digest.add(0, &content);
        assert_ne!(
            digest.finish(content.len() as u64 + 512),
            volume_digest(&content)
        );
    }

    #[test]
    fn an_update_gives_what_a_fresh_digest_gives() {
        let mut content: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        let mut running = ContentDigest::empty();
        running.add(0, &content);
        let changed_at = 12 * 4096;
        let old = content[changed_at..changed_at + 8192].to_vec();
        content[changed_at..changed_at + 8192].fill(0x5a);
        running.remove(changed_at as u64, &old);
        running.add(changed_at as u64, &content[changed_at..changed_at + 8192]);
        assert_eq!(
            running.finish(content.len() as u64),
            volume_digest(&content)
        );
    }

    #[test]
    fn a_short_last_unit_counts_as_padded() {
        let mut padded = vec![0u8; 8192];
        padded[4096..4096 + 512].fill(3);
        let mut short = ContentDigest::empty();
        short.add(0, &padded[..4096 + 512]);
        let mut full = ContentDigest::empty();
        full.add(0, &padded);
        assert_eq!(short, full);
    }

    #[test]
    fn the_cache_keeps_digests_and_ignores_damaged_ones() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DigestCache::new(dir.path());
        let mut digest = ContentDigest::empty();
        digest.add(0, &[1u8; 4096]);
        cache.put(&[1; 16], 8192, &digest);
        assert_eq!(cache.get(&[1; 16], 8192), Some(digest));
        assert_eq!(cache.get(&[1; 16], 4096), None, "another size");
        assert_eq!(cache.get(&[2; 16], 8192), None);
        let path = dir.path().join("grove.digests").join(hex::encode([1; 16]));
        let mut bytes = fs::read(&path).unwrap();
        bytes[9] ^= 1;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get(&[1; 16], 8192), None);

        // An entry of another digest version (checksum made to match) is
        // ignored, never mixed in.
        bytes[9] ^= 1;
        bytes[0] = 1;
        let end = bytes.len() - 4;
        let crc = crc32c::crc32c(&bytes[..end]).to_le_bytes();
        bytes[end..].copy_from_slice(&crc);
        fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get(&[1; 16], 8192), None);
    }

    #[test]
    fn forgetting_keeps_known_entries_and_what_is_not_the_cache_s() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DigestCache::new(dir.path());
        assert_eq!(cache.forget_unknown(HashSet::new), 0, "no directory yet");
        let digest = ContentDigest::empty();
        for guid in [[1; 16], [2; 16], [3; 16]] {
            cache.put(&guid, 4096, &digest);
        }
        let entries = dir.path().join("grove.digests");
        fs::write(
            entries.join(format!("{}.new", hex::encode([4; 16]))),
            b"cut",
        )
        .unwrap();
        fs::write(entries.join("README"), b"not an entry").unwrap();
        let known = || HashSet::from([[2; 16]]);
        assert_eq!(cache.forget_unknown(known), 3, "two entries, one temporary");
        assert_eq!(cache.get(&[1; 16], 4096), None);
        assert_eq!(cache.get(&[2; 16], 4096), Some(digest));
        assert_eq!(cache.get(&[3; 16], 4096), None);
        assert!(entries.join("README").exists());
        assert_eq!(fs::read_dir(&entries).unwrap().count(), 2);
    }
}
