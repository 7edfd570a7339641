//! `lockstep bench redis`: the same load, in one run on this machine,
//! against plain Redis, Redis's own ways of not losing writes (async
//! replicas, `appendfsync always`, `WAIT` after every write), and lockstep
//! clusters (shm with output commit and input commit, tcp).
//!
//! Every system is started by the bench on loopback ports outside the
//! ephemeral range, loaded by `redis-benchmark` (SET, GET, INCR, LPUSH and
//! a pipelined SET) and by the project's own client (`loadgen`: SET, plus
//! `WAIT 1 0` for the WAIT row), and stopped before the next one starts,
//! so no two systems compete for the CPU. The results go to stdout (a
//! table), a JSON file and a PNG chart in the results directory.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use lockstep_common::config::REDIS_REPLICA_ARGS;
use lockstep_common::Config;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use plotters::style::RGBColor;
use serde::Serialize;

use crate::bench::cpu_cost;
use crate::bench::harness::{
    bench_spec, in_path, lockstep_divergences, redis_benchmark, redis_server_args, write_spec,
};
use crate::chart;
use crate::up::Cluster;
use lockstep_common::resp::Value;
use lockstep_launcher::binaries::Binaries;
use lockstep_launcher::commands::redis_command;
use lockstep_launcher::load::{self, LoadSpec, Request};
use lockstep_launcher::ports;
use lockstep_launcher::process::{last_line, open_log, spawn_logged, stop_on_signals, Grouping};
use lockstep_launcher::resp;

/// How long a started server may take to answer PING / a replica to sync.
const READY_LIMIT: Duration = Duration::from_secs(60);
/// How long a stopping redis-server may take after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The redis-benchmark tests of the unpipelined run.
const RB_TESTS: [&str; 4] = ["SET", "GET", "INCR", "LPUSH"];
/// Requests of the one-client run (at most `--requests`): its latency
/// settles within a few thousand.
const LOW_LOAD_REQUESTS: u64 = 20_000;

/// A system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    /// One redis-server, no persistence.
    Plain,
    /// A primary with two native async replicas (`--replicaof`).
    Replicas,
    /// One redis-server with `--appendonly yes --appendfsync always`.
    AofAlways,
    /// A primary with one replica; the client sends `WAIT 1 0` after each write.
    Wait,
    /// lockstep, 3 nodes, shm transport, `commit = "output"`.
    LockstepOutput,
    /// lockstep, 3 nodes, shm transport, `commit = "input"`.
    LockstepInput,
    /// lockstep, 3 nodes, tcp transport, `commit = "output"`.
    LockstepTcp,
}

impl System {
    /// Every system, in the order they run (plain first: the reference).
    pub const ALL: [System; 7] = [
        System::Plain,
        System::Replicas,
        System::AofAlways,
        System::Wait,
        System::LockstepOutput,
        System::LockstepInput,
        System::LockstepTcp,
    ];

    /// The name used by `--only`, the table and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            System::Plain => "plain",
            System::Replicas => "replicas",
            System::AofAlways => "aof-always",
            System::Wait => "wait",
            System::LockstepOutput => "lockstep-output",
            System::LockstepInput => "lockstep-input",
            System::LockstepTcp => "lockstep-tcp",
        }
    }

    /// One line saying what it is.
    pub fn describe(self) -> &'static str {
        match self {
            System::Plain => "redis-server, no persistence",
            System::Replicas => {
                "redis primary + 2 async replicas (--replicaof), load on the primary"
            }
            System::AofAlways => "redis-server --appendonly yes --appendfsync always",
            System::Wait => {
                "redis primary + 1 replica, client sends WAIT 1 0 after every SET (loadgen only)"
            }
            System::LockstepOutput => "lockstep, 3 nodes, shm transport, commit = \"output\"",
            System::LockstepInput => "lockstep, 3 nodes, shm transport, commit = \"input\"",
            System::LockstepTcp => "lockstep, 3 nodes, tcp transport, commit = \"output\"",
        }
    }

    /// Transport and commit mode of a lockstep system.
    fn lockstep(self) -> Option<(&'static str, &'static str)> {
        match self {
            System::LockstepOutput => Some(("shm", "output")),
            System::LockstepInput => Some(("shm", "input")),
            System::LockstepTcp => Some(("tcp", "output")),
            _ => None,
        }
    }

    /// Chart colour.
    fn color(self) -> RGBColor {
        match self {
            System::Plain => RGBColor(140, 140, 140),
            System::Replicas => RGBColor(66, 133, 244),
            System::AofAlways => RGBColor(251, 140, 0),
            System::Wait => RGBColor(142, 68, 173),
            System::LockstepOutput => RGBColor(46, 160, 67),
            System::LockstepInput => RGBColor(0, 150, 160),
            System::LockstepTcp => RGBColor(20, 90, 40),
        }
    }
}

