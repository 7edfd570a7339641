//! What operators and proxies see: `lockstep status` (its exit code, its
//! JSON, a down node's line), the Prometheus metrics and the `/health` and
//! `/leader` endpoints on each node's metrics address — against a real
//! 3-node cluster whose nodes are killed one by one.

mod cluster;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::*;

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(120);

/// Gives every node of `c` a metrics address (before it starts).
fn with_metrics(c: &TestCluster) -> Vec<SocketAddr> {
    let text = std::fs::read_to_string(&c.config_path).expect("config");
    let mut addrs = Vec::new();
    let mut out = String::new();
    for line in text.lines() {
        out.push_str(line);
        out.push('\n');
        if line.starts_with("control = ") {
            let a = SocketAddr::from(([127, 0, 0, 1], free_port()));
            out.push_str(&format!("metrics = \"{a}\"\n"));
            addrs.push(a);
        }
    }
    std::fs::write(&c.config_path, out).expect("write config");
    assert_eq!(addrs.len(), c.nodes.len());
    addrs
}

/// `GET path` on `addr`: the status code and the body.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    Ok((code, body.to_string()))
}

/// Polls `GET path` on `addr` until `cond` holds for (code, body).
fn wait_http(
    c: &TestCluster,
    addr: SocketAddr,
    path: &str,
    what: &str,
    cond: impl Fn(u16, &str) -> bool,
) -> String {
    let start = Instant::now();
    loop {
        let got = http_get(addr, path);
        if let Ok((code, body)) = &got {
            if cond(*code, body) {
                return body.clone();
            }
        }
        assert!(
            start.elapsed() < HANG,
            "timed out waiting for {what} (GET {path} on {addr}: {got:?})\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

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

#[test]
fn metrics_name_role_build_server_and_lag() {
    let mut c = TestCluster::new("obs-metrics", Options::default());
    let metrics = with_metrics(&c);
    c.start_all();
    let m1 = wait_http(&c, metrics[0], "/metrics", "node 1 leading", |code, b| {
        code == 200 && b.contains("lockstep_role{role=\"leader\"} 1\n")
    });
    let version = env!("CARGO_PKG_VERSION");
    for want in [
        "lockstep_role{role=\"backup\"} 0\n",
        "lockstep_role{role=\"joining\"} 0\n",
        "lockstep_role{role=\"stale\"} 0\n",
        &format!("lockstep_build_info{{version=\"{version}\"}} 1\n"),
        "# TYPE lockstep_build_info gauge\n",
        "lockstep_server_up 1\n",
        "lockstep_apply_lag_entries ",
        "lockstep_apply_lag_seconds ",
        "# TYPE lockstep_persisted_entries_total counter\n",
    ] {
        assert!(m1.contains(want), "no {want:?} in\n{m1}");
    }
    // No ZooKeeper in static election mode: no session gauge; no lag
    // without a unit.
    assert!(!m1.contains("lockstep_zookeeper_connected"), "{m1}");
    assert!(!m1.contains("lockstep_apply_lag "), "{m1}");
    wait_http(&c, metrics[1], "/metrics", "node 2 as backup", |code, b| {
        code == 200
            && b.contains("lockstep_role{role=\"backup\"} 1\n")
            && b.contains("lockstep_server_up 1\n")
    });

    // Node 2's server dies: its follower reports it.
    c.kill_server(2);
    wait_http(
        &c,
        metrics[1],
        "/metrics",
        "node 2 stale, server down",
        |code, b| {
            code == 200
                && b.contains("lockstep_role{role=\"stale\"} 1\n")
                && b.contains("lockstep_role{role=\"backup\"} 0\n")
                && b.contains("lockstep_server_up 0\n")
        },
    );
    let (code, m3) = http_get(metrics[2], "/metrics").expect("scrape node 3");
    assert_eq!(code, 200);
    assert!(m3.contains("lockstep_role{role=\"backup\"} 1\n"), "{m3}");
}
