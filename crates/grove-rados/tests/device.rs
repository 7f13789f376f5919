//! RadosDevice against the real cluster of scripts/ceph.sh: the BlockDevice
//! contract against the in-memory model, thin objects, punching, and the
//! exclusive lock's refusal of a second opener.

mod common;

use common::{fresh_target, object_sizes};
use grove_rados::{Claim, RadosDevice};
use grove_store::{BlockDevice, MemDevice};

/// A small object size, so that requests cross object boundaries often.
const SMALL_OBJECTS: u64 = 16 << 10;

/// xorshift64*: deterministic, so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn assert_same(device: &RadosDevice, model: &MemDevice, offset: u64, len: usize, step: usize) {
    let mut got = vec![0xaa; len];
    let mut want = vec![0x55; len];
    device.read_at(&mut got, offset).unwrap();
    model.read_at(&mut want, offset).unwrap();
    assert!(
        got == want,
        "step {step}: {len} bytes at {offset} differ from the model"
    );
}

/// A punch, after which every byte of the range reads as zero or as
/// before (the contract: the device zeroes what it gives back and may
/// leave the rest); the model then takes what the device reads.
fn punch_within_contract(
    device: &RadosDevice,
    model: &MemDevice,
    offset: u64,
    len: usize,
    step: usize,
) {
    device.punch(offset, len as u64).unwrap();
    let mut before = vec![0u8; len];
    model.read_at(&mut before, offset).unwrap();
    let mut after = vec![0u8; len];
    device.read_at(&mut after, offset).unwrap();
    let kept_or_zero = after.iter().zip(&before).all(|(a, b)| *a == 0 || a == b);
    assert!(
        kept_or_zero,
        "step {step}: a punch at {offset} changed bytes"
    );
    // Past the length the model stays short: writing would grow it.
    let model_len = model.len_bytes().unwrap();
    let inside = model_len.saturating_sub(offset).min(len as u64) as usize;
    model.write_at(&after[..inside], offset).unwrap();
}

/// Several reads handed over at once (`read_each_at`, and
/// `read_written_each_at` where every byte was written) read what one
/// read at a time does.
fn assert_same_at_once(
    device: &RadosDevice,
    model: &MemDevice,
    rng: &mut Rng,
    span: u64,
    step: usize,
) {
    let places: Vec<(u64, usize)> = (0..1 + rng.below(5))
        .map(|_| (rng.below(span), 1 + rng.below(2 * SMALL_OBJECTS) as usize))
        .collect();
    let mut bufs: Vec<Vec<u8>> = places.iter().map(|&(_, len)| vec![0xaa; len]).collect();
    let mut reads: Vec<(u64, &mut [u8])> = places
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&(offset, _), buf)| (offset, buf.as_mut_slice()))
        .collect();
    device.read_each_at(&mut reads).unwrap();
    for (&(offset, len), got) in places.iter().zip(&bufs) {
        let mut want = vec![0x55; len];
        model.read_at(&mut want, offset).unwrap();
        assert!(
            got == &want,
            "step {step}: {len} bytes at {offset}, read at once"
        );
    }
    // Every byte of the first object was written: read_written agrees.
    let head = model.len_bytes().unwrap().min(SMALL_OBJECTS);
    let mut written = vec![1u8; head as usize];
    model.write_at(&written, 0).unwrap();
    device.write_at(&written, 0).unwrap();
    let (first, second) = written.split_at_mut(head as usize / 2);
    let mut reads = [(0, first), (head / 2, second)];
    device.read_written_each_at(&mut reads).unwrap();
    assert!(
        written.iter().all(|&b| b == 1),
        "step {step}: read_written at once"
    );
}

/// Up to 6 writes that do not overlap, from `offset` on: some neighbours
/// (which the device merges), some with gaps, crossing objects, handed
/// over out of order.
fn batch_of_writes(rng: &mut Rng, offset: u64, step: usize) -> Vec<(u64, Vec<u8>)> {
    let mut at = offset;
    let mut batch = Vec::new();
    for i in 0..1 + rng.below(6) {
        let len = 1 + rng.below(SMALL_OBJECTS) as usize;
        let fill = (step as u8).wrapping_mul(7).wrapping_add(i as u8);
        batch.push((at, (0..len).map(|k| fill ^ k as u8).collect()));
        at += len as u64
            + if rng.below(2) == 0 {
                0
            } else {
                rng.below(4096)
            };
    }
    batch.reverse();
    batch
}

