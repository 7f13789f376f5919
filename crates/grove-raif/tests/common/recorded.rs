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
            let image = CrashImages::new(ops).image(count, |_| match mode {
                0 => WriteFate::Landed,
                1 => WriteFate::Lost,
                _ => match rng.below(3) {
                    0 => WriteFate::Lost,
                    1 => WriteFate::Landed,
                    _ => WriteFate::Torn(rng.next()),
                },
            });
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
        let key = format!("{place}/{SHAPE_FILE_NAME}");
        self.file(key.clone(), false)
            .or_else(|_| self.file(key, true))
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
        let key = format!("{place}/{SHAPE_FILE_NAME}");
        self.file(key.clone(), false)
            .or_else(|_| self.file(key, true))
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
