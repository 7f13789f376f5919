//! Moving bytes between volumes and files: import, export, write and read.
//! All of them stream in chunks of `CHUNK_BYTES`, so memory stays flat
//! whatever the volume size, and import and export skip zero blocks so that
//! holes stay holes on both sides.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Read, Seek, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use grove_store::types::{BLOCK_SIZE_MAX_BYTES, SECTOR_BYTES};
use grove_store::{Pool, Volume};

use crate::output::format_size;
use crate::progress::Progress;

/// Bytes moved per read or write call: large enough that per-call costs
/// vanish, small enough to keep memory flat. A multiple of every block size.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Bytes OR-ed together per step when testing for zeros: wide enough for
/// the compiler to vectorize the inner loop.
const ZERO_SCAN_STRIDE_BYTES: usize = 64;

const _: () = assert!(
    CHUNK_BYTES.is_multiple_of(BLOCK_SIZE_MAX_BYTES as usize),
    "chunks must hold whole blocks"
);

/// `grove import`: a new volume sized to FILE, holding its non-zero blocks.
pub fn import(pool: &Pool, name: &str, path: &Path) -> Result<u64> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let file_bytes = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    // Volume sizes are whole sectors: round the file up to one.
    let size_bytes = file_bytes.div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
    pool.create_volume(name, size_bytes)
        .with_context(|| format!("cannot import {}", path.display()))?;
    let copied = pool
        .volume(name)
        .map_err(anyhow::Error::from)
        .and_then(|volume| copy_file_into(&file, path, file_bytes, &volume, pool));
    if let Err(copy_error) = copied {
        // A half-copied volume would look like a good one in `grove list`.
        let context = match pool.remove_volume(name) {
            Ok(_) => format!(
                "cannot import {} into volume {name:?} (the partial volume was removed)",
                path.display()
            ),
            Err(remove_error) => format!(
                "cannot import {} into volume {name:?}, and removing the partial volume failed \
                 too ({remove_error})",
                path.display()
            ),
        };
        return Err(copy_error.context(context));
    }
    Ok(size_bytes)
}

fn copy_file_into(
    file: &File,
    path: &Path,
    file_bytes: u64,
    volume: &Volume,
    pool: &Pool,
) -> Result<()> {
    let block_bytes = u64::from(pool.block_size_bytes());
    let progress = Progress::bytes("importing", file_bytes);
    let read_context = || format!("cannot read {}", path.display());
    // Everything before `position` is in the volume or is a hole.
    let mut position = 0u64;
    while position < file_bytes {
        let Some((data_start, data_end)) =
            next_data(file, position, file_bytes).with_context(read_context)?
        else {
            break;
        };
        // The file system's blocks may be smaller than the volume's: widen
        // the range to whole volume blocks, so every piece tested for zeros
        // is one volume block, without going back over what is done.
        let start = (data_start / block_bytes * block_bytes).max(position);
        let end = data_end
            .div_ceil(block_bytes)
            .saturating_mul(block_bytes)
            .min(file_bytes);
        let copied_to = copy_range(file, start, end, volume, block_bytes, &progress)
            .with_context(read_context)?;
        if copied_to < end {
            break; // The file shrank while we read it: the rest stays a hole.
        }
        position = end;
        progress.set_position(position);
    }
    volume.flush()?;
    Ok(())
}

/// Copies the non-zero volume blocks of file range [start, end) into the
/// volume. `start` is block-aligned. Returns where the copy stopped: `end`,
/// or sooner if the file ended early.
fn copy_range(
    file: &File,
    start: u64,
    end: u64,
    volume: &Volume,
    block_bytes: u64,
    progress: &Progress,
) -> Result<u64> {
    debug_assert!(start.is_multiple_of(block_bytes));
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut offset = start;
    while offset < end {
        let len = (end - offset).min(CHUNK_BYTES as u64) as usize;
        let filled = read_full_at(file, &mut chunk[..len], offset)?;
        for (run_start, run_len) in nonzero_runs(&chunk[..filled], block_bytes as usize) {
            volume.write_at(
                &chunk[run_start..run_start + run_len],
                offset + run_start as u64,
            )?;
        }
        offset += filled as u64;
        progress.set_position(offset);
        if filled < len {
            break;
        }
    }
    Ok(offset)
}

