//! `lockstep bench memcached`: memcached through lockstep, and what its
//! worker threads give there. For each worker count (`-t`) it runs the same
//! closed-loop loads (every connection sends a `set`, or a `get` of a key
//! set before, and waits for the reply; then `set`s pipelined `--pipeline`
//! deep; `lockstep_launcher::load`) against a plain memcached and against
//! 3-node lockstep clusters of them (shm and tcp transports, output
//! commit, static leader 1, started as `lockstep up` starts one), and
//! prints a table (or JSON lines) of requests per second and latency, each
//! lockstep row with its ratio to plain memcached at the same worker
//! count.
//!
//! The leader runs one event-loop turn at a time (the turn lock): its
//! workers take turns instead of running at once, which is what this
//! measures against plain memcached's parallel workers.
//!
//! Figures, not tests: `tests/bench_redis.rs` only checks that it runs and
//! says what it measured.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::Config;
use lockstep_launcher::load::{self, LoadSpec, Request};
use lockstep_launcher::memcache::Memcache;

use crate::bench::harness::{bench_spec, in_path, lockstep_divergences, work_dir, write_spec};
use crate::up::Cluster;
use lockstep_launcher::binaries::Binaries;

/// How long a server or cluster may take to take its first `set`.
const READY_LIMIT: Duration = Duration::from_secs(120);

/// What `lockstep bench memcached` runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Worker thread counts to compare (memcached `-t`).
    pub workers: Vec<u32>,
    /// Client connections (one thread each).
    pub clients: usize,
    /// Depth of the pipelined `set` run.
    pub pipeline: usize,
    /// Systems to run: `plain`, `lockstep-shm`, `lockstep-tcp`.
    pub systems: Vec<String>,
    /// How long each load runs.
    pub duration: Duration,
    /// Work directory (one sub-directory per run).
    pub out: PathBuf,
    /// One JSON object per row instead of a table.
    pub json: bool,
    /// Keep each run's data and logs.
    pub keep: bool,
}

/// One measured load.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// memcached `-t`.
    pub workers: u32,
    /// `plain`, `lockstep-shm` or `lockstep-tcp`.
    pub system: String,
    /// `set`, `get` or `set -P<depth>`.
    pub workload: String,
    /// Requests completed.
    pub requests: u64,
    /// Requests per second.
    pub rps: f64,
    /// Median and 99th percentile latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// `rps` over plain memcached's with the same workers and workload.
    pub ratio_to_plain: Option<f64>,
    /// Divergences the lockstep nodes counted (None for plain).
    pub divergences: Option<u64>,
}

/// Runs every worker count, plain and through lockstep.
pub fn run(opts: &Options) -> anyhow::Result<()> {
    if !in_path("memcached") {
        bail!("memcached is not installed (Debian package memcached; scripts/setup installs it)");
    }
    if opts.workers.is_empty() || opts.workers.contains(&0) {
        bail!("--workers: expected worker counts of 1 or more, e.g. 1,4");
    }
    for s in &opts.systems {
        if !matches!(s.as_str(), "plain" | "lockstep-shm" | "lockstep-tcp") {
            bail!("--systems: {s:?} is none of plain, lockstep-shm, lockstep-tcp");
        }
    }
    let bins = Binaries::beside_current_exe()?;
    let out = work_dir(&opts.out)?;
    let mut rows: Vec<Row> = Vec::new();
    for &workers in &opts.workers {
        for system in opts.systems.iter().map(String::as_str) {
            eprintln!("bench memcached: -t {workers}, {system}");
            let dir = out.join(format!("{system}-t{workers}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let mut measured = match system {
                "plain" => {
                    let server = PlainMemcached::start(workers, &dir)?;
                    loads(server.addr, workers, system, opts)?
                }
                _ => {
                    let transport = system.trim_start_matches("lockstep-");
                    let (mut cluster, config) = start_lockstep(workers, transport, &dir, &bins)?;
                    let r = loads(config.node(1)?.app, workers, system, opts);
                    let divergences = lockstep_divergences(&config);
                    cluster.stop();
                    let mut r = r?;
                    for row in &mut r {
                        row.divergences = divergences;
                    }
                    r
                }
            };
            // A run that succeeded leaves nothing behind (unless kept).
            if !opts.keep {
                let _ = std::fs::remove_dir_all(&dir);
            }
            for row in &mut measured {
                row.ratio_to_plain = rows
                    .iter()
                    .find(|p| {
                        p.system == "plain" && p.workers == workers && p.workload == row.workload
                    })
                    .map(|p| row.rps / p.rps);
                if opts.json {
                    println!("{}", serde_json::to_string(row)?);
                }
            }
            rows.extend(measured);
        }
    }
    if !opts.json {
        println!("{}", table(&rows));
    }
    Ok(())
}

/// The `set` load, the `get` and `incr` loads of the keys it set, the
/// pipelined `set`s.
fn loads(addr: SocketAddr, workers: u32, system: &str, opts: &Options) -> anyhow::Result<Vec<Row>> {
    let stop = AtomicBool::new(false);
    let mut rows = Vec::new();
    let pipelined = format!("set -P{}", opts.pipeline);
    for (workload, request, pipeline) in [
        ("set", Request::MemcachedSet, 1),
        ("get", Request::MemcachedGet, 1),
        ("incr", Request::MemcachedIncr, 1),
        (pipelined.as_str(), Request::MemcachedSet, opts.pipeline),
    ] {
        let res = load::run(
            &LoadSpec {
                addr,
                clients: opts.clients,
                requests: 0,
                duration: Some(opts.duration),
                request,
                pipeline,
                value_size: 32,
            },
            &stop,
        )?;
        let row = Row {
            workers,
            system: system.into(),
            workload: workload.into(),
            requests: res.requests,
            rps: res.rps(),
            p50_ms: res.quantile_ms(0.5),
            p99_ms: res.quantile_ms(0.99),
            ratio_to_plain: None,
            divergences: None,
        };
        eprintln!(
            "  {workload}: {:.0} req/s, p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms, max {:.3} ms",
            row.rps,
            row.p50_ms,
            row.p99_ms,
            res.quantile_ms(0.999),
            res.latency_ns.max() as f64 / 1e6
        );
        rows.push(row);
    }
    Ok(rows)
}

/// The markdown table of `rows`.
fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| -t | system | load | req/s | × plain | p50 ms | p99 ms | divergences |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        t.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {:.3} | {:.3} | {} |\n",
            r.workers,
            r.system,
            r.workload,
            r.rps,
            r.ratio_to_plain
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.p50_ms,
            r.p99_ms,
            r.divergences
                .map(|d| d.to_string())
                .unwrap_or_else(|| "-".into()),
        ));
    }
    t
}

