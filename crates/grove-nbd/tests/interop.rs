//! Real NBD clients against a server started in this process on a unix
//! socket: qemu-img, qemu-io, nbdinfo, nbdcopy and fio's nbd engine. A test
//! whose tool is missing says so and passes; scripts/test.sh installs them
//! (Debian packages qemu-utils, libnbd-bin, fio).

mod common;

use std::process::Command;

use common::{have, pattern, run, skip, stdout, TestServer};
use grove_nbd::ServerOptions;

const MIB: u64 = 1024 * 1024;

/// A raw image with data at a few places and holes elsewhere.
fn sparse_image(path: &std::path::Path, size: u64) -> Vec<u8> {
    let mut image = vec![0u8; size as usize];
    for (offset, len, seed) in [
        (0u64, 64 * 1024usize, 1u64),
        (3 * MIB, 200_000, 2),
        (size - 4096, 4096, 3),
    ] {
        image[offset as usize..offset as usize + len].copy_from_slice(&pattern(len, seed));
    }
    std::fs::write(path, &image).unwrap();
    image
}

#[test]
fn qemu_img_convert_into_an_export_and_back_is_byte_identical() {
    if !have("qemu-img") {
        return;
    }
    let size = 8 * MIB;
    let t = TestServer::start(&[("disk", size)], ServerOptions::default());
    let source = t.dir.path().join("source.img");
    let image = sparse_image(&source, size);
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&source)
        .arg(t.uri("disk")));
    assert!(
        t.read_volume("disk", 0, size as usize) == image,
        "the volume holds the image"
    );
    let back = t.dir.path().join("back.img");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(t.uri("disk"))
        .arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == image,
        "the image read back is identical"
    );
}

#[test]
fn qemu_img_map_and_nbdinfo_map_show_the_holes() {
    let size = 8 * MIB;
    let t = TestServer::start(&[("disk", size)], ServerOptions::default());
    let volume = t.pool.volume("disk").unwrap();
    volume.write_at(&pattern(MIB as usize, 7), MIB).unwrap();
    volume.write_at(&pattern(4096, 8), 6 * MIB).unwrap();
    volume.flush().unwrap();

    if have("qemu-img") {
        let out = run(Command::new("qemu-img")
            .args(["map", "--output=json", "-f", "raw"])
            .arg(t.uri("disk")));
        let map: Vec<serde_json::Value> =
            serde_json::from_slice(&out.stdout).expect("qemu-img map JSON");
        // (start, length, data) of each extent, merging what qemu splits.
        let mut extents: Vec<(u64, u64, bool)> = Vec::new();
        for e in &map {
            let (start, length) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
            let data = e["data"].as_bool().unwrap();
            assert_eq!(
                e["zero"].as_bool().unwrap(),
                !data,
                "holes read as zeros: {e}"
            );
            match extents.last_mut() {
                Some(last) if last.2 == data && last.0 + last.1 == start => last.1 += length,
                _ => extents.push((start, length, data)),
            }
        }
        assert_eq!(
            extents,
            vec![
                (0, MIB, false),
                (MIB, MIB, true),
                (2 * MIB, 4 * MIB, false),
                (6 * MIB, 4096, true),
                (6 * MIB + 4096, 2 * MIB - 4096, false),
            ],
            "qemu-img map:\n{}",
            stdout(&out)
        );
    }
    if have("nbdinfo") {
        let out = run(Command::new("nbdinfo").arg("--map").arg(t.uri("disk")));
        let map = stdout(&out);
        let lines: Vec<Vec<&str>> = map
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let expected = [
            (0, MIB, 3),
            (MIB, MIB, 0),
            (2 * MIB, 4 * MIB, 3),
            (6 * MIB, 4096, 0),
            (6 * MIB + 4096, 2 * MIB - 4096, 3),
        ];
        assert_eq!(lines.len(), expected.len(), "nbdinfo --map:\n{map}");
        for (line, (offset, len, kind)) in lines.iter().zip(expected) {
            assert_eq!(line[0], offset.to_string(), "nbdinfo --map:\n{map}");
            assert_eq!(line[1], len.to_string(), "nbdinfo --map:\n{map}");
            assert_eq!(line[2], kind.to_string(), "nbdinfo --map:\n{map}");
        }
    }
}