/// Parses `--only`: a comma list of system names.
pub fn parse_systems(s: &str) -> Result<Vec<System>, String> {
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let sys = System::ALL
            .into_iter()
            .find(|x| x.name() == name)
            .ok_or_else(|| {
                format!(
                    "unknown system {name:?} (one of: {})",
                    System::ALL.map(System::name).join(", ")
                )
            })?;
        if !out.contains(&sys) {
            out.push(sys);
        }
    }
    if out.is_empty() {
        return Err("no system named".into());
    }
    Ok(out)
}

/// What `lockstep bench redis` was asked for.
pub struct Options {
    /// Results directory (default: target/bench-redis/<timestamp>).
    pub out: Option<PathBuf>,
    /// Requests per redis-benchmark test and per loadgen run.
    pub requests: u64,
    /// Client connections (redis-benchmark -c, loadgen threads).
    pub clients: usize,
    /// Pipeline depth of the pipelined SET run.
    pub pipeline: usize,
    /// The loadgen runs this long instead of `requests` requests.
    pub duration: Option<Duration>,
    /// Systems to run (all when None).
    pub only: Option<Vec<System>>,
    /// Keep the servers' data and logs afterwards.
    pub keep: bool,
}

/// One measurement: one workload on one system.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// System name.
    pub system: String,
    /// Workload ("SET", "SET -P16", "loadgen SET", …).
    pub workload: String,
    /// redis-benchmark | loadgen.
    pub client: String,
    /// Requests the run made.
    pub requests: u64,
    /// Requests per second.
    pub rps: f64,
    /// Median latency, ms (None when the client does not report it).
    pub p50_ms: Option<f64>,
    /// 99th percentile latency, ms.
    pub p99_ms: Option<f64>,
    /// rps divided by plain Redis's rps for the same workload and client.
    pub ratio_to_plain: Option<f64>,
}

/// Per-system facts besides the rows.
#[derive(Clone, Debug, Serialize)]
struct SystemReport {
    name: String,
    description: String,
    /// Seconds from the first process start to ready.
    start_s: f64,
    /// lockstep only: divergences the nodes reported after the load.
    divergences: Option<u64>,
}

// ---------------------------------------------------------------- ports

