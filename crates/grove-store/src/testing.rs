//! Test support that is part of the engine: a device that records every
//! write and flush so that any power cut can be rebuilt (the crash
//! simulator), and a device that fails on command (fault injection). Both are
//! real `BlockDevice`s; the engine cannot tell them from a file.

use std::collections::HashSet;
use std::io;
use std::sync::Mutex;

use crate::device::BlockDevice;

/// Torn writes are modelled at this granularity: a sector is written whole
/// or not at all, which is what disks promise.
pub const TORN_WRITE_SECTOR_BYTES: usize = 512;

/// What a device writes whole or not at all, and in what order, when the
/// power goes: the rule every crash image follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tearing {
    /// A disk: each 512-byte sector whole or not at all, sectors and
    /// writes landing in any order until a flush.
    Sectors,
    /// An object store, striped as grove-rados stripes a device: each
    /// write's share of one object whole or not at all (RADOS applies an op
    /// to one object atomically); the shares of different objects landing
    /// in any subset until a flush; those of one object in the order they
    /// were written (RADOS applies one object's ops in order). The length
    /// is an object of its own (the header), written after the data that
    /// grows it, so a crash can keep either without the other.
    Objects { object_bytes: u64 },
}

/// The unit of the header object in `Tearing::Objects`: no data object
/// has this index.
const HEADER_OBJECT: u64 = u64::MAX;

impl Tearing {
    /// The bytes a write keeps or loses together, aligned to multiples of
    /// themselves on the device.
    fn unit_bytes(self) -> u64 {
        match self {
            Tearing::Sectors => TORN_WRITE_SECTOR_BYTES as u64,
            Tearing::Objects { object_bytes } => object_bytes,
        }
    }

    fn is_objects(self) -> bool {
        matches!(self, Tearing::Objects { .. })
    }
}

/// Decides unit by unit what of the volatile ops lands: as each op's fate
/// says, except that on an object store a share written to an object after
/// one that was lost is lost too (one object's ops apply in order).
struct Landing {
    tearing: Tearing,
    /// Objects a lost share has cut off.
    cut: HashSet<u64>,
}

impl Landing {
    fn new(tearing: Tearing) -> Landing {
        Landing {
            tearing,
            cut: HashSet::new(),
        }
    }

    /// Whether the `index`-th unit the op touches, unit `unit` of the
    /// device, lands.
    fn lands(&mut self, fate: WriteFate, index: u64, unit: u64) -> bool {
        let by_fate = match fate {
            WriteFate::Lost => false,
            WriteFate::Landed => true,
            WriteFate::Torn(mask) => mask & (1 << (index % 64)) != 0,
        };
        if !self.tearing.is_objects() {
            return by_fate;
        }
        if self.cut.contains(&unit) {
            return false;
        }
        if !by_fate {
            self.cut.insert(unit);
        }
        by_fate
    }
}

/// One device operation, in the order the engine issued it.
#[derive(Clone, Debug)]
pub enum DeviceOp {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    Flush,
    /// The writes before it to these bytes are durable (a write made with
    /// `write_durable_at`); nothing else is.
    FlushRange {
        offset: u64,
        len_bytes: u64,
    },
    SetLen {
        len_bytes: u64,
    },
    /// A hole punched (see `BlockDevice::punch`): the range reads as zeros
    /// if it landed, as before if it was lost, and each sector as either if
    /// it tore.
    Punch {
        offset: u64,
        len_bytes: u64,
    },
}

/// How a write (or punch) since the last flush survives a power cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFate {
    Lost,
    Landed,
    /// Only some units landed (sectors, or objects on an object store):
    /// bit i of the mask says the i-th unit the write touches did (units
    /// past 64 follow bit i % 64).
    Torn(u64),
}

struct CrashLog {
    current: Vec<u8>,
    ops: Vec<DeviceOp>,
}

/// A memory device that logs every operation.
pub struct CrashDevice {
    log: Mutex<CrashLog>,
    tearing: Tearing,
}