#[test]
fn qemu_io_patterns_with_verification() {
    if !have("qemu-io") {
        return;
    }
    let t = TestServer::start(&[("disk", 16 * MIB)], ServerOptions::default());
    let commands = [
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        "write -P 0x5c 4097 3000",
        "read -P 0xab 0 4097",
        "read -P 0x5c 4097 3000",
        "discard 512k 256k",
        "read -P 0 512k 256k",
        "read -P 0xab 768k 256k",
        "write -P 0x11 2M 1M",
        "write -z 2M 64k",
        "read -P 0 2M 64k",
        "read -P 0x11 2112k 960k",
        // write-zeroes without unmap permission: real zeros (NO_HOLE).
        "write -P 0x22 4M 128k",
        "write -z -u 4M 64k",
        "read -P 0 4M 64k",
        "read -P 0x22 4160k 64k",
        // FUA writes and a flush.
        "write -f -P 0x33 8M 64k",
        "read -P 0x33 8M 64k",
        "flush",
        // The last byte of the export.
        "write -P 0x44 16383k 1k",
        "read -P 0x44 16383k 1k",
    ];
    // Zeroing by unmapping a range that starts and ends inside blocks: the
    // partial blocks must read as zeros too, and their neighbours keep data.
    let base = 6 * MIB;
    let (start, len) = (base + 1000, 10_000);
    let unaligned = [
        format!("write -P 0x66 {base} 64k"),
        format!("write -z -u {start} {len}"),
        format!("read -P 0x66 {base} 1000"),
        format!("read -P 0 {start} {len}"),
        format!(
            "read -P 0x66 {} {}",
            start + len,
            base + 65536 - start - len
        ),
    ];
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw"]);
    for c in commands.iter().map(|c| c.to_string()).chain(unaligned) {
        command.args(["-c", &c]);
    }
    command.arg(t.uri("disk"));
    let output = run(&mut command);
    let text = format!(
        "{}{}",
        stdout(&output),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !text.contains("failed") && !text.contains("error"),
        "qemu-io reported a failure:\n{text}"
    );
    // And the engine agrees with what qemu-io wrote.
    assert!(t
        .read_volume("disk", 0, 512 * 1024)
        .iter()
        .take(4097)
        .all(|&b| b == 0xab));
    assert!(t.read_volume("disk", 4097, 3000).iter().all(|&b| b == 0x5c));
    assert!(t
        .read_volume("disk", 512 * 1024, 256 * 1024)
        .iter()
        .all(|&b| b == 0));
    assert!(t
        .read_volume("disk", 8 * MIB, 64 * 1024)
        .iter()
        .all(|&b| b == 0x33));
}

#[test]
fn nbdcopy_between_two_exports() {
    if !have("nbdcopy") {
        return;
    }
    let size = 16 * MIB;
    let t = TestServer::start(&[("a", size), ("b", size)], ServerOptions::default());
    let a = t.pool.volume("a").unwrap();
    let data = pattern(3 * MIB as usize, 11);
    a.write_at(&data, 5 * MIB + 512).unwrap();
    a.write_at(&pattern(4096, 12), 0).unwrap();
    // Something in b that the copy must overwrite, including in a's holes.
    t.pool
        .volume("b")
        .unwrap()
        .write_at(&pattern(size as usize, 13), 0)
        .unwrap();
    run(Command::new("nbdcopy").arg(t.uri("a")).arg(t.uri("b")));
    assert!(
        t.read_volume("a", 0, size as usize) == t.read_volume("b", 0, size as usize),
        "b is a copy of a"
    );
}

