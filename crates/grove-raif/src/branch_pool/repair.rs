//! Repairs of a branch pool while it is in use: a replacement branch
//! refilled from the others (rebuild), and every stripe checked and mended
//! (scrub). Both work in batches holding the gate, so that no commit
//! writes a stripe between their read and their write: a rebuild shares
//! it with client reads (it writes only the branch they never read), a
//! scrub holds it alone (it may rewrite what they read).
//!
//! Which copy of a unit is right is decided by its checksum (the sums a
//! commit writes beside the units), not by a vote: a mirror that agrees
//! with its sum wins over any number that do not, and a data unit that
//! fails its sum is rebuilt from parity and checked against the sum again.

use std::collections::BTreeMap;
use std::io;

use super::segment::{
    read_lock, unit_sum, write_lock, Health, Io, MemberDevices, Segment, SUM_BYTES, SUM_UNKNOWN,
};
use crate::codec;
use crate::raid;

/// Stripes one batch of a scrub handles with the gate held.
pub const REPAIR_BATCH_STRIPES: u64 = 64;
/// Bytes of each branch one batch of a rebuild reads in one request (and
/// writes to the replacement): large sequential I/O, the gate held for
/// a few milliseconds.
pub const REBUILD_BATCH_BYTES: u64 = 1024 * 1024;

/// What a scrub found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    pub stripes: u64,
    /// Stripes with at least one unit that disagreed.
    pub stripes_with_errors: u64,
    /// Units that disagreed with what their stripe says they hold, by label.
    pub bad_units: BTreeMap<String, u64>,
    /// Units (or their sums) written again.
    pub repaired_units: u64,
    /// Stripes whose right contents could not be told (no good copy, and
    /// parity could not rebuild one that matches its sum).
    pub unrepairable_stripes: u64,
    /// Units with no checksum (punched, or written by RAIF0), judged by
    /// comparing copies and parity only.
    pub units_without_sum: u64,
}

/// What a rebuild did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebuildReport {
    pub label: String,
    pub stripes: u64,
    pub bytes_written: u64,
}

/// Each branch's unit of a stripe as a scrub read it: its bytes, its
/// stored sum and the verdict of one against the other (None: not read).
type StripeUnits = Vec<Option<(Vec<u8>, u32, Verdict)>>;

/// A unit read during a scrub, judged by its sum.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Good,
    Bad,
    NoSum,
}

impl Segment {
    /// Puts fresh files in the place of branch `b`'s share of this
    /// segment. The device has marked the branch rebuilding: written by
    /// commits, never read, until `rebuild_member` has refilled it.
    pub(super) fn replace_devices(&self, b: usize, devices: MemberDevices) {
        assert_eq!(
            self.members[b].health(),
            Health::Rebuilding,
            "a branch is marked rebuilding before its files are replaced"
        );
        let _gate = write_lock(&self.gate);
        *write_lock(&self.members[b].devices) = Some(devices);
    }

    /// Stripes this segment holds: what a rebuild or scrub of it covers.
    pub(super) fn stripe_count(&self) -> io::Result<u64> {
        Ok(grove_store::BlockDevice::len_bytes(self)? / self.layout.stripe_data_bytes())
    }

