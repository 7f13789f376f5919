//! Many writes handed over at once (`BlockDevice::write_each_at`): a
//! commit's images going home, a checkpoint step, a request's runs of
//! data. Each synchronous librados write waits for a round trip, so done
//! in turn they cost one round trip each; here neighbouring writes are
//! merged into one run, each run is split per object, and every piece
//! goes to the I/O threads at once: the batch costs about one round trip.
//! Each write's result is still its own: it succeeds only once every
//! piece holding its bytes was acknowledged by the OSDs.

use crate::device::{overflow, RadosDevice, Shared};
use crate::io_pool::Op;
use crate::layout;
use std::io;
use std::sync::Arc;

/// Writes that follow each other on the device, merged into one buffer.
struct Run {
    offset: u64,
    bytes: Vec<u8>,
    /// Which of the caller's writes it holds.
    members: Vec<usize>,
}

/// The writes at `indices` of `writes`, neighbours (one ending where the
/// next starts) merged, in offset order. Writes that overlap stay apart
/// (the caller promises none).
fn merge(writes: &[(u64, &[u8])], indices: &[usize]) -> Vec<Run> {
    let mut order = indices.to_vec();
    order.sort_by_key(|&i| writes[i].0);
    let mut runs: Vec<Run> = Vec::new();
    for i in order {
        let (offset, bytes) = writes[i];
        if let Some(last) = runs.last_mut() {
            if last.offset + last.bytes.len() as u64 == offset {
                last.bytes.extend_from_slice(bytes);
                last.members.push(i);
                continue;
            }
        }
        runs.push(Run {
            offset,
            bytes: bytes.to_vec(),
            members: vec![i],
        });
    }
    runs
}

fn error_copy(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

impl RadosDevice {
    /// See the module's comment.
    pub(crate) fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<io::Result<()>> {
        if let Err(e) = self.shared.fence.check() {
            return writes.iter().map(|_| Err(error_copy(&e))).collect();
        }
        let mut results: Vec<io::Result<()>> = writes
            .iter()
            .map(
                |(offset, bytes)| match offset.checked_add(bytes.len() as u64) {
                    Some(_) => Ok(()),
                    None => Err(overflow(*offset, bytes.len())),
                },
            )
            .collect();
        let valid: Vec<usize> = (0..writes.len()).filter(|&i| results[i].is_ok()).collect();
        for (member, result) in self.write_runs(merge(writes, &valid)) {
            results[member] = result;
        }
        results
    }

    /// Writes every run's pieces at once and grows the length; returns
    /// each member write's result, by its index in the caller's writes.
    fn write_runs(&self, runs: Vec<Run>) -> Vec<(usize, io::Result<()>)> {
        let object_size = self.shared.object_size;
        let mut ops: Vec<Op<io::Result<()>>> = Vec::new();
        let mut op_run: Vec<usize> = Vec::new();
        for (r, run) in runs.iter().enumerate() {
            let run_bytes: Arc<[u8]> = Arc::from(run.bytes.as_slice());
            for piece in layout::pieces(run.offset, run.bytes.len() as u64, object_size) {
                let shared: Arc<Shared> = Arc::clone(&self.shared);
                let bytes = Arc::clone(&run_bytes);
                ops.push(Box::new(move || {
                    let data = &bytes[piece.buf_offset..piece.buf_offset + piece.len];
                    Ok(shared.write_piece(piece, data))
                }));
                op_run.push(r);
            }
        }
        let mut run_result: Vec<io::Result<()>> = runs.iter().map(|_| Ok(())).collect();
        match self.run_ops(ops) {
            Ok(done) => {
                for (r, result) in op_run.into_iter().zip(done) {
                    if let (Err(e), true) = (result, run_result[r].is_ok()) {
                        run_result[r] = Err(e);
                    }
                }
            }
            Err(e) => run_result.iter_mut().for_each(|r| *r = Err(error_copy(&e))),
        }
        self.grow_after(&runs, &mut run_result);
        let mut out = Vec::new();
        for (run, result) in runs.iter().zip(run_result) {
            for &member in &run.members {
                out.push((member, result.as_ref().map(|_| ()).map_err(error_copy)));
            }
        }
        out
    }

    /// The length grown to the end of every run that landed; if that
    /// fails, those runs fail too (their bytes past the old length would
    /// not read back after a reopen).
    fn grow_after(&self, runs: &[Run], results: &mut [io::Result<()>]) {
        let end = runs
            .iter()
            .zip(results.iter())
            .filter(|(_, r)| r.is_ok())
            .map(|(run, _)| run.offset + run.bytes.len() as u64)
            .max();
        let Some(end) = end else { return };
        if let Err(e) = self.shared.grow_to(end) {
            results
                .iter_mut()
                .filter(|r| r.is_ok())
                .for_each(|r| *r = Err(error_copy(&e)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_merge_in_offset_order_and_gaps_stay_apart() {
        let a = [1u8; 4];
        let b = [2u8; 4];
        let c = [3u8; 4];
        let writes = [(8, &c[..]), (0, &a[..]), (4, &b[..]), (20, &a[..])];
        let runs = merge(&writes, &[0, 1, 2, 3]);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].offset, 0);
        assert_eq!(runs[0].bytes, [a, b, c].concat());
        assert_eq!(runs[0].members, vec![1, 2, 0]);
        assert_eq!((runs[1].offset, runs[1].members.clone()), (20, vec![3]));
    }
}
