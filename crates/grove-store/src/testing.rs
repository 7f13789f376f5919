//! Test support that is part of the engine: a device that records every
//! write and flush so that any power cut can be rebuilt (the crash
//! simulator), and a device that fails on command (fault injection). Both are
//! real `BlockDevice`s; the engine cannot tell them from a file.

use std::io;
use std::sync::Mutex;

use crate::device::BlockDevice;

/// Torn writes are modelled at this granularity: a sector is written whole
/// or not at all, which is what disks promise.
pub const TORN_WRITE_SECTOR_BYTES: usize = 512;

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
    /// Only some sectors landed: bit i of the mask says sector i did
    /// (sectors past 64 follow bit i % 64).
    Torn(u64),
}

struct CrashLog {
    current: Vec<u8>,
    ops: Vec<DeviceOp>,
}

/// A memory device that logs every operation.
pub struct CrashDevice {
    log: Mutex<CrashLog>,
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
        }
    }

    /// A device that starts out holding `bytes`, as if they were durable.
    pub fn from_bytes(bytes: Vec<u8>) -> CrashDevice {
        CrashDevice {
            log: Mutex::new(CrashLog {
                current: bytes,
                ops: Vec::new(),
            }),
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
        }
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
        for op in &self.ops[self.durable_upto..last_flush] {
            apply(&mut self.durable, op, WriteFate::Landed);
        }
        self.durable_upto = last_flush;
        position - last_flush
    }

    /// The device after a power cut following the first `position` ops,
    /// with `fate(i)` deciding what became of the i-th volatile write.
    pub fn image(&mut self, position: usize, mut fate: impl FnMut(usize) -> WriteFate) -> Vec<u8> {
        let volatile = self.volatile_writes(position);
        let mut image = self.durable.clone();
        let since_flush = &self.ops[position - volatile..position];
        for (i, op) in since_flush.iter().enumerate() {
            let fate = fate(i);
            apply(&mut image, op, fate);
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
    apply(image, &part, WriteFate::Landed);
}

fn apply(image: &mut Vec<u8>, op: &DeviceOp, fate: WriteFate) {
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
            let start = (*offset as usize).min(image.len());
            let end = offset.saturating_add(*len_bytes).min(image.len() as u64) as usize;
            for (sector, chunk) in image[start..end]
                .chunks_mut(TORN_WRITE_SECTOR_BYTES)
                .enumerate()
            {
                let lands = match fate {
                    WriteFate::Lost => false,
                    WriteFate::Landed => true,
                    WriteFate::Torn(mask) => mask & (1 << (sector % 64)) != 0,
                };
                if lands {
                    chunk.fill(0);
                }
            }
        }
        DeviceOp::Write { offset, data } => {
            let offset = *offset as usize;
            if fate == WriteFate::Lost {
                return;
            }
            if image.len() < offset + data.len() {
                image.resize(offset + data.len(), 0);
            }
            for (sector, chunk) in data.chunks(TORN_WRITE_SECTOR_BYTES).enumerate() {
                let lands = match fate {
                    WriteFate::Torn(mask) => mask & (1 << (sector % 64)) != 0,
                    _ => true,
                };
                if lands {
                    let start = offset + sector * TORN_WRITE_SECTOR_BYTES;
                    image[start..start + chunk.len()].copy_from_slice(chunk);
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
        apply(
            &mut log.current,
            &DeviceOp::Write {
                offset,
                data: buf.to_vec(),
            },
            WriteFate::Landed,
        );
        // What reaches the disk is whole sectors as the page cache holds
        // them, earlier writes to the same sectors included: log that, so a
        // landed write never undoes part of an earlier one in its sectors.
        let sector = TORN_WRITE_SECTOR_BYTES as u64;
        let start = offset / sector * sector;
        let end = (offset + buf.len() as u64).div_ceil(sector) * sector;
        let end = end.min(log.current.len() as u64);
        let data = log.current[start as usize..end as usize].to_vec();
        log.ops.push(DeviceOp::Write {
            offset: start,
            data,
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.log().ops.push(DeviceOp::Flush);
        Ok(())
    }

    /// The write, then a flush of its range alone: a crash image keeps,
    /// loses or tears the other writes since the last flush as before.
    fn write_durable_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
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
        let op = DeviceOp::SetLen { len_bytes };
        apply(&mut log.current, &op, WriteFate::Landed);
        log.ops.push(op);
        Ok(())
    }

    fn describe(&self) -> String {
        "crash-simulator device".to_string()
    }

    /// Zeros the range now and logs the punch, so that crash images keep
    /// it, lose it or tear it like a write.
    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        let mut log = self.log();
        let op = DeviceOp::Punch { offset, len_bytes };
        apply(&mut log.current, &op, WriteFate::Landed);
        log.ops.push(op);
        Ok(())
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
}