impl Default for CrashDevice {
    fn default() -> Self {
        CrashDevice::new()
    }
}

impl CrashDevice {
    pub fn new() -> CrashDevice {
        CrashDevice {
            log: Mutex::new(CrashLog {
                current: Vec::new(),
                ops: Vec::new(),
            }),
            tearing: Tearing::Sectors,
        }
    }

    /// The device with another rule for what a crash keeps (a disk's by
    /// default).
    pub fn with_tearing(mut self, tearing: Tearing) -> CrashDevice {
        if let Tearing::Objects { object_bytes } = tearing {
            assert!(
                object_bytes > 0 && object_bytes.is_multiple_of(TORN_WRITE_SECTOR_BYTES as u64),
                "objects of {object_bytes} bytes do not hold whole sectors"
            );
        }
        self.tearing = tearing;
        self
    }

    pub fn tearing(&self) -> Tearing {
        self.tearing
    }

    /// A device that starts out holding `bytes`, as if they were durable.
    pub fn from_bytes(bytes: Vec<u8>) -> CrashDevice {
        CrashDevice {
            log: Mutex::new(CrashLog {
                current: bytes,
                ops: Vec::new(),
            }),
            tearing: Tearing::Sectors,
        }
    }

    /// The device's current contents (every write landed).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.log().current.clone()
    }

    fn log(&self) -> std::sync::MutexGuard<'_, CrashLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Operations logged so far; a crash point is an index into them.
    pub fn op_count(&self) -> usize {
        self.log().ops.len()
    }

    pub fn ops(&self) -> Vec<DeviceOp> {
        self.log().ops.clone()
    }
}

/// Rebuilds device images at crash points of a recorded log, walking the
/// log forwards so each image costs one copy.
pub struct CrashImages {
    ops: Vec<DeviceOp>,
    /// The device as the last flush before `position` left it.
    durable: Vec<u8>,
    /// Ops applied to `durable`: everything up to and including the last
    /// flush before the current position.
    durable_upto: usize,
    tearing: Tearing,
}

impl CrashImages {
    pub fn new(ops: Vec<DeviceOp>) -> CrashImages {
        CrashImages::with_base(Vec::new(), ops)
    }

    /// Crash images of a log recorded on a device that started with `base`.
    pub fn with_base(base: Vec<u8>, ops: Vec<DeviceOp>) -> CrashImages {
        CrashImages {
            ops,
            durable: base,
            durable_upto: 0,
            tearing: Tearing::Sectors,
        }
    }

    /// Images torn as `tearing` says (the recording device's rule: see
    /// `CrashDevice::tearing`), a disk's by default.
    pub fn with_tearing(mut self, tearing: Tearing) -> CrashImages {
        self.tearing = tearing;
        self
    }

    /// The writes a power cut after the first `position` ops may keep or
    /// lose: those after the last flush. Moves the durable image forward,
    /// so positions must be asked for in increasing order.
    pub fn volatile_writes(&mut self, position: usize) -> usize {
        let last_flush = self.ops[..position]
            .iter()
            .rposition(|op| matches!(op, DeviceOp::Flush))
            .map_or(0, |i| i + 1);
        assert!(
            last_flush >= self.durable_upto,
            "positions must not go backwards"
        );
        let mut landing = Landing::new(self.tearing);
        for op in &self.ops[self.durable_upto..last_flush] {
            apply(&mut self.durable, op, WriteFate::Landed, &mut landing);
        }
        self.durable_upto = last_flush;
        position - last_flush
    }