/// A loopback port nothing is bound to now, outside the kernel's ephemeral
/// range: a port from there (what binding port 0 hands out) can become the
/// local end of an outgoing connection — there are many here, 50 clients
/// per run — before the server binds it, and then its bind fails.
fn free_port() -> anyhow::Result<u16> {
    ports::try_free_port().context("no free loopback port outside the ephemeral range")
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

// ------------------------------------------------------- plain redis-server

/// A redis-server the bench started; dropping it stops it.
struct RedisServer {
    what: String,
    addr: SocketAddr,
    child: Child,
    log: PathBuf,
}

impl RedisServer {
    /// Starts `redis-server` on a free port with its data in `dir`, plus
    /// `extra` arguments; returns once it answers PING.
    fn start(
        what: &str,
        dir: &Path,
        extra: &[&str],
        stop: &AtomicBool,
    ) -> anyhow::Result<RedisServer> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let addr = loopback(free_port()?);
        let log = dir.join("redis.log");
        let out =
            open_log(&log, false).with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = redis_command(addr.port(), dir, &REDIS_REPLICA_ARGS);
        cmd.args(extra);
        let child = spawn_logged(&mut cmd, out, Grouping::Inherit).context(
            "cannot start redis-server (Debian package redis-server; scripts/setup installs it)",
        )?;
        let mut s = RedisServer {
            what: what.to_string(),
            addr,
            child,
            log,
        };
        s.wait_until("answering PING", stop, |addr| {
            matches!(
                resp::command(addr, &["PING"], Duration::from_secs(1)),
                Ok(Value::Simple(p)) if p == "PONG"
            )
        })?;
        Ok(s)
    }

    /// Polls `ready` until it holds; fails when the server exits, on
    /// Ctrl-C, or after READY_LIMIT.
    fn wait_until(
        &mut self,
        what: &str,
        stop: &AtomicBool,
        ready: impl Fn(SocketAddr) -> bool,
    ) -> anyhow::Result<()> {
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                bail!(
                    "{} exited ({st}) before {what}: {} (log {})",
                    self.what,
                    last_line(&self.log),
                    self.log.display()
                );
            }
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted");
            }
            if ready(self.addr) {
                return Ok(());
            }
            if t0.elapsed() > READY_LIMIT {
                bail!(
                    "{} not {what} within {READY_LIMIT:?} (log {})",
                    self.what,
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until this replica finished its initial sync with the primary.
    fn wait_synced(&mut self, stop: &AtomicBool) -> anyhow::Result<()> {
        self.wait_until("in sync with its primary", stop, |addr| {
            matches!(
                resp::command(addr, &["INFO", "replication"], Duration::from_secs(1)),
                Ok(Value::Bulk(b)) if String::from_utf8_lossy(&b).contains("master_link_status:up")
            )
        })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let t0 = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if t0.elapsed() > STOP_GRACE => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

// ------------------------------------------------------------ the systems

/// A started system; dropping it stops every process of it. Replicas
/// come before their primary in the `Vec` (dropped front to back), so
/// they stop first and do not fill their logs with reconnect attempts.
enum Running {
    Redis(Vec<RedisServer>),
    Lockstep {
        cluster: Box<Cluster>,
        config: Box<Config>,
    },
}

struct Started {
    /// Where the load goes.
    addr: SocketAddr,
    running: Running,
    /// Seconds from the first process start to ready.
    start_s: f64,
}

/// Everything the runs share.
struct Ctx {
    work: PathBuf,
    stop: Arc<AtomicBool>,
    bins: Option<Binaries>,
}

fn start(sys: System, ctx: &Ctx) -> anyhow::Result<Started> {
    let t0 = Instant::now();
    let dir = ctx.work.join(sys.name());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let stop = &*ctx.stop;
    let with_replicas = |n: usize| -> anyhow::Result<(SocketAddr, Running)> {
        // No 5 s wait for more replicas before the initial sync (only
        // start-up time; the load runs after every replica is in sync).
        let primary = RedisServer::start(
            "primary",
            &dir.join("primary"),
            &["--repl-diskless-sync-delay", "0"],
            stop,
        )?;
        let port = primary.addr.port().to_string();
        let mut servers = Vec::new();
        for i in 1..=n {
            let mut r = RedisServer::start(
                &format!("replica {i}"),
                &dir.join(format!("replica-{i}")),
                &["--replicaof", "127.0.0.1", &port],
                stop,
            )?;
            r.wait_synced(stop)?;
            servers.push(r);
        }
        let addr = primary.addr;
        servers.push(primary);
        Ok((addr, Running::Redis(servers)))
    };
    let (addr, running) = match sys {
        System::Plain => {
            let s = RedisServer::start("redis-server", &dir, &[], stop)?;
            (s.addr, Running::Redis(vec![s]))
        }
        System::AofAlways => {
            // Later arguments override REDIS_REPLICA_ARGS's `--appendonly no`.
            let s = RedisServer::start(
                "redis-server (aof)",
                &dir,
                &["--appendonly", "yes", "--appendfsync", "always"],
                stop,
            )?;
            (s.addr, Running::Redis(vec![s]))
        }
        System::Replicas => with_replicas(2)?,
        System::Wait => with_replicas(1)?,
        System::LockstepOutput | System::LockstepInput | System::LockstepTcp => {
            start_lockstep(sys, &dir, ctx)?
        }
    };
    Ok(Started {
        addr,
        running,
        start_s: t0.elapsed().as_secs_f64(),
    })
}

/// Writes a 3-node config for `sys` into `dir` and starts it with
/// `Cluster::start` (as `lockstep up` would); the load goes to node 1,
/// the static leader.
fn start_lockstep(sys: System, dir: &Path, ctx: &Ctx) -> anyhow::Result<(SocketAddr, Running)> {
    let (transport, commit) = sys.lockstep().expect("a lockstep system");
    let bins = ctx
        .bins
        .as_ref()
        .expect("binaries located for lockstep systems");
    let name = format!("benchredis-{}-{}", std::process::id(), sys.name());
    let spec = bench_spec(&name, dir, transport)?
        .set("commit", commit)
        .set_list("server", &redis_server_args());
    let (path, config) = write_spec(&spec, dir)?;
    let cmd = config.server.clone().unwrap_or_default();
    let say = |m: &str| eprintln!("    {m}");
    let cluster = Cluster::start(config.clone(), &path, &cmd, bins, &ctx.stop, &say)?;
    let addr = config.node(1)?.app;
    Ok((
        addr,
        Running::Lockstep {
            cluster: Box::new(cluster),
            config: Box::new(config),
        },
    ))
}

// ------------------------------------------------------------- the loads

/// What each part of a system spent per request in one load.
pub type Cost = (String, String, std::collections::BTreeMap<String, f64>);

/// The processes of a running system, by part (see `cpu_cost`): the
/// server clients talk to, the other servers (replicas, backups), the
/// followers.
fn processes(st: &Started) -> cpu_cost::Processes {
    let mut p = cpu_cost::Processes::default();
    match &st.running {
        Running::Redis(servers) => {
            for s in servers {
                let part = if s.addr == st.addr {
                    "leader server"
                } else {
                    "backup servers"
                };
                p.add(part, s.child.id());
            }
        }
        Running::Lockstep { config, .. } => {
            for n in &config.nodes {
                let Ok(s) = crate::status::query(config, n.id, Duration::from_secs(2)) else {
                    continue;
                };
                let part = if n.app == st.addr {
                    "leader server"
                } else {
                    "backup servers"
                };
                p.add(part, s.server_pid as u32);
                p.add("followers", s.follower_pid as u32);
            }
        }
    }
    p
}

/// A plain redis-server's `redis-benchmark -t set -c 50` rate on this
/// machine (requests/s): the reference `lockstep bench follower` compares
/// the backups' apply rate with. The server lives in `dir` and is stopped
/// before this returns.
pub fn plain_set_rate(dir: &Path, requests: u64) -> anyhow::Result<f64> {
    let stop = AtomicBool::new(false);
    let server = RedisServer::start("plain redis-server", dir, &[], &stop)?;
    let args: Vec<String> = ["-t", "set", "-c", "50", "-n", &requests.to_string()]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let rows = redis_benchmark(server.addr, &args, dir, &stop)?;
    rows.iter()
        .find(|r| r.0 == "SET")
        .map(|r| r.1)
        .context("redis-benchmark reported no SET row")
}

/// Runs every workload against one started system.
fn load(
    sys: System,
    st: &Started,
    opts: &Options,
    ctx: &Ctx,
) -> anyhow::Result<(Vec<Row>, Vec<Cost>)> {
    let stop = &*ctx.stop;
    let log_dir = ctx.work.join(sys.name());
    let mut rows = Vec::new();
    let mut costs = Vec::new();
    let procs = processes(st);
    let mut cost = |load: String, before: &cpu_cost::Sample, requests: u64| {
        let after = cpu_cost::sample(&procs);
        costs.push((
            sys.name().to_string(),
            load,
            cpu_cost::per_request(before, &after, requests),
        ));
    };
    let row = |workload: &str, client: &str, requests: u64, rps, p50, p99| Row {
        system: sys.name().into(),
        workload: workload.into(),
        client: client.into(),
        requests,
        rps,
        p50_ms: p50,
        p99_ms: p99,
        ratio_to_plain: None,
    };
    let report = |r: &Row| {
        eprintln!(
            "    {:<12} {:<15} {:>10.0} req/s  p50 {} ms  p99 {} ms",
            r.workload,
            r.client,
            r.rps,
            r.p50_ms.map(chart::fmt_ms).unwrap_or("-".into()),
            r.p99_ms.map(chart::fmt_ms).unwrap_or("-".into()),
        );
    };
    // redis-benchmark cannot send WAIT after each write: the WAIT row is
    // measured with the loadgen only.
    if sys != System::Wait {
        let common = [
            "-c".to_string(),
            opts.clients.to_string(),
            "-n".to_string(),
            opts.requests.to_string(),
        ];
        eprintln!(
            "  redis-benchmark {}: {} requests each, {} clients",
            RB_TESTS.join(","),
            opts.requests,
            opts.clients
        );
        let mut args = common.to_vec();
        args.extend(["-t".into(), RB_TESTS.join(",").to_lowercase()]);
        let before = cpu_cost::sample(&procs);
        for (test, rps, p50, p99) in redis_benchmark(st.addr, &args, &log_dir, stop)? {
            let r = row(&test, "redis-benchmark", opts.requests, rps, p50, p99);
            report(&r);
            rows.push(r);
        }
        cost(
            RB_TESTS.join(","),
            &before,
            opts.requests * RB_TESTS.len() as u64,
        );
        eprintln!(
            "  redis-benchmark SET pipelined -P {}: {} requests",
            opts.pipeline, opts.requests
        );
        let mut args = common.to_vec();
        args.extend([
            "-t".into(),
            "set".into(),
            "-P".into(),
            opts.pipeline.to_string(),
        ]);
        let before = cpu_cost::sample(&procs);
        let pipelined = redis_benchmark(st.addr, &args, &log_dir, stop)?;
        cost(format!("SET -P{}", opts.pipeline), &before, opts.requests);
        for (test, rps, p50, p99) in pipelined {
            let r = row(
                &format!("{test} -P{}", opts.pipeline),
                "redis-benchmark",
                opts.requests,
                rps,
                p50,
                p99,
            );
            report(&r);
            rows.push(r);
        }
        // Low load: one client, one request at a time. Its p50 minus
        // plain's is what lockstep adds to each request's latency.
        let requests = opts.requests.min(LOW_LOAD_REQUESTS);
        eprintln!("  redis-benchmark SET, one client: {requests} requests");
        let args: Vec<String> = ["-c", "1", "-n", &requests.to_string(), "-t", "set"]
            .map(String::from)
            .to_vec();
        for (test, rps, p50, p99) in redis_benchmark(st.addr, &args, &log_dir, stop)? {
            let r = row(
                &format!("{test} -c1"),
                "redis-benchmark",
                requests,
                rps,
                p50,
                p99,
            );
            report(&r);
            rows.push(r);
        }
    }
    let wait = (sys == System::Wait).then_some(1);
    eprintln!(
        "  loadgen SET{}: {}, {} clients",
        if wait.is_some() { " + WAIT 1 0" } else { "" },
        match opts.duration {
            Some(d) => format!("{} s", d.as_secs_f64()),
            None => format!("{} requests", opts.requests),
        },
        opts.clients
    );
    let before = cpu_cost::sample(&procs);
    let res = load::run(
        &LoadSpec {
            addr: st.addr,
            clients: opts.clients,
            requests: opts.requests,
            duration: opts.duration,
            request: Request::RedisSet {
                wait_replicas: wait,
            },
            pipeline: 1,
            value_size: 3,
        },
        stop,
    )?;
    let r = row(
        "loadgen SET",
        "loadgen",
        res.requests,
        res.rps(),
        Some(res.quantile_ms(0.5)),
        Some(res.quantile_ms(0.99)),
    );
    report(&r);
    rows.push(r);
    // The load client runs in this process: its CPU is not the client
    // part's (which counts the children this bench waited for).
    cost("loadgen SET".into(), &before, res.requests);
    if let Some((_, _, parts)) = costs.last_mut() {
        parts.remove("client");
    }
    Ok((rows, costs))
}

// ------------------------------------------------------------- reporting

/// Fills `ratio_to_plain` from the plain rows of the same workload and client.
fn add_ratios(rows: &mut [Row]) {
    let plain: Vec<(String, String, f64)> = rows
        .iter()
        .filter(|r| r.system == System::Plain.name())
        .map(|r| (r.workload.clone(), r.client.clone(), r.rps))
        .collect();
    for r in rows.iter_mut() {
        r.ratio_to_plain = plain
            .iter()
            .find(|(w, c, _)| *w == r.workload && *c == r.client)
            .filter(|(_, _, rps)| *rps > 0.0)
            .map(|(_, _, rps)| r.rps / rps);
    }
}

/// The stdout table.
fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<16} {:<12} {:<15} {:>10} {:>9} {:>9} {:>9}\n",
        "system", "workload", "client", "req/s", "p50 ms", "p99 ms", "vs plain"
    );
    let ms = |v: Option<f64>| v.map(chart::fmt_ms).unwrap_or_else(|| "-".into());
    for r in rows {
        s.push_str(&format!(
            "{:<16} {:<12} {:<15} {:>10.0} {:>9} {:>9} {:>9}\n",
            r.system,
            r.workload,
            r.client,
            r.rps,
            ms(r.p50_ms),
            ms(r.p99_ms),
            r.ratio_to_plain
                .map(|x| format!("{x:.2}x"))
                .unwrap_or_else(|| "-".into())
        ));
    }
    s
}