/// The next range of `file` at or after `from` that may hold data, below
/// `file_bytes`, as (start, end); None when only holes remain. Uses
/// SEEK_DATA and SEEK_HOLE, so a 10 GiB image with 100 MiB of data reads
/// 100 MiB, not 10 GiB of zeros.
fn next_data(file: &File, from: u64, file_bytes: u64) -> io::Result<Option<(u64, u64)>> {
    use rustix::fs::{seek, SeekFrom};
    use rustix::io::Errno;
    let start = match seek(file, SeekFrom::Data(from)) {
        Ok(start) if start < file_bytes => start,
        Ok(_) | Err(Errno::NXIO) => return Ok(None),
        // No hole support here (some file systems, devices): all is data.
        Err(Errno::INVAL | Errno::OPNOTSUPP | Errno::SPIPE) => return Ok(Some((from, file_bytes))),
        Err(errno) => return Err(errno.into()),
    };
    let end = match seek(file, SeekFrom::Hole(start)) {
        Ok(end) => end.clamp(start + 1, file_bytes),
        Err(errno) => return Err(errno.into()),
    };
    Ok(Some((start, end)))
}

/// Reads `buf` from `offset` until it is full or the file ends; returns
/// the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// What `grove export` wrote: the volume's size, its data, and whether
/// FILE was this process's standard output (where no report may go).
pub struct Exported {
    pub size_bytes: u64,
    pub data_bytes: u64,
    pub to_stdout: bool,
}

/// Where an export goes, decided before anything is written.
enum ExportTarget {
    /// A regular file, new or (with --force) truncated: written sparse.
    File(File),
    /// A block device, pipe or character device (/dev/stdout): written in
    /// order, zeros included, as nothing there reads holes as zeros.
    Stream(File),
}

/// `grove export`: the volume as a raw image in FILE. An existing regular
/// file is only replaced with `force`: a mistyped name must not destroy an
/// image. A block device, pipe or /dev/stdout (whatever stdout was
/// redirected to) is a target the user named on purpose, as with dd, and
/// is written without it.
pub fn export(pool: &Pool, name: &str, path: &Path, force: bool) -> Result<Exported> {
    // Everything that can fail on the pool side is asked before FILE is
    // touched, so a bad name does not truncate someone's file.
    let volume = pool.volume(name)?;
    let size_bytes = volume.size_bytes()?;
    let extents = volume.mapped_extents()?;
    let block_bytes = pool.block_size_bytes() as usize;
    let write_context = || format!("cannot write {}", path.display());
    let to_stdout = is_stdout(path);
    let (file, data_bytes) = match open_export_target(path, force, to_stdout, size_bytes)? {
        ExportTarget::File(file) => {
            file.set_len(size_bytes).with_context(write_context)?;
            let data_bytes = export_sparse(&volume, extents, &file, block_bytes, path)?;
            (file, data_bytes)
        }
        ExportTarget::Stream(file) => {
            let data_bytes = export_stream(&volume, size_bytes, &file, block_bytes, path)?;
            (file, data_bytes)
        }
    };
    // A pipe or a terminal cannot sync; only what can be made durable is.
    if let Err(e) = file.sync_all() {
        if e.kind() != ErrorKind::InvalidInput {
            return Err(e).with_context(write_context);
        }
    }
    Ok(Exported {
        size_bytes,
        data_bytes,
        to_stdout,
    })
}

fn open_export_target(
    path: &Path,
    force: bool,
    to_stdout: bool,
    size_bytes: u64,
) -> Result<ExportTarget> {
    use std::os::unix::fs::FileTypeExt;
    let create_context = || format!("cannot create {}", path.display());
    let metadata = match std::fs::metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            // create_new: a file that appears meanwhile is not truncated.
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .with_context(create_context)?;
            return Ok(ExportTarget::File(file));
        }
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", path.display())),
        Ok(metadata) => metadata,
    };
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        bail!(
            "{} is a directory: name an image file to write",
            path.display()
        );
    }
    // `grove export v /dev/stdout > v.img`: the shell has already made
    // (and emptied) the file the user chose, so it is written, in order.
    if file_type.is_file() && !to_stdout {
        if !force {
            bail!(
                "{} already exists ({}); add --force to overwrite it",
                path.display(),
                format_size(metadata.len())
            );
        }
        let file = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)
            .with_context(create_context)?;
        return Ok(ExportTarget::File(file));
    }
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if file_type.is_block_device() {
        let device_bytes = file
            .seek(io::SeekFrom::End(0))
            .and_then(|len| file.rewind().map(|()| len))
            .with_context(|| format!("cannot size {}", path.display()))?;
        if device_bytes < size_bytes {
            bail!(
                "{} holds {}, less than the volume's {}",
                path.display(),
                format_size(device_bytes),
                format_size(size_bytes)
            );
        }
    }
    Ok(ExportTarget::Stream(file))
}

/// Whether `path` is this process's standard output (`/dev/stdout`, or the
/// file stdout was redirected to).
fn is_stdout(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(target) = std::fs::metadata(path) else {
        return false;
    };
    match rustix::fs::fstat(io::stdout().as_fd()) {
        Ok(stdout) => stdout.st_dev == target.dev() && stdout.st_ino == target.ino(),
        Err(_) => false,
    }
}

