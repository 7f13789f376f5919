//! Where a stored stream goes on: each part of a stream kept in object
//! storage carries a cursor naming the stream (a fingerprint of the
//! snapshots it carries) and the [`Position`] after its last frame, so an
//! interrupted upload sends only what is not stored, and a receive starts
//! again at the part holding its progress. The one byte layout of a
//! position; resume tokens (`token.rs`) name a receiver's place by the
//! snapshots' GUIDs instead, for a sender that stored nothing.
//!
//! Cursor bytes:
//!   0   16  stream fingerprint
//!   16  4   section (little-endian)
//!   20  1   begun: 0 before the section's Begin frame, 1 after
//!   21  8   offset in the section's target (little-endian)

use crate::format::Position;

/// Bytes of an encoded cursor.
pub const CURSOR_BYTES: usize = 29;

/// A stored part's cursor: which stream, and where it goes on after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub fingerprint: [u8; 16],
    pub at: Position,
}

impl Cursor {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CURSOR_BYTES);
        out.extend_from_slice(&self.fingerprint);
        out.extend_from_slice(&self.at.section.to_le_bytes());
        out.push(u8::from(self.at.begun));
        out.extend_from_slice(&self.at.offset.to_le_bytes());
        debug_assert_eq!(out.len(), CURSOR_BYTES);
        out
    }

    /// None for bytes that are not a cursor (wrong length, a begun flag
    /// other than 0 or 1).
    pub fn decode(bytes: &[u8]) -> Option<Cursor> {
        if bytes.len() != CURSOR_BYTES || bytes[20] > 1 {
            return None;
        }
        Some(Cursor {
            fingerprint: bytes[..16].try_into().ok()?,
            at: Position {
                section: u32::from_le_bytes(bytes[16..20].try_into().ok()?),
                begun: bytes[20] == 1,
                offset: u64::from_le_bytes(bytes[21..29].try_into().ok()?),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_decodes_as_encoded_and_nothing_else_decodes() {
        let cursor = Cursor {
            fingerprint: [7; 16],
            at: Position {
                section: 3,
                begun: true,
                offset: 1 << 40,
            },
        };
        let bytes = cursor.encode();
        assert_eq!(Cursor::decode(&bytes), Some(cursor));
        assert_eq!(Cursor::decode(&bytes[..CURSOR_BYTES - 1]), None);
        let mut flag = bytes.clone();
        flag[20] = 2;
        assert_eq!(Cursor::decode(&flag), None);
    }
}