/// "31.2k" style req/s for bar labels.
fn short_rps(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The chart's content: one group per workload (in first-seen order), one
/// bar per system that ran it.
fn chart_of(rows: &[Row], systems: &[System], subtitle: String) -> chart::Chart {
    let mut workloads: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (r.workload.clone(), r.client.clone());
        if !workloads.contains(&k) {
            workloads.push(k);
        }
    }
    let relative = rows.iter().any(|r| r.ratio_to_plain.is_some());
    let groups = workloads
        .iter()
        .map(|(w, c)| {
            let of: Vec<&Row> = rows
                .iter()
                .filter(|r| r.workload == *w && r.client == *c)
                .collect();
            let max = of.iter().map(|r| r.rps).fold(0.0, f64::max).max(1e-9);
            chart::Group {
                name: if c == "loadgen" || w.starts_with("loadgen") {
                    w.clone()
                } else {
                    format!("{w} (redis-benchmark)")
                },
                bars: of
                    .iter()
                    .filter_map(|r| {
                        let series = systems.iter().position(|s| s.name() == r.system)?;
                        Some(chart::Bar {
                            series,
                            relative: if relative {
                                r.ratio_to_plain.unwrap_or(0.0)
                            } else {
                                r.rps / max
                            },
                            label: short_rps(r.rps),
                            p99_ms: r.p99_ms,
                        })
                    })
                    .collect(),
            }
        })
        .collect();
    chart::Chart {
        title: "lockstep bench redis".into(),
        subtitle,
        relative_title: if relative {
            "throughput relative to plain Redis (same workload and client; labels: req/s)".into()
        } else {
            "throughput relative to the fastest system per workload (labels: req/s)".into()
        },
        series: systems
            .iter()
            .map(|s| {
                let name = if *s == System::Wait {
                    "redis + WAIT 1 0".to_string()
                } else {
                    s.name().to_string()
                };
                (name, s.color())
            })
            .collect(),
        groups,
    }
}

