//! `lockstep run`: a node's server started by hand the one supported way
//! (real followers, real redis-server under the preload).

use lockstep_testkit::cluster;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cluster::*;
use lockstep_launcher::binaries::Binaries;

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(120);

/// A `lockstep run` process, stopped (SIGTERM, then SIGKILL) when dropped.
struct Run {
    child: Child,
    err: std::path::PathBuf,
}

impl Run {
    /// `lockstep run --config CONFIG --node ID -- redis-server …` on the
    /// node's port, from `cwd` (with the config named relative to it).
    fn start(c: &TestCluster, id: u64, cwd: &Path, config: &Path, extra: &[&str]) -> Run {
        let bins = Binaries::of_test_build().expect("built binaries");
        let err = c.dir.join(format!("run-{id}.stderr"));
        let data = c.dir.join(format!("run-data-{id}"));
        std::fs::create_dir_all(&data).expect("server dir");
        let port = c.app(id).port().to_string();
        let mut cmd = Command::new(&bins.lockstep);
        cmd.current_dir(cwd)
            .arg("run")
            .arg("--config")
            .arg(config)
            .args(["--node", &id.to_string()])
            .args(extra)
            .args(["--", "redis-server", "--port", &port, "--bind", "127.0.0.1"])
            .args(lockstep_common::config::REDIS_REPLICA_ARGS)
            .arg("--dir")
            .arg(&data)
            .env("LOCKSTEP_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).expect("stderr file"));
        let child = cmd.spawn().expect("start lockstep run");
        Run { child, err }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn wait_exit(&mut self) -> i32 {
        let start = std::time::Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st.code().unwrap_or(-1);
            }
            assert!(start.elapsed() < HANG, "lockstep run did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..250 {
            if !self.running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn run_waits_for_the_follower_then_serves_replicated_and_stops_on_sigterm() {
    let mut c = TestCluster::new("run-cli", Options::default());
    // Servers first, from another directory with a relative config path
    // (the README's mistake that made ld.so ignore a relative preload).
    let cwd = c.config_path.parent().unwrap().to_path_buf();
    let rel = Path::new(c.config_path.file_name().unwrap()).to_path_buf();
    let mut runs: Vec<Run> = (1..=3)
        .map(|id| Run::start(&c, id, &cwd, &rel, &[]))
        .collect();
    c.wait("each run to say it waits for its follower", HANG, |_| {
        runs.iter()
            .all(|r| r.stderr().contains("waiting for node") && r.stderr().contains("follower"))
    });
    // No server runs before its follower does.
    for id in 1..=3 {
        assert!(
            std::net::TcpStream::connect(c.app(id)).is_err(),
            "node {id}'s server started before its follower"
        );
    }
    for id in 1..=3 {
        c.start_follower(id);
    }
    c.serve_and_agree(&[1, 2, 3], HANG);
    // `run` looks at its region every 100 ms: the line may come a moment
    // after the cluster already saw the server attached.
    c.wait("each run to say its server attached", HANG, |_| {
        runs.iter()
            .all(|r| r.stderr().contains("is attached to its region"))
    });
    for r in &mut runs {
        assert!(r.running(), "{}", r.stderr());
    }

    // A backup started this way can be snapshotted (its own session).
    let out = Command::new(Binaries::of_test_build().unwrap().lockstep)
        .arg("snapshot")
        .arg(&c.config_path)
        .args(["--node", "2"])
        .output()
        .expect("lockstep snapshot");
    assert!(
        out.status.success(),
        "snapshot of a server started by `lockstep run` failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.logs()
    );

    // SIGTERM stops the server, and run exits as it did.
    let r = &mut runs[2];
    let pid = nix::unistd::Pid::from_raw(r.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    r.wait_exit();
    c.wait("node 3's server gone", HANG, |c| {
        std::net::TcpStream::connect(c.app(3)).is_err()
    });
}

#[test]
fn run_refuses_a_wrong_node_and_reports_a_failed_server() {
    let mut c = TestCluster::new("run-refuse", Options::default());
    for id in 1..=3 {
        c.start_follower(id);
    }
    let cwd = c.dir.clone();
    let config = c.config_path.clone();
    let mut r = Run::start(&c, 1, &cwd, &config, &[]);
    // A node the config does not have.
    let mut bad = {
        let bins = Binaries::of_test_build().unwrap();
        let err = c.dir.join("run-9.stderr");
        let child = Command::new(&bins.lockstep)
            .args(["run", "--node", "9", "--config"])
            .arg(&config)
            .args(["--", "redis-server"])
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Run { child, err }
    };
    assert_eq!(bad.wait_exit(), 1);
    assert!(
        bad.stderr().contains("node 9 is not in the config"),
        "{}",
        bad.stderr()
    );
    // Node 1's app address is taken (node 1's server runs): a second one
    // as node 1 is refused before it starts.
    c.wait("node 1's server listening", HANG, |c| {
        std::net::TcpStream::connect(c.app(1)).is_ok()
    });
    let dir = c.dir.clone();
    let mut twice = Run::start(&c, 1, &dir, &config, &[]);
    assert_eq!(twice.wait_exit(), 1);
    assert!(twice.stderr().contains("is in use"), "{}", twice.stderr());
    assert!(r.running(), "{}", r.stderr());
    drop(r);

    // A server that fails at start: run exits as it did, with its last lines.
    let bins = Binaries::of_test_build().unwrap();
    let err = c.dir.join("run-fail.stderr");
    let child = Command::new(&bins.lockstep)
        .args(["run", "--node", "2", "--config"])
        .arg(&config)
        .args(["--", "redis-server", "--no-such-option", "1"])
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut failing = Run { child, err };
    assert_ne!(failing.wait_exit(), 0);
    let text = failing.stderr();
    assert!(text.contains("exited with"), "{text}");
    assert!(text.contains("no-such-option"), "{text}");
}

#[test]
fn status_is_not_ok_while_a_node_serves_clients_unreplicated() {
    let mut c = TestCluster::new("run-unreplicated", Options::default());
    c.start_all();
    c.kill_server(3);
    c.wait("node 3's follower to see its server gone", HANG, |c| {
        c.status(3)
            .is_ok_and(|s| s.server_pid == 0 || s.stale_reason.is_some())
    });
    // Node 3's server restarted without the preload (what a relative
    // LD_PRELOAD that ld.so ignores amounts to).
    let data = c.dir.join("plain-3");
    std::fs::create_dir_all(&data).unwrap();
    let mut plain = lockstep_launcher::commands::redis_command(
        c.app(3).port(),
        &data,
        &lockstep_common::config::REDIS_REPLICA_ARGS,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("plain redis-server");
    let lockstep = Binaries::of_test_build().unwrap().lockstep;
    let status = |json: bool| {
        let mut cmd = Command::new(&lockstep);
        cmd.arg("status").arg(&c.config_path);
        if json {
            cmd.arg("--json");
        }
        cmd.output().expect("lockstep status")
    };
    c.wait("the plain server to listen", HANG, |c| {
        std::net::TcpStream::connect(c.app(3)).is_ok()
    });
    let out = status(false);
    let text = String::from_utf8_lossy(&out.stdout);
    let _ = plain.kill();
    let _ = plain.wait();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("node 3: something serves clients") && text.contains("NOT replicated"),
        "{text}"
    );
    // Nodes 1 and 2 are not reported: their servers are attached.
    assert!(!text.contains("node 2: something serves"), "{text}");
    c.wait("the plain server gone", HANG, |c| {
        std::net::TcpStream::connect(c.app(3)).is_err()
    });
    // Without it, the cluster (a leader and a majority) is ok again, and
    // node 3 has no server: said as such, not as unreplicated.
    let out = status(true);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(j["healthy"], true, "{j}");
    assert!(j["nodes"][2].get("unreplicated_server").is_none(), "{j}");
}
