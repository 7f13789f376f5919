//! The catalog: the archive's whole state at one commit, stored once per
//! generation as `catalog-<generation:016x>`, create-only. The newest
//! generation is the archive; a writer commits by creating the next one,
//! so two writers racing cannot both commit (the gateway's conditional
//! update cannot be trusted, its create-only put can).
//!
//! ```text
//! "grove-archive catalog <version> <crc32c of the JSON, 8 hex> <JSON bytes>\n"
//! JSON: the Catalog below
//! ```

use serde::{Deserialize, Serialize};

pub const MAGIC: &str = "grove-archive catalog";
pub const VERSION: u32 = 2;
/// The longest first line a decoder reads.
const HEADER_LINE_MAX_BYTES: usize = 100;

/// One snapshot in the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedSnapshot {
    /// Its place in push order, from 1; never reused.
    pub seq: u64,
    pub name: String,
    /// The pool's GUID of the snapshot, 32 hex digits.
    pub guid: String,
    pub created_unix_secs: u64,
    /// The pool's birth generation when it was made (orders pushes).
    pub created_generation: u64,
    /// Retention rank (0: taken by hand, kept until released).
    pub rank: u8,
    pub size_bytes: u64,
    /// `grove hash` of the snapshot when pushed.
    pub hash: String,
    /// Its index root object.
    pub index: String,
    /// The root object's bytes.
    pub index_bytes: u64,
    pub pushed_unix_secs: u64,
    /// Bytes of new versions this push stored.
    pub stored_bytes: u64,
    /// Pushed by hand (rank 0) and since released: the next expiry drops it.
    #[serde(default)]
    pub released: bool,
}

/// One pack in the archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackRecord {
    pub id: u64,
    /// The snapshot expected to need this pack's versions longest: the
    /// pack expires with it.
    pub owner_seq: u64,
    /// Every snapshot that references the pack lies in
    /// `first_seq..=last_seq`: once none there is kept, it goes.
    pub first_seq: u64,
    pub last_seq: u64,
    pub slots: u32,
    pub object_bytes: u64,
}

/// An object of index pages (pages-<id>), deleted whole once no kept
/// snapshot lies in its reference range; pages are never copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PagesRecord {
    pub id: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub object_bytes: u64,
}

/// A deleted pack whose addresses kept snapshots still use: its forward
/// table says where their versions went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardRecord {
    /// The deleted pack's id: the addresses' pack.
    pub origin: u64,
    /// The deleted pack's reference range: once no kept snapshot lies in
    /// it, nothing uses these addresses.
    pub first_seq: u64,
    pub last_seq: u64,
    /// The table's object (forward-<origin>-<n>).
    pub object: String,
    pub object_bytes: u64,
    /// The packs its entries point into (their ranges grow with it).
    pub targets: Vec<u64>,
}

/// A push that stopped part way: the packs it stored are listed (and
/// referenced) here, so that the next push of the same snapshot goes on
/// after them and sends again at most the pack it was writing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialPush {
    pub seq: u64,
    pub guid: String,
    /// The packs stored so far, whose block tables say what they hold.
    pub packs: Vec<u64>,
    /// Changed blocks below this one are stored.
    pub next_block: u64,
    /// The page objects stored so far.
    #[serde(default)]
    pub pages: Vec<u64>,
    /// The pages of the root's first segments, those completed so far
    /// (page object, offset, length; None: all holes).
    #[serde(default)]
    pub pages_done: Vec<Option<(u64, u32, u32)>>,
    /// How many of those pages, and of the base's kept for the rest,
    /// address each pack.
    #[serde(default)]
    pub pack_counts: Vec<(u64, u32)>,
}

/// What the archive has moved, since it was made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Pack bytes written by pushes.
    pub pushed_bytes: u64,
    /// Pack bytes written by expiry, copying what must now live longer.
    pub copied_bytes: u64,
    /// Index bytes written: roots, pages and forward tables.
    pub index_bytes: u64,
    /// Pack bytes deleted.
    pub deleted_bytes: u64,
}