/// The mapped extents' non-zero blocks, at their offsets; the rest stays a
/// hole. Returns the bytes of data written.
fn export_sparse(
    volume: &Volume,
    extents: Vec<(u64, u64)>,
    file: &File,
    block_bytes: usize,
    path: &Path,
) -> Result<u64> {
    let write_context = || format!("cannot write {}", path.display());
    let mapped_bytes = extents.iter().map(|(_, len)| len).sum();
    let progress = Progress::bytes("exporting", mapped_bytes);
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut written_bytes = 0u64;
    for (extent_start, extent_len) in extents {
        let mut done = 0u64;
        while done < extent_len {
            let len = (extent_len - done).min(CHUNK_BYTES as u64) as usize;
            let offset = extent_start + done;
            volume.read_at(&mut chunk[..len], offset)?;
            // Extents start on block boundaries and chunks hold whole
            // blocks, so these runs are block-aligned in the volume.
            for (start, run) in nonzero_runs(&chunk[..len], block_bytes) {
                file.write_all_at(&chunk[start..start + run], offset + start as u64)
                    .with_context(write_context)?;
                written_bytes += run as u64;
            }
            done += len as u64;
            progress.advance(len as u64);
        }
    }
    Ok(written_bytes)
}

/// Every byte of the volume in order, zeros included. Returns the bytes of
/// data (non-zero blocks) among them.
fn export_stream(
    volume: &Volume,
    size_bytes: u64,
    file: &File,
    block_bytes: usize,
    path: &Path,
) -> Result<u64> {
    let progress = Progress::bytes("exporting", size_bytes);
    let mut writer = io::BufWriter::with_capacity(CHUNK_BYTES, file);
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut data_bytes = 0u64;
    let mut offset = 0u64;
    while offset < size_bytes {
        let len = (size_bytes - offset).min(CHUNK_BYTES as u64) as usize;
        volume.read_at(&mut chunk[..len], offset)?;
        data_bytes += nonzero_runs(&chunk[..len], block_bytes)
            .iter()
            .map(|&(_, run)| run as u64)
            .sum::<u64>();
        writer
            .write_all(&chunk[..len])
            .with_context(|| format!("cannot write {}", path.display()))?;
        offset += len as u64;
        progress.advance(len as u64);
    }
    writer
        .flush()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(data_bytes)
}

/// `grove write`: bytes from FILE (or stdin when None or `-`) at `offset`.
/// Returns the bytes written.
/// A volume's bytes as `grove read` and `grove write` move them: the
/// volume itself where the pool is open here, or one reached through the
/// control socket of the daemon that holds the pool (control.rs).
pub trait VolumeBytes {
    fn size_bytes(&self) -> grove_store::Result<u64>;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> grove_store::Result<()>;
    fn write_at(&self, data: &[u8], offset: u64) -> grove_store::Result<()>;
    fn flush(&self) -> grove_store::Result<()>;
}

