//! Recovery is idempotent and survives its own crash: a store whose journal
//! holds transactions that no checkpoint has absorbed is opened on a
//! recording device; a power cut at every point of that open (replay, then
//! checkpoint), followed by another open, gives exactly the same volumes.

mod common;
use common::contents;
use std::path::Path;
use std::sync::Arc;

use grove_store::testing::{CrashDevice, CrashImages, WriteFate};
use grove_store::{MemDevice, Pool, PoolOptions};

#[test]
fn a_crash_during_replay_replays_to_the_same_state() {
    let dir = Path::new("replay");
    // A store with committed but un-checkpointed transactions.
    let device = Arc::new(CrashDevice::new());
    let options = PoolOptions {
        block_size_bytes: 1024,
        capacity_bytes: None,
        journal_bytes: Some(256 * 1024),
    };
    let pool = Pool::format(device.clone(), &options, dir, None).unwrap();
    pool.create_volume("a", 512 * 1024).unwrap();
    let a = pool.volume("a").unwrap();
    for i in 0..40u64 {
        a.write_at(&[i as u8 + 1; 3000], i * 12_000).unwrap();
    }
    a.flush().unwrap();
    pool.snapshot("a", "s").unwrap();
    a.discard(100_000, 200_000).unwrap();
    a.write_at(&[0xee; 5000], 150_000).unwrap();
    a.flush().unwrap();
    let crashed = device.to_bytes();
    drop(a);
    std::mem::forget(pool); // no clean close: the journal stays unabsorbed

    // The reference: replay once, all the way.
    let reference_pool =
        Pool::open_device(Arc::new(MemDevice::from_bytes(crashed.clone())), dir, None).unwrap();
    let reference = contents(&reference_pool);
    assert_eq!(reference.len(), 2);

    // Replay again on a recording device, and cut power everywhere in it.
    let recording = Arc::new(CrashDevice::from_bytes(crashed.clone()));
    let reopened = Pool::open_device(recording.clone(), dir, None).unwrap();
    assert_eq!(
        contents(&reopened),
        reference,
        "a second replay of the same store differs"
    );
    let ops = recording.ops();
    assert!(
        ops.len() > 10,
        "the open wrote little: was there anything to replay?"
    );
    let mut images = CrashImages::with_base(crashed, ops.clone());
    let mut checked = 0;
    for position in 0..=ops.len() {
        for fate in [
            WriteFate::Lost,
            WriteFate::Landed,
            WriteFate::Torn(0x5555_5555_5555_5555),
        ] {
            let image = images.image(position, |_| fate);
            let pool = Pool::open_device(Arc::new(MemDevice::from_bytes(image)), dir, None)
                .unwrap_or_else(|e| panic!("crash at {position} of the replay ({fate:?}): {e}"));
            assert!(
                pool.check(false).unwrap().is_clean(),
                "crash at {position} of the replay ({fate:?})"
            );
            assert_eq!(
                contents(&pool),
                reference,
                "crash at {position} of the replay ({fate:?})"
            );
            checked += 1;
        }
    }
    println!("{checked} crash states during replay");
}
