//! What the benchmarks share: their clusters' specs, redis-benchmark run
//! and read, the divergences the nodes counted, the work directory, a
//! dataset written through the leader, the wait for every node to agree.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::config::REDIS_REPLICA_ARGS;
use lockstep_common::resp::Value;
use lockstep_common::Config;
use lockstep_launcher::binaries::Binaries;
use lockstep_launcher::cluster_spec::ClusterSpec;
use lockstep_launcher::resp;

use crate::status;

/// How long any one step of a bench (a dataset written, the nodes
/// agreeing) may take before the bench gives up.
pub(crate) const STEP_LIMIT: Duration = Duration::from_secs(600);
/// How long one redis-benchmark run may take before it counts as hung.
const RUN_LIMIT: Duration = Duration::from_secs(900);

/// A benchmark cluster's `server` command: redis-server as a replica.
pub(crate) fn redis_server_args() -> Vec<&'static str> {
    let mut server = vec!["redis-server", "--port", "{port}", "--bind", "{host}"];
    server.extend(REDIS_REPLICA_ARGS);
    server.extend(["--dir", "{data}"]);
    server
}

/// A benchmark cluster's config: `name`, data under `dir`, `transport`
/// (with a key when it is tcp), a 64 MiB ring, a static leader 1 and
/// three nodes on free loopback ports; the caller adds the rest.
pub(crate) fn bench_spec(name: &str, dir: &Path, transport: &str) -> anyhow::Result<ClusterSpec> {
    let mut spec = ClusterSpec::new(name, &dir.join("data"))
        .set("transport", transport)
        .set("ring_size", "64MiB");
    if transport == "tcp" {
        // A tcp cluster's peers prove a shared key.
        let key = format!("lockstep-bench-key-{:010}", std::process::id());
        spec = spec.set("key", &key);
    }
    spec.loopback_nodes(3, false)
}

/// Writes `spec` to `dir/cluster.toml` and loads it back.
pub(crate) fn write_spec(spec: &ClusterSpec, dir: &Path) -> anyhow::Result<(PathBuf, Config)> {
    let path = dir.join("cluster.toml");
    spec.write(&path)?;
    let config = Config::load(&path)?;
    Ok((path, config))
}

/// Runs redis-benchmark once; returns (test name, rps, p50 ms, p99 ms)
/// per test from its `--csv` output.
#[allow(clippy::type_complexity)]
pub(crate) fn redis_benchmark(
    addr: SocketAddr,
    args: &[String],
    log_dir: &Path,
    stop: &AtomicBool,
) -> anyhow::Result<Vec<(String, f64, Option<f64>, Option<f64>)>> {
    let out_path = log_dir.join("redis-benchmark.csv");
    let err_path = log_dir.join("redis-benchmark.err");
    let mut child = Command::new("redis-benchmark")
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(args)
        .arg("--csv")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()
        .context("cannot start redis-benchmark")?;
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if stop.load(Ordering::Relaxed) || t0.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            bail!(
                "redis-benchmark {} did not finish within {RUN_LIMIT:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let csv = std::fs::read_to_string(&out_path).unwrap_or_default();
    // A terminal's Ctrl-C reaches redis-benchmark too: say why it died.
    if stop.load(Ordering::Relaxed) {
        bail!("interrupted");
    }
    if !st.success() {
        bail!(
            "redis-benchmark {} failed ({st}): {}",
            args.join(" "),
            std::fs::read_to_string(&err_path)
                .unwrap_or_default()
                .trim()
        );
    }
    let rows = parse_csv(&csv);
    if rows.is_empty() {
        bail!(
            "redis-benchmark {} printed no results: {}",
            args.join(" "),
            std::fs::read_to_string(&err_path)
                .unwrap_or_default()
                .trim()
        );
    }
    Ok(rows)
}

/// Parses `redis-benchmark --csv`: a header line naming the columns
/// (redis 7: "test","rps","avg_latency_ms",…,"p50_latency_ms",…), then one
/// line per test. Older versions print only test and rps, without header.
#[allow(clippy::type_complexity)]
fn parse_csv(csv: &str) -> Vec<(String, f64, Option<f64>, Option<f64>)> {
    let fields = |l: &str| -> Vec<String> {
        l.split(',')
            .map(|f| f.trim().trim_matches('"').to_string())
            .collect()
    };
    let mut header: Vec<String> = vec!["test".into(), "rps".into()];
    let mut out = Vec::new();
    for line in csv.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let f = fields(line);
        if f.first().map(|s| s.as_str()) == Some("test") {
            header = f;
            continue;
        }
        let col = |name: &str| -> Option<f64> {
            header
                .iter()
                .position(|h| h == name)
                .and_then(|i| f.get(i))
                .and_then(|v| v.parse().ok())
        };
        if let (Some(test), Some(rps)) = (f.first(), col("rps")) {
            out.push((
                test.clone(),
                rps,
                col("p50_latency_ms"),
                col("p99_latency_ms"),
            ));
        }
    }
    out
}