/// The archive's state at one commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub volume: String,
    /// Random, fixed when the archive is made: an archive deleted and made
    /// again at the same place is another archive (readers' caches key
    /// versions by it, as their addresses start over).
    #[serde(default)]
    pub archive_id: String,
    pub generation: u64,
    pub block_bytes: u32,
    /// Blocks per index segment, fixed when the archive is made.
    pub segment_blocks: u32,
    pub next_pack: u64,
    pub next_seq: u64,
    /// In push order.
    pub snapshots: Vec<ArchivedSnapshot>,
    /// By id.
    pub packs: Vec<PackRecord>,
    /// Page objects, by id (ids come from the packs' counter).
    pub pages: Vec<PagesRecord>,
    /// Deleted packs' forward tables, by origin.
    pub forwards: Vec<ForwardRecord>,
    pub partial: Option<PartialPush>,
    pub totals: Totals,
}

impl Catalog {
    /// An empty catalog before its first commit (generation 0: the first
    /// commit is 1), for an archive of `volume` named `archive_id`.
    pub fn empty(
        volume: &str,
        archive_id: String,
        block_bytes: u32,
        segment_blocks: u32,
    ) -> Catalog {
        Catalog {
            volume: volume.to_string(),
            archive_id,
            generation: 0,
            block_bytes,
            segment_blocks,
            next_pack: 1,
            next_seq: 1,
            snapshots: Vec::new(),
            packs: Vec::new(),
            pages: Vec::new(),
            forwards: Vec::new(),
            partial: None,
            totals: Totals::default(),
        }
    }
}

/// The object name of generation `generation`.
pub fn object_name(generation: u64) -> String {
    format!("catalog-{generation:016x}")
}

/// The generation an object name is the catalog of, if it is one.
pub fn generation_of(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("catalog-")?;
    (hex.len() == 16).then(|| u64::from_str_radix(hex, 16).ok())?
}

pub fn encode(catalog: &Catalog) -> Vec<u8> {
    let json = serde_json::to_vec(catalog).expect("a catalog serializes");
    let mut out = format!(
        "{MAGIC} {VERSION} {:08x} {}\n",
        crc32c::crc32c(&json),
        json.len()
    )
    .into_bytes();
    out.extend_from_slice(&json);
    out
}

/// Decodes the catalog of generation `generation`.
pub fn decode(bytes: &[u8], generation: u64) -> Result<Catalog, String> {
    let line_end = bytes
        .iter()
        .take(HEADER_LINE_MAX_BYTES)
        .position(|&b| b == b'\n')
        .ok_or("not a grove archive catalog (no header line)")?;
    let line =
        std::str::from_utf8(&bytes[..line_end]).map_err(|_| "a header line that is not text")?;
    let rest = line
        .strip_prefix(MAGIC)
        .ok_or("not a grove archive catalog (bad magic)")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let [version, crc, len] = fields[..] else {
        return Err(format!("a malformed header line {line:?}"));
    };
    if version != VERSION.to_string() {
        return Err(format!(
            "catalog format version {version}, this grove reads {VERSION}"
        ));
    }
    let json = &bytes[line_end + 1..];
    if len.parse::<usize>().ok() != Some(json.len()) {
        return Err(format!(
            "{} bytes where the header says {len} (a truncated catalog)",
            json.len()
        ));
    }
    if u32::from_str_radix(crc, 16).ok() != Some(crc32c::crc32c(json)) {
        return Err("the catalog fails its checksum".into());
    }
    let catalog: Catalog =
        serde_json::from_slice(json).map_err(|e| format!("a malformed catalog: {e}"))?;
    if catalog.generation != generation {
        return Err(format!(
            "holds generation {}, stored as {generation}",
            catalog.generation
        ));
    }
    Ok(catalog)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let catalog = Catalog {
            volume: "vm".into(),
            archive_id: "00112233445566778899aabbccddeeff".into(),
            generation: 4,
            block_bytes: 4096,
            segment_blocks: 16384,
            next_pack: 2,
            next_seq: 3,
            snapshots: Vec::new(),
            packs: vec![PackRecord {
                id: 1,
                owner_seq: 1,
                first_seq: 1,
                last_seq: 2,
                slots: 9,
                object_bytes: 100,
            }],
            pages: Vec::new(),
            forwards: Vec::new(),
            partial: None,
            totals: Totals::default(),
        };
        let bytes = encode(&catalog);
        assert_eq!(decode(&bytes, 4).unwrap(), catalog);
        assert!(decode(&bytes, 5).is_err());
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], 4).is_err(), "truncated at {len}");
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x01;
            assert!(decode(&bad, 4).is_err(), "flip at {at}");
        }
        assert_eq!(generation_of(&object_name(77)), Some(77));
        assert_eq!(generation_of("catalog-zz"), None);
    }
}
