//! `lockstep bench redis`, `restart`, `snapshots` and `memcached` end to
//! end, kept short: `redis` with plain Redis and one lockstep cluster, a
//! few thousand requests, checks the run finishes, leaves no region file
//! behind, and writes a JSON file with real rows; `restart` at one short
//! log length, snapshots on and off, checks it measures both and leaves
//! nothing behind; `snapshots` with no dataset and a short load.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The built `lockstep`; the follower and the preload must sit beside it.
fn lockstep() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_lockstep"));
    let dir = exe.parent().expect("target dir");
    for b in ["lockstep-follower", "liblockstep.so"] {
        assert!(
            dir.join(b).exists(),
            "{} missing: run `cargo build --workspace` first (scripts/test does)",
            dir.join(b).display()
        );
    }
    exe
}

/// One bench at a time: each picks free ports for its servers, and two
/// picking at once can pick the same one.
static ONE_BENCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `cmd` to its end, one bench at a time; asserts it succeeded;
/// returns its pid (the cluster names its region files after it) and its
/// stdout.
fn run_lockstep(cmd: &mut Command) -> (u32, String) {
    let _one = ONE_BENCH.lock().unwrap_or_else(|p| p.into_inner());
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    let pid = child.id();
    let run = child.wait_with_output().expect("wait for lockstep");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "{cmd:?}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        run.status
    );
    (pid, stdout)
}

#[test]
fn bench_redis_writes_rows_for_plain_and_lockstep() {
    let out =
        std::env::temp_dir().join(format!("lockstep-bench-redis-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let (pid, stdout) = run_lockstep(
        Command::new(lockstep())
            .args(["bench", "redis", "--only", "plain,lockstep-output"])
            .args(["--requests", "2000", "--clients", "10"])
            .arg("--out")
            .arg(&out),
    );
    assert!(stdout.contains("results in "), "{stdout}");

    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("results.json")).expect("results.json"),
    )
    .expect("valid JSON");
    let rows = json["rows"].as_array().expect("rows");
    for system in ["plain", "lockstep-output"] {
        for (workload, client) in [
            ("SET", "redis-benchmark"),
            ("GET", "redis-benchmark"),
            ("SET -P16", "redis-benchmark"),
            ("loadgen SET", "loadgen"),
        ] {
            let row = rows
                .iter()
                .find(|r| {
                    r["system"] == system && r["workload"] == workload && r["client"] == client
                })
                .unwrap_or_else(|| panic!("no {system} {workload} row in {json:#}"));
            assert!(row["rps"].as_f64().unwrap() > 0.0, "{row}");
            assert!(row["ratio_to_plain"].as_f64().unwrap() > 0.0, "{row}");
        }
    }
    let lg = rows
        .iter()
        .find(|r| r["system"] == "lockstep-output" && r["client"] == "loadgen")
        .unwrap();
    assert_eq!(lg["requests"], 2000, "{lg}");
    assert!(
        lg["p99_ms"].as_f64().unwrap() >= lg["p50_ms"].as_f64().unwrap(),
        "{lg}"
    );
    assert_eq!(json["systems"][1]["divergences"], 0, "{json:#}");
    // The chart needs a font; where one is installed it must be drawn.
    if std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
        let png = std::fs::read(out.join("chart.png")).expect("chart.png");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    }
    // The servers' work directory is removed after a successful run, and
    // the cluster's region files (named after the bench's pid) with it.
    assert!(!out.join("work").exists());
    assert_no_regions_left(&format!("lockstep-benchredis-{pid}-"));
    let _ = std::fs::remove_dir_all(&out);
}

/// No region file whose name starts with `prefix` is left in /dev/shm.
fn assert_no_regions_left(prefix: &str) {
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "region files left: {left:?}");
}

