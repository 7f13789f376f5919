//! Pure decisions of the file operations that need no FUSE session:
//! SEEK_DATA and SEEK_HOLE over a volume's mapped extents, and what a
//! fallocate mode asks of a fixed-size volume.

/// lseek's whence for the next byte of data at or after the offset.
pub const SEEK_DATA: i32 = 3;
/// lseek's whence for the next hole at or after the offset.
pub const SEEK_HOLE: i32 = 4;

/// fallocate mode bits (linux/falloc.h) that a volume file understands.
pub const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
pub const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
pub const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// Why a seek found nothing: past the end, or no data after the offset.
#[derive(Debug, PartialEq, Eq)]
pub enum SeekError {
    /// ENXIO: the offset is at or past the end, or there is no more data.
    NoSuchOffset,
    /// EINVAL: a whence other than SEEK_DATA or SEEK_HOLE.
    InvalidWhence,
}

/// Where SEEK_DATA or SEEK_HOLE lands from `offset` in a file of
/// `size_bytes` whose data is `extents` ((offset, length), sorted, as
/// `Volume::mapped_extents_in` returns them; they may reach past either
/// end of the window). The end of the file counts as a hole, as lseek(2)
/// says.
pub fn seek_data_hole(
    whence: i32,
    offset: i64,
    size_bytes: u64,
    extents: &[(u64, u64)],
) -> Result<u64, SeekError> {
    let Ok(offset) = u64::try_from(offset) else {
        return Err(SeekError::NoSuchOffset);
    };
    if offset >= size_bytes {
        return Err(SeekError::NoSuchOffset);
    }
    match whence {
        SEEK_DATA => extents
            .iter()
            .find(|(start, len)| start + len > offset)
            .map(|(start, _)| (*start).max(offset))
            .filter(|position| *position < size_bytes)
            .ok_or(SeekError::NoSuchOffset),
        SEEK_HOLE => {
            let mut position = offset;
            for (start, len) in extents {
                if *start > position {
                    break;
                }
                position = position.max(start + len);
            }
            Ok(position.min(size_bytes))
        }
        _ => Err(SeekError::InvalidWhence),
    }
}

/// What a fallocate call does to a volume.
#[derive(Debug, PartialEq, Eq)]
pub enum Fallocate {
    /// Nothing to do: space for a thin volume is given on write.
    Nothing,
    /// Unmap [offset, offset + len): reads as zeros afterwards.
    Discard { offset: u64, len: u64 },
    /// The mode would grow the file or is not one a volume supports.
    Unsupported,
}

/// Decides a fallocate on a file of `size_bytes`. A volume's size is
/// fixed, so only modes that keep it are done; punching a hole and zeroing
/// a range both unmap, which reads back as zeros and frees the space.
pub fn fallocate_action(mode: i32, offset: u64, len: u64, size_bytes: u64) -> Fallocate {
    let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
    if mode & !known != 0 {
        return Fallocate::Unsupported;
    }
    let end = offset.saturating_add(len);
    let keep_size = mode & FALLOC_FL_KEEP_SIZE != 0;
    if !keep_size && end > size_bytes {
        return Fallocate::Unsupported;
    }
    if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) == 0 {
        return Fallocate::Nothing;
    }
    let start = offset.min(size_bytes);
    let end = end.min(size_bytes);
    if start == end {
        return Fallocate::Nothing;
    }
    Fallocate::Discard {
        offset: start,
        len: end - start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXTENTS: &[(u64, u64)] = &[(4096, 8192), (16384, 4096)];

    #[test]
    fn seek_data_finds_the_next_extent_or_stays_inside_one() {
        assert_eq!(seek_data_hole(SEEK_DATA, 0, 65536, EXTENTS), Ok(4096));
        assert_eq!(seek_data_hole(SEEK_DATA, 5000, 65536, EXTENTS), Ok(5000));
        assert_eq!(seek_data_hole(SEEK_DATA, 12288, 65536, EXTENTS), Ok(16384));
        assert_eq!(
            seek_data_hole(SEEK_DATA, 20480, 65536, EXTENTS),
            Err(SeekError::NoSuchOffset)
        );
    }

    #[test]
    fn seek_hole_skips_adjacent_extents_and_ends_at_the_size() {
        assert_eq!(seek_data_hole(SEEK_HOLE, 0, 65536, EXTENTS), Ok(0));
        assert_eq!(seek_data_hole(SEEK_HOLE, 4096, 65536, EXTENTS), Ok(12288));
        let adjacent = &[(0, 4096), (4096, 4096)];
        assert_eq!(seek_data_hole(SEEK_HOLE, 0, 65536, adjacent), Ok(8192));
        assert_eq!(seek_data_hole(SEEK_HOLE, 0, 6000, adjacent), Ok(6000));
    }

    #[test]
    fn seek_past_the_end_or_with_another_whence_fails() {
        assert_eq!(
            seek_data_hole(SEEK_HOLE, 65536, 65536, EXTENTS),
            Err(SeekError::NoSuchOffset)
        );
        assert_eq!(
            seek_data_hole(SEEK_DATA, -1, 65536, EXTENTS),
            Err(SeekError::NoSuchOffset)
        );
        assert_eq!(
            seek_data_hole(0, 0, 65536, EXTENTS),
            Err(SeekError::InvalidWhence)
        );
    }

    #[test]
    fn fallocate_modes() {
        let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
        assert_eq!(
            fallocate_action(punch, 4096, 8192, 65536),
            Fallocate::Discard {
                offset: 4096,
                len: 8192
            }
        );
        assert_eq!(
            fallocate_action(punch, 61440, 8192, 65536),
            Fallocate::Discard {
                offset: 61440,
                len: 4096
            }
        );
        assert_eq!(fallocate_action(0, 0, 65536, 65536), Fallocate::Nothing);
        assert_eq!(fallocate_action(0, 0, 65537, 65536), Fallocate::Unsupported);
        assert_eq!(
            fallocate_action(FALLOC_FL_ZERO_RANGE, 0, 4096, 65536),
            Fallocate::Discard {
                offset: 0,
                len: 4096
            }
        );
        // FALLOC_FL_COLLAPSE_RANGE changes the size.
        assert_eq!(
            fallocate_action(0x08, 0, 4096, 65536),
            Fallocate::Unsupported
        );
    }
}