#[test]
fn nbdinfo_lists_exports_and_details() {
    if !have("nbdinfo") {
        return;
    }
    let t = TestServer::start(
        &[("disk", 4 * MIB), ("other", MIB)],
        ServerOptions {
            default_export: Some("disk".into()),
            ..Default::default()
        },
    );
    t.pool.snapshot("disk", "disk@1").unwrap();
    let out = run(Command::new("nbdinfo")
        .arg("--list")
        .arg(format!("nbd+unix://?socket={}", t.socket.display())));
    let list = stdout(&out);
    for name in ["disk", "other", "disk@1"] {
        assert!(
            list.contains(&format!("export=\"{name}\"")),
            "nbdinfo --list shows {name}:\n{list}"
        );
    }
    assert!(
        list.contains("snapshot of disk"),
        "descriptions are listed:\n{list}"
    );

    // The empty name is the default export.
    let out =
        run(Command::new("nbdinfo").arg(format!("nbd+unix://?socket={}", t.socket.display())));
    let info = stdout(&out);
    assert!(
        info.contains("export-size: 4194304"),
        "default export info:\n{info}"
    );
    assert!(info.contains("can_multi_conn: true"), "{info}");
    assert!(info.contains("can_trim: true"), "{info}");
    assert!(info.contains("can_zero: true"), "{info}");
    assert!(info.contains("can_fua: true"), "{info}");
    assert!(
        info.contains("can_cache: true"),
        "NBD_CMD_CACHE is advertised:\n{info}"
    );
    assert!(info.contains("is_read_only: false"), "{info}");
    assert!(info.contains("block_size_preferred: 4096"), "{info}");
    assert!(info.contains("block_size_maximum: 33554432"), "{info}");
    assert!(info.contains("base:allocation"), "{info}");

    let out = run(Command::new("nbdinfo").arg(t.uri("disk@1")));
    let info = stdout(&out);
    assert!(
        info.contains("is_read_only: true"),
        "snapshots are read-only exports"
    );
    assert!(
        info.contains("can_cache: true"),
        "read-only exports cache too:\n{info}"
    );
}

fn fio(t: &TestServer, name: &str, rw: &str) {
    let output = Command::new("fio")
        .arg(format!("--name={name}"))
        .arg("--ioengine=nbd")
        .arg(format!("--uri={}", t.uri("disk")))
        .arg(format!("--rw={rw}"))
        .args([
            "--bs=4k",
            "--size=16m",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
        ])
        .args(["--verify_fatal=1", "--numjobs=1", "--output-format=normal"])
        // fio saves verify state files in its working directory: not in the tree.
        .arg("--verify_state_save=0")
        .current_dir(std::env::temp_dir())
        .output()
        .expect("run fio");
    let text = format!(
        "{}{}",
        stdout(&output),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "fio {rw} failed:\n{text}");
    assert!(
        !text.contains("verify:") || !text.contains("bad"),
        "fio {rw} verification failed:\n{text}"
    );
    assert!(text.contains("err= 0"), "fio {rw} reported errors:\n{text}");
}

#[test]
fn fio_nbd_engine_random_and_sequential_with_crc32c_verify() {
    if !have("fio") {
        return;
    }
    let engines = run(Command::new("fio").arg("--enghelp"));
    if !stdout(&engines).lines().any(|l| l.trim() == "nbd") {
        skip("this fio has no nbd engine (fio --enghelp)");
        return;
    }
    let t = TestServer::start(&[("disk", 32 * MIB)], ServerOptions::default());
    fio(&t, "random", "randwrite");
    fio(&t, "sequential", "write");
}

#[test]
fn qemu_io_cannot_write_a_read_only_snapshot() {
    if !have("qemu-io") {
        return;
    }
    let t = TestServer::start(&[("disk", 4 * MIB)], ServerOptions::default());
    t.pool
        .volume("disk")
        .unwrap()
        .write_at(&[0x77; 4096], 0)
        .unwrap();
    t.pool.snapshot("disk", "snap").unwrap();
    // Reading works; opening read-write is refused by qemu because the
    // export says READ_ONLY (the wire-level EPERM is in robustness.rs).
    let out = run(Command::new("qemu-io")
        .args(["-r", "-f", "raw", "-c", "read -P 0x77 0 4k"])
        .arg(t.uri("snap")));
    assert!(!stdout(&out).contains("failed"), "{}", stdout(&out));
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 1 0 4k"])
        .arg(t.uri("snap"))
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(
        text.to_lowercase().contains("read-only")
            || text.contains("Permission")
            || !out.status.success(),
        "{text}"
    );
    assert!(
        t.read_volume("snap", 0, 4096).iter().all(|&b| b == 0x77),
        "the snapshot is unchanged"
    );
}
