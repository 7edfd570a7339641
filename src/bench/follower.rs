//! `lockstep bench follower`: the follower's figures on this machine.
//!
//! Sets up three nodes (shm or tcp transport, static leader 1): three real
//! `lockstep-follower` processes with real RocksDB, and real redis-servers
//! under the preload on the two backups. The bench itself plays the
//! leader's preload: it appends entries with the preload's own
//! [`LeaderWriter`] (the leader's ring, then the backups' through the
//! configured transport), waits for acks as the preload does and raises
//! the commit index once a majority acked — the same protocol
//! `liblockstep.so` runs — but without a leader server, so the figures are
//! the followers' alone.
//!
//! 1. **persist+ack latency** per entry size: from the moment an entry is
//!    in every ring to the moment a follower's ack is in the leader's
//!    region (each follower, and the majority a client waits for). Once
//!    back to back ("hot": followers still spinning) and once after an idle
//!    gap ("parked": followers asleep on the region's doorbell).
//! 2. **streaming**: `--entries` small Redis commands over `--conns`
//!    connections, pipelined as fast as acks allow: ingest rate (majority
//!    acked) and the backups' live apply rate.
//! 3. **restart replay**: node 2's server and follower are SIGKILLed; the
//!    follower restarts on its RocksDB with a fresh server and replays the
//!    whole log into it. Its rate is the apply throughput from a stored
//!    log; the two backups' `DEBUG DIGEST`s are compared afterwards.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::control::NodeStatus;
use lockstep_common::entry::{self, EntryHeader, Kind};
use lockstep_common::leader_writer::{
    self, AckMajority, AppendError, AppendHooks, LeaderWriter, Waited,
};
use lockstep_common::region::{self, Region};
use lockstep_common::resp::{command_bytes, Value};
use lockstep_common::ring::{ReadOutcome, RingReader};
use lockstep_common::transport::{self, Transport, TransportError};
use lockstep_common::Config;
use lockstep_launcher::cluster_spec::{ClusterSpec, ElectionSpec};
use lockstep_launcher::commands::{follower_command, redis_command, under_preload};
use lockstep_launcher::process::{kill_and_reap, open_log, spawn_logged, Grouping};
use lockstep_launcher::resp;
use serde_json::json;

use lockstep_launcher::binaries::Binaries;

/// What `lockstep bench follower` was asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// "shm" or "tcp".
    pub transport: String,
    /// "memory-ack" or "fsync".
    pub durability: String,
    /// Ring size, e.g. "64MiB".
    pub ring_size: String,
    /// Entry payload sizes for the latency runs.
    pub sizes: Vec<usize>,
    /// Measured entries per size and mode.
    pub samples: usize,
    /// Idle gap before each "parked" sample.
    pub idle: Duration,
    /// Entries of the streaming run (and of the replayed log).
    pub entries: u64,
    /// Client connections the streamed entries are spread over.
    pub conns: u64,
    /// Print one JSON object instead of tables.
    pub json: bool,
    /// Keep the working directory (logs, RocksDB).
    pub keep: bool,
    /// Start the backups' servers only after the latency runs, so those
    /// figures leave out the apply work (replay into Redis) competing for
    /// the CPU.
    pub servers_after_latency: bool,
}

/// Bound on every wait of the bench: reaching it is a hang.
const HANG: Duration = Duration::from_secs(600);
const NODES: u64 = 3;
const LEADER: u64 = 1;

// ---------------------------------------------------------------------
// Processes

/// The bench's cluster: config, follower processes, backup servers. Kills
/// them and removes region files (and, unless kept, the directory) on drop.
struct Bench {
    dir: PathBuf,
    config: Config,
    config_path: PathBuf,
    bins: Binaries,
    followers: Vec<Option<Child>>,
    servers: Vec<Option<Child>>,
    keep: bool,
}