    /// The device after a power cut following the first `position` ops,
    /// with `fate(i)` deciding what became of the i-th volatile write.
    pub fn image(&mut self, position: usize, mut fate: impl FnMut(usize) -> WriteFate) -> Vec<u8> {
        let volatile = self.volatile_writes(position);
        let mut image = self.durable.clone();
        let mut landing = Landing::new(self.tearing);
        // On an object store the length is the header object's: it moves
        // only when a header write lands.
        let mut header_len = image.len();
        let since_flush = &self.ops[position - volatile..position];
        for (i, op) in since_flush.iter().enumerate() {
            let fate = fate(i);
            if let (DeviceOp::SetLen { len_bytes }, true) = (op, self.tearing.is_objects()) {
                if landing.lands(fate, 0, HEADER_OBJECT) {
                    header_len = *len_bytes as usize;
                }
                continue;
            }
            apply(&mut image, op, fate, &mut landing);
            if fate != WriteFate::Landed {
                // What a later ranged flush made durable landed whatever
                // became of the rest of the write.
                for later in &since_flush[i + 1..] {
                    if let DeviceOp::FlushRange { offset, len_bytes } = later {
                        apply_within(&mut image, op, *offset, *len_bytes);
                    }
                }
            }
        }
        if self.tearing.is_objects() {
            // Bytes of objects past the length are out of the device's
            // reach (a later grow that lands zeroes nothing, so they would
            // read again only through a bug this cut shows as zeros).
            image.resize(header_len, 0);
        }
        image
    }
}

/// Applies the part of a write that lies within `offset..offset + len_bytes`
/// as landed (the sectors of the range that a ranged flush made durable).
fn apply_within(image: &mut Vec<u8>, op: &DeviceOp, offset: u64, len_bytes: u64) {
    let DeviceOp::Write {
        offset: write_at,
        data,
    } = op
    else {
        return;
    };
    let start = offset.max(*write_at);
    let end = (offset + len_bytes).min(write_at + data.len() as u64);
    if start >= end {
        return;
    }
    let part = DeviceOp::Write {
        offset: start,
        data: data[(start - write_at) as usize..(end - write_at) as usize].to_vec(),
    };
    apply(
        image,
        &part,
        WriteFate::Landed,
        &mut Landing::new(Tearing::Sectors),
    );
}

/// The units (sectors or objects) `offset..offset + len_bytes` touches, as
/// (index among them, unit, byte range).
fn units(
    offset: u64,
    len_bytes: u64,
    unit_bytes: u64,
) -> impl Iterator<Item = (u64, u64, std::ops::Range<usize>)> {
    let end = offset + len_bytes;
    let first = offset / unit_bytes;
    // An empty range touches no unit.
    let last = if len_bytes == 0 {
        first
    } else {
        end.div_ceil(unit_bytes)
    };
    (first..last).map(move |unit| {
        let start = (unit * unit_bytes).max(offset);
        let stop = ((unit + 1) * unit_bytes).min(end);
        (unit - first, unit, start as usize..stop as usize)
    })
}

fn apply(image: &mut Vec<u8>, op: &DeviceOp, fate: WriteFate, landing: &mut Landing) {
    let unit_bytes = landing.tearing.unit_bytes();
    match op {
        DeviceOp::Flush | DeviceOp::FlushRange { .. } => {}
        DeviceOp::SetLen { len_bytes } => {
            // Growing is kept even when lost: the engine only ever grows the
            // store, and the bytes a lost grow would cut read as zeros anyway.
            let len = *len_bytes as usize;
            if image.len() < len || fate != WriteFate::Lost {
                image.resize(len, 0);
            }
        }
        DeviceOp::Punch { offset, len_bytes } => {
            // A punch never grows the device (KEEP_SIZE).
            let end = offset.saturating_add(*len_bytes).min(image.len() as u64);
            let len = end.saturating_sub(*offset);
            for (index, unit, range) in units(*offset, len, unit_bytes) {
                if landing.lands(fate, index, unit) {
                    image[range].fill(0);
                }
            }
        }
        DeviceOp::Write { offset, data } => {
            // A lost share still cuts its object off on an object store.
            if fate == WriteFate::Lost && !landing.tearing.is_objects() {
                return;
            }
            let end = *offset as usize + data.len();
            if image.len() < end {
                image.resize(end, 0);
            }
            for (index, unit, range) in units(*offset, data.len() as u64, unit_bytes) {
                if landing.lands(fate, index, unit) {
                    let from = range.start - *offset as usize;
                    image[range.clone()].copy_from_slice(&data[from..from + range.len()]);
                }
            }
        }
    }
}