/// Sum of the divergences the nodes report, once the backups applied
/// everything the leader committed (or after 30 s).
pub(crate) fn lockstep_divergences(config: &Config) -> Option<u64> {
    let t0 = Instant::now();
    loop {
        let nodes = status::query_all(config, Duration::from_secs(1));
        let ok: Vec<_> = nodes
            .iter()
            .filter_map(|n| n.status.as_ref().ok())
            .collect();
        let top = ok.iter().map(|s| s.committed).max().unwrap_or(0);
        let caught_up = ok.len() == nodes.len() && ok.iter().all(|s| s.applied >= top);
        if caught_up || t0.elapsed() > Duration::from_secs(30) {
            if ok.is_empty() {
                return None;
            }
            return Some(ok.iter().map(|s| s.divergences).sum());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the cases of a bench whose runs each start their own Redis
/// clusters (`bench restart`, `bench snapshots`): checks redis-benchmark is
/// there, makes the work directory `out`, runs `one` on each case in
/// order and prints each result as a JSON line when `json`, else `table`
/// of them all at the end.
pub(crate) fn run_cluster_cases<C, R: serde::Serialize>(
    out: &Path,
    cases: impl IntoIterator<Item = C>,
    json: bool,
    mut one: impl FnMut(C, &Path, &Binaries) -> anyhow::Result<R>,
    table: impl Fn(&[R]) -> String,
) -> anyhow::Result<()> {
    if !in_path("redis-benchmark") {
        bail!("redis-benchmark is not installed (Debian package redis-tools; scripts/setup installs it)");
    }
    let bins = Binaries::beside_current_exe()?;
    let out = work_dir(out)?;
    let mut runs = Vec::new();
    for case in cases {
        let r = one(case, &out, &bins)?;
        if json {
            println!("{}", serde_json::to_string(&r)?);
        }
        runs.push(r);
    }
    if !json {
        println!("{}", table(&runs));
    }
    Ok(())
}

/// Creates a bench's work directory `out` and returns it absolute (the
/// clusters' `data_dir` must be: a relative one is read against the
/// config file's directory).
pub(crate) fn work_dir(out: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    out.canonicalize()
        .with_context(|| format!("cannot resolve {}", out.display()))
}

pub(crate) fn in_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

/// Waits until every node is up with nothing left to apply.
pub(crate) fn wait_converged(config: &Config, limit: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let nodes = status::query_all(config, Duration::from_millis(500));
        let ok: Vec<_> = nodes
            .iter()
            .filter_map(|n| n.status.as_ref().ok())
            .collect();
        if ok.len() == nodes.len() {
            let top = ok.iter().map(|s| s.committed).max().unwrap_or(0);
            if ok
                .iter()
                .all(|s| s.applied >= top && (s.role == "leader" || s.role == "backup"))
            {
                return Ok(());
            }
        }
        if start.elapsed() > limit {
            bail!("the cluster did not converge within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Loads `dataset_mb` MB into the Redis at `leader` (`DEBUG POPULATE`,
/// 1000-byte values, one log entry): the dataset an image holds. Nothing
/// when 0.
pub(crate) fn populate(leader: SocketAddr, dataset_mb: u64) -> anyhow::Result<()> {
    if dataset_mb == 0 {
        return Ok(());
    }
    let keys = (dataset_mb * 1000).to_string();
    let r = resp::command(
        leader,
        &["DEBUG", "POPULATE", &keys, "data", "1000"],
        STEP_LIMIT,
    )?;
    if r != Value::Simple("OK".into()) {
        bail!("DEBUG POPULATE {keys} answered {r:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis7_csv() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"SET\",\"30769.23\",\"1.053\",\"0.240\",\"0.951\",\"1.743\",\"3.015\",\"9.927\"\n\
                   \"GET\",\"34188.04\",\"0.958\",\"0.232\",\"0.895\",\"1.639\",\"2.127\",\"6.655\"\n";
        let r = parse_csv(csv);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0], ("SET".into(), 30769.23, Some(0.951), Some(3.015)));
        assert_eq!(r[1].0, "GET");
    }

    #[test]
    fn parses_old_csv_without_latencies() {
        let r = parse_csv("\"SET\",\"81967.21\"\n");
        assert_eq!(r, vec![("SET".into(), 81967.21, None, None)]);
    }
}
