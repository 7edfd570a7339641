//! `lockstep verify` end to end: a short run with faults against a real
//! cluster (real redis-server, real followers over tcp, each node in a
//! network namespace of its own, a real ZooKeeper) finds the history valid
//! and writes its report; and its checkers refuse the same history once
//! an anomaly is written into it. Needs root (network namespaces), as CI
//! runs; it fails naming that when it cannot create them.

use std::path::Path;
use std::process::Command;

fn lockstep() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lockstep"))
}

#[test]
fn a_short_verify_run_with_faults_is_valid_and_its_checkers_bite() {
    let out = std::env::temp_dir().join(format!("lockstep-verify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = lockstep()
        .args([
            "verify",
            "--time",
            "32",
            "--hold",
            "3",
            "--quiet",
            "3",
            "--clients",
            "4",
        ])
        .args([
            "--faults",
            "kill-leader,partition-bridge,disk-full-backup,interrupt-install",
        ])
        .args(["--subnet", "232", "--seed", "42", "--out"])
        .arg(&out)
        .output()
        .expect("run lockstep verify");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "verify failed:\n{said}");
    assert!(said.contains("verify: valid"), "{said}");
    for f in [
        "history.jsonl",
        "faults.json",
        "verdict.json",
        "summary.md",
        "timeline.png",
    ] {
        let p = out.join(f);
        assert!(
            std::fs::metadata(&p).map(|m| m.len() > 0).unwrap_or(false),
            "{} missing or empty\n{said}",
            p.display()
        );
    }
    let faults: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("faults.json")).unwrap()).unwrap();
    assert!(
        faults.as_array().map_or(0, |f| f.len()) >= 2,
        "faults injected: {faults}"
    );
    let history = std::fs::read_to_string(out.join("history.jsonl")).unwrap();
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    for w in ["list-append | valid", "register | valid", "counter | valid"] {
        assert!(summary.contains(w), "{w}:\n{summary}");
    }

    // The same history rechecked is valid …
    let recheck = |path: &Path| {
        let o = lockstep()
            .args(["verify", "--recheck"])
            .arg(path)
            .output()
            .expect("run lockstep verify --recheck");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).to_string(),
        )
    };
    let (ok, text) = recheck(&out.join("history.jsonl"));
    assert!(ok, "{text}");
    // … and refused once a counter's final read says one more than the
    // acknowledged and unknown INCRs allow (an INCR applied twice).
    let tampered = tamper_final_counter_read(&history);
    let path = out.join("tampered.jsonl");
    std::fs::write(&path, tampered).unwrap();
    let (ok, text) = recheck(&path);
    assert!(!ok && text.contains("counter: INVALID"), "{text}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The history with the last ok counter read's value raised by as many
/// INCRs of that key as have an unknown outcome, plus one.
fn tamper_final_counter_read(history: &str) -> String {
    let mut lines: Vec<serde_json::Value> = history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at = lines
        .iter()
        .rposition(|e| e["f"] == "counter-read" && e["type"] == "ok")
        .expect("a final counter read");
    let key = lines[at]["value"]["key"].clone();
    let unknown = lines
        .iter()
        .filter(|e| e["f"] == "incr" && e["type"] == "info" && e["value"]["key"] == key)
        .count() as i64;
    let v = lines[at]["value"]["value"].as_i64().unwrap();
    lines[at]["value"]["value"] = serde_json::json!(v + unknown + 1);
    lines.iter().map(|e| format!("{e}\n")).collect()
}
