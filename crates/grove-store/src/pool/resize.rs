//! Resizing a volume, and the guard against shrinking away data by mistake.
//!
//! Shrinking drops every byte past the new end, and a later growth reads
//! them back as zeros. `lvreduce` and `qemu-img resize --shrink` make the
//! user say so; `Shrink::KeepData` does the same here: a smaller size is
//! refused with how much mapped data lies past it.

use super::{
    commit_locked, ensure_changes_allowed, read_only_error, validate_volume_size,
    volume_info_off_lock, Pool, VolumeInfo,
};
use crate::error::{Error, ErrorKind, Result};
use crate::state::State;
use crate::types::VolumeId;

/// Whether a resize to a smaller size may drop the data past the new end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shrink {
    /// Refuse to shrink a volume (growing is always allowed).
    KeepData,
    /// Shrink, dropping whatever lies past the new end.
    DropData,
}

impl Pool {
    /// Resizes a writable volume, dropping data past a smaller size.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<VolumeInfo> {
        self.resize_volume_with(name, size_bytes, Shrink::DropData)
    }

    /// Resizes a writable volume; with `Shrink::KeepData` a smaller size is
    /// refused, naming the mapped bytes it would drop. The check and the
    /// resize share one hold of the state lock, so no write slips between.
    pub fn resize_volume_with(
        &self,
        name: &str,
        size_bytes: u64,
        shrink: Shrink,
    ) -> Result<VolumeInfo> {
        validate_volume_size(size_bytes)?;
        let mut state = self.state();
        ensure_changes_allowed(&state)?;
        let record = state.volume_by_name(name)?.clone();
        if !record.kind.is_writable() {
            return Err(read_only_error(&record));
        }
        if shrink == Shrink::KeepData && size_bytes < record.size_bytes {
            let dropped = mapped_bytes_past(&mut state, record.id, size_bytes)?;
            return Err(shrink_refused(name, record.size_bytes, size_bytes, dropped));
        }
        state.resize_volume(record.id, size_bytes)?;
        commit_locked(&self.inner, &mut state)?;
        volume_info_off_lock(&self.inner, state, record.id)
    }
}

/// Mapped bytes of a volume from `offset` to its end: what shrinking to
/// `offset` drops.
fn mapped_bytes_past(state: &mut State, id: VolumeId, offset: u64) -> Result<u64> {
    let record = state.live_record(id).clone();
    let block_bytes = state.geometry().block_bytes();
    let end = state.geometry().blocks_for(record.size_bytes);
    let mut extents = Vec::new();
    state.mapped_blocks(
        record.root,
        record.height,
        offset / block_bytes,
        end,
        &mut extents,
    )?;
    let dropped = extents
        .iter()
        .map(|&(first, count)| {
            let start = (first * block_bytes).max(offset);
            let stop = ((first + count) * block_bytes).min(record.size_bytes);
            stop.saturating_sub(start)
        })
        .sum();
    Ok(dropped)
}

fn shrink_refused(name: &str, from: u64, to: u64, dropped: u64) -> Error {
    let what = if dropped == 0 {
        "no mapped data, but shrinking is not undone by growing back".to_string()
    } else {
        format!("{} of data that shrinking drops", bytes_text(dropped))
    };
    Error::new(
        ErrorKind::InvalidArgument,
        format!(
            "{name:?} would shrink from {} to {}: past the new end it holds {what}",
            bytes_text(from),
            bytes_text(to)
        ),
    )
}

/// Bytes in binary units with one decimal, as the command line prints them.
fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