/// The memcached command line of one node or of the plain server.
fn memcached_args(workers: u32) -> Vec<String> {
    let t = workers.to_string();
    [
        "memcached",
        "-u",
        "root",
        "-t",
        &t,
        "-U",
        "0",
        "-m",
        "256",
        "-l",
        "{host}",
        "-p",
        "{port}",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

/// A memcached started directly (no lockstep), stopped on drop.
struct PlainMemcached {
    addr: SocketAddr,
    child: Child,
}

impl PlainMemcached {
    fn start(workers: u32, dir: &Path) -> anyhow::Result<PlainMemcached> {
        let port = lockstep_launcher::ports::free_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let args: Vec<String> = memcached_args(workers)
            .into_iter()
            .map(|a| {
                a.replace("{host}", "127.0.0.1")
                    .replace("{port}", &port.to_string())
            })
            .collect();
        let log = std::fs::File::create(dir.join("memcached.log"))?;
        let child = Command::new(&args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start memcached")?;
        let server = PlainMemcached { addr, child };
        wait_stores(addr)?;
        Ok(server)
    }
}

impl Drop for PlainMemcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the server at `addr` stores an item.
fn wait_stores(addr: SocketAddr) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        let stored = Memcache::connect(addr)
            .and_then(|mut m| m.request(b"set lockstep:ready 0 0 1\r\n1\r\n"))
            .is_ok_and(|r| r == "STORED");
        if stored {
            return Ok(());
        }
        if t0.elapsed() > READY_LIMIT {
            bail!("memcached at {addr} stored nothing within {READY_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes a 3-node memcached config (`transport` shm or tcp) into `dir`
/// and starts it as `lockstep up` would; returns once the leader (node 1)
/// stores an item.
fn start_lockstep(
    workers: u32,
    transport: &str,
    dir: &Path,
    bins: &Binaries,
) -> anyhow::Result<(Cluster, Config)> {
    let name = format!("benchmc-{}-{transport}-t{workers}", std::process::id());
    let spec = bench_spec(&name, dir, transport)?
        .set("commit", "output")
        .set("protocol", "memcached")
        .set("backup_clients", "deny")
        .set_list("server", &memcached_args(workers));
    let (path, config) = write_spec(&spec, dir)?;
    let cmd = config.server.clone().unwrap_or_default();
    let stop = AtomicBool::new(false);
    let say = |m: &str| eprintln!("    {m}");
    let cluster = Cluster::start(config.clone(), &path, &cmd, bins, &stop, &say)?;
    wait_stores(config.node(1)?.app)?;
    Ok((cluster, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_run() {
        let row = |system: &str, rps, ratio| Row {
            workers: 4,
            system: system.into(),
            workload: "set".into(),
            requests: 10,
            rps,
            p50_ms: 0.25,
            p99_ms: 1.5,
            ratio_to_plain: ratio,
            divergences: (system != "plain").then_some(0),
        };
        let t = table(&[
            row("plain", 1000.0, None),
            row("lockstep-shm", 500.0, Some(0.5)),
        ]);
        assert!(
            t.contains("| 4 | plain | set | 1000 | - | 0.250 | 1.500 | - |"),
            "{t}"
        );
        assert!(
            t.contains("| 4 | lockstep-shm | set | 500 | 0.50 | 0.250 | 1.500 | 0 |"),
            "{t}"
        );
    }
}