/// Random writes (alone and in batches), reads, punches and length
/// changes, each checked against
/// MemDevice, then the whole device again after closing and reopening.
#[test]
fn random_operations_match_the_in_memory_model() {
    let Some(target) = fresh_target("model") else {
        return;
    };
    let device = RadosDevice::open_exclusive(
        &target,
        Claim::Create {
            object_size: SMALL_OBJECTS,
        },
    )
    .unwrap();
    let model = MemDevice::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let span = 12 * SMALL_OBJECTS;
    for step in 0..400 {
        let offset = rng.below(span);
        let len = 1 + rng.below(3 * SMALL_OBJECTS) as usize;
        match rng.below(10) {
            0..=3 => {
                let fill = (step % 251) as u8 + 1;
                let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                device.write_at(&data, offset).unwrap();
                model.write_at(&data, offset).unwrap();
            }
            4 => {
                let data = vec![step as u8; len];
                device.write_durable_at(&data, offset).unwrap();
                model.write_durable_at(&data, offset).unwrap();
            }
            5 | 6 => punch_within_contract(&device, &model, offset, len, step),
            8 => {
                let batch = batch_of_writes(&mut rng, offset, step);
                let writes: Vec<(u64, &[u8])> =
                    batch.iter().map(|(o, d)| (*o, d.as_slice())).collect();
                for result in device.write_each_at(&writes) {
                    result.unwrap();
                }
                for result in model.write_each_at(&writes) {
                    result.unwrap();
                }
            }
            7 if step % 5 == 0 => {
                let new_len = rng.below(span);
                device.set_len_bytes(new_len).unwrap();
                model.set_len_bytes(new_len).unwrap();
            }
            _ => {}
        }
        assert_eq!(
            device.len_bytes().unwrap(),
            model.len_bytes().unwrap(),
            "step {step}"
        );
        let (read_at, read_len) = (
            rng.below(span + SMALL_OBJECTS),
            1 + rng.below(2 * SMALL_OBJECTS) as usize,
        );
        assert_same(&device, &model, read_at, read_len, step);
        if step % 4 == 0 {
            assert_same_at_once(&device, &model, &mut rng, span, step);
        }
    }
    device.flush().unwrap();
    drop(device);
    let again = RadosDevice::open_exclusive(&target, Claim::Open).unwrap();
    assert_eq!(again.object_size(), SMALL_OBJECTS);
    assert_eq!(again.len_bytes().unwrap(), model.len_bytes().unwrap());
    assert_same(&again, &model, 0, (span + SMALL_OBJECTS) as usize, 400);
}

/// Objects exist only where written; punching removes whole objects,
/// truncates tails, leaves middles alone, and never creates one.
#[test]
fn objects_exist_only_where_written_and_punches_give_them_back() {
    let Some(target) = fresh_target("thin") else {
        return;
    };
    let size = 64 << 10;
    let device = RadosDevice::open_exclusive(&target, Claim::Create { object_size: size }).unwrap();
    device.write_at(&[7; 4096], 3 * size + 100).unwrap();
    device.write_at(&[9; 4096], 10 * size).unwrap();
    device.write_at(&[9; 4096], 10 * size + 8192).unwrap();
    assert_eq!(device.len_bytes().unwrap(), 10 * size + 8192 + 4096);
    let mut sizes = vec![None; 12];
    sizes[3] = Some(100 + 4096);
    sizes[10] = Some(8192 + 4096);
    assert_eq!(object_sizes(&target, 12), sizes);

    // A punch over objects that do not exist creates none.
    device.punch(0, 3 * size).unwrap();
    // A whole object goes; a tail is truncated; a middle is left as it
    // is (zeroing it would give nothing back: BlueStore keeps zeros).
    device.punch(3 * size, size).unwrap();
    device.punch(10 * size + 8192, size - 8192).unwrap();
    device.punch(10 * size, 4096).unwrap();
    sizes[3] = None;
    sizes[10] = Some(8192);
    assert_eq!(object_sizes(&target, 12), sizes);
    let mut back = vec![1u8; 3 * 4096];
    device.read_at(&mut back, 10 * size).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 9), "the middle is kept");
    assert!(back[4096..].iter().all(|&b| b == 0));
    // A punch that ends at the object's current size but not at the
    // object's end is a middle too, not truncated: a block after it may
    // be being written at that moment, and a truncation would cut it off.
    device.write_at(&[5; 4096], 5 * size).unwrap();
    device.write_at(&[6; 4096], 5 * size + 8192).unwrap();
    device.punch(5 * size + 8192, 4096).unwrap();
    sizes[5] = Some(8192 + 4096);
    assert_eq!(object_sizes(&target, 12), sizes);
    // The length never changes on a punch.
    assert_eq!(device.len_bytes().unwrap(), 10 * size + 8192 + 4096);
}

