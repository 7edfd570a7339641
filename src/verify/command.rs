//! `lockstep verify`: starts its own cluster, runs concurrent clients
//! while the nemesis injects faults, heals, waits for recovery, reads the
//! final state, checks the history and writes the report.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::check::{self, Anomaly, Validity, Verdict};
use super::client::{self, Keys, Recorder, Shared, Target, Workload};
use super::cluster::VerifyCluster;
use super::nemesis::{self, Fault, Schedule};
use super::report;
use lockstep_launcher::rng::Rng;

/// The options of `lockstep verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Seconds of load (faults are injected during it)
    #[arg(long, default_value_t = 60)]
    pub time: u64,
    /// Faults to inject, in a shuffled round, one at a time (comma list,
    /// `all` or `none`): kill-leader, kill-backup, pause-leader,
    /// pause-backup (a node's server and follower), each also as
    /// -server or -follower (that process alone: kill-leader-server, …);
    /// kill-majority; partition-leader, partition-halves,
    /// partition-leader-zookeeper, partition-bridge; zookeeper-down;
    /// disk-full-backup (each node's data dir becomes a small tmpfs);
    /// interrupt-install
    #[arg(
        long,
        default_value = "kill-leader,kill-backup,kill-leader-server,kill-leader-follower,pause-leader,pause-leader-follower,partition-leader,partition-halves,partition-leader-zookeeper,partition-bridge,zookeeper-down,kill-majority,disk-full-backup,interrupt-install"
    )]
    pub faults: String,
    /// Workloads the clients run (comma list): list-append (transactions,
    /// checked for strict serializability), register (GET/SET/compare-and-set,
    /// checked for linearizability), counter (INCR, checked for exactly-once)
    #[arg(long, default_value = "list-append,register,counter")]
    pub workloads: String,
    /// Concurrent clients
    #[arg(long, default_value_t = 6)]
    pub clients: u64,
    /// Operations per second, all clients together (0: as fast as the
    /// cluster answers); a bound keeps long runs' histories checkable
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Seconds each fault is held before it is healed
    #[arg(long, default_value_t = 5)]
    pub hold: u64,
    /// Seconds of quiet after each heal (and before the first fault)
    #[arg(long, default_value_t = 5)]
    pub quiet: u64,
    /// How long a request waits for its reply before its outcome is unknown (ms)
    #[arg(long, default_value_t = 3000)]
    pub request_timeout_ms: u64,
    /// Report directory [default: target/verify/<timestamp>]
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of the clients' and the nemesis' choices [default: from the clock]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Log entries between two snapshots of a node's server (the config's
    /// `snapshot_every.entries`): small, so that even a short run takes
    /// snapshots, compacts logs and rebuilds nodes from peers' images
    #[arg(long, default_value_t = 20_000)]
    pub snapshot_every: u64,
    /// The third octet of the private network 10.213.N.0/24 the nodes live on
    #[arg(long, default_value_t = 231)]
    pub subnet: u8,
    /// Check this recorded history (a history.jsonl) again instead of
    /// running anything: prints each checker's verdict
    #[arg(long, value_name = "HISTORY")]
    pub recheck: Option<PathBuf>,
}

/// `--recheck`: the checkers over a recorded history.
fn recheck(path: &std::path::Path) -> anyhow::Result<bool> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let events = super::history::parse(&text)?;
    let verdicts = check::check(&events);
    for v in &verdicts {
        println!(
            "{}: {} ({} ok, {} failed, {} unknown, {} anomalies)",
            v.workload,
            report::validity_word(v.valid),
            v.ok,
            v.fail,
            v.info,
            v.anomalies.len()
        );
        for a in &v.anomalies {
            println!("  {}: {}", a.kind, a.explanation);
        }
    }
    Ok(verdicts.iter().all(|v| v.valid == Validity::Valid))
}

/// How long the cluster may take to recover after the last heal.
const RECOVERY_LIMIT: Duration = Duration::from_secs(120);

