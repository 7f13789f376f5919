//! The stripe journal: how a branch pool closes the RAID write hole.
//!
//! Stripes are never changed in place until their new contents are durable
//! in the journal. A commit writes every staged stripe's data units to the
//! journal file of every healthy branch and syncs them; only then are the
//! stripes (data, mirrors, parity) written home. A crash during the writes
//! home leaves stripes whose parity disagrees with their data, but the
//! journal holds what they should be, and opening the pool writes them again
//! before anything reads them. So no stripe is ever rebuilt from parity that
//! does not match its data, even when a branch is lost in the same crash.
//!
//! One journal is one buffer written at offset 0 of the journal file:
//!
//! ```text
//! header (HEADER_BYTES)
//!   0  magic        8  "GROVESJ1"
//!   8  sequence     8  u64 LE, one more for every commit
//!  16  stripes      4  u32 LE, records that follow
//!  20  unit_bytes   4  u32 LE, the stripe unit
//!  24  data_units   4  u32 LE, data units per stripe
//!  28  records_crc  4  crc32c of every record byte
//!  32  header_crc   4  crc32c of bytes 0..32
//! records, from HEADER_BYTES, each RECORD_PREFIX_BYTES + data_units * unit_bytes
//!   0  stripe       8  u64 LE, in increasing order
//!   8  data         the stripe's data units, in stripe order
//! ```
//!
//! A journal is replayed only if its header and every record check out; a
//! torn one was never synced, so its stripes were never written home and
//! nothing depends on it. A journal with no records marks the last one as
//! replayed.

use std::collections::BTreeMap;

/// Bytes before the first record (one 4 KiB sector-aligned block).
pub const HEADER_BYTES: usize = 4096;
/// Bytes of a record before its data.
pub const RECORD_PREFIX_BYTES: usize = 8;

const MAGIC: &[u8; 8] = b"GROVESJ1";
const SEQUENCE_AT: usize = 8;
const STRIPES_AT: usize = SEQUENCE_AT + 8;
const UNIT_BYTES_AT: usize = STRIPES_AT + 4;
const DATA_UNITS_AT: usize = UNIT_BYTES_AT + 4;
const RECORDS_CRC_AT: usize = DATA_UNITS_AT + 4;
const HEADER_CRC_AT: usize = RECORDS_CRC_AT + 4;
const HEADER_USED_BYTES: usize = HEADER_CRC_AT + 4;

/// A decoded journal: the stripes it holds, each with its data units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Journal {
    pub sequence: u64,
    pub stripes: BTreeMap<u64, Vec<u8>>,
}

/// Why a journal buffer is not one to replay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    #[error("no stripe journal (magic missing)")]
    NoMagic,
    #[error("stripe journal header checksum mismatch")]
    HeaderChecksum,
    #[error(
        "stripe journal for a {found_unit}-byte unit and {found_k} data units, not {unit} and {k}"
    )]
    Shape {
        found_unit: usize,
        found_k: usize,
        unit: usize,
        k: usize,
    },
    #[error("stripe journal is shorter than its {0} records")]
    Truncated(u32),
    #[error("stripe journal records checksum mismatch (a commit torn before its sync)")]
    RecordsChecksum,
    #[error("stripe journal records out of order at stripe {0}")]
    Order(u64),
}

/// Bytes of one record with these stripe dimensions.
pub fn record_bytes(unit_bytes: usize, data_units: usize) -> usize {
    RECORD_PREFIX_BYTES + unit_bytes * data_units
}

