//! A memory device that keeps only pages that are not all zeros, for
//! workloads whose volumes are larger than memory but whose data is zeros
//! and never read back (diff walks metadata only).

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use grove_store::BlockDevice;

const PAGE_BYTES: u64 = 4096;

pub struct SparseMemDevice {
    pages: Mutex<HashMap<u64, Box<[u8]>>>,
    len_bytes: Mutex<u64>,
}

impl SparseMemDevice {
    pub fn new() -> SparseMemDevice {
        SparseMemDevice {
            pages: Mutex::new(HashMap::new()),
            len_bytes: Mutex::new(0),
        }
    }
}

/// Calls `f(page, offset in the page, range of the buffer)` for each page
/// that `len` bytes from `offset` touch.
fn for_each_page(offset: u64, len: usize, mut f: impl FnMut(u64, usize, std::ops::Range<usize>)) {
    let mut done = 0usize;
    while done < len {
        let position = offset + done as u64;
        let in_page = (position % PAGE_BYTES) as usize;
        let n = (PAGE_BYTES as usize - in_page).min(len - done);
        f(position / PAGE_BYTES, in_page, done..done + n);
        done += n;
    }
}

impl BlockDevice for SparseMemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let pages = self.pages.lock().expect("pages");
        for_each_page(offset, buf.len(), |page, in_page, range| {
            let n = range.len();
            match pages.get(&page) {
                Some(bytes) => buf[range].copy_from_slice(&bytes[in_page..in_page + n]),
                None => buf[range].fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut pages = self.pages.lock().expect("pages");
        for_each_page(offset, buf.len(), |page, in_page, range| {
            let n = range.len();
            let data = &buf[range];
            let zero = data.iter().all(|&b| b == 0);
            match pages.get_mut(&page) {
                Some(bytes) => {
                    bytes[in_page..in_page + n].copy_from_slice(data);
                    if bytes.iter().all(|&b| b == 0) {
                        pages.remove(&page);
                    }
                }
                None if zero => {}
                None => {
                    let mut bytes = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
                    bytes[in_page..in_page + n].copy_from_slice(data);
                    pages.insert(page, bytes);
                }
            }
        });
        let mut len = self.len_bytes.lock().expect("len");
        *len = (*len).max(offset + buf.len() as u64);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len_bytes(&self) -> io::Result<u64> {
        Ok(*self.len_bytes.lock().expect("len"))
    }

    fn set_len_bytes(&self, len_bytes: u64) -> io::Result<()> {
        *self.len_bytes.lock().expect("len") = len_bytes;
        Ok(())
    }

    fn describe(&self) -> String {
        "sparse memory device".into()
    }
}
