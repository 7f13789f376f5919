//! Branch files recorded for the crash simulator: every file a crash
//! device, all their operations in one global order, so that a power cut
//! at any point keeps, loses or tears each file's unsynced writes on its
//! own. Each test crate uses part of this.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use grove_raif::branch_pool::members::{segment_file_names, SHAPE_FILE_NAME};
use grove_raif::branch_pool::{BranchFiles, MemberDevices};
use grove_store::testing::{CrashDevice, CrashImages, WriteFate};
use grove_store::{BlockDevice, MemDevice};

use super::Rng;

/// A crash device that also notes its number in the global order.
pub struct Ordered {
    pub id: usize,
    pub inner: CrashDevice,
    pub order: Arc<Mutex<Vec<usize>>>,
}

impl Ordered {
    fn note(&self) {
        self.order.lock().unwrap().push(self.id);
    }
}

impl BlockDevice for Ordered {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)?;
        self.note();
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()?;
        self.note();
        Ok(())
    }
    fn len_bytes(&self) -> io::Result<u64> {
        self.inner.len_bytes()
    }
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.inner.set_len_bytes(len_bytes)?;
        self.note();
        Ok(())
    }
    fn describe(&self) -> String {
        format!("crash device {}", self.id)
    }
    fn punch(&self, offset: u64, len_bytes: u64) -> io::Result<()> {
        self.inner.punch(offset, len_bytes)?;
        self.note();
        Ok(())
    }
}

/// An unsynced write's fate in a crash image: `mode` 0, every write
/// lands; 1, every one is lost; else each lands, is lost or is torn at
/// random.
pub fn fate(mode: u64, rng: &mut Rng) -> WriteFate {
    match mode {
        0 => WriteFate::Landed,
        1 => WriteFate::Lost,
        _ => match rng.below(3) {
            0 => WriteFate::Lost,
            1 => WriteFate::Landed,
            _ => WriteFate::Torn(rng.next()),
        },
    }
}

pub const SECTOR: usize = 512;

/// A logical write, with the global position when it was issued.
pub struct LoggedWrite {
    pub at: usize,
    pub offset: usize,
    pub data: Vec<u8>,
}

/// A completed flush: where it started and ended.
pub struct LoggedFlush {
    pub started: usize,
    pub done: usize,
}

/// What each sector may hold after a crash at `position`: its content at
/// the last flush done by then, or one of the writes issued after that.
pub fn allowed<'a>(
    size: usize,
    writes: &'a [LoggedWrite],
    flushes: &[LoggedFlush],
    position: usize,
) -> (Vec<u8>, Vec<&'a LoggedWrite>) {
    let durable_before = flushes
        .iter()
        .filter(|f| f.done <= position)
        .map(|f| f.started)
        .max()
        .unwrap_or(0);
    let mut durable = vec![0u8; size];
    let mut volatile = Vec::new();
    for write in writes {
        if write.at < durable_before {
            durable[write.offset..write.offset + write.data.len()].copy_from_slice(&write.data);
        } else if write.at < position {
            volatile.push(write);
        }
    }
    (durable, volatile)
}

/// Checks every sector of `got` against `allowed`'s answer.
pub fn check_sectors(got: &[u8], durable: &[u8], volatile: &[&LoggedWrite], context: &str) {
    for (s, sector) in got.chunks(SECTOR).enumerate() {
        let at = s * SECTOR;
        if sector == &durable[at..at + SECTOR] {
            continue;
        }
        let later = volatile.iter().any(|w| {
            w.offset <= at
                && at + SECTOR <= w.offset + w.data.len()
                && sector == &w.data[at - w.offset..at - w.offset + SECTOR]
        });
        assert!(
            later,
            "{context}: sector {s} holds neither its durable content nor a later write"
        );
    }
}

/// One recorded file: made at a position of the order, maybe removed at
/// a later one.
struct RecordedFile {
    device: Arc<Ordered>,
    made_at: usize,
    removed_at: Option<usize>,
}

/// Branch files made on demand, each recorded, keyed "PLACE/NAME".
pub struct RecordedFiles {
    order: Arc<Mutex<Vec<usize>>>,
    files: Mutex<BTreeMap<String, RecordedFile>>,
    next_id: Mutex<usize>,
}

impl Default for RecordedFiles {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordedFiles {
    pub fn new() -> RecordedFiles {
        RecordedFiles {
            order: Arc::new(Mutex::new(Vec::new())),
            files: Mutex::new(BTreeMap::new()),
            next_id: Mutex::new(0),
        }
    }

    pub fn position(&self) -> usize {
        self.order.lock().unwrap().len()
    }