impl BlockDevice for CrashDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let log = self.log();
        let start = (offset as usize).min(log.current.len());
        let available = (log.current.len() - start).min(buf.len());
        buf[..available].copy_from_slice(&log.current[start..start + available]);
        buf[available..].fill(0);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut log = self.log();
        let len_before = log.current.len();
        log.apply_landed(
            &DeviceOp::Write {
                offset,
                data: buf.to_vec(),
            },
            self.tearing,
        );
        // What reaches the disk is whole sectors as the page cache holds
        // them, earlier writes to the same sectors included: log that, so a
        // landed write never undoes part of an earlier one in its sectors.
        // (On an object store the sector's other bytes came from earlier
        // ops to the same object, which land first anyway.)
        let sector = TORN_WRITE_SECTOR_BYTES as u64;
        let start = offset / sector * sector;
        let end = (offset + buf.len() as u64).div_ceil(sector) * sector;
        let end = end.min(log.current.len() as u64);
        let data = log.current[start as usize..end as usize].to_vec();
        log.ops.push(DeviceOp::Write {
            offset: start,
            data,
        });
        // grove-rados writes the header with the new length once the data
        // that grows the device is stored.
        if self.tearing.is_objects() && log.current.len() > len_before {
            let len_bytes = log.current.len() as u64;
            log.ops.push(DeviceOp::SetLen { len_bytes });
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.log().ops.push(DeviceOp::Flush);
        Ok(())
    }

    /// The write, then a flush of its range alone: a crash image keeps,
    /// loses or tears the other writes since the last flush as before. On
    /// an object store, a write and a whole flush (grove-rados's writes
    /// return once stored, so everything before them is stored too).
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        if self.tearing.is_objects() {
            return self.flush();
        }
        self.log().ops.push(DeviceOp::FlushRange {
            offset,
            len_bytes: buf.len() as u64,
        });
        Ok(())
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.log().current.len() as u64)
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        let mut log = self.log();
        let len_before = log.current.len() as u64;
        if self.tearing.is_objects() && len_bytes < len_before {
            // grove-rados gives back the cut-off objects before it writes
            // the shorter length.
            let op = DeviceOp::Punch {
                offset: len_bytes,
                len_bytes: len_before - len_bytes,
            };
            log.apply_landed(&op, self.tearing);
            log.ops.push(op);
        }
        let op = DeviceOp::SetLen { len_bytes };
        log.apply_landed(&op, self.tearing);
        log.ops.push(op);
        debug_assert_eq!(log.current.len() as u64, len_bytes);
        Ok(())
    }

    fn describe(&self) -> String {
        match self.tearing {
            Tearing::Sectors => "crash-simulator device".to_string(),
            Tearing::Objects { object_bytes } => {
                format!("crash-simulator object store ({object_bytes}-byte objects)")
            }
        }
    }

    /// Zeros the range now and logs the punch, so that crash images keep
    /// it, lose it or tear it like a write.
    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        let mut log = self.log();
        let op = DeviceOp::Punch { offset, len_bytes };
        log.apply_landed(&op, self.tearing);
        log.ops.push(op);
        Ok(())
    }
}

impl CrashLog {
    /// Applies an op to the current contents, as if it landed whole.
    fn apply_landed(&mut self, op: &DeviceOp, tearing: Tearing) {
        apply(
            &mut self.current,
            op,
            WriteFate::Landed,
            &mut Landing::new(tearing),
        );
    }
}

