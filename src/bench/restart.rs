//! `lockstep bench restart`: how long a node takes to come back against the
//! length of the log, with snapshots on and off.
//!
//! For each snapshot mode and log length it starts a 3-node Redis cluster
//! (shm, static leader 1, like `lockstep up`), writes SETs until the log
//! holds that many entries, then measures
//! - **rejoin**: backup node 3 SIGKILLed (server and follower) and started
//!   again as `lockstep up` restarts it (from its newest snapshot when there
//!   is one), until it is a backup again and applied everything the leader
//!   had committed at the kill;
//! - **majority loss**: both backups SIGKILLed and started again, until the
//!   leader acknowledges a write;
//! - **leader restart**: leader node 1 SIGKILLed and started again, until it
//!   acknowledges a write (with snapshots it deleted its log like every
//!   node, so it rebuilds its server from a backup's image);
//! - **disk**: the largest node data directory (log and snapshots) once
//!   the log holds that many entries;
//! - **leader p99 while a backup snapshots** (snapshots on): SET p99 of a
//!   `redis-benchmark` run on the leader, alone and while backup 2 takes
//!   one snapshot after another.
//!
//! Figures, not tests: `tests/bench_redis.rs` only checks that it runs
//! and says what it measured.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::resp::Value;
use lockstep_common::{control, Config};
use lockstep_launcher::disk::tree_bytes;
use lockstep_launcher::resp;

use crate::bench::harness::{
    bench_spec, populate, redis_benchmark, redis_server_args, run_cluster_cases, wait_converged,
    STEP_LIMIT,
};
use crate::status;
use crate::up::{self, Cluster};
use lockstep_launcher::binaries::Binaries;

/// What `lockstep bench restart` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Log lengths (entries) to measure at.
    pub entries: Vec<u64>,
    /// Snapshot modes to compare (`process`, `off`).
    pub modes: Vec<String>,
    /// `snapshot_every.entries` of the clusters with snapshots on.
    pub snapshot_every: u64,
    /// Megabytes loaded first with `DEBUG POPULATE` (1000-byte values).
    pub dataset_mb: u64,
    /// Work directory (one sub-directory per run).
    pub out: PathBuf,
    /// One JSON object per run instead of a table.
    pub json: bool,
    /// Keep each run's data and logs.
    pub keep: bool,
}

/// One run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Run {
    /// `process` or `off`.
    pub snapshot: String,
    /// Entries in the leader's log when node 3 was killed.
    pub log_entries: u64,
    /// Megabytes loaded first (`--dataset-mb`).
    pub dataset_mb: u64,
    /// Seconds from the kill of backup 3 to it applying the whole log again.
    pub rejoin_s: f64,
    /// Whether node 3's follower restored its server from a snapshot.
    pub rejoin_restored: bool,
    /// Entries node 3's server replayed to rejoin (after its snapshot, or
    /// the whole log).
    pub rejoin_replayed: u64,
    /// Seconds from the kill of both backups to the leader's first
    /// acknowledged write.
    pub majority_loss_s: f64,
    /// Seconds from the kill of the leader to its first acknowledged write
    /// after its restart.
    pub leader_restart_s: f64,
    /// Whether the restarted leader installed a backup's snapshot.
    pub leader_installed: bool,
    /// The largest node data directory (RocksDB and snapshots), MB.
    pub disk_max_mb: f64,
    /// The leader's SET p99 (ms) with no snapshot requested (snapshots on
    /// only).
    pub p99_ms: Option<f64>,
    /// The same while backup 2 snapshots again and again.
    pub p99_ms_snapshotting: Option<f64>,
    /// Snapshots backup 2 completed during that run.
    pub snapshots_during: u64,
}

/// Parses `200000,1M,4M` into entry counts.
pub fn parse_entries(s: &str) -> Result<Vec<u64>, String> {
    s.split(',')
        .map(|p| {
            let p = p.trim();
            let (num, mult) = match p.strip_suffix(['M', 'm']) {
                Some(n) => (n, 1_000_000),
                None => match p.strip_suffix(['k', 'K']) {
                    Some(n) => (n, 1_000),
                    None => (p, 1),
                },
            };
            num.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .map(|n| n * mult)
                .ok_or_else(|| {
                    format!("{p:?} is not a positive entry count (e.g. 200000, 500k, 4M)")
                })
        })
        .collect()
}