/// A second opener is refused with one line naming the holder; once the
/// holder closes, it opens.
#[test]
fn a_second_opener_is_refused_with_the_holder_named() {
    let Some(target) = fresh_target("second") else {
        return;
    };
    let first = RadosDevice::open_exclusive(
        &target,
        Claim::Create {
            object_size: 1 << 20,
        },
    )
    .unwrap();
    first.write_at(b"held", 0).unwrap();
    let err = match RadosDevice::open_exclusive(&target, Claim::Open) {
        Ok(_) => panic!("a second opener got the device"),
        Err(e) => e.to_string(),
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for part in [
        target.location(),
        format!("host {}", host.trim()),
        format!("pid {}", std::process::id()),
        "since 20".to_string(),
        "client.".to_string(),
        "--takeover".to_string(),
    ] {
        assert!(err.contains(&part), "{part:?} missing from: {err}");
    }
    assert!(!err.contains('\n'), "{err}");
    let again = RadosDevice::open_exclusive(
        &target,
        Claim::Create {
            object_size: 1 << 20,
        },
    );
    assert!(again.is_err(), "a create over a held device succeeded");
    drop(first);
    let second = RadosDevice::open_exclusive(&target, Claim::Open).unwrap();
    let mut back = [0u8; 4];
    second.read_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"held");
    let exists = RadosDevice::open_exclusive(
        &target,
        Claim::Create {
            object_size: 1 << 20,
        },
    );
    assert!(exists.is_err());
}

/// The room the engine sees is the RADOS pool's (`ceph df`), not the local
/// file system's.
#[test]
fn the_room_to_grow_is_the_rados_pools() {
    let Some(target) = fresh_target("space") else {
        return;
    };
    let device = RadosDevice::open_exclusive(
        &target,
        Claim::Create {
            object_size: 1 << 20,
        },
    )
    .unwrap();
    let space = device.host_space().expect("the monitor answered ceph df");
    assert!(
        space.available_bytes > 0 && space.total_bytes >= space.available_bytes,
        "{space:?}"
    );
    // scripts/ceph.sh's OSD is a 10 GiB file: the pool cannot offer more.
    assert!(space.available_bytes <= 10 << 30, "{space:?}");
    assert_eq!(
        device.host_space(),
        Some(space),
        "a second ask within seconds is the cached answer"
    );
}

/// grove serve runs as many requests per connection as the pool's device
/// reports: on RADOS, where each waits for a round trip, more than on a
/// file.
#[test]
fn a_rados_device_takes_more_requests_at_once_than_a_file() {
    let Some(target) = fresh_target("queue-depth") else {
        return;
    };
    let device = RadosDevice::open_exclusive(
        &target,
        Claim::Create {
            object_size: 1 << 20,
        },
    )
    .unwrap();
    let file_like = MemDevice::new().queue_depth();
    assert_eq!(
        file_like, 4,
        "the default, grove serve's for a pool of files"
    );
    assert_eq!(device.queue_depth(), 16);
}