/// Runs it; Ok(true) when every checker found the history valid and the
/// cluster recovered with no divergence.
pub fn run(args: &VerifyArgs) -> anyhow::Result<bool> {
    if let Some(path) = &args.recheck {
        return recheck(path);
    }
    let faults: Vec<Fault> = match args.faults.as_str() {
        "none" | "" => Vec::new(),
        "all" => nemesis::FAULTS.iter().map(|(_, f)| *f).collect(),
        list => list
            .split(',')
            .map(|f| f.trim().parse().map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?,
    };
    let workloads: Vec<Workload> = args
        .workloads
        .split(',')
        .map(|w| w.trim().parse().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!workloads.is_empty(), "--workloads names none");
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from("target/verify").join(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs().to_string())
                .unwrap_or_default(),
        )
    });
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let out = out.canonicalize()?;
    let fault_names: Vec<&str> = faults.iter().map(|f| f.name()).collect();
    let header = format!(
        "3 nodes (tcp transport, a network namespace each, ZooKeeper election), {} clients at {} ops/s, workloads {}, faults {}, {} s, seed {seed}",
        args.clients,
        if args.rate == 0 { "most".to_string() } else { args.rate.to_string() },
        args.workloads,
        if faults.is_empty() { "none".to_string() } else { fault_names.join(",") },
        args.time
    );
    println!("verify: {header}; report in {}", out.display());

    let small_disks = faults.contains(&Fault::DiskFullBackup);
    let mut cluster = VerifyCluster::start(
        &out.join("cluster"),
        args.subnet,
        small_disks,
        args.snapshot_every,
    )?;
    println!("verify: cluster up, load starts");
    let recorder = Recorder::new();
    let shared = Arc::new(Shared {
        recorder: recorder.clone(),
        target: Target::new(cluster.config.clone()),
        list_keys: Keys::new(client::ACTIVE_LIST_KEYS, client::APPENDS_PER_KEY),
        register_keys: Keys::new(client::ACTIVE_REGISTER_KEYS, client::OPS_PER_REGISTER),
        workloads: workloads.clone(),
        request_timeout: Duration::from_millis(args.request_timeout_ms),
        interval: (args.rate > 0)
            .then(|| Duration::from_secs_f64(args.clients as f64 / args.rate as f64)),
        stop: Arc::new(AtomicBool::new(false)),
    });
    // The clients run in this thread's network namespace (the clients').
    let threads: Vec<_> = (0..args.clients)
        .map(|i| {
            let shared = shared.clone();
            let stride = args.clients;
            std::thread::spawn(move || client::run(&shared, i, stride, seed ^ (i + 1)))
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(args.time);
    let mut rng = Rng::new(seed);
    let schedule = Schedule {
        warmup: Duration::from_secs(args.quiet.min(args.time / 4)),
        hold: Duration::from_secs(args.hold),
        quiet: Duration::from_secs(args.quiet),
    };
    let (windows, stopped) =
        nemesis::run(&mut cluster, &faults, &schedule, until, &recorder, &mut rng);
    let remaining = until.saturating_duration_since(Instant::now());
    std::thread::sleep(remaining);
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let mut extra = Vec::new();
    if let Some(e) = stopped {
        println!("verify: the faults stopped early: {e:#}");
        extra.push(Verdict::single(
            "nemesis",
            Anomaly {
                kind: "fault not healed".into(),
                explanation: format!(
                    "the faults stopped early, a fault could not be applied or healed: {e:#}"
                ),
                events: Vec::new(),
            },
        ));
    }
    println!(
        "verify: load stopped after {} operations and {} faults; waiting for the cluster to recover",
        recorder.count() / 2,
        windows.len()
    );
    let recovered = cluster.wait_healthy(RECOVERY_LIMIT);
    if let Err(e) = &recovered {
        extra.push(Verdict::single(
            "recovery",
            Anomaly {
                kind: "no recovery".into(),
                explanation: format!("after the last heal the cluster did not recover: {e:#}"),
                events: Vec::new(),
            },
        ));
    } else {
        client::final_reads(
            &shared,
            args.clients * 1_000_000,
            1,
            Instant::now() + RECOVERY_LIMIT,
        );
        cluster.wait_healthy(RECOVERY_LIMIT).ok();
        let diverged: Vec<String> = cluster
            .divergences()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(id, n)| format!("node {id} counted {n}"))
            .collect();
        if !diverged.is_empty() {
            extra.push(Verdict::single(
                "replicas",
                Anomaly {
                    kind: "divergence".into(),
                    explanation: format!(
                        "a backup's server answered differently from the leader's: {} (see the servers' logs in {})",
                        diverged.join(", "),
                        out.join("cluster/logs").display()
                    ),
                    events: Vec::new(),
                },
            ));
        }
    }
    drop(cluster);
    let events = recorder.events();
    let mut verdicts = check::check(&events);
    verdicts.extend(extra);
    let summary = report::write(&out, &events, &windows, &verdicts, &header)?;
    println!("{summary}");
    let valid = verdicts.iter().all(|v| v.valid == Validity::Valid);
    println!(
        "verify: {} (report in {})",
        if valid { "valid" } else { "NOT valid" },
        out.display()
    );
    Ok(valid)
}