/// Encodes a journal of `stripes` (each `unit_bytes * data_units` long).
pub fn encode(
    sequence: u64,
    unit_bytes: usize,
    data_units: usize,
    stripes: &BTreeMap<u64, Vec<u8>>,
) -> Vec<u8> {
    let stripe_bytes = unit_bytes * data_units;
    let mut out = vec![0u8; HEADER_BYTES + stripes.len() * record_bytes(unit_bytes, data_units)];
    let mut at = HEADER_BYTES;
    for (&stripe, data) in stripes {
        assert_eq!(data.len(), stripe_bytes, "a staged stripe is whole");
        out[at..at + 8].copy_from_slice(&stripe.to_le_bytes());
        out[at + RECORD_PREFIX_BYTES..at + RECORD_PREFIX_BYTES + stripe_bytes]
            .copy_from_slice(data);
        at += RECORD_PREFIX_BYTES + stripe_bytes;
    }
    let records_crc = crc32c::crc32c(&out[HEADER_BYTES..]);
    out[..8].copy_from_slice(MAGIC);
    out[SEQUENCE_AT..SEQUENCE_AT + 8].copy_from_slice(&sequence.to_le_bytes());
    let count = u32::try_from(stripes.len()).expect("staged stripes are bounded");
    out[STRIPES_AT..STRIPES_AT + 4].copy_from_slice(&count.to_le_bytes());
    out[UNIT_BYTES_AT..UNIT_BYTES_AT + 4].copy_from_slice(&(unit_bytes as u32).to_le_bytes());
    out[DATA_UNITS_AT..DATA_UNITS_AT + 4].copy_from_slice(&(data_units as u32).to_le_bytes());
    out[RECORDS_CRC_AT..RECORDS_CRC_AT + 4].copy_from_slice(&records_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&out[..HEADER_CRC_AT]);
    out[HEADER_CRC_AT..HEADER_USED_BYTES].copy_from_slice(&header_crc.to_le_bytes());
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Decodes the header only: the sequence and how many bytes the whole
/// journal takes, so the caller reads no more than that.
pub fn decode_header(
    header: &[u8],
    unit_bytes: usize,
    data_units: usize,
) -> Result<(u64, usize), JournalError> {
    if header.len() < HEADER_USED_BYTES || &header[..8] != MAGIC {
        return Err(JournalError::NoMagic);
    }
    if crc32c::crc32c(&header[..HEADER_CRC_AT]) != u32_at(header, HEADER_CRC_AT) {
        return Err(JournalError::HeaderChecksum);
    }
    let found_unit = u32_at(header, UNIT_BYTES_AT) as usize;
    let found_k = u32_at(header, DATA_UNITS_AT) as usize;
    if (found_unit, found_k) != (unit_bytes, data_units) {
        return Err(JournalError::Shape {
            found_unit,
            found_k,
            unit: unit_bytes,
            k: data_units,
        });
    }
    let count = u32_at(header, STRIPES_AT);
    let total = (count as usize)
        .checked_mul(record_bytes(unit_bytes, data_units))
        .and_then(|records| records.checked_add(HEADER_BYTES))
        .ok_or(JournalError::Truncated(count))?;
    Ok((u64_at(header, SEQUENCE_AT), total))
}

/// Decodes a whole journal; never panics on any input.
pub fn decode(bytes: &[u8], unit_bytes: usize, data_units: usize) -> Result<Journal, JournalError> {
    let (sequence, total) = decode_header(bytes, unit_bytes, data_units)?;
    let count = u32_at(bytes, STRIPES_AT);
    if bytes.len() < total {
        return Err(JournalError::Truncated(count));
    }
    if crc32c::crc32c(&bytes[HEADER_BYTES..total]) != u32_at(bytes, RECORDS_CRC_AT) {
        return Err(JournalError::RecordsChecksum);
    }
    let record = record_bytes(unit_bytes, data_units);
    let mut stripes = BTreeMap::new();
    let mut previous: Option<u64> = None;
    for chunk in bytes[HEADER_BYTES..total].chunks_exact(record) {
        let stripe = u64_at(chunk, 0);
        if previous.is_some_and(|p| p >= stripe) {
            return Err(JournalError::Order(stripe));
        }
        previous = Some(stripe);
        stripes.insert(stripe, chunk[RECORD_PREFIX_BYTES..].to_vec());
    }
    Ok(Journal { sequence, stripes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BTreeMap<u64, Vec<u8>> {
        let mut stripes = BTreeMap::new();
        stripes.insert(3, vec![7u8; 1024]);
        stripes.insert(9, (0..1024).map(|i| i as u8).collect());
        stripes
    }

    #[test]
    fn a_journal_round_trips() {
        let bytes = encode(42, 512, 2, &sample());
        let journal = decode(&bytes, 512, 2).unwrap();
        assert_eq!(journal.sequence, 42);
        assert_eq!(journal.stripes, sample());
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_refused() {
        let bytes = encode(5, 512, 2, &sample());
        for at in (0..HEADER_USED_BYTES).chain(HEADER_BYTES..bytes.len()) {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(decode(&bad, 512, 2).is_err(), "flip at {at} accepted");
        }
        for cut in [HEADER_BYTES, HEADER_BYTES + 10, bytes.len() - 1] {
            assert!(
                decode(&bytes[..cut], 512, 2).is_err(),
                "cut at {cut} accepted"
            );
        }
        assert!(decode(&[], 512, 2).is_err());
        assert!(matches!(
            decode(&bytes, 1024, 1),
            Err(JournalError::Shape { .. })
        ));
    }

    #[test]
    fn an_empty_journal_holds_no_stripes() {
        let bytes = encode(8, 4096, 3, &BTreeMap::new());
        assert_eq!(bytes.len(), HEADER_BYTES);
        let journal = decode(&bytes, 4096, 3).unwrap();
        assert!(journal.stripes.is_empty());
        assert_eq!(journal.sequence, 8);
    }

    proptest::proptest! {
        /// Any bytes, and any header whose checksums are made to match
        /// (a stripe count up to u32::MAX included), decode to a journal or
        /// an error: never a panic, never a huge allocation.
        #[test]
        fn any_bytes_decode_without_panicking(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..9000),
            count in proptest::prelude::any::<u32>(),
        ) {
            let _ = decode(&bytes, 512, 2);
            let mut forged = encode(1, 512, 2, &sample());
            forged[STRIPES_AT..STRIPES_AT + 4].copy_from_slice(&count.to_le_bytes());
            let crc = crc32c::crc32c(&forged[..HEADER_CRC_AT]);
            forged[HEADER_CRC_AT..HEADER_USED_BYTES].copy_from_slice(&crc.to_le_bytes());
            if count != 2 {
                proptest::prop_assert!(decode(&forged, 512, 2).is_err());
            }
        }
    }
}