    /// Refills branch `b`'s share of this segment from the other branches,
    /// in batches, reading back what it wrote. `progress(stripes)` is
    /// called after each batch with the stripes it did; `stop()` true ends
    /// the rebuild early (the branch stays rebuilding, to be run again).
    /// The device marks the branch healthy once every segment is done.
    pub(super) fn rebuild_member(
        &self,
        b: usize,
        progress: &mut dyn FnMut(u64),
        stop: &dyn Fn() -> bool,
    ) -> io::Result<u64> {
        let label = &self.members[b].label;
        assert_eq!(self.members[b].health(), Health::Rebuilding);
        let stripes = self.stripe_count()?;
        let unit = self.layout.stripe_unit_bytes;
        let devices = self.members[b].devices()?;
        devices.data.set_len_bytes(stripes * unit)?;
        devices.sums.set_len_bytes(stripes * SUM_BYTES)?;
        let mut done = 0;
        while done < stripes {
            if stop() {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    format!("rebuild of {label} stopped at stripe {done} of {stripes}"),
                ));
            }
            let batch = (REBUILD_BATCH_BYTES / unit).max(1);
            let end = (done + batch).min(stripes);
            self.rebuild_batch(b, &devices, done, end)?;
            progress(end - done);
            done = end;
        }
        devices.data.flush()?;
        devices.sums.flush()?;
        Ok(stripes * unit)
    }

    /// Rebuilds branch `b`'s units of stripes `from..to`: each other
    /// readable branch's units of the batch in one read, then each stripe's
    /// lost unit from a mirror copy or from parity.
    fn rebuild_batch(
        &self,
        b: usize,
        devices: &MemberDevices,
        from: u64,
        to: u64,
    ) -> io::Result<()> {
        let unit = self.layout.stripe_unit_bytes as usize;
        let count = (to - from) as usize;
        let mut units = vec![0u8; unit * count];
        let mut sums = vec![0u8; SUM_BYTES as usize * count];
        // Shared, not alone: commits (which hold the gate alone) cannot
        // rewrite the batch between its read and its write, while client
        // reads go on, since they never read a branch being rebuilt.
        let _gate = read_lock(&self.gate);
        let io = Io(self);
        let runs: Vec<Option<Vec<u8>>> = (0..self.members.len())
            .map(|c| {
                if c == b || raid::BranchIo::is_failed(&io, c) {
                    return None;
                }
                // Straight from the branch, not through the balancer: a
                // 1 MiB batch read is no sample of a client read's latency.
                let mut run = vec![0u8; unit * count];
                let read = self.members[c]
                    .devices()
                    .and_then(|d| d.data.read_at(&mut run, from * unit as u64));
                match read {
                    Ok(()) => Some(run),
                    Err(e) => {
                        self.mark_failed(c, &e);
                        None
                    }
                }
            })
            .collect();
        for (i, stripe) in (from..to).enumerate() {
            let slice = |c: usize| runs[c].as_ref().map(|run| &run[i * unit..(i + 1) * unit]);
            let rebuilt = self.lost_unit(stripe, b, &slice)?;
            units[i * unit..(i + 1) * unit].copy_from_slice(&rebuilt);
            sums[i * SUM_BYTES as usize..(i + 1) * SUM_BYTES as usize]
                .copy_from_slice(&unit_sum(&rebuilt).to_le_bytes());
        }
        devices.data.write_at(&units, from * unit as u64)?;
        devices.sums.write_at(&sums, from * SUM_BYTES)?;
        let mut back = vec![0u8; units.len()];
        devices.data.read_at(&mut back, from * unit as u64)?;
        if back != units {
            return Err(io::Error::other(format!(
                "branch {}: stripes {from}..{to} read back differently from what was written",
                self.members[b].label
            )));
        }
        Ok(())
    }

    /// Branch `b`'s unit of `stripe`, from the other branches' units
    /// (`unit_of(c)`, None where unreadable): a mirror copy, or the stripe
    /// recovered from its data and parity.
    fn lost_unit<'a>(
        &self,
        stripe: u64,
        b: usize,
        unit_of: &dyn Fn(usize) -> Option<&'a [u8]>,
    ) -> io::Result<Vec<u8>> {
        let map = self.layout.stripe_map(stripe);
        let position = self.unit_position(stripe, b);
        let k = map.data.len();
        if position < k {
            if let Some(copy) = map.data[position]
                .iter()
                .find_map(|&c| (c != b).then(|| unit_of(c)).flatten())
            {
                return Ok(copy.to_vec());
            }
        }
        if self.layout.level.parity_units() == 0 {
            return Err(io::Error::other(format!(
                "stripe {stripe}: no readable copy of branch {}'s unit",
                self.members[b].label
            )));
        }
        let mut all: Vec<Option<Vec<u8>>> = map
            .data
            .iter()
            .map(|copies| unit_of(copies[0]).map(<[u8]>::to_vec))
            .chain(map.parity.iter().map(|&p| unit_of(p).map(<[u8]>::to_vec)))
            .collect();
        all[position] = None;
        codec::recover(self.layout.level, &mut all)
            .map_err(|e| io::Error::other(format!("stripe {stripe}: {e}")))?;
        all[position]
            .take()
            .ok_or_else(|| io::Error::other(format!("stripe {stripe}: unit not recovered")))
    }

    /// Where branch `b`'s unit of `stripe` sits in `read_stripe`'s answer
    /// (data units, then parity).
    fn unit_position(&self, stripe: u64, b: usize) -> usize {
        let map = self.layout.stripe_map(stripe);
        if let Some(j) = map.data.iter().position(|copies| copies.contains(&b)) {
            return j;
        }
        let p = map
            .parity
            .iter()
            .position(|&p| p == b)
            .expect("every branch holds a unit of every stripe");
        map.data.len() + p
    }

    /// Reads every stripe from every readable branch and checks it against
    /// its sums, mirrors and parity; with `repair`, writes what is wrong
    /// again from what is right. `progress(stripes)` follows the batches.
    pub(super) fn scrub(
        &self,
        repair: bool,
        report: &mut ScrubReport,
        progress: &mut dyn FnMut(u64),
        stop: &dyn Fn() -> bool,
    ) -> io::Result<()> {
        grove_store::BlockDevice::flush(self)?;
        let stripes = self.stripe_count()?;
        let repaired_before = report.repaired_units;
        let mut done = 0;
        while done < stripes {
            if stop() {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    format!("scrub stopped at stripe {done} of {stripes}"),
                ));
            }
            let end = (done + REPAIR_BATCH_STRIPES).min(stripes);
            let _gate = write_lock(&self.gate);
            for stripe in done..end {
                self.scrub_stripe(stripe, repair, report)?;
            }
            drop(_gate);
            progress(end - done);
            done = end;
        }
        if repair && report.repaired_units > repaired_before {
            grove_store::BlockDevice::flush(self)?;
        }
        Ok(())
    }

    fn scrub_stripe(&self, stripe: u64, repair: bool, report: &mut ScrubReport) -> io::Result<()> {
        report.stripes += 1;
        let read = self.read_stripe_units(stripe, report)?;
        let Some(expected) = self.expected_units(stripe, &read) else {
            report.stripes_with_errors += 1;
            report.unrepairable_stripes += 1;
            for (b, entry) in read.iter().enumerate() {
                if matches!(entry, Some((_, _, Verdict::Bad))) {
                    self.count_bad_unit(b, report);
                }
            }
            return Ok(());
        };
        let mut errors = false;
        for (b, entry) in read.iter().enumerate() {
            let Some((bytes, sum, verdict)) = entry else {
                continue;
            };
            let right = &expected[b];
            let content_wrong = bytes != right;
            let sum_wrong =
                *verdict == Verdict::Bad || (*sum != SUM_UNKNOWN && *sum != unit_sum(right));
            if !content_wrong && !sum_wrong {
                continue;
            }
            errors = true;
            self.count_bad_unit(b, report);
            if repair {
                self.repair_unit(b, stripe, right, report)?;
            }
        }
        if errors {
            report.stripes_with_errors += 1;
        }
        Ok(())
    }

    /// Each readable branch's unit of `stripe`, its stored sum and the
    /// verdict of one against the other; a branch that fails to read is
    /// marked failed and left out.
    fn read_stripe_units(&self, stripe: u64, report: &mut ScrubReport) -> io::Result<StripeUnits> {
        let unit = self.layout.stripe_unit_bytes as usize;
        let offset = stripe * unit as u64;
        let mut read: StripeUnits = vec![None; self.members.len()];
        for (b, member) in self.members.iter().enumerate() {
            if member.health() != Health::Healthy {
                continue;
            }
            let devices = member.devices()?;
            let mut bytes = vec![0u8; unit];
            let mut sum = [0u8; SUM_BYTES as usize];
            let result = devices
                .data
                .read_at(&mut bytes, offset)
                .and_then(|()| devices.sums.read_at(&mut sum, stripe * SUM_BYTES));
            if let Err(e) = result {
                self.mark_failed(b, &e);
                continue;
            }
            let sum = u32::from_le_bytes(sum);
            let verdict = if sum == SUM_UNKNOWN {
                report.units_without_sum += 1;
                Verdict::NoSum
            } else if unit_sum(&bytes) == sum {
                Verdict::Good
            } else {
                Verdict::Bad
            };
            read[b] = Some((bytes, sum, verdict));
        }
        Ok(read)
    }

    fn count_bad_unit(&self, branch: usize, report: &mut ScrubReport) {
        *report
            .bad_units
            .entry(self.members[branch].label.clone())
            .or_default() += 1;
    }

    /// Writes `right` and its sum over branch `branch`'s unit of `stripe`;
    /// a branch that fails the write is marked failed.
    fn repair_unit(
        &self,
        branch: usize,
        stripe: u64,
        right: &[u8],
        report: &mut ScrubReport,
    ) -> io::Result<()> {
        let offset = stripe * self.layout.stripe_unit_bytes;
        let devices = self.members[branch].devices()?;
        let written = devices.data.write_at(right, offset).and_then(|()| {
            devices
                .sums
                .write_at(&unit_sum(right).to_le_bytes(), stripe * SUM_BYTES)
        });
        match written {
            Ok(()) => report.repaired_units += 1,
            Err(e) => self.mark_failed(branch, &e),
        }
        Ok(())
    }

    /// What every branch should hold of a stripe, decided by the sums:
    /// for each data unit a copy that matches its sum (or, with no sum,
    /// the first copy read); a data unit with no such copy is rebuilt from
    /// parity and kept only if it then matches its sum. None if some unit
    /// cannot be decided.
    fn expected_units(
        &self,
        stripe: u64,
        read: &[Option<(Vec<u8>, u32, Verdict)>],
    ) -> Option<Vec<Vec<u8>>> {
        let map = self.layout.stripe_map(stripe);
        let k = map.data.len();
        let mut data: Vec<Option<Vec<u8>>> = Vec::with_capacity(k);
        let mut sums_of_lost: Vec<Option<u32>> = vec![None; k];
        for (j, copies) in map.data.iter().enumerate() {
            let pick = |want: Verdict| {
                copies.iter().find_map(|&b| match &read[b] {
                    Some((bytes, _, v)) if *v == want => Some(bytes.clone()),
                    _ => None,
                })
            };
            let chosen = pick(Verdict::Good).or_else(|| pick(Verdict::NoSum));
            if chosen.is_none() {
                sums_of_lost[j] = copies.iter().find_map(|&b| match &read[b] {
                    Some((_, sum, Verdict::Bad)) => Some(*sum),
                    _ => None,
                });
            }
            data.push(chosen);
        }
        if data.iter().any(|d| d.is_none()) {
            if self.layout.level.parity_units() == 0 {
                return None;
            }
            let mut units: Vec<Option<Vec<u8>>> = data.clone();
            for &p in &map.parity {
                units.push(match &read[p] {
                    Some((bytes, _, v)) if *v != Verdict::Bad => Some(bytes.clone()),
                    _ => None,
                });
            }
            codec::recover(self.layout.level, &mut units).ok()?;
            for j in 0..k {
                if data[j].is_none() {
                    let rebuilt = units[j].take()?;
                    if sums_of_lost[j].is_some_and(|sum| unit_sum(&rebuilt) != sum) {
                        return None;
                    }
                    data[j] = Some(rebuilt);
                }
            }
        }
        let data: Vec<Vec<u8>> = data.into_iter().collect::<Option<_>>()?;
        let joined: Vec<u8> = data.concat();
        let mut expected = vec![Vec::new(); self.members.len()];
        for (b, bytes) in self.stripe_units(stripe, &joined).ok()? {
            expected[b] = bytes;
        }
        Some(expected)
    }
}