/// Which operation a fault hits, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    ReadEio,
    WriteEio,
    WriteEnospc,
    FlushEio,
    /// A punch fails with EIO (a real error: logged, counted, ignored).
    PunchEio,
    /// A punch fails with EOPNOTSUPP, as on a file system without hole
    /// punching.
    PunchUnsupported,
}

struct FaultState {
    armed: Option<Fault>,
    /// Matching operations to let through before failing.
    skip: u64,
    /// Fail every matching operation from then on (else only one).
    sticky: bool,
    injected: u64,
}

/// Wraps a device and fails chosen operations with EIO or ENOSPC.
pub struct FaultyDevice<D: BlockDevice> {
    inner: D,
    state: Mutex<FaultState>,
}

impl<D: BlockDevice> FaultyDevice<D> {
    pub fn new(inner: D) -> FaultyDevice<D> {
        FaultyDevice {
            inner,
            state: Mutex::new(FaultState {
                armed: None,
                skip: 0,
                sticky: false,
                injected: 0,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails the matching operation after `skip` successful ones; with
    /// `sticky`, every one after that too, until `clear`.
    pub fn arm(&self, fault: Fault, skip: u64, sticky: bool) {
        let mut state = self.state();
        state.armed = Some(fault);
        state.skip = skip;
        state.sticky = sticky;
    }

    pub fn clear(&self) {
        self.state().armed = None;
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.state().injected
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn check(&self, kinds: &[Fault]) -> io::Result<()> {
        let mut state = self.state();
        let Some(fault) = state.armed.filter(|f| kinds.contains(f)) else {
            return Ok(());
        };
        if state.skip > 0 {
            state.skip -= 1;
            return Ok(());
        }
        if !state.sticky {
            state.armed = None;
        }
        state.injected += 1;
        let errno = match fault {
            Fault::WriteEnospc => rustix::io::Errno::NOSPC,
            Fault::PunchUnsupported => rustix::io::Errno::OPNOTSUPP,
            _ => rustix::io::Errno::IO,
        };
        Err(io::Error::from_raw_os_error(errno.raw_os_error()))
    }
}

impl<D: BlockDevice> BlockDevice for FaultyDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(&[Fault::ReadEio])?;
        self.inner.read_at(buf, offset)
    }

    fn read_written_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(&[Fault::ReadEio])?;
        self.inner.read_written_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check(&[Fault::WriteEio, Fault::WriteEnospc])?;
        self.inner.write_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.check(&[Fault::FlushEio])?;
        self.inner.flush()
    }

    fn len_bytes(&self) -> io::Result<u64> {
        self.inner.len_bytes()
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.check(&[Fault::WriteEio, Fault::WriteEnospc])?;
        self.inner.set_len_bytes(len_bytes)
    }

    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }

    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.check(&[Fault::PunchEio, Fault::PunchUnsupported])?;
        self.inner.punch(offset, len_bytes)
    }

    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        self.inner.allocated_bytes()
    }

    fn place_of(&self, offset: u64) -> Option<String> {
        self.inner.place_of(offset)
    }

    fn piece_bytes(&self) -> Option<u64> {
        self.inner.piece_bytes()
    }

    fn lost_pieces(&self, needed: &[(u64, u64)]) -> io::Result<Vec<String>> {
        self.inner.lost_pieces(needed)
    }
}

