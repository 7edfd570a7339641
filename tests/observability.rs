//! What operators and proxies see: `lockstep status` (its exit code, its
//! JSON, a down node's line), the Prometheus metrics and the `/health` and
//! `/leader` endpoints on each node's metrics address — against a real
//! 3-node cluster whose nodes are killed one by one.

mod cluster;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::*;

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(120);

/// `lockstep status --config F [--json]`: exit code and stdout.
fn cli_status(config: &Path, json: bool) -> (i32, String) {
    let mut cmd = Command::new(bin_dir().join("lockstep"));
    cmd.arg("status");
    if json {
        cmd.arg("--json");
    }
    let out = cmd
        .arg("--config")
        .arg(config)
        .output()
        .expect("run lockstep status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn cli_status_json(config: &Path) -> (i32, serde_json::Value) {
    let (code, text) = cli_status(config, true);
    let v = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("lockstep status --json printed no JSON ({e}): {text}"));
    (code, v)
}

/// Waits until `lockstep status` exits with `code`; returns its table.
fn wait_status_code(c: &TestCluster, code: i32) -> String {
    let start = Instant::now();
    loop {
        let (got, text) = cli_status(&c.config_path, false);
        if got == code {
            return text;
        }
        assert!(
            start.elapsed() < HANG,
            "lockstep status kept exiting {got}, not {code}:\n{text}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn status_exit_code_json_and_down_nodes() {
    let mut c = TestCluster::new("obs-status", Options::default());
    c.start_all();
    let path = c.config_path.display().to_string();

    let text = wait_status_code(&c, 0);
    assert!(text.contains("ok: node 1 leads view"), "{text}");
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["healthy"], true, "{json}");
    assert_eq!(json["leader"], 1, "{json}");
    assert_eq!(json["leader_app"], c.app(1).to_string(), "{json}");
    for (i, n) in json["nodes"].as_array().expect("nodes").iter().enumerate() {
        assert_eq!(n["app"], c.app(i as u64 + 1).to_string(), "{json}");
    }

    // One backup down: the leader keeps a majority.
    c.kill_server(3);
    c.kill_follower(3);
    let text = wait_status_code(&c, 0);
    assert!(
        text.contains(&format!(
            "node 3 is down: the follower is not running (nothing listens on {})",
            c.nodes[2].control
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("lockstep-follower --config {path} --node 3")),
        "{text}"
    );
    assert!(
        !text.contains("handshake") && !text.contains("os error"),
        "{text}"
    );
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["nodes"][2]["role"], "down", "{json}");
    assert_eq!(json["nodes"][2]["app"], c.app(3).to_string(), "{json}");

    // Two of three down: the leader answers, but has no majority.
    c.kill_server(2);
    c.kill_follower(2);
    let text = wait_status_code(&c, 1);
    assert!(
        text.contains("NOT OK: no leader with a live majority"),
        "{text}"
    );
    assert!(text.contains("only 1 of 3"), "{text}");
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 1, "{json}");
    assert_eq!(json["healthy"], false, "{json}");

    // Everything down.
    c.kill_server(1);
    c.kill_follower(1);
    let text = wait_status_code(&c, 1);
    assert!(text.contains("no node answers"), "{text}");
    let (code, json) = cli_status_json(&c.config_path);
    assert_eq!(code, 1, "{json}");
    assert_eq!(json["leader"], 0, "{json}");
    assert!(json["leader_app"].is_null(), "{json}");
}