    fn file(&self, key: String, create: bool) -> io::Result<Arc<dyn BlockDevice>> {
        let mut files = self.files.lock().unwrap();
        if let Some(file) = files.get(&key).filter(|f| f.removed_at.is_none()) {
            assert!(!create, "{key} is made once in these runs");
            return Ok(file.device.clone());
        }
        if !create {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{key}: no such file"),
            ));
        }
        let mut next_id = self.next_id.lock().unwrap();
        let device = Arc::new(Ordered {
            id: *next_id,
            inner: CrashDevice::new(),
            order: self.order.clone(),
        });
        *next_id += 1;
        let made_at = self.position();
        files.insert(
            key,
            RecordedFile {
                device: device.clone(),
                made_at,
                removed_at: None,
            },
        );
        Ok(device)
    }

    /// Every file there after a power cut once `position` operations had
    /// been issued, each unsynced write's fate drawn from `rng` (`mode` 0:
    /// all land, 1: all lost, else random and torn). A removal counts as
    /// done when issued.
    pub fn images(&self, position: usize, mode: u64, rng: &mut Rng) -> ImageFiles {
        let order = self.order.lock().unwrap();
        let files = self.files.lock().unwrap();
        let mut images = BTreeMap::new();
        for (key, file) in files.iter() {
            if file.made_at > position || file.removed_at.is_some_and(|at| at <= position) {
                continue;
            }
            let count = order[..position]
                .iter()
                .filter(|&&d| d == file.device.id)
                .count();
            let ops = file.device.inner.ops()[..count].to_vec();
            let image = CrashImages::new(ops).image(count, |_| fate(mode, rng));
            images.insert(key.clone(), image);
        }
        ImageFiles {
            files: Mutex::new(
                images
                    .into_iter()
                    .map(|(k, bytes)| (k, Arc::new(MemDevice::from_bytes(bytes)) as _))
                    .collect(),
            ),
        }
    }
}

/// A branch's shape file, made if missing (as `DirFiles` does).
fn shape_device(
    file: impl Fn(String, bool) -> io::Result<Arc<dyn BlockDevice>>,
    place: &str,
) -> io::Result<Arc<dyn BlockDevice>> {
    let key = format!("{place}/{SHAPE_FILE_NAME}");
    file(key.clone(), false).or_else(|_| file(key, true))
}

fn segment_devices(
    file: impl Fn(String) -> io::Result<Arc<dyn BlockDevice>>,
    place: &str,
    id: u32,
) -> io::Result<MemberDevices> {
    let [data, journal, sums] = segment_file_names(id).map(|name| format!("{place}/{name}"));
    Ok(MemberDevices {
        data: file(data)?,
        journal: file(journal)?,
        sums: file(sums)?,
    })
}

impl BranchFiles for RecordedFiles {
    fn shape(&self, place: &str) -> io::Result<Arc<dyn BlockDevice>> {
        shape_device(|key, create| self.file(key, create), place)
    }

    fn segment(&self, place: &str, id: u32, create: bool) -> io::Result<MemberDevices> {
        segment_devices(|key| self.file(key, create), place, id)
    }

    fn remove_segment(&self, place: &str, id: u32) {
        let position = self.position();
        let mut files = self.files.lock().unwrap();
        for name in segment_file_names(id) {
            if let Some(file) = files.get_mut(&format!("{place}/{name}")) {
                file.removed_at = Some(position);
            }
        }
    }
}

/// The files of a crash image, in memory.
pub struct ImageFiles {
    files: Mutex<BTreeMap<String, Arc<dyn BlockDevice>>>,
}

impl ImageFiles {
    fn file(&self, key: String, create: bool) -> io::Result<Arc<dyn BlockDevice>> {
        let mut files = self.files.lock().unwrap();
        if create {
            let device: Arc<dyn BlockDevice> = Arc::new(MemDevice::new());
            files.insert(key, device.clone());
            return Ok(device);
        }
        files
            .get(&key)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{key}: no such file")))
    }
}

impl BranchFiles for ImageFiles {
    fn shape(&self, place: &str) -> io::Result<Arc<dyn BlockDevice>> {
        shape_device(|key, create| self.file(key, create), place)
    }

    fn segment(&self, place: &str, id: u32, create: bool) -> io::Result<MemberDevices> {
        segment_devices(|key| self.file(key, create), place, id)
    }

    fn remove_segment(&self, place: &str, id: u32) {
        let mut files = self.files.lock().unwrap();
        for name in segment_file_names(id) {
            files.remove(&format!("{place}/{name}"));
        }
    }
}