impl<D: BlockDevice> BlockDevice for std::sync::Arc<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        (**self).write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn len_bytes(&self) -> io::Result<u64> {
        (**self).len_bytes()
    }
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        (**self).set_len_bytes(len_bytes)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        (**self).punch(offset, len_bytes)
    }
    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        (**self).allocated_bytes()
    }
    fn host_space(&self) -> Option<crate::space_levels::HostSpace> {
        (**self).host_space()
    }
    fn place_of(&self, offset: u64) -> Option<String> {
        (**self).place_of(offset)
    }
    fn read_written_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_written_at(buf, offset)
    }
    fn piece_bytes(&self) -> Option<u64> {
        (**self).piece_bytes()
    }
    fn lost_pieces(&self, needed: &[(u64, u64)]) -> io::Result<Vec<String>> {
        (**self).lost_pieces(needed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A durable write lands in every crash image after it, whatever
    /// becomes of the other writes since the last flush; a crash image
    /// before it may still lose or tear it.
    #[test]
    fn a_ranged_flush_keeps_its_own_writes_only() {
        let device = CrashDevice::from_bytes(vec![0; 4096]);
        device.write_at(&[1; 1024], 0).unwrap();
        device.write_durable_at(&[2; 1024], 2048).unwrap();
        device.write_at(&[3; 512], 2048).unwrap();
        let ops = device.ops();
        assert!(matches!(
            ops[2],
            DeviceOp::FlushRange {
                offset: 2048,
                len_bytes: 1024
            }
        ));
        let mut images = CrashImages::with_base(vec![0; 4096], ops.clone());
        // Before the ranged flush: the durable write may be lost or torn.
        let torn = images.image(2, |_| WriteFate::Torn(0b01));
        assert_eq!(torn[2048], 2);
        assert_eq!(torn[2560], 0, "the second sector was lost");
        for fate in [WriteFate::Lost, WriteFate::Torn(0b10), WriteFate::Landed] {
            let mut images = CrashImages::with_base(vec![0; 4096], ops.clone());
            let image = images.image(ops.len(), |_| fate);
            let landed = fate == WriteFate::Landed;
            // The write before it, outside its range: as the fate says.
            assert_eq!(image[0] == 1, landed, "{fate:?}");
            // Its own range: durable.
            assert!(image[2560..3072].iter().all(|&b| b == 2), "{fate:?}");
            // A later write into the range: as the fate says again.
            let later_kept = fate != WriteFate::Lost;
            let first_sector = if later_kept { 3 } else { 2 };
            if fate != WriteFate::Torn(0b10) {
                assert!(
                    image[2048..2560].iter().all(|&b| b == first_sector),
                    "{fate:?}"
                );
            }
        }
    }

    /// On an object store a write tears only at object boundaries, a
    /// share written to an object after a lost one is lost too, and the
    /// length is the header's: a lost header write keeps the old length.
    #[test]
    fn an_object_store_tears_at_objects_and_keeps_each_objects_order() {
        let objects = Tearing::Objects { object_bytes: 4096 };
        let device = CrashDevice::from_bytes(vec![0; 8192]).with_tearing(objects);
        // Objects 0, 1 and 2 (growing the device), then object 0 again.
        device.write_at(&[1; 8192], 2048).unwrap();
        device.write_at(&[2; 512], 1024).unwrap();
        let ops = device.ops();
        assert!(matches!(ops[1], DeviceOp::SetLen { len_bytes: 10240 }));
        let image = |fates: [WriteFate; 3]| {
            let mut images =
                CrashImages::with_base(vec![0; 8192], ops.clone()).with_tearing(objects);
            images.image(ops.len(), |i| fates[i])
        };
        use WriteFate::{Landed, Lost, Torn};
        // The first write's share of object 1 lost, those of objects 0
        // and 2 landed, whole; the header landed.
        let torn = image([Torn(0b101), Landed, Landed]);
        assert_eq!(torn.len(), 10240);
        assert!(torn[2048..4096].iter().all(|&b| b == 1));
        assert!(torn[4096..8192].iter().all(|&b| b == 0));
        assert!(torn[8192..].iter().all(|&b| b == 1));
        assert!(torn[1024..1536].iter().all(|&b| b == 2));
        // Its share of object 0 lost: the later write to object 0 is lost
        // with it, though its own fate says landed.
        let cut = image([Torn(0b110), Landed, Landed]);
        assert!(cut[1024..4096].iter().all(|&b| b == 0));
        assert!(cut[4096..].iter().all(|&b| b == 1));
        // The header lost: the device keeps its old length.
        let short = image([Landed, Lost, Landed]);
        assert_eq!(short.len(), 8192);
    }
}
