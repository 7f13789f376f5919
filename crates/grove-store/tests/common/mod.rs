//! Helpers shared by the engine's integration tests.

// Each test binary compiles this module and uses only some of it.
#![allow(dead_code)]

use std::collections::BTreeMap;

use grove_store::Pool;

/// xorshift64*: deterministic, so a failure replays.
pub struct Rng(pub u64);

impl Rng {
    /// A number below `n` (0 for n = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// Every volume's whole contents, by name.
pub fn contents(pool: &Pool) -> BTreeMap<String, Vec<u8>> {
    pool.volumes()
        .unwrap()
        .into_iter()
        .map(|info| {
            let mut buf = vec![0u8; info.summary.size_bytes as usize];
            pool.volume(&info.summary.name)
                .unwrap()
                .read_at(&mut buf, 0)
                .unwrap();
            (info.summary.name, buf)
        })
        .collect()
}

/// `check` finds no error, nothing leaked and no count held back.
#[track_caller]
pub fn assert_clean(pool: &Pool, context: &str) {
    let report = pool.check(false).unwrap();
    assert!(report.is_clean(), "{context}: {:?}", report.errors);
    assert!(
        !report
            .warnings
            .iter()
            .any(|w| w.contains("leaked") || w.contains("more references")),
        "{context}: {:?}",
        report.warnings
    );
}

/// What a test runs before a write or a flush reaches the device.
pub type Hook = Box<dyn Fn(&grove_store::MemDevice) + Send + Sync>;

/// A memory device that runs a test's hook before each read, write or
/// flush: to slow writes down, count flushes, or keep images.
pub struct HookedDevice {
    pub inner: grove_store::MemDevice,
    before_read: Option<Hook>,
    before_write: Option<Hook>,
    before_flush: Option<Hook>,
}

impl HookedDevice {
    pub fn new() -> HookedDevice {
        HookedDevice {
            inner: grove_store::MemDevice::new(),
            before_read: None,
            before_write: None,
            before_flush: None,
        }
    }

    pub fn before_read(
        mut self,
        hook: impl Fn(&grove_store::MemDevice) + Send + Sync + 'static,
    ) -> Self {
        self.before_read = Some(Box::new(hook));
        self
    }

    pub fn before_write(
        mut self,
        hook: impl Fn(&grove_store::MemDevice) + Send + Sync + 'static,
    ) -> Self {
        self.before_write = Some(Box::new(hook));
        self
    }

    pub fn before_flush(
        mut self,
        hook: impl Fn(&grove_store::MemDevice) + Send + Sync + 'static,
    ) -> Self {
        self.before_flush = Some(Box::new(hook));
        self
    }
}

impl grove_store::BlockDevice for HookedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if let Some(hook) = &self.before_read {
            hook(&self.inner);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if let Some(hook) = &self.before_write {
            hook(&self.inner);
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        if let Some(hook) = &self.before_flush {
            hook(&self.inner);
        }
        self.inner.flush()
    }
    fn len_bytes(&self) -> std::io::Result<u64> {
        self.inner.len_bytes()
    }
    fn set_len_bytes(&self, len_bytes: u64) -> std::io::Result<()> {
        self.inner.set_len_bytes(len_bytes)
    }
    fn describe(&self) -> String {
        "hooked memory device".into()
    }
}