/// Runs every mode at every length; prints a table (or JSON lines).
pub fn run(opts: &Options) -> anyhow::Result<()> {
    for m in &opts.modes {
        if m != "process" && m != "off" {
            bail!("snapshot mode {m:?}: expected process or off");
        }
    }
    let cases = opts
        .modes
        .iter()
        .flat_map(|mode| opts.entries.iter().map(move |&entries| (mode, entries)));
    run_cluster_cases(
        &opts.out,
        cases,
        opts.json,
        |(mode, entries), out, bins| {
            eprintln!("bench restart: snapshot = {mode}, {entries} entries");
            one_run(mode, entries, out, opts, bins)
        },
        table,
    )
}

/// The markdown table of `runs`.
fn table(runs: &[Run]) -> String {
    let mut t = String::from(
        "| snapshot | log entries | rejoin s | rejoined from a snapshot | entries replayed | majority loss: first write s | leader restart: first write s | leader installed a backup's image | disk per node MB | leader SET p99 ms | p99 ms while a backup snapshots (snapshots taken) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let yes = |b: bool| if b { "yes" } else { "no" };
    for r in runs {
        t.push_str(&format!(
            "| {} | {} | {:.2} | {} | {} | {:.2} | {:.2} | {} | {:.0} | {} | {} |\n",
            r.snapshot,
            r.log_entries,
            r.rejoin_s,
            yes(r.rejoin_restored),
            r.rejoin_replayed,
            r.majority_loss_s,
            r.leader_restart_s,
            yes(r.leader_installed),
            r.disk_max_mb,
            r.p99_ms.map_or("-".into(), |p| format!("{p:.2}")),
            r.p99_ms_snapshotting
                .map_or("-".into(), |p| format!("{p:.2} ({})", r.snapshots_during)),
        ));
    }
    t
}

fn one_run(
    mode: &str,
    entries: u64,
    out: &Path,
    opts: &Options,
    bins: &Binaries,
) -> anyhow::Result<Run> {
    let dir = out.join(format!("{mode}-{entries}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = write_config(&dir, mode, opts.snapshot_every)?;
    let config = Config::load(&path)?;
    let cmd = config.server.clone().unwrap_or_default();
    let stop = AtomicBool::new(false);
    // What the cluster says, kept to learn whether a restart restored.
    let said = Mutex::new(Vec::<String>::new());
    let say = |m: &str| {
        said.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(m.to_string())
    };
    let mut cluster = Cluster::start(config.clone(), &path, &cmd, bins, &stop, &say)?;
    let result = measure(
        &mut cluster,
        mode == "process",
        &config,
        &path,
        entries,
        opts.dataset_mb,
        bins,
        &stop,
        &say,
        &said,
    );
    cluster.stop();
    if !opts.keep && result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result.map(|m| Run {
        snapshot: mode.to_string(),
        log_entries: entries,
        dataset_mb: opts.dataset_mb,
        rejoin_s: m.rejoin.as_secs_f64(),
        rejoin_restored: m.restored,
        rejoin_replayed: m.replayed,
        majority_loss_s: m.majority_loss.as_secs_f64(),
        leader_restart_s: m.leader_restart.as_secs_f64(),
        leader_installed: m.leader_installed,
        disk_max_mb: m.disk_max as f64 / 1e6,
        p99_ms: m.p99.map(|p| p.0),
        p99_ms_snapshotting: m.p99.map(|p| p.1),
        snapshots_during: m.p99.map_or(0, |p| p.2),
    })
}

/// The leader's SET p99 alone, and while backup 2 snapshots over and
/// over (with the count it took meanwhile).
fn p99_while_snapshotting(
    config: &Config,
    leader: SocketAddr,
    dir: &Path,
    stop: &AtomicBool,
) -> anyhow::Result<(f64, f64, u64)> {
    let args: Vec<String> = [
        "-t", "set", "-r", "100000", "-d", "64", "-c", "20", "-n", "100000",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let p99 = |rows: Vec<(String, f64, Option<f64>, Option<f64>)>| {
        rows.first()
            .and_then(|r| r.3)
            .context("redis-benchmark gave no p99")
    };
    let alone = p99(redis_benchmark(leader, &args, dir, stop)?)?;
    let done = AtomicBool::new(false);
    let (busy, taken) = std::thread::scope(|s| {
        let snapper = s.spawn(|| {
            let mut n = 0u64;
            while !done.load(Ordering::Relaxed) {
                if control::take_snapshot(config, 2, Duration::from_secs(60)).is_ok() {
                    n += 1;
                }
            }
            n
        });
        let busy = redis_benchmark(leader, &args, dir, stop);
        done.store(true, Ordering::Relaxed);
        (busy, snapper.join().unwrap_or(0))
    });
    Ok((alone, p99(busy?)?, taken))
}

/// What [`measure`] found.
struct Measured {
    rejoin: Duration,
    restored: bool,
    replayed: u64,
    majority_loss: Duration,
    leader_restart: Duration,
    leader_installed: bool,
    disk_max: u64,
    p99: Option<(f64, f64, u64)>,
}

#[allow(clippy::too_many_arguments)]
fn measure(
    cluster: &mut Cluster,
    snapshots: bool,
    config: &Config,
    path: &Path,
    entries: u64,
    dataset_mb: u64,
    bins: &Binaries,
    stop: &AtomicBool,
    say: &dyn Fn(&str),
    said: &Mutex<Vec<String>>,
) -> anyhow::Result<Measured> {
    let leader = config.node(1)?.app;
    populate(leader, dataset_mb)?;
    fill(config, leader, entries)?;
    wait_converged(config, STEP_LIMIT)?;
    if snapshots {
        // A backup that has been up a while holds a snapshot: measure that.
        wait("node 3 to hold a snapshot", || {
            status::query(config, 3, Duration::from_millis(500)).is_ok_and(|s| s.snapshot > 0)
        })?;
    }
    let snapshot_at = status::query(config, 3, Duration::from_secs(2))
        .map_err(anyhow::Error::msg)?
        .snapshot;
    let disk_max = config
        .ids()
        .map(|id| tree_bytes(&config.node_data_dir(id)))
        .max()
        .unwrap_or(0);

    // Rejoin of one backup.
    said.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let at_kill = status::query(config, 1, Duration::from_secs(2))
        .map_err(anyhow::Error::msg)?
        .committed;
    up::kill_node(config, 3)?;
    let t0 = Instant::now();
    cluster.restart_node(3, path, bins, stop, say)?;
    wait(&format!("node 3 to apply up to seq {at_kill}"), || {
        status::query(config, 3, Duration::from_millis(500))
            .map(|s| s.role == "backup" && s.applied >= at_kill)
            .unwrap_or(false)
    })?;
    let rejoin = t0.elapsed();
    let restored = said
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|l| l.contains("restored the server from a snapshot"));
    wait_converged(config, STEP_LIMIT)?;

    // Both backups lost, then back.
    up::kill_node(config, 2)?;
    up::kill_node(config, 3)?;
    let t0 = Instant::now();
    // Reap both before either restarts: a restart waits on every process
    // of the cluster and takes another's death for its own failure.
    cluster.stop_node_now(2);
    cluster.stop_node_now(3);
    cluster.restart_node(2, path, bins, stop, say)?;
    cluster.restart_node(3, path, bins, stop, say)?;
    let acked = || {
        matches!(
            resp::command(
                leader,
                &["INCR", "lockstep:restart"],
                Duration::from_millis(500)
            ),
            Ok(Value::Int(_))
        )
    };
    wait("the leader to acknowledge a write", acked)?;
    let majority_loss = t0.elapsed();
    wait_converged(config, STEP_LIMIT)?;

    // The leader lost and back (static election: it leads again once its
    // server is rebuilt). With snapshots it deleted its log like the
    // backups (measured once it did: a backup's image rebuilds it).
    if snapshots {
        wait("the leader to delete its log below a snapshot", || {
            status::query(config, 1, Duration::from_millis(500)).is_ok_and(|s| s.oldest > 1)
        })?;
    }
    up::kill_node(config, 1)?;
    let t0 = Instant::now();
    cluster.stop_node_now(1);
    cluster.restart_node(1, path, bins, stop, say)?;
    wait("the restarted leader to acknowledge a write", acked)?;
    let leader_restart = t0.elapsed();
    // A server replaced by an installed image is the node's from now on.
    for line in cluster.reap_lines() {
        say(&line);
    }
    cluster.adopt_replaced_server(1, say);
    // The leader takes no snapshots: one it holds was installed.
    let leader_installed = status::query(config, 1, Duration::from_secs(2))
        .map_err(anyhow::Error::msg)?
        .snapshot
        > 0;
    // Last: its load lengthens the log.
    let p99 = if snapshots {
        wait_converged(config, STEP_LIMIT)?;
        Some(p99_while_snapshotting(
            config,
            leader,
            &config.data_dir,
            stop,
        )?)
    } else {
        None
    };
    Ok(Measured {
        rejoin,
        restored,
        replayed: at_kill
            - if restored {
                snapshot_at.min(at_kill)
            } else {
                0
            },
        majority_loss,
        leader_restart,
        leader_installed,
        disk_max,
        p99,
    })
}

/// Writes SETs (64-byte values over 100k keys) to `leader` until its log
/// holds `entries` entries.
fn fill(config: &Config, leader: SocketAddr, entries: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let have = status::query(config, 1, Duration::from_secs(2))
            .map_err(anyhow::Error::msg)?
            .committed;
        if have >= entries {
            return Ok(());
        }
        if started.elapsed() > STEP_LIMIT {
            bail!("the log reached only {have} of {entries} entries in {STEP_LIMIT:?}");
        }
        let n = (entries - have).clamp(1000, 200_000);
        let st = Command::new("redis-benchmark")
            .args([
                "-h",
                &leader.ip().to_string(),
                "-p",
                &leader.port().to_string(),
            ])
            .args(["-t", "set", "-r", "100000", "-d", "64", "-c", "20", "-q"])
            .args(["-n", &n.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("cannot run redis-benchmark")?;
        if !st.success() {
            bail!("redis-benchmark failed ({st})");
        }
    }
}

fn wait(what: &str, mut cond: impl FnMut() -> bool) -> anyhow::Result<()> {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > STEP_LIMIT {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// A 3-node Redis cluster's config in `dir` (snapshot mode `mode`).
fn write_config(dir: &Path, mode: &str, every: u64) -> anyhow::Result<PathBuf> {
    let name = format!("benchrestart-{}-{mode}", std::process::id());
    let mut spec = bench_spec(&name, dir, "shm")?
        .set("snapshot", mode)
        .set_list("server", &redis_server_args());
    if mode == "process" {
        spec = spec.section(&format!(
            "[snapshot_every]\nentries = {every}\nimage_percent = 0\n"
        ));
    }
    let path = dir.join("cluster.toml");
    spec.write(&path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_lists_parse_with_suffixes_and_refuse_nonsense() {
        assert_eq!(
            parse_entries("200000,500k,4M").unwrap(),
            vec![200_000, 500_000, 4_000_000]
        );
        assert!(parse_entries("0").is_err());
        assert!(parse_entries("lots").is_err());
        assert!(parse_entries("1,,2").is_err());
    }

    #[test]
    fn the_table_has_a_row_per_run() {
        let r = Run {
            snapshot: "process".into(),
            log_entries: 1000,
            dataset_mb: 0,
            rejoin_s: 0.5,
            rejoin_restored: true,
            rejoin_replayed: 10,
            majority_loss_s: 1.25,
            leader_restart_s: 2.5,
            leader_installed: true,
            disk_max_mb: 12.0,
            p99_ms: Some(0.5),
            p99_ms_snapshotting: Some(0.75),
            snapshots_during: 3,
        };
        let t = table(&[
            r.clone(),
            Run {
                snapshot: "off".into(),
                rejoin_restored: false,
                p99_ms: None,
                p99_ms_snapshotting: None,
                ..r
            },
        ]);
        assert!(
            t.contains(
                "| process | 1000 | 0.50 | yes | 10 | 1.25 | 2.50 | yes | 12 | 0.50 | 0.75 (3) |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| off | 1000 | 0.50 | no | 10 | 1.25 | 2.50 | yes | 12 | - | - |"),
            "{t}"
        );
    }
}
