//! `lockstep bench redis` end to end, kept short: plain Redis and one
//! lockstep cluster, a few thousand requests; checks the run finishes,
//! leaves no region file behind, and writes a JSON file with real rows.

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

#[test]
fn bench_redis_writes_rows_for_plain_and_lockstep() {
    let out =
        std::env::temp_dir().join(format!("lockstep-bench-redis-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let child = Command::new(lockstep())
        .args(["bench", "redis", "--only", "plain,lockstep-output"])
        .args(["--requests", "2000", "--clients", "10"])
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lockstep bench redis");
    let pid = child.id();
    let run = child
        .wait_with_output()
        .expect("wait for lockstep bench redis");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        run.status
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
    let prefix = format!("lockstep-benchredis-{pid}-");
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "region files left: {left:?}");
    let _ = std::fs::remove_dir_all(&out);
}
