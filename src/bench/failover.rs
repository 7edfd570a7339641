//! `lockstep bench failover`: time from SIGKILL of the leader to the first
//! acknowledged write on the new leader, over several rounds. The killed
//! node is restarted (fresh server, same data dir) and caught up between
//! rounds, so every round starts from a full cluster.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::config::ElectionMode;
use lockstep_common::resp::Value;
use lockstep_common::Config;
use lockstep_launcher::resp;

use crate::bench::harness::wait_converged;
use crate::status;
use crate::up::{self, Cluster};
use lockstep_launcher::binaries::Binaries;

/// One INCR on `addr`: Ok when the server acknowledged it.
fn incr(addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    match resp::command(addr, &["INCR", "lockstep:failover"], timeout)? {
        Value::Int(_) => Ok(()),
        other => bail!("answered {other:?}"),
    }
}

/// The node that reports itself leader, if any.
fn leader(config: &Config) -> Option<u64> {
    status::query_all(config, Duration::from_millis(300))
        .into_iter()
        .filter_map(|n| n.status.ok())
        .find(|s| s.role == "leader")
        .map(|s| s.node)
}

/// Runs `rounds` failovers on the cluster of `config_path`; prints each
/// round and p50/max.
pub fn run(config_path: &Path, rounds: usize) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    if config.election.mode != ElectionMode::Zookeeper {
        bail!(
            "bench failover needs election.mode = \"zookeeper\" in {}",
            config_path.display()
        );
    }
    let bins = Binaries::beside_current_exe()?;
    let stop = AtomicBool::new(false);
    let say = |m: &str| eprintln!("  {m}");
    let cmd = config
        .server
        .clone()
        .context("bench failover needs `server = [...]` in the config")?;
    let mut cluster = Cluster::start(config.clone(), config_path, &cmd, &bins, &stop, &say)?;
    println!(
        "failover bench: {} nodes, session_timeout_ms = {}, {rounds} rounds",
        config.nodes.len(),
        config.election.session_timeout_ms
    );
    let mut times = Vec::new();
    for round in 1..=rounds {
        wait_converged(&config, Duration::from_secs(120))?;
        // A leader that serves (a short session may have just moved it).
        let mut old = None;
        for _ in 0..100 {
            if let Some(l) = leader(&config) {
                if incr(config.node(l)?.app, Duration::from_secs(2)).is_ok() {
                    old = Some(l);
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let old = old.context("no leader serves before the kill")?;
        up::kill_node(&config, old)?;
        let t0 = Instant::now();
        let new = loop {
            if t0.elapsed() > Duration::from_secs(120) {
                bail!("round {round}: no new leader within 120 s");
            }
            if let Some(l) = leader(&config).filter(|&l| l != old) {
                if incr(config.node(l)?.app, Duration::from_millis(500)).is_ok() {
                    break l;
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let took = t0.elapsed();
        println!(
            "round {round:2}: node {old} killed, node {new} acknowledged a write after {:.0} ms",
            took.as_secs_f64() * 1e3
        );
        times.push(took);
        cluster.restart_node(old, config_path, &bins, &stop, &say)?;
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    if let (Some(p50), Some(max)) = (times.get(times.len() / 2), times.last()) {
        println!(
            "failover: p50 {:.0} ms, max {:.0} ms over {} rounds",
            ms(*p50),
            ms(*max),
            times.len()
        );
    }
    cluster.stop();
    Ok(())
}
