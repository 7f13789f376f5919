//! Branches in memory, with failures to inject: for tests and for the
//! layout code's own checks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::raid::BranchIo;

/// One byte vector per branch; a failed branch refuses every I/O.
#[derive(Debug)]
pub struct MemBranches {
    pub components: Mutex<Vec<Vec<u8>>>,
    failed: Vec<AtomicBool>,
}

impl MemBranches {
    pub fn new(width: usize) -> MemBranches {
        MemBranches {
            components: Mutex::new(vec![Vec::new(); width]),
            failed: (0..width).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Loses a branch: its contents are wiped and it fails every I/O.
    pub fn lose(&self, branch: usize) {
        self.components.lock().unwrap_or_else(|e| e.into_inner())[branch].clear();
        self.failed[branch].store(true, Ordering::Relaxed);
    }

    /// Brings a lost branch back, empty: what rebuild refills.
    pub fn replace(&self, branch: usize) {
        self.components.lock().unwrap_or_else(|e| e.into_inner())[branch].clear();
        self.failed[branch].store(false, Ordering::Relaxed);
    }

    /// Flips one byte of a branch's component (silent corruption).
    pub fn corrupt(&self, branch: usize, offset: usize) {
        let mut components = self.components.lock().unwrap_or_else(|e| e.into_inner());
        let component = &mut components[branch];
        if component.len() <= offset {
            component.resize(offset + 1, 0);
        }
        component[offset] ^= 0xff;
    }
}

impl BranchIo for MemBranches {
    fn read_at(&self, branch: usize, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        if self.is_failed(branch) {
            return Err(std::io::Error::other("branch lost"));
        }
        let components = self.components.lock().unwrap_or_else(|e| e.into_inner());
        let component = &components[branch];
        let start = (offset as usize).min(component.len());
        let end = (offset as usize + buf.len()).min(component.len());
        buf.fill(0);
        buf[..end - start].copy_from_slice(&component[start..end]);
        Ok(())
    }

    fn write_at(&self, branch: usize, offset: u64, data: &[u8]) -> std::io::Result<()> {
        if self.is_failed(branch) {
            return Err(std::io::Error::other("branch lost"));
        }
        let mut components = self.components.lock().unwrap_or_else(|e| e.into_inner());
        let component = &mut components[branch];
        let end = offset as usize + data.len();
        if component.len() < end {
            component.resize(end, 0);
        }
        component[offset as usize..end].copy_from_slice(data);
        Ok(())
    }

    fn is_failed(&self, branch: usize) -> bool {
        self.failed[branch].load(Ordering::Relaxed)
    }

    fn fail(&self, branch: usize, _error: &std::io::Error) {
        self.failed[branch].store(true, Ordering::Relaxed);
    }
}