/// UTC "YYYYmmdd-HHMMSS" without a date crate (civil-from-days).
fn timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// The default results directory: target/bench-redis/<timestamp> of the
/// workspace whose build is running (the exe lives in target/<profile>/),
/// else ./bench-redis/<timestamp>.
fn default_out() -> PathBuf {
    let target = std::env::current_exe().ok().and_then(|exe| {
        let t = exe.parent()?.parent()?.to_path_buf();
        (t.file_name()? == "target").then_some(t)
    });
    target
        .unwrap_or_else(|| PathBuf::from("."))
        .join("bench-redis")
        .join(timestamp())
}

fn redis_version() -> String {
    Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Runs the bench.
pub fn run(opts: &Options) -> anyhow::Result<()> {
    if opts.requests == 0 || opts.clients == 0 || opts.pipeline == 0 {
        bail!("--requests, --clients and --pipeline must be at least 1");
    }
    if !in_path("redis-server") {
        bail!("redis-server not found: install Debian's redis-server package (scripts/setup does)");
    }
    if !in_path("redis-benchmark") {
        bail!(
            "redis-benchmark not found: install Debian's redis-tools package (scripts/setup does)"
        );
    }
    let systems: Vec<System> = opts.only.clone().unwrap_or_else(|| System::ALL.to_vec());
    let bins = if systems.iter().any(|s| s.lockstep().is_some()) {
        Some(Binaries::beside_current_exe()?)
    } else {
        None
    };
    let out = opts.out.clone().unwrap_or_else(default_out);
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let out = out.canonicalize()?;
    let stop = stop_on_signals().context("cannot install signal handlers")?;
    let ctx = Ctx {
        work: out.join("work"),
        stop,
        bins,
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    eprintln!(
        "bench redis: {} systems, {} clients, {} requests per run, {cores} cores; results in {}",
        systems.len(),
        opts.clients,
        opts.requests,
        out.display()
    );
    let t_all = Instant::now();
    let mut rows = Vec::new();
    let mut reports = Vec::new();
    let mut costs: Vec<Cost> = Vec::new();
    let res = (|| -> anyhow::Result<()> {
        for (i, &sys) in systems.iter().enumerate() {
            eprintln!(
                "[{}/{}] {}: {}",
                i + 1,
                systems.len(),
                sys.name(),
                sys.describe()
            );
            let st = start(sys, &ctx).with_context(|| format!("starting {}", sys.name()))?;
            eprintln!("  ready after {:.1} s at {}", st.start_s, st.addr);
            let (r, c) =
                load(sys, &st, opts, &ctx).with_context(|| format!("loading {}", sys.name()))?;
            rows.extend(r);
            costs.extend(c);
            let divergences = match &st.running {
                Running::Lockstep { config, .. } => {
                    let d = lockstep_divergences(config);
                    eprintln!(
                        "  divergences reported by the nodes: {}",
                        d.map(|d| d.to_string()).unwrap_or("unknown".into())
                    );
                    d
                }
                Running::Redis(_) => None,
            };
            reports.push(SystemReport {
                name: sys.name().into(),
                description: sys.describe().into(),
                start_s: st.start_s,
                divergences,
            });
            eprintln!("  stopping {}", sys.name());
            match st.running {
                Running::Lockstep { mut cluster, .. } => cluster.stop(),
                Running::Redis(servers) => drop(servers),
            }
            if !opts.keep {
                let _ = std::fs::remove_dir_all(ctx.work.join(sys.name()));
            }
        }
        Ok(())
    })();
    match &res {
        Ok(()) if !opts.keep => {
            let _ = std::fs::remove_dir_all(&ctx.work);
        }
        Ok(()) => eprintln!("kept the servers' data and logs in {}", ctx.work.display()),
        // Every process is stopped by now (the guards dropped); what they
        // logged is what explains the failure.
        Err(_) => eprintln!(
            "the failed system's data and logs are in {}",
            ctx.work.display()
        ),
    }
    res?;
    add_ratios(&mut rows);
    print!("{}", table(&rows));
    let subtitle = format!(
        "{} clients, {} requests per run, pipeline {}, {cores} cores, {}",
        opts.clients,
        opts.requests,
        opts.pipeline,
        redis_version()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let json = serde_json::json!({
        "bench": "redis",
        "when": timestamp(),
        "cores": cores,
        "redis": redis_version(),
        "options": {
            "requests": opts.requests,
            "clients": opts.clients,
            "pipeline": opts.pipeline,
            "loadgen_duration_s": opts.duration.map(|d| d.as_secs_f64()),
        },
        "systems": reports,
        "rows": rows,
        "cpu_us_per_request": costs
            .iter()
            .map(|(system, load, parts)| serde_json::json!({
                "system": system, "load": load, "parts": parts,
            }))
            .collect::<Vec<_>>(),
        "took_s": t_all.elapsed().as_secs_f64(),
    });
    let json_path = out.join("results.json");
    std::fs::File::create(&json_path)
        .and_then(|mut f| writeln!(f, "{}", serde_json::to_string_pretty(&json)?))
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    let cost_path = out.join("cost.md");
    let cost_table = format!(
        "# CPU per request ({cores} cores; µs of CPU time each part spent per request)\n\n{}",
        cpu_cost::table(&costs)
    );
    std::fs::write(&cost_path, &cost_table)
        .with_context(|| format!("cannot write {}", cost_path.display()))?;
    println!("CPU per request (µs), also in {}:", cost_path.display());
    print!("{}", cpu_cost::table(&costs));
    let png = out.join("chart.png");
    match chart::draw(&chart_of(&rows, &systems, subtitle), &png) {
        Ok(()) => {}
        Err(e) => eprintln!("warning: no chart: {e:#}"),
    }
    println!("results in {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_lists() {
        assert_eq!(
            parse_systems("plain, lockstep-output").unwrap(),
            vec![System::Plain, System::LockstepOutput]
        );
        assert!(parse_systems("plain,nope").unwrap_err().contains("nope"));
        assert!(parse_systems("").is_err());
    }

    #[test]
    fn ratios_compare_same_workload_and_client() {
        let row = |system: &str, workload: &str, client: &str, rps| Row {
            system: system.into(),
            workload: workload.into(),
            client: client.into(),
            requests: 1,
            rps,
            p50_ms: None,
            p99_ms: None,
            ratio_to_plain: None,
        };
        let mut rows = vec![
            row("plain", "SET", "redis-benchmark", 100.0),
            row("plain", "loadgen SET", "loadgen", 50.0),
            row("wait", "loadgen SET", "loadgen", 25.0),
            row("lockstep-tcp", "SET", "redis-benchmark", 40.0),
            row("lockstep-tcp", "GET", "redis-benchmark", 40.0),
        ];
        add_ratios(&mut rows);
        let ratios: Vec<Option<f64>> = rows.iter().map(|r| r.ratio_to_plain).collect();
        assert_eq!(
            ratios,
            vec![Some(1.0), Some(1.0), Some(0.5), Some(0.4), None]
        );
    }

    #[test]
    fn timestamps_look_right() {
        let t = timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert!(t.starts_with("20"), "{t}");
        assert_eq!(&t[8..9], "-");
    }
}
