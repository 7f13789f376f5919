//! The device layer: where blocks live. The engine sees only this trait, so
//! the same engine runs on one file, on a RAID layout over branches, or on the
//! crash simulator's recording device.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Byte-addressed storage with positioned I/O. Implementations must allow
/// concurrent calls from many threads.
pub trait BlockDevice: Send + Sync {
    /// Fills `buf` from `offset`. Bytes past the end of the device read as
    /// zeros, as they do in a sparse file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, growing the device if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len_bytes(&self) -> io::Result<u64>;
    /// Sets the length: growing leaves a hole, which reads as zeros.
    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()>;
    /// A human-readable name for error messages.
    fn describe(&self) -> String;
}

/// A device backed by one regular file, usually sparse.
pub struct FileDevice {
    file: File,
    path: PathBuf,
}

impl FileDevice {
    pub fn open(path: &Path) -> io::Result<FileDevice> {
        let file = File::options().read(true).write(true).open(path)?;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Creates a new file; fails if it exists, so that init never clobbers data.
    pub fn create_new(path: &Path) -> io::Result<FileDevice> {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
        })
    }
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // read_exact_at fails with UnexpectedEof past the end; a sparse
        // device instead reads zeros there, so read what exists and zero-fill.
        let mut filled = 0;
        while filled < buf.len() {
            match self
                .file
                .read_at(&mut buf[filled..], offset + filled as u64)
            {
                Ok(0) => {
                    buf[filled..].fill(0);
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        self.file.set_len(len_bytes)
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// A device in memory, for tests and the crash simulator's images.
#[derive(Default)]
pub struct MemDevice {
    bytes: std::sync::Mutex<Vec<u8>>,
}

impl MemDevice {
    pub fn new() -> MemDevice {
        MemDevice::default()
    }

    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        MemDevice {
            bytes: std::sync::Mutex::new(bytes),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl BlockDevice for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let available = (bytes.len() - start).min(buf.len());
        buf[..available].copy_from_slice(&bytes[start..start + available]);
        buf[available..].fill(0);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let start = usize::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let end = start + buf.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(self.bytes.lock().unwrap_or_else(|e| e.into_inner()).len() as u64)
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        let len = usize::try_from(len_bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
        self.bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .resize(len, 0);
        Ok(())
    }

    fn describe(&self) -> String {
        "memory device".to_string()
    }
}
