//! How a follower that cannot start says so: one line, naming the problem,
//! and nothing logged or touched before it.

use lockstep_testkit::cluster;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{bin_dir, Options, TestCluster};

/// Bound on the wait for the follower to exit (a hang, not a latency).
const HANG: Duration = Duration::from_secs(60);

#[test]
fn a_taken_control_port_is_the_only_line() {
    let c = TestCluster::new("start-port", Options::default());
    let control = c.nodes[0].control;
    let _taken = TcpListener::bind(control).expect("take the control port");
    let mut child = Command::new(bin_dir().join("lockstep-follower"))
        .arg("--config")
        .arg(&c.config_path)
        .args(["--node", "1"])
        .env("LOCKSTEP_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn follower");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > HANG {
            let _ = child.kill();
            panic!("the follower still runs with its control port taken");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("lockstep-follower: cannot listen on control address")
            && lines[0].contains(&control.to_string()),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    // Nothing was touched: no region file, no log store.
    assert!(!lockstep_common::region::region_path(&c.name, 1).exists());
    assert!(!c.dir.join("data").join("node-1").exists());
}
