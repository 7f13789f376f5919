//! Runs bench/run's harness on its tiny `--smoke` profile (seconds): every
//! workload against every peer, the targets and the report. It checks that
//! the harness works, not how fast anything is: CI runs no benchmark.
//! Needs fio, qemu-img, qemu-nbd, qemu-io and nbdkit; without them it
//! prints SKIP, except under scripts/test.sh ($GROVE_REQUIRE_TOOLS).

use std::path::{Path, PathBuf};
use std::process::Command;

const TOOLS: [&str; 7] = [
    "fio",
    "qemu-img",
    "qemu-nbd",
    "qemu-io",
    "nbdkit",
    "restic",
    "/usr/bin/time",
];
const WORKLOADS: [&str; 9] = [
    "servers",
    "depth",
    "nsnaps",
    "memory",
    "snapcount",
    "replication",
    "retention",
    "archive",
    "archive_scale",
];
const TARGET_COUNT: usize = 13;

fn tools_required() -> bool {
    std::env::var_os("GROVE_REQUIRE_TOOLS").is_some_and(|v| v != "0")
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The distribution's python3 (where python3-matplotlib goes), else any.
fn python() -> Option<PathBuf> {
    let system = PathBuf::from("/usr/bin/python3");
    if system.exists() {
        return Some(system);
    }
    have("python3").then(|| PathBuf::from("python3"))
}

/// The grove binary beside grove-bench, built in the same profile if the
/// workspace has not built it yet (`cargo test -p grove-bench` alone).
fn grove_binary(bench_binary: &Path) -> PathBuf {
    let dir = bench_binary.parent().expect("grove-bench has a directory");
    let grove = dir.join("grove");
    if !grove.exists() {
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-p", "grove"]);
        if dir.file_name().is_some_and(|name| name == "release") {
            build.arg("--release");
        }
        let status = build
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .status()
            .expect("run cargo build -p grove");
        assert!(status.success(), "cargo build -p grove failed");
    }
    grove
}

#[test]
fn smoke_profile_runs_every_workload_and_reports() {
    let missing: Vec<&str> = TOOLS.into_iter().filter(|t| !have(t)).collect();
    let python = python();
    if !missing.is_empty() || python.is_none() {
        let why = format!("bench harness smoke test needs {missing:?} and python3");
        assert!(!tools_required(), "{why}, and GROVE_REQUIRE_TOOLS is set");
        eprintln!("SKIP: {why}");
        return;
    }
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_grove-bench"));
    let grove = grove_binary(&bench);
    let out = tempfile::tempdir().expect("temp dir");
    let harness = concat!(env!("CARGO_MANIFEST_DIR"), "/harness/main.py");
    let output = Command::new(python.unwrap())
        .arg(harness)
        .arg("--smoke")
        .arg("--grove")
        .arg(&grove)
        .arg("--grove-bench")
        .arg(&bench)
        .arg("--out")
        .arg(out.path())
        .arg("--work-dir")
        .arg(out.path())
        .output()
        .expect("run the harness");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "harness failed:\n{stderr}");

    let report = std::fs::read_to_string(out.path().join("latest.md")).expect("latest.md");
    assert!(report.contains("## Targets"), "{report}");
    let json_name = std::fs::read_dir(out.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| name.ends_with("-smoke.json"))
        .expect("a <date>-smoke.json");
    let text = std::fs::read_to_string(out.path().join(json_name)).unwrap();
    let results: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    for workload in WORKLOADS {
        let w = &results["workloads"][workload];
        assert!(w.is_object(), "{workload} missing:\n{text}");
        assert!(
            w.get("error").is_none(),
            "{workload} failed: {}",
            w["error"]
        );
        assert!(w["metadata"]["metadata_bytes"].is_u64(), "{workload}: {w}");
    }
    // Write after snapshot stands next to the host's own first writes.
    let nsnaps = &results["workloads"]["nsnaps"];
    for field in [
        "host_overwrite_iops",
        "host_first_write_iops",
        "host_ratio_median",
    ] {
        assert!(
            nsnaps[field].as_f64().is_some_and(|v| v > 0.0),
            "nsnaps {field}: {nsnaps}"
        );
    }
    // Replication: grove's transfers, each verified, next to btrfs's when
    // this machine can mount btrfs (root, btrfs-progs, loop devices).
    let replication = &results["workloads"]["replication"];
    let rows = replication["transfers"]["rows"]
        .as_array()
        .expect("replication rows");
    let systems: Vec<&str> = rows.iter().filter_map(|r| r["system"].as_str()).collect();
    let expected = if replication["btrfs"] == "ok" { 4 } else { 2 };
    assert_eq!(rows.len(), expected, "{replication}");
    assert!(systems.contains(&"grove"), "{replication}");
    for row in rows {
        assert!(row["mb_s"].as_f64().is_some_and(|v| v > 0.0), "{row}");
        assert!(row["verified"].is_string(), "{row}");
    }
    assert!(
        replication["sparse"]["grove_over_data"]
            .as_f64()
            .is_some_and(|v| v >= 1.0),
        "{replication}"
    );
    assert!(
        replication["snapshots"]["receive_s"].is_f64(),
        "{replication}"
    );
    // Retention: every count pruned down to what the policy keeps, inside
    // its window, and the list of every volume timed beside a reader.
    let retention = &results["workloads"]["retention"];
    let rounds = retention["prune"].as_array().expect("prune rounds");
    // Each count under fio's full load and under the one-request probe.
    let under = |load: &str| rounds.iter().filter(|r| r["load"] == load).count();
    assert!(under("full") > 0, "{retention}");
    assert_eq!(under("probe"), under("full"), "{retention}");
    for round in rounds {
        let in_flight = round["numjobs"].as_u64().zip(round["iodepth"].as_u64());
        if round["load"] == "probe" {
            assert_eq!(in_flight, Some((1, 1)), "{round}");
        }
        assert_eq!(round["kept"], 2, "{round}");
        assert!(round["covered"] == true, "{round}");
        assert!(
            round["quiet_span"]["iops"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{round}"
        );
        assert!(round["prune_s"].is_f64(), "{round}");
    }
    // `grove list` and the admin commands, on each pool size of the profile.
    let cases = retention["list_counts"].as_array().expect("list counts");
    assert!(!cases.is_empty(), "{retention}");
    for case in cases {
        assert!(
            case["list"]["stall_ms"].as_f64().is_some_and(|v| v > 0.0),
            "{case}"
        );
        // The admin commands, each timed beside the same reader.
        let commands = case["admin"]["commands"]
            .as_array()
            .expect("admin commands");
        assert_eq!(commands.len(), 4, "{case}");
        for command in commands {
            assert!(command["s"].is_f64(), "{command}");
            assert!(command["stall_ms"].is_f64(), "{command}");
        }
    }
    // Archive reads after the year: an archived snapshot over NBD, cold and
    // warm, beside the pool's copy and the other ways back from the store.
    let reads = &results["workloads"]["archive"]["reads"]["file"];
    for figure in [
        &reads["random_4k"]["cold_iops"],
        &reads["random_4k"]["warm_over_pool"],
        &reads["sequential_1m"]["archive_cold_mib_s"],
        &reads["sequential_1m"]["pool_mib_s"],
        &reads["ways_back"]["receive"]["mib_s"],
        &reads["ways_back"]["restore"]["mib_s"],
    ] {
        assert!(figure.as_f64().is_some_and(|v| v > 0.0), "{reads}");
    }
    // The archive made object by object is one `grove archive check`
    // finds clean, before and after expiry, and every command ran on it.
    let scale = &results["workloads"]["archive_scale"];
    assert!(scale["check_clean"] == true, "{scale}");
    assert!(scale["check_after_expire_clean"] == true, "{scale}");
    assert_eq!(scale["listed"], scale["snapshots"], "{scale}");
    assert!(scale["reads"]["peak_hwm_bytes"].is_u64(), "{scale}");
    let targets = results["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), TARGET_COUNT, "{text}");
    for target in targets {
        assert!(target["met"].is_boolean(), "{target}");
        assert!(
            target["met"] == true || target["blocker"].is_string(),
            "a target not met says what blocks it: {target}"
        );
    }
    // The harness removes its work directory: no pool, image or socket stays.
    let leftovers: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("grove-bench."))
        .collect();
    assert!(leftovers.is_empty(), "work directory left behind");
}

/// `--set` refuses an unknown field and a value of the wrong type, with
/// one line naming it, before anything runs.
#[test]
fn profile_overrides_refuse_bad_fields_and_values() {
    let Some(python) = python() else {
        assert!(
            !tools_required(),
            "python3 missing, and GROVE_REQUIRE_TOOLS is set"
        );
        eprintln!("SKIP: needs python3");
        return;
    };
    let harness = concat!(env!("CARGO_MANIFEST_DIR"), "/harness/main.py");
    for (setting, expected) in [
        ("no_such_field=1", "not FIELD=VALUE with a field"),
        ("archive_days=many", "archive_days takes a int"),
        ("archive_days", "not FIELD=VALUE"),
    ] {
        let output = Command::new(&python)
            .args([harness, "--smoke", "--set", setting])
            .output()
            .expect("run the harness");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "--set {setting} was taken");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(setting) && stderr.contains(expected),
            "{stderr}"
        );
    }
}