impl VolumeBytes for Volume {
    fn size_bytes(&self) -> grove_store::Result<u64> {
        Volume::size_bytes(self)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> grove_store::Result<()> {
        Volume::read_at(self, buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> grove_store::Result<()> {
        Volume::write_at(self, data, offset)
    }
    fn flush(&self) -> grove_store::Result<()> {
        Volume::flush(self)
    }
}

pub fn write(
    volume: &dyn VolumeBytes,
    name: &str,
    offset: u64,
    input: Option<&Path>,
) -> Result<u64> {
    // An empty write makes the engine refuse a read-only snapshot or an
    // offset past the end with its own message, before any input is read.
    volume.write_at(&[], offset)?;
    let size_bytes = volume.size_bytes()?;
    let (mut reader, what, known_bytes) = open_input(input)?;
    if let Some(len) = known_bytes {
        // A file's length is known, so a write past the end is refused
        // before any of it lands.
        ensure_in_volume("write", name, offset, len, size_bytes)?;
    }
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut done = 0u64;
    loop {
        let filled =
            read_full(&mut reader, &mut chunk).with_context(|| format!("cannot read {what}"))?;
        if filled == 0 {
            break;
        }
        // A pipe's length shows only as it arrives: refuse the chunk that
        // would cross the end, and say what was already written.
        if offset + done + filled as u64 > size_bytes {
            bail!(
                "write at offset {offset} runs past the end of volume {name:?} ({size_bytes} \
                 bytes): {what} holds more than the {} bytes that fit; the first {done} bytes \
                 were written",
                size_bytes - offset
            );
        }
        volume.write_at(&chunk[..filled], offset + done)?;
        done += filled as u64;
    }
    volume.flush()?;
    Ok(done)
}

/// `grove read`: `length` bytes from `offset` (default: to the end) to stdout.
pub fn read(volume: &dyn VolumeBytes, name: &str, offset: u64, length: Option<u64>) -> Result<()> {
    let size_bytes = volume.size_bytes()?;
    let length = match length {
        Some(length) => length,
        None if offset <= size_bytes => size_bytes - offset,
        None => bail!(
            "offset {offset} is past the end of volume {name:?} ({size_bytes} bytes, {})",
            format_size(size_bytes)
        ),
    };
    ensure_in_volume("read", name, offset, length, size_bytes)?;
    let mut stdout = io::stdout().lock();
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut done = 0u64;
    while done < length {
        let len = (length - done).min(CHUNK_BYTES as u64) as usize;
        volume.read_at(&mut chunk[..len], offset + done)?;
        match stdout.write_all(&chunk[..len]) {
            // The reader went away (`grove read v | head`): stop quietly,
            // as cat does.
            Err(e) if e.kind() == ErrorKind::BrokenPipe => return Ok(()),
            result => result.context("cannot write to standard output")?,
        }
        done += len as u64;
    }
    match stdout.flush() {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        result => result.context("cannot write to standard output"),
    }
}

/// The reader for `grove write`, a name for messages, and the input length
/// when it is a regular file (stdin redirected from a file counts too).
fn open_input(input: Option<&Path>) -> Result<(File, String, Option<u64>)> {
    let (mut file, what) = match input {
        Some(path) if path != Path::new("-") => (
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
            path.display().to_string(),
        ),
        _ => {
            let fd = io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .context("cannot use standard input")?;
            (File::from(fd), "standard input".to_string())
        }
    };
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot stat {what}"))?;
    let known_bytes = if metadata.is_file() {
        // Stdin may already be part-way into its file.
        let position = file.stream_position().unwrap_or(0);
        Some(metadata.len().saturating_sub(position))
    } else {
        None
    };
    Ok((file, what, known_bytes))
}

/// Refuses a range that does not lie inside the volume, in the engine's words.
fn ensure_in_volume(what: &str, name: &str, offset: u64, len: u64, size_bytes: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size_bytes => Ok(()),
        _ => bail!(
            "{what} of {len} bytes at offset {offset} runs past the end of volume {name:?} \
             ({size_bytes} bytes, {})",
            format_size(size_bytes)
        ),
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
/// Pipes and terminals hand over data in small pieces, and a short read
/// must not leave a gap in the volume.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Runs of `buf` that hold data, as (start, length), with every piece of
/// `piece_bytes` (from the start of `buf`) that is all zeros left out.
/// Adjacent data pieces are merged, so a dense buffer is one run.
fn nonzero_runs(buf: &[u8], piece_bytes: usize) -> Vec<(usize, usize)> {
    assert!(piece_bytes > 0);
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (index, piece) in buf.chunks(piece_bytes).enumerate() {
        if is_zero(piece) {
            continue;
        }
        let start = index * piece_bytes;
        match runs.last_mut() {
            Some((run_start, run_len)) if *run_start + *run_len == start => *run_len += piece.len(),
            _ => runs.push((start, piece.len())),
        }
    }
    runs
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes
        .chunks(ZERO_SCAN_STRIDE_BYTES)
        .all(|stride| stride.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_skip_zero_pieces_and_merge_neighbours() {
        let mut buf = vec![0u8; 10 * 4];
        assert_eq!(nonzero_runs(&buf, 4), vec![]);
        buf[0] = 1; // piece 0
        buf[7] = 1; // piece 1
        buf[20] = 1; // piece 5
        buf[39] = 1; // piece 9
        assert_eq!(nonzero_runs(&buf, 4), vec![(0, 8), (20, 4), (36, 4)]);
    }

    #[test]
    fn runs_handle_a_short_last_piece() {
        let mut buf = vec![0u8; 10];
        buf[9] = 1;
        assert_eq!(nonzero_runs(&buf, 4), vec![(8, 2)]);
        assert_eq!(nonzero_runs(&[1, 1, 1], 4), vec![(0, 3)]);
    }

    #[test]
    fn zero_scan() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 1000]));
        let mut buf = [0u8; 1000];
        buf[999] = 0x80;
        assert!(!is_zero(&buf));
    }

    #[test]
    fn read_full_gathers_short_reads() {
        struct Trickle(Vec<u8>);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() || buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0.remove(0);
                Ok(1)
            }
        }
        let mut buf = [0u8; 4];
        let mut trickle = Trickle(vec![1, 2, 3, 4, 5]);
        assert_eq!(read_full(&mut trickle, &mut buf).unwrap(), 4);
        assert_eq!(buf, [1, 2, 3, 4]);
        assert_eq!(read_full(&mut trickle, &mut buf).unwrap(), 1);
    }
}