impl Bench {
    fn new(opts: &Options) -> anyhow::Result<Bench> {
        let bins = Binaries::beside_current_exe()?;
        let pid = std::process::id();
        let name = format!("bench{pid}");
        let dir = std::env::temp_dir().join(format!("lockstep-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let key = format!("lockstep-bench-key-{pid:010}");
        let spec = ClusterSpec::new(&name, &dir.join("data"))
            .set("transport", &opts.transport)
            .set("ring_size", &opts.ring_size)
            .set("durability", &opts.durability)
            .set("backup_clients", "allow")
            .set("key", &key)
            .election(ElectionSpec::Static { leader: LEADER })
            .loopback_nodes(NODES, true)?;
        let config_path = dir.join("cluster.toml");
        spec.write(&config_path)?;
        let config = Config::load(&config_path)?;
        Ok(Bench {
            dir,
            config,
            config_path,
            bins,
            followers: (0..NODES).map(|_| None).collect(),
            servers: (0..NODES).map(|_| None).collect(),
            keep: opts.keep,
        })
    }

    fn log(&self, what: &str, id: u64) -> anyhow::Result<std::fs::File> {
        Ok(open_log(&self.dir.join(format!("{what}-{id}.log")), true)?)
    }

    fn status(&self, id: u64) -> Result<NodeStatus, String> {
        lockstep_common::control::query_status(&self.config, id, Duration::from_secs(5))
    }

    fn wait(
        &mut self,
        what: &str,
        mut cond: impl FnMut(&Bench) -> Result<bool, String>,
    ) -> anyhow::Result<()> {
        let start = Instant::now();
        let mut last = String::new();
        loop {
            match cond(self) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => last = e,
            }
            for c in self
                .followers
                .iter_mut()
                .chain(self.servers.iter_mut())
                .flatten()
            {
                if let Ok(Some(st)) = c.try_wait() {
                    bail!("a process of the bench (pid {}) exited ({st}) while waiting for {what}\n{}", c.id(), self.logs());
                }
            }
            if start.elapsed() > HANG {
                bail!("timed out waiting for {what} ({last})\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn start_follower(&mut self, id: u64) -> anyhow::Result<()> {
        let log = self.log("follower", id)?;
        let mut cmd = follower_command(&self.bins.follower, &self.config_path, id);
        cmd.env("LOCKSTEP_LOG", "info");
        let child = spawn_logged(&mut cmd, log, Grouping::Inherit)
            .with_context(|| format!("cannot start {}", self.bins.follower.display()))?;
        self.followers[id as usize - 1] = Some(child);
        self.wait(&format!("follower {id} answering"), |b| {
            Ok(b.status(id).is_ok())
        })
    }

    fn start_server(&mut self, id: u64) -> anyhow::Result<()> {
        let app = self.config.node(id)?.app;
        let data = self.dir.join(format!("server-{id}"));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data)?;
        let log = self.log("server", id)?;
        let mut cmd = redis_command(
            app.port(),
            &data,
            &lockstep_common::config::REDIS_REPLICA_ARGS,
        );
        // Dated when the log began, as on every replica (see `lockstep run`).
        self.wait(&format!("node {id} to know when the log began"), |b| {
            Ok(lockstep_launcher::commands::region_origin(&b.config, id).is_some())
        })?;
        under_preload(&mut cmd, &self.bins.preload, &self.config_path, id);
        let child = spawn_logged(&mut cmd, log, Grouping::Inherit)
            .context("cannot start redis-server (is it installed? scripts/setup installs it)")?;
        self.servers[id as usize - 1] = Some(child);
        self.wait(&format!("server {id} listening and attached"), |b| {
            Ok(TcpStream::connect(app).is_ok() && b.status(id)?.server_pid != 0)
        })
    }

    fn logs(&self) -> String {
        lockstep_launcher::process::log_tails(&[&self.dir], 8)
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        for c in self.servers.iter_mut().chain(self.followers.iter_mut()) {
            kill_and_reap(c);
        }
        for id in 1..=NODES {
            let _ = std::fs::remove_file(region::region_path(&self.config.cluster, id));
        }
        if self.keep {
            eprintln!("bench: kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------
// The bench as the leader's preload

/// How long one park on the leader's doorbell lasts while the bench waits
/// for acks.
const PARK: Duration = Duration::from_millis(1);

/// Writes entries the way the leader's preload does, with its writer:
/// ring, peers, tail, doorbell; flow control on the majority ack.
struct Leader {
    region: Arc<Region>,
    transport: Box<dyn Transport>,
    log: LeaderWriter,
    majority: AckMajority,
}

impl Leader {
    fn attach(config: &Config) -> anyhow::Result<Leader> {
        let spec = config.region_spec(LEADER);
        let region = Arc::new(
            Region::open(&spec.default_path(), &spec).context("cannot open the leader's region")?,
        );
        let transport = transport::open(config, LEADER, region.clone())?;
        let (seq, pos) = region.writer_start();
        let mut log = LeaderWriter::for_node(config, LEADER);
        log.start(region.view(), seq, pos);
        Ok(Leader {
            majority: log.majority().clone(),
            log,
            region,
            transport,
        })
    }

    /// Highest seq a majority acknowledged.
    fn majority_acked(&self) -> u64 {
        self.majority.acked(&self.region)
    }

    /// Seq of the last entry appended.
    fn last_seq(&self) -> u64 {
        self.log.next_seq() - 1
    }

    /// Appends one entry to every ring; returns its seq.
    fn append(&mut self, kind: Kind, conn: u64, payload: &[u8]) -> anyhow::Result<u64> {
        self.append_timed(kind, conn, 0, payload)
            .map(|(seq, _)| seq)
    }

    /// Appends one entry to every ring; returns its seq and, per node, the
    /// instant the bench started writing the entry into that node's ring
    /// (taken before the write: a write rings the node's doorbell, and on a
    /// small machine the woken follower may run before the bench does).
    fn append_timed(
        &mut self,
        kind: Kind,
        conn: u64,
        flags: u8,
        payload: &[u8],
    ) -> anyhow::Result<(u64, [Instant; NODES as usize])> {
        let mut fields = EntryHeader::new(kind, 0, 0, conn, 0);
        fields.flags = flags;
        let mut hooks = BenchHooks {
            region: &self.region,
            majority: &self.majority,
            at: [Instant::now(); NODES as usize],
            missed: None,
        };
        let posted = self
            .log
            .append(&self.region, &*self.transport, &fields, payload, &mut hooks)
            .map_err(|e| match e {
                AppendError::Room(e) => e,
                e => anyhow::anyhow!("append: {e}"),
            })?;
        if let Some(e) = hooks.missed {
            bail!("{e}");
        }
        Ok((posted.seq, hooks.at))
    }

    /// Waits until `pred(acks)` holds: spins a little, then parks on the
    /// leader's doorbell (acks ring it).
    fn wait_acks(&self, pred: impl FnMut(&[u64; NODES as usize]) -> bool) -> anyhow::Result<()> {
        wait_acks(&self.region, pred)
    }

    fn wait_majority(&self, seq: u64) -> anyhow::Result<()> {
        wait_majority(&self.region, &self.majority, seq)
    }
}

/// The leader's ack array.
fn acks_of(region: &Region) -> [u64; NODES as usize] {
    let mut a = [0; NODES as usize];
    for (i, v) in a.iter_mut().enumerate() {
        *v = region.ack(i as u64 + 1);
    }
    a
}

/// Waits until `pred` holds of the leader's ack array, at most [`HANG`]
/// parked.
fn wait_acks(
    region: &Region,
    mut pred: impl FnMut(&[u64; NODES as usize]) -> bool,
) -> anyhow::Result<()> {
    leader_writer::wait_until(
        region,
        PARK,
        || pred(&acks_of(region)),
        |waited| match waited {
            Waited::Parked(d) if d > HANG => {
                bail!("no majority ack (acks {:?})", acks_of(region))
            }
            _ => Ok(()),
        },
    )
}

/// Waits until a majority acknowledged `seq`, then raises the commit word.
fn wait_majority(region: &Region, majority: &AckMajority, seq: u64) -> anyhow::Result<()> {
    wait_acks(region, |_| majority.has_acked(region, seq))?;
    region.raise_commit(seq);
    Ok(())
}

/// The bench's side of an append: room is the majority's acks, each
/// node's write is timed, and a lost peer fails the bench.
struct BenchHooks<'a> {
    region: &'a Region,
    majority: &'a AckMajority,
    at: [Instant; NODES as usize],
    missed: Option<String>,
}

impl AppendHooks for BenchHooks<'_> {
    type Error = anyhow::Error;

    fn wait_for_room(&mut self, seq: u64) -> anyhow::Result<()> {
        wait_majority(self.region, self.majority, seq)
    }

    fn writing_to(&mut self, node: u64) {
        self.at[node as usize - 1] = Instant::now();
    }

    fn peer_missed(&mut self, node: u64, error: &TransportError) {
        self.missed
            .get_or_insert_with(|| format!("cannot write to node {node}: {error}"));
    }
}

// ---------------------------------------------------------------------
// Payloads

/// A `SET key value` command of exactly `size` bytes (the key is padded
/// when the value's length digits would skip `size`); the shortest such
/// command when `size` is below it.
fn set_of_size(key: &str, size: usize) -> Vec<u8> {
    for pad in 0..4 {
        let key = format!("{key}{}", "_".repeat(pad));
        let base = command_bytes(&[b"SET", key.as_bytes(), b""]).len();
        if size <= base {
            return command_bytes(&[b"SET", key.as_bytes(), b""]);
        }
        // The length prefix grows by at most 6 digits here.
        for vlen in (size - base).saturating_sub(6)..=size - base {
            let cmd = command_bytes(&[b"SET", key.as_bytes(), &vec![b'x'; vlen]]);
            if cmd.len() == size {
                return cmd;
            }
        }
    }
    unreachable!("no SET command of {size} bytes")
}

// ---------------------------------------------------------------------
// Figures

/// Nearest-rank percentile of sorted `v` (µs).
fn pct(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[derive(Debug)]
struct Latency {
    size: usize,
    mode: &'static str,
    /// µs, sorted: leader's own follower, backups (both pooled), majority.
    own: Vec<f64>,
    backups: Vec<f64>,
    majority: Vec<f64>,
    /// Backups' mean RocksDB write per batch (µs) and entries per batch.
    persist_us: f64,
    per_batch: f64,
}

impl Latency {
    fn summary(v: &[f64]) -> serde_json::Value {
        json!({"p50_us": pct(v, 0.50), "p99_us": pct(v, 0.99), "p999_us": pct(v, 0.999), "max_us": pct(v, 1.0), "n": v.len()})
    }
}

/// Measures persist+ack latency of `samples` entries of `size` bytes.
fn latency(
    l: &mut Leader,
    conn: u64,
    size: usize,
    samples: usize,
    idle: Option<Duration>,
) -> anyhow::Result<Latency> {
    let payload = set_of_size(&format!("lat:{size}"), size);
    let warmup = (samples / 10).max(10);
    let mut out = Latency {
        size: payload.len(),
        mode: if idle.is_some() { "parked" } else { "hot" },
        own: Vec::with_capacity(samples),
        backups: Vec::with_capacity(2 * samples),
        majority: Vec::with_capacity(samples),
        persist_us: f64::NAN,
        per_batch: f64::NAN,
    };
    for i in 0..warmup + samples {
        if let Some(gap) = idle {
            std::thread::sleep(gap);
        }
        let (seq, written) = l.append_timed(Kind::Data, conn, 0, &payload)?;
        let mut at: [Option<Duration>; NODES as usize] = [None; NODES as usize];
        let mut majority_at = None;
        let m = l.majority.need();
        l.wait_acks(|a| {
            let now = Instant::now();
            for (k, &x) in a.iter().enumerate() {
                if x >= seq && at[k].is_none() {
                    at[k] = Some(now - written[k]);
                }
            }
            if majority_at.is_none() && at.iter().filter(|t| t.is_some()).count() >= m {
                // A client waits from the first write on.
                majority_at = Some(now - written[LEADER as usize - 1]);
            }
            at.iter().all(|t| t.is_some())
        })?;
        l.region.raise_commit(seq);
        if i >= warmup {
            let us = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e6).unwrap_or(f64::NAN);
            out.own.push(us(at[LEADER as usize - 1]));
            for id in (1..=NODES).filter(|&id| id != LEADER) {
                out.backups.push(us(at[id as usize - 1]));
            }
            out.majority.push(us(majority_at));
        }
    }
    for v in [&mut out.own, &mut out.backups, &mut out.majority] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    Ok(out)
}

struct Stream {
    /// Entries streamed (the connections' ACCEPTs included).
    entries: u64,
    /// Last seq of the log afterwards.
    last: u64,
    bytes: u64,
    ingest: Duration,
    applied_live: Duration,
}

/// Streams `n` small commands over `conns` connections (round robin, the
/// order many clients produce); returns when both backups applied them.
fn stream(b: &mut Bench, l: &mut Leader, n: u64, conns: u64) -> anyhow::Result<Stream> {
    let start = Instant::now();
    let mut ids = Vec::new();
    for _ in 0..conns {
        ids.push(l.append(Kind::Accept, 0, &[])?);
    }
    let mut bytes = 0u64;
    let report = (n / 10).max(1);
    for i in 0..n {
        let c = (i % conns) as usize;
        let cmd = if i % 2 == 0 {
            command_bytes(&[
                b"SET",
                format!("k:{}", i % 10_000).as_bytes(),
                format!("v{i:016}").as_bytes(),
            ])
        } else {
            command_bytes(&[b"INCR", format!("ctr:{c}").as_bytes()])
        };
        bytes += cmd.len() as u64;
        // One round over the connections is one turn of a busy server's
        // event loop (every client ready): its entries carry SAME_TURN as
        // the preload's would, so backups may hand them over together.
        let flags = if c == 0 { 0 } else { entry::SAME_TURN };
        let (seq, _) = l.append_timed(Kind::Data, ids[c], flags, &cmd)?;
        if seq % 64 == 0 {
            let m = l.majority_acked();
            l.region.raise_commit(m);
        }
        if (i + 1) % report == 0 {
            eprintln!(
                "  streamed {} of {n} entries ({:.1?})",
                i + 1,
                start.elapsed()
            );
        }
    }
    let last = l.last_seq();
    l.wait_majority(last)?;
    let ingest = start.elapsed();
    b.wait("both backups applying the streamed entries", |b| {
        Ok((1..=NODES)
            .filter(|&id| id != LEADER)
            .all(|id| b.status(id).map(|s| s.applied >= last).unwrap_or(false)))
    })?;
    Ok(Stream {
        entries: n + conns,
        last,
        bytes,
        ingest,
        applied_live: start.elapsed(),
    })
}

struct Replay {
    entries: u64,
    /// From the follower's spawn to its first status answer.
    startup: Duration,
    /// From the spawn to the whole log applied to the fresh server.
    total: Duration,
}

/// SIGKILLs node `id` (server and follower), restarts it with a fresh
/// server, and times the replay of its whole log.
fn restart_replay(b: &mut Bench, id: u64, last: u64) -> anyhow::Result<Replay> {
    kill_and_reap(&mut b.servers[id as usize - 1]);
    kill_and_reap(&mut b.followers[id as usize - 1]);
    let t0 = Instant::now();
    b.start_follower(id)?;
    let startup = t0.elapsed();
    b.start_server(id)?;
    let report = Instant::now();
    let mut said = Instant::now();
    b.wait(&format!("node {id} replaying its log"), |b| {
        let s = b.status(id)?;
        if said.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "  node {id}: applied {} of {last} ({:.1?})",
                s.applied,
                report.elapsed()
            );
            said = Instant::now();
        }
        Ok(s.applied >= last)
    })?;
    Ok(Replay {
        entries: last,
        startup,
        total: t0.elapsed(),
    })
}

/// `DEBUG DIGEST` of the Redis at `addr`.
/// `DEBUG DIGEST` of the Redis server at `addr` (another reply as it reads).
fn digest(addr: SocketAddr) -> anyhow::Result<String> {
    Ok(
        match resp::command(addr, &["DEBUG", "DIGEST"], Duration::from_secs(60))? {
            Value::Simple(s) => s,
            other => format!("{other:?}"),
        },
    )
}

/// `lockstep_persist_seconds` (sum in seconds, count of batches) and
/// `lockstep_persisted_entries_total` from node `id`'s metrics.
fn persist_metrics(config: &Config, id: u64) -> Option<(f64, f64, f64)> {
    let addr = config.node(id).ok()?.metrics?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).ok()?;
    let get = |name: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    Some((
        get("lockstep_persist_seconds_sum")?,
        get("lockstep_persist_seconds_count")?,
        get("lockstep_persisted_entries_total")?,
    ))
}

/// Mean RocksDB write per batch (µs) and entries per batch on the
/// backups between two scrapes.
fn persist_delta(
    before: &[Option<(f64, f64, f64)>],
    after: &[Option<(f64, f64, f64)>],
) -> (f64, f64) {
    let (mut sum, mut batches, mut entries) = (0.0, 0.0, 0.0);
    for (b, a) in before.iter().zip(after) {
        if let (Some(b), Some(a)) = (b, a) {
            sum += a.0 - b.0;
            batches += a.1 - b.1;
            entries += a.2 - b.2;
        }
    }
    if batches == 0.0 {
        (f64::NAN, f64::NAN)
    } else {
        (sum / batches * 1e6, entries / batches)
    }
}

/// Runs the follower bench.
pub fn run(opts: &Options) -> anyhow::Result<()> {
    let mut b = Bench::new(opts)?;
    eprintln!(
        "bench follower: 3 nodes, transport {}, durability {}, ring {}, work dir {}",
        opts.transport,
        opts.durability,
        opts.ring_size,
        b.dir.display()
    );
    for id in 1..=NODES {
        b.start_follower(id)?;
    }
    if !opts.servers_after_latency {
        for id in (1..=NODES).filter(|&id| id != LEADER) {
            b.start_server(id)?;
        }
    }
    let stand_in = ApplyStandIn::start(&b.config)?;
    b.wait("node 1 leading", |b| Ok(b.status(LEADER)?.role == "leader"))?;
    drop(stand_in);
    let mut l = Leader::attach(&b.config)?;

    // 1. Latency.
    let conn = l.append(Kind::Accept, 0, &[])?;
    l.wait_majority(conn)?;
    let mut lat = Vec::new();
    for &size in &opts.sizes {
        if size > b.config.max_entry as usize {
            bail!(
                "entry size {size} is above max_entry ({})",
                b.config.max_entry
            );
        }
        eprintln!("  latency: {size} B entries");
        let backups: Vec<u64> = (1..=NODES).filter(|&id| id != LEADER).collect();
        let scrape = || {
            backups
                .iter()
                .map(|&id| persist_metrics(&b.config, id))
                .collect::<Vec<_>>()
        };
        let mut modes = vec![None];
        if !opts.idle.is_zero() {
            modes.push(Some(opts.idle));
        }
        for idle in modes {
            let n = if idle.is_some() {
                opts.samples / 4
            } else {
                opts.samples
            };
            let before = scrape();
            let mut x = latency(&mut l, conn, size, n, idle)?;
            (x.persist_us, x.per_batch) = persist_delta(&before, &scrape());
            lat.push(x);
        }
    }

    if opts.servers_after_latency {
        for id in (1..=NODES).filter(|&id| id != LEADER) {
            b.start_server(id)?;
        }
    }

    // 2. Streaming and live apply.
    eprintln!(
        "  streaming {} entries over {} connections",
        opts.entries, opts.conns
    );
    let st = stream(&mut b, &mut l, opts.entries, opts.conns.max(1))?;

    // Apply latency: commit -> every backup's server consumed the input.
    eprintln!("  apply latency: {} commands", opts.samples.min(1000));
    let apply_us = apply_latency(&b.config, &mut l, opts.samples.min(1000))?;

    // 3. Restart replay of the whole log into a fresh server.
    eprintln!(
        "  restarting node 2: replay of {} entries into a fresh redis-server",
        st.last
    );
    let rp = restart_replay(&mut b, 2, st.last)?;
    let d2 = digest(b.config.node(2)?.app)?;
    let d3 = digest(b.config.node(3)?.app)?;
    let divergences: u64 = (1..=NODES)
        .filter_map(|id| b.status(id).ok())
        .map(|s| s.divergences)
        .sum();

    // 4. The reference: a plain redis-server under redis-benchmark SET,
    // on the same machine in the same run (the cluster is idle by now).
    eprintln!("  plain redis-server under redis-benchmark SET -c 50 (the reference)");
    let plain_set = crate::bench::redis::plain_set_rate(&b.dir.join("plain-redis"), 100_000)?;

    let rate = |n: u64, d: Duration| n as f64 / d.as_secs_f64();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    if opts.json {
        let j = json!({
            "machine": {"cores": cores},
            "transport": opts.transport,
            "durability": opts.durability,
            "apply_during_latency": !opts.servers_after_latency,
            "latency": lat.iter().map(|x| json!({
                "entry_bytes": x.size,
                "mode": x.mode,
                "leader_follower": Latency::summary(&x.own),
                "backup": Latency::summary(&x.backups),
                "majority": Latency::summary(&x.majority),
                "backup_rocksdb_write_us_mean": x.persist_us,
                "backup_entries_per_batch": x.per_batch,
            })).collect::<Vec<_>>(),
            "stream": {
                "entries": st.entries,
                "log_entries": st.last,
                "payload_bytes": st.bytes,
                "ingest_s": st.ingest.as_secs_f64(),
                "ingest_entries_per_s": rate(st.entries, st.ingest),
                "live_apply_s": st.applied_live.as_secs_f64(),
                "live_apply_entries_per_s": rate(st.entries, st.applied_live),
                "plain_redis_set_per_s": plain_set,
                "live_apply_to_plain_set": rate(st.entries, st.applied_live) / plain_set,
            },
            "apply_latency": Latency::summary(&apply_us),
            "restart_replay": {
                "entries": rp.entries,
                "follower_startup_s": rp.startup.as_secs_f64(),
                "total_s": rp.total.as_secs_f64(),
                "entries_per_s": rate(rp.entries, rp.total),
                "digests_equal": d2 == d3,
            },
            "divergences": divergences,
        });
        println!("{j}");
    } else {
        println!(
            "persist+ack latency, µs (entry in the ring -> ack in the leader's region; {cores} cores, transport {}, durability {}, {})",
            opts.transport,
            opts.durability,
            if opts.servers_after_latency { "no apply meanwhile" } else { "backups applying to Redis meanwhile" }
        );
        println!(
            "{:>7} {:>7} | {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>9} {:>9} | {:>8}",
            "entry",
            "mode",
            "own p50",
            "own p99",
            "bkp p50",
            "bkp p99",
            "bkp max",
            "maj p50",
            "maj p99",
            "rocksdb"
        );
        for x in &lat {
            println!(
                "{:>7} {:>7} | {:>9.1} {:>9.1} | {:>9.1} {:>9.1} {:>9.1} | {:>9.1} {:>9.1} | {:>8.1}",
                x.size,
                x.mode,
                pct(&x.own, 0.5),
                pct(&x.own, 0.99),
                pct(&x.backups, 0.5),
                pct(&x.backups, 0.99),
                pct(&x.backups, 1.0),
                pct(&x.majority, 0.5),
                pct(&x.majority, 0.99),
                x.persist_us
            );
        }
        println!("  own = the leader node's follower, bkp = each backup's follower, maj = majority (what a client waits for),");
        println!("  rocksdb = the backups' mean RocksDB write per batch (from their metrics)");
        println!();
        println!(
            "streaming {} entries ({} payload bytes) over {} connections (log: {} entries):",
            st.entries, st.bytes, opts.conns, st.last
        );
        println!(
            "  ingest (majority acked)   {:>8.2} s  {:>10.0} entries/s",
            st.ingest.as_secs_f64(),
            rate(st.entries, st.ingest)
        );
        println!(
            "  live apply (both backups) {:>8.2} s  {:>10.0} entries/s",
            st.applied_live.as_secs_f64(),
            rate(st.entries, st.applied_live)
        );
        println!(
            "  plain redis-server SET    {:>8} {:>12.0} req/s    (redis-benchmark -c 50; live apply is {:.2}x that)",
            "",
            plain_set,
            rate(st.entries, st.applied_live) / plain_set
        );
        println!(
            "  apply latency             p50 {:>8.1} µs  p99 {:>8.1} µs  (commit -> every backup's server consumed it)",
            pct(&apply_us, 0.5),
            pct(&apply_us, 0.99)
        );
        println!("restart of node 2 (SIGKILL, fresh redis-server, replay from its RocksDB):");
        println!(
            "  follower answering        {:>8.2} s",
            rp.startup.as_secs_f64()
        );
        println!(
            "  whole log applied         {:>8.2} s  {:>10.0} entries/s  ({} entries)",
            rp.total.as_secs_f64(),
            rate(rp.entries, rp.total),
            rp.entries
        );
        println!(
            "  backups' DEBUG DIGEST     {}",
            if d2 == d3 {
                "equal".to_string()
            } else {
                format!("DIFFER: {d2} vs {d3}")
            }
        );
        println!("  divergences reported      {divergences}");
    }
    if d2 != d3 {
        bail!("the restarted node's digest {d2} differs from node 3's {d3}");
    }
    Ok(())
}

/// Node 1 runs no server here (the bench plays its preload), yet its
/// follower hands it the log's `VIEW` entries before it may lead: this
/// stands in for the passive preload and consumes them, until dropped.
struct ApplyStandIn {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApplyStandIn {
    fn start(config: &Config) -> anyhow::Result<ApplyStandIn> {
        let spec = config.region_spec(LEADER);
        let region =
            Region::open(&spec.default_path(), &spec).context("cannot open the leader's region")?;
        let (size, max) = (
            lockstep_common::region::apply_ring_size(config.ring_size),
            config.max_entry,
        );
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut epoch = u64::MAX;
            let mut reader = RingReader::new(size, 0, 1, max);
            let mut buf = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let a = region.apply();
                let (e, start) = a.epoch();
                if e != epoch {
                    epoch = e;
                    reader = RingReader::new(size, 0, start, max);
                }
                while let ReadOutcome::Entry { header, pos, len } =
                    reader.poll(region.apply_ring(), a.tail(), &mut buf)
                {
                    a.set_applied(header.seq);
                    a.set_head(pos + len as u64);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Ok(ApplyStandIn {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ApplyStandIn {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Measures, for `n` commands one at a time, the time from the commit (a
/// majority stored it; the leader raised its commit word) until every
/// backup's server consumed the input (its preload's applied mark). Includes
/// how the commit reaches the backups: on the next entry's header or, as
/// here with one command in flight, the leader's commit heartbeat.
fn apply_latency(config: &Config, l: &mut Leader, n: usize) -> anyhow::Result<Vec<f64>> {
    let backups: Vec<Region> = (1..=NODES)
        .filter(|&id| id != LEADER)
        .map(|id| {
            let spec = config.region_spec(id);
            Region::open(&spec.default_path(), &spec).context("cannot open a backup's region")
        })
        .collect::<anyhow::Result<_>>()?;
    let conn = l.append(Kind::Accept, 0, &[])?;
    l.wait_majority(conn)?;
    l.region.raise_commit(conn);
    let payload = command_bytes(&[b"INCR", b"apply:latency"]);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let seq = l.append(Kind::Data, conn, &payload)?;
        l.wait_majority(seq)?;
        l.region.raise_commit(seq);
        let committed = Instant::now();
        let limit = committed + Duration::from_secs(30);
        while backups.iter().any(|r| r.apply().applied() < seq) {
            if Instant::now() > limit {
                bail!("seq {seq} not applied by every backup within 30 s");
            }
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        out.push(committed.elapsed().as_secs_f64() * 1e6);
    }
    out.sort_by(|a, b| a.total_cmp(b));
    Ok(out)
}

/// Parses "64,1KiB,16KiB".
pub fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|p| lockstep_common::config::parse_size(p).map(|v| v as usize))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_commands_have_the_asked_size() {
        for size in [40, 64, 100, 1024, 16384, 65536] {
            assert_eq!(set_of_size("lat:1", size).len(), size, "size {size}");
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 0.5), 50.0);
        assert_eq!(pct(&v, 0.99), 99.0);
        assert_eq!(pct(&v, 1.0), 100.0);
        assert!(pct(&[], 0.5).is_nan());
    }

    #[test]
    fn size_lists() {
        assert_eq!(parse_sizes("64,1KiB,16KiB").unwrap(), vec![64, 1024, 16384]);
        assert!(parse_sizes("64,x").is_err());
    }
}
