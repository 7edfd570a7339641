//! `lockstep bench snapshots`: what snapshots cost the followers, against
//! the dataset's size, with the image rule (`snapshot_every.image_percent`)
//! at each value asked for (0 is the rule off: a snapshot every
//! `snapshot_every.entries`, as before the rule).
//!
//! For each dataset size and percentage it starts a 3-node Redis cluster
//! (shm, static leader 1, the default `snapshot_every`), loads the dataset
//! with `DEBUG POPULATE` (1000-byte values), has both backups take a first
//! snapshot (so that each has an image to weigh, as a cluster that has run
//! a while does), then runs `redis-benchmark -t set` against the leader and
//! measures, over that run only:
//! - the three followers' CPU seconds (their own threads and their waited
//!   children, which are the CRIU dumps) and per request;
//! - the CRIU dumps' share of it (the children's CPU);
//! - the snapshots the backups took.
//!
//! Figures, not tests: `tests/bench_redis.rs` only checks that it runs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use lockstep_common::{control, Config};
use lockstep_launcher::binaries::Binaries;

use crate::bench::cpu_cost;
use crate::bench::harness::{
    bench_spec, populate, redis_benchmark, redis_server_args, run_cluster_cases, wait_converged,
};
use crate::status;
use crate::up::Cluster;

/// How long any one step may take before the bench gives up.
const STEP_LIMIT: Duration = Duration::from_secs(600);

/// What `lockstep bench snapshots` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Dataset sizes (MB loaded first) to measure at.
    pub datasets_mb: Vec<u64>,
    /// `snapshot_every.image_percent` values to compare.
    pub image_percents: Vec<u64>,
    /// SET requests of the measured run.
    pub requests: u64,
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
    /// Megabytes loaded first.
    pub dataset_mb: u64,
    /// `snapshot_every.image_percent` (0: the rule off).
    pub image_percent: u64,
    /// Bytes of backup 2's first image (taken before the run).
    pub image_bytes: u64,
    /// SET requests of the measured run.
    pub requests: u64,
    /// SETs per second redis-benchmark measured.
    pub set_per_s: f64,
    /// The three followers' CPU seconds over the run, CRIU included.
    pub follower_cpu_s: f64,
    /// That per request, in µs.
    pub follower_us_per_request: f64,
    /// The CRIU dumps' CPU seconds (the followers' waited children).
    pub criu_cpu_s: f64,
    /// Snapshots the two backups completed during the run.
    pub snapshots: u64,
}

impl Run {
    /// The CRIU dumps' share of the followers' CPU.
    pub fn criu_share(&self) -> f64 {
        if self.follower_cpu_s > 0.0 {
            self.criu_cpu_s / self.follower_cpu_s
        } else {
            0.0
        }
    }
}

/// Runs every percentage at every dataset size; prints a table (or JSON
/// lines).
pub fn run(opts: &Options) -> anyhow::Result<()> {
    let cases = opts.datasets_mb.iter().flat_map(|&mb| {
        opts.image_percents
            .iter()
            .map(move |&percent| (mb, percent))
    });
    run_cluster_cases(
        &opts.out,
        cases,
        opts.json,
        |(dataset_mb, percent), out, bins| {
            eprintln!("bench snapshots: {dataset_mb} MB, image_percent = {percent}");
            one_run(dataset_mb, percent, out, opts, bins)
        },
        table,
    )
}

/// The markdown table of `runs`.
fn table(runs: &[Run]) -> String {
    let mut t = String::from(
        "| dataset MB | image_percent | image MB | SET requests | SET/s | followers' CPU s | µs per request | CRIU CPU s | CRIU share | snapshots |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        t.push_str(&format!(
            "| {} | {} | {:.0} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1}% | {} |\n",
            r.dataset_mb,
            r.image_percent,
            r.image_bytes as f64 / 1e6,
            r.requests,
            r.set_per_s,
            r.follower_cpu_s,
            r.follower_us_per_request,
            r.criu_cpu_s,
            r.criu_share() * 100.0,
            r.snapshots,
        ));
    }
    t
}