#[test]
fn bench_restart_measures_rejoin_majority_loss_and_leader_restart_with_snapshots_on_and_off() {
    let out = std::env::temp_dir().join(format!(
        "lockstep-bench-restart-test-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let (pid, stdout) = run_lockstep(
        Command::new(lockstep())
            .args([
                "bench",
                "restart",
                "--entries",
                "20k",
                "--modes",
                "process,off",
            ])
            .args(["--snapshot-every", "1000", "--json", "--out"])
            .arg(&out),
    );
    let runs: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let modes: Vec<&str> = runs
        .iter()
        .map(|r| r["snapshot"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["process", "off"], "{stdout}");
    for r in &runs {
        assert_eq!(r["log_entries"], 20_000, "{r}");
        assert!(r["rejoin_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["majority_loss_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["leader_restart_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["disk_max_mb"].as_f64().unwrap() > 0.0, "{r}");
    }
    // With snapshots on the leader deleted its log too, and a backup's
    // image rebuilt its server; off, it replayed its whole log.
    assert_eq!(runs[0]["leader_installed"], true, "{}", runs[0]);
    // The leader's p99 is measured alone and while backup 2 snapshots
    // (which it did at least once meanwhile).
    assert!(runs[0]["p99_ms"].as_f64().unwrap() > 0.0, "{}", runs[0]);
    assert!(
        runs[0]["p99_ms_snapshotting"].as_f64().unwrap() > 0.0,
        "{}",
        runs[0]
    );
    assert!(
        runs[0]["snapshots_during"].as_u64().unwrap() > 0,
        "{}",
        runs[0]
    );
    assert_eq!(runs[1]["leader_installed"], false, "{}", runs[1]);
    // With snapshots on the backup comes back from its snapshot and replays
    // less than the log; off, there is nothing to restore from.
    assert_eq!(runs[0]["rejoin_restored"], true, "{}", runs[0]);
    assert!(
        runs[0]["rejoin_replayed"].as_u64().unwrap() < 20_000,
        "{}",
        runs[0]
    );
    assert_eq!(runs[1]["rejoin_restored"], false, "{}", runs[1]);
    // Each run's directory is removed after it succeeded, region files too.
    assert_eq!(std::fs::read_dir(&out).map(|d| d.count()).unwrap_or(0), 0);
    assert_no_regions_left(&format!("lockstep-benchrestart-{pid}-"));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bench_snapshots_measures_the_followers_cpu_with_an_image_taken_first() {
    let out = std::env::temp_dir().join(format!(
        "lockstep-bench-snapshots-test-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let (pid, stdout) = run_lockstep(
        Command::new(lockstep())
            .args(["bench", "snapshots", "--dataset-mb", "0"])
            .args(["--image-percent", "100", "--requests", "20000"])
            .args(["--json", "--out"])
            .arg(&out),
    );
    let runs: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert_eq!(runs.len(), 1, "{stdout}");
    let r = &runs[0];
    assert_eq!(r["image_percent"], 100, "{r}");
    assert_eq!(r["requests"], 20_000, "{r}");
    // Each backup imaged its server before the run.
    assert!(r["image_bytes"].as_u64().unwrap() > 0, "{r}");
    assert!(r["set_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["follower_cpu_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["criu_cpu_s"].as_f64().unwrap() >= 0.0, "{r}");
    assert_eq!(std::fs::read_dir(&out).map(|d| d.count()).unwrap_or(0), 0);
    assert_no_regions_left(&format!("lockstep-benchsnap-{pid}-"));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bench_memcached_compares_worker_counts_plain_and_through_lockstep() {
    let out = std::env::temp_dir().join(format!(
        "lockstep-bench-memcached-test-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    let (pid, stdout) = run_lockstep(
        Command::new(lockstep())
            .args(["bench", "memcached", "--workers", "1,4", "--clients", "8"])
            .args(["--pipeline", "4", "--duration", "0.3", "--json", "--out"])
            .arg(&out),
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let runs: Vec<String> = rows
        .iter()
        .map(|r| format!("{} {} {}", r["workers"], r["system"], r["workload"]))
        .collect();
    let mut want = Vec::new();
    for workers in [1, 4] {
        for system in ["plain", "lockstep-shm", "lockstep-tcp"] {
            for workload in ["set", "get", "incr", "set -P4"] {
                want.push(format!("{workers} \"{system}\" \"{workload}\""));
            }
        }
    }
    assert_eq!(runs, want, "{stdout}");
    for r in &rows {
        assert!(r["requests"].as_u64().unwrap() > 0, "{r}");
        if r["system"] != "plain" {
            assert!(r["ratio_to_plain"].as_f64().unwrap() > 0.0, "{r}");
            assert_eq!(r["divergences"], 0, "{r}");
        }
    }
    assert_eq!(std::fs::read_dir(&out).map(|d| d.count()).unwrap_or(0), 0);
    assert_no_regions_left(&format!("lockstep-benchmc-{pid}-"));
    let _ = std::fs::remove_dir_all(&out);
}