fn one_run(
    dataset_mb: u64,
    percent: u64,
    out: &Path,
    opts: &Options,
    bins: &Binaries,
) -> anyhow::Result<Run> {
    let dir = out.join(format!("{dataset_mb}mb-{percent}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = write_config(&dir, percent)?;
    let config = Config::load(&path)?;
    let cmd = config.server.clone().unwrap_or_default();
    let stop = AtomicBool::new(false);
    let mut cluster = Cluster::start(config.clone(), &path, &cmd, bins, &stop, &|_| {})?;
    let result = measure(&config, dataset_mb, percent, opts.requests, &dir, &stop);
    cluster.stop();
    if !opts.keep && result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn measure(
    config: &Config,
    dataset_mb: u64,
    percent: u64,
    requests: u64,
    dir: &Path,
    stop: &AtomicBool,
) -> anyhow::Result<Run> {
    let leader = config.node(1)?.app;
    populate(leader, dataset_mb)?;
    wait_converged(config, STEP_LIMIT)?;
    // Each backup images the dataset once first: the run measures the
    // cadence of a cluster that has an image, not its first snapshot.
    for id in [2, 3] {
        control::take_snapshot(config, id, STEP_LIMIT)
            .map_err(|e| anyhow::anyhow!("node {id}'s first snapshot: {e}"))?;
    }
    let image_bytes = node_status(config, 2)?.snapshot_bytes;
    let followers: Vec<u64> = config
        .ids()
        .map(|id| node_status(config, id).map(|s| s.follower_pid))
        .collect::<anyhow::Result<_>>()?;
    let before = cpu_seconds(&followers)?;
    let done = AtomicBool::new(false);
    let (rows, snapshots) = std::thread::scope(|s| {
        let counter = s.spawn(|| count_snapshots(config, &done));
        let rows = redis_benchmark(leader, &bench_args(requests), dir, stop);
        done.store(true, Ordering::Relaxed);
        (rows, counter.join().unwrap_or(0))
    });
    let after = cpu_seconds(&followers)?;
    let set_per_s = rows?
        .first()
        .map(|r| r.1)
        .context("redis-benchmark gave no SET row")?;
    let follower_cpu_s = after.0 - before.0;
    let criu_cpu_s = after.1 - before.1;
    Ok(Run {
        dataset_mb,
        image_percent: percent,
        image_bytes,
        requests,
        set_per_s,
        follower_cpu_s,
        follower_us_per_request: follower_cpu_s * 1e6 / requests.max(1) as f64,
        criu_cpu_s,
        snapshots,
    })
}

fn node_status(config: &Config, id: u64) -> anyhow::Result<control::NodeStatus> {
    status::query(config, id, Duration::from_secs(2))
        .map_err(|e| anyhow::anyhow!("node {id}'s status: {e}"))
}

/// redis-benchmark's arguments: `requests` SETs of 64 bytes over 100k
/// keys from 50 clients (the load `lockstep bench redis` runs).
fn bench_args(requests: u64) -> Vec<String> {
    [
        "-t",
        "set",
        "-r",
        "100000",
        "-d",
        "64",
        "-c",
        "50",
        "-n",
        &requests.to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

/// Snapshots the backups complete until `done`: each new seq their status
/// shows counts one.
fn count_snapshots(config: &Config, done: &AtomicBool) -> u64 {
    let mut newest = [0u64; 2];
    let mut seen = 0;
    let mut first = true;
    while !done.load(Ordering::Relaxed) {
        for (i, id) in [2u64, 3].into_iter().enumerate() {
            if let Ok(s) = status::query(config, id, Duration::from_millis(500)) {
                if s.snapshot != newest[i] && !first {
                    seen += 1;
                }
                newest[i] = s.snapshot;
            }
        }
        first = false;
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// CPU seconds of `pids` (their own and their waited children's), and of
/// their waited children alone.
fn cpu_seconds(pids: &[u64]) -> anyhow::Result<(f64, f64)> {
    let mut all = 0.0;
    let mut children = 0.0;
    for &pid in pids {
        let (own, waited) = cpu_cost::process_and_children_seconds(pid as u32)
            .with_context(|| format!("cannot read the CPU time of follower pid {pid}"))?;
        all += own + waited;
        children += waited;
    }
    Ok((all, children))
}

/// A 3-node Redis cluster's config in `dir` with snapshots on, the
/// default `snapshot_every` and `image_percent = percent`.
fn write_config(dir: &Path, percent: u64) -> anyhow::Result<PathBuf> {
    let name = format!("benchsnap-{}-{percent}", std::process::id());
    let spec = bench_spec(&name, dir, "shm")?
        .set("snapshot", "process")
        .set_list("server", &redis_server_args())
        .section(&format!("[snapshot_every]\nimage_percent = {percent}\n"));
    let path = dir.join("cluster.toml");
    spec.write(&path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_row_per_run_with_the_criu_share() {
        let r = Run {
            dataset_mb: 200,
            image_percent: 100,
            image_bytes: 209_000_000,
            requests: 1_000_000,
            set_per_s: 52_000.0,
            follower_cpu_s: 10.0,
            follower_us_per_request: 10.0,
            criu_cpu_s: 1.5,
            snapshots: 2,
        };
        let t = table(&[r]);
        assert!(
            t.contains("| 200 | 100 | 209 | 1000000 | 52000 | 10.00 | 10.00 | 1.50 | 15.0% | 2 |"),
            "{t}"
        );
    }
}
