//! `lockstep`: the command line of a lockstep cluster.

mod bench;
mod chart;
mod check;
mod launch;
mod run;
mod status;
mod supervisor;
mod up;
mod up_zookeeper;
mod verify;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use lockstep_common::config::KeyError;
use lockstep_common::Config;

/// Replicated, fault-tolerant unmodified servers.
///
/// lockstep runs an unmodified event-loop server (Redis, memcached, ...) on
/// several nodes. A library preloaded into the leader's server writes every
/// input the server reads into a log; each node's follower stores the log,
/// acknowledges it and feeds it to its own server, so every backup holds
/// the leader's state. One TOML file describes the cluster; `lockstep check`
/// reads it, `lockstep up` runs it, `lockstep status` watches it.
///
/// Logging: LOCKSTEP_LOG (default warn), e.g. LOCKSTEP_LOG=info.
/// The reference is docs/reference/cli.md in the source tree.
#[derive(Parser)]
#[command(
    name = "lockstep",
    version,
    after_long_help = "Examples:
  lockstep check examples/redis-3.toml          # is the config sound, and can it run here?
  lockstep up examples/redis-3.toml             # the whole cluster on this host, until Ctrl-C
  lockstep status examples/redis-3.toml         # who leads, and is every node well?
  lockstep kill examples/redis-3.toml --node 1  # SIGKILL a node, to watch it come back
  lockstep help run                             # the help of one subcommand"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Shows who leads and how each node is doing; exits 0 only when the
    /// cluster takes writes.
    ///
    /// Asks every node's follower over its control address and prints one
    /// line per node (role, view, persisted, committed, applied, lag,
    /// divergences, app address), a line for each node that needs a hand,
    /// and whether the cluster takes writes. Exit status 0 only when a
    /// leader with a live majority exists (it answers, leads the newest view,
    /// and a majority of the nodes, itself included, are live members of
    /// that view), no node is degraded, and no node serves clients without
    /// its server attached; 1 otherwise, with a NOT OK line saying what is
    /// missing. It reads the cluster key but never creates it: run it as the
    /// user the followers run as.
    #[command(after_long_help = "Examples:
  lockstep status cluster.toml
  lockstep status --config cluster.toml --json | jq .leader_app
  until lockstep status cluster.toml >/dev/null; do sleep 1; done   # wait until it takes writes")]
    Status {
        /// Cluster config (the same as --config).
        #[arg(value_name = "CONFIG")]
        config_pos: Option<PathBuf>,
        /// Cluster config.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print one JSON object instead of the table (`view`, `leader`,
        /// `leader_app`, `healthy`, `nodes` and the other names are stable;
        /// see docs/reference/status-json.md).
        #[arg(long)]
        json: bool,
    },
    /// Runs a whole cluster on this host until Ctrl-C; with --node N, only
    /// node N (one node per host).
    ///
    /// Starts each node's follower, then its server under the preload
    /// (through `lockstep run`), each in a session of its own, and a private
    /// ZooKeeper when election.mode = "zookeeper" and none answers. While it
    /// runs it heals the nodes: a server or follower that exits, or a node
    /// that turns stale, is restarted with a fresh server rebuilt from the
    /// log, with backoff, one line per step. Ctrl-C (SIGINT) or SIGTERM stops
    /// the servers, then the followers, and leaves no process and no region
    /// file behind; data_dir is kept. Logs go to <data_dir>/logs.
    ///
    /// With --node N it runs node N only and starts no ZooKeeper (the
    /// configured one must answer); run it on each host with the same config.
    #[command(after_long_help = "Examples:
  lockstep up examples/redis-3.toml
  lockstep up examples/redis-3-zk.toml                       # starts a private ZooKeeper if none answers
  lockstep up cluster.toml --node 2                          # on node 2's host (see examples/systemd/)
  lockstep up cluster.toml --server-cmd redis-server --port {port} --save ''")]
    Up {
        /// Cluster config.
        config: PathBuf,
        /// Server command, overriding the config's `server`; {port}, {host},
        /// {data}, {node} are expanded for each node. Takes every argument
        /// after it, so give it last.
        #[arg(long, num_args = 1.., allow_hyphen_values = true)]
        server_cmd: Vec<String>,
        /// Run only this node (its follower and its server, restarted when
        /// they fail): one node per host. Starts no ZooKeeper.
        #[arg(long)]
        node: Option<u64>,
    },
    /// SIGKILLs a node's server and follower (fault demos and tests).
    ///
    /// Kills the server attached to the node's region and the node's
    /// follower at once, as a crash would; a running `lockstep up` then
    /// restarts the node, which rebuilds its server from the log.
    #[command(after_long_help = "Examples:
  lockstep kill examples/redis-3-zk.toml --node 1   # then `lockstep status` shows the new leader")]
    Kill {
        /// Cluster config.
        config: PathBuf,
        /// Node to kill.
        #[arg(long)]
        node: u64,
    },
    /// Has a backup snapshot its server now; prints the snapshot's seq.
    ///
    /// The node's follower takes a CRIU process image of its server at a
    /// turn boundary, in <data_dir>/node-N/snapshots/<seq>/, as it does by
    /// itself every snapshot_every. Only a backup takes one; the leader never
    /// waits for it. Needs CRIU and root on that node. Waits up to 150 s.
    #[command(after_long_help = "Examples:
  lockstep snapshot cluster.toml --node 2")]
    Snapshot {
        /// Cluster config.
        config: PathBuf,
        /// The node (a backup).
        #[arg(long)]
        node: u64,
    },
    /// Checks a config file and what running it needs; exits 1 with one line
    /// per problem.
    ///
    /// Beyond what every command checks when it loads the config, it checks
    /// what `lockstep up` would need: the server program on PATH, {port} in
    /// its command, no memcached with several worker threads (-t) while
    /// backup_clients = "allow", a writable data_dir, a generated key file
    /// that only its owner reads. Then it prints what the config describes
    /// and what this host offers: which nodes' addresses are in use, whether
    /// ZooKeeper answers (problems with --node N, warnings otherwise).
    #[command(after_long_help = "Examples:
  lockstep check examples/redis-3.toml
  lockstep check cluster.toml --node 2   # before starting node 2 by hand on this host")]
    Check {
        /// Cluster config.
        config: PathBuf,
        /// The node about to be started here by hand: its addresses in use,
        /// or no ZooKeeper answering, are problems (otherwise warnings).
        #[arg(long)]
        node: Option<u64>,
    },
    /// Runs node N's server under the preload, as a node started by hand
    /// should be; exits as the server did.
    ///
    /// Refuses a node the config lacks, and one whose app address is in use
    /// or is not an address of this host. Waits for the node's follower (so
    /// start order does not matter), then starts the server with the preload
    /// and the config by absolute path, in a session and PID namespace of
    /// its own (what snapshots need; root is needed for the namespace).
    /// Stays in the foreground, passes SIGTERM/SIGINT/SIGHUP on, says once
    /// when the server attached, and prints the last lines of the server's
    /// log when it fails. `lockstep up` and the systemd unit start servers
    /// this way.
    #[command(after_long_help = "Examples:
  lockstep run --config cluster.toml --node 1                  # the config's `server`, in a fresh {data}
  lockstep run --config cluster.toml --node 1 -- redis-server --port 7001 --save '' --appendonly no")]
    Run {
        /// Cluster config.
        #[arg(long)]
        config: PathBuf,
        /// This node's id in the config.
        #[arg(long)]
        node: u64,
        /// The server's log, its stdout and stderr appended
        /// [default: <data_dir>/logs/server-<node>.log].
        #[arg(long)]
        log: Option<PathBuf>,
        /// Start the server at once, not waiting for the follower (its
        /// preload attaches when the follower comes; clients are refused
        /// until then).
        #[arg(long)]
        no_wait: bool,
        /// The server command, e.g. `-- redis-server --port 7001 --save ''`
        /// [default: the config's `server`, {port}, {host}, {data}, {node}
        /// expanded, in a fresh {data} directory].
        #[arg(last = true)]
        argv: Vec<std::ffi::OsString>,
    },
    /// Checks lockstep itself, Jepsen-style: faults injected into a cluster
    /// of its own while clients run, then the recorded history checked.
    ///
    /// Starts a 3-node Redis cluster (tcp transport, each node in a network
    /// namespace of its own, a private ZooKeeper for the election; root
    /// needed), runs concurrent clients for --time seconds while the
    /// nemesis injects the --faults one at a time (each held --hold
    /// seconds, then healed), waits for the cluster to recover, reads the
    /// final state, and checks the history: list-append transactions for
    /// strict serializability, registers for linearizability, counters for
    /// exactly-once; and that no backup diverged. Writes a report directory:
    /// history.jsonl, faults.json, verdict.json, summary.md, timeline.png.
    /// Exit status 0 only when every check passed.
    #[command(after_long_help = "Examples:
  lockstep verify --time 60                                   # every fault, every workload, a minute
  lockstep verify --time 600 --hold 10 --quiet 10 --out /tmp/verify-long
  lockstep verify --time 30 --faults partition-leader --workloads register")]
    Verify(verify::VerifyArgs),
    /// Runs a node's server in a PID namespace of its own (what `up` and
    /// the tests start servers through, so their process images can be
    /// restored): exits as the server did.
    #[command(hide = true)]
    LaunchServer {
        /// The server's log (its stdout and stderr, appended to).
        #[arg(long)]
        log: PathBuf,
        /// KEY=VALUE set in the server's environment only (the preload's).
        #[arg(long)]
        env: Vec<String>,
        /// Set by the launcher for the namespace's first process.
        #[arg(long)]
        inner: bool,
        /// The server command.
        #[arg(last = true, required = true)]
        argv: Vec<std::ffi::OsString>,
    },
    /// Stands in for a server that a follower restored from a snapshot:
    /// passes SIGTERM/SIGINT/SIGHUP on, exits once it is gone.
    #[command(hide = true)]
    WatchServer {
        /// The restored server's pid.
        #[arg(long)]
        pid: u32,
    },
    /// Benchmarks (figures, not tests).
    ///
    /// Each starts the clusters it measures and stops them afterwards.
    /// Build with --release for figures worth comparing; docs/benchmarks.md
    /// says how each is run and read.
    #[command(after_long_help = "Examples:
  lockstep bench redis --quick
  lockstep bench follower --transport tcp --durability fsync
  lockstep bench failover examples/redis-3-zk.toml --rounds 10")]
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// SIGKILL the leader, time until the new leader acknowledges a write;
    /// restarts the killed node between rounds (needs election.mode = "zookeeper").
    #[command(after_long_help = "Examples:
  lockstep bench failover examples/redis-3-zk.toml
  lockstep bench failover examples/redis-3-zk.toml --rounds 5")]
    Failover {
        /// Cluster config (started by the bench, like `lockstep up`).
        config: PathBuf,
        /// Rounds.
        #[arg(long, default_value_t = 20)]
        rounds: usize,
    },
    /// Follower figures: persist+ack latency per entry size, streaming
    /// ingest and live apply, restart replay of the whole log (starts its
    /// own 3-node cluster; the bench plays the leader's preload).
    #[command(after_long_help = "Examples:
  lockstep bench follower
  lockstep bench follower --transport tcp --durability fsync --sizes 64,4KiB --json")]
    Follower {
        /// Transport between the nodes: shm | tcp.
        #[arg(long, default_value = "shm")]
        transport: String,
        /// memory-ack | fsync.
        #[arg(long, default_value = "memory-ack")]
        durability: String,
        /// Ring size.
        #[arg(long, default_value = "64MiB")]
        ring_size: String,
        /// Entry sizes of the latency runs.
        #[arg(long, default_value = "64,1KiB,16KiB", value_parser = bench::follower::parse_sizes)]
        sizes: std::vec::Vec<usize>,
        /// Measured entries per size (a quarter of that after idle gaps).
        #[arg(long, default_value_t = 2000)]
        samples: usize,
        /// Idle gap before each "parked" sample, in µs (0: skip those runs).
        #[arg(long, default_value_t = 2000)]
        idle_us: u64,
        /// Entries streamed, then replayed by a restarted follower.
        #[arg(long, default_value_t = 1_000_000)]
        entries: u64,
        /// Client connections the streamed entries alternate between.
        #[arg(long, default_value_t = 8)]
        conns: u64,
        /// One JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// Keep the work directory (logs, RocksDB) afterwards.
        #[arg(long)]
        keep: bool,
        /// Start the backups' servers after the latency runs (latency
        /// without apply work competing for the CPU).
        #[arg(long)]
        servers_after_latency: bool,
    },
    /// The same load against plain Redis, Redis with async replicas, with
    /// `appendfsync always`, with `WAIT 1 0` after each write, and 3-node
    /// lockstep clusters (shm output/input commit, tcp): redis-benchmark
    /// and the built-in load client; a table, JSON and a PNG chart.
    #[command(after_long_help = "Examples:
  lockstep bench redis --quick
  lockstep bench redis --only plain,lockstep-output --duration 10 --out /tmp/bench")]
    Redis {
        /// Results directory [default: target/bench-redis/<timestamp>].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Requests per redis-benchmark test and per load-client run
        /// [default: 50000, 5000 with --quick].
        #[arg(long)]
        requests: Option<u64>,
        /// Client connections (redis-benchmark -c, load-client threads).
        #[arg(long, default_value_t = 50)]
        clients: usize,
        /// Depth of the pipelined SET run (redis-benchmark -P).
        #[arg(long, default_value_t = 16)]
        pipeline: usize,
        /// Run the load client this many seconds instead of --requests.
        #[arg(long)]
        duration: Option<f64>,
        /// Only these systems (comma list): plain, replicas, aof-always,
        /// wait, lockstep-output, lockstep-input, lockstep-tcp.
        #[arg(long, value_parser = bench::redis::parse_systems)]
        only: Option<std::vec::Vec<bench::redis::System>>,
        /// A short run (5000 requests per run unless --requests says otherwise).
        #[arg(long)]
        quick: bool,
        /// Keep the servers' data and logs (under the results directory).
        #[arg(long)]
        keep: bool,
    },
    /// memcached with 1 and with 4 worker threads (`-t`), plain and through
    /// 3-node lockstep clusters (shm, tcp), under the same set, get and
    /// pipelined set loads.
    #[command(after_long_help = "Examples:
  lockstep bench memcached
  lockstep bench memcached --workers 1 --systems plain,lockstep-shm --duration 2")]
    Memcached {
        /// Worker thread counts to compare (comma list).
        #[arg(long, default_value = "1,4", value_delimiter = ',')]
        workers: Vec<u32>,
        /// Client connections (one load thread each).
        #[arg(long, default_value_t = 50)]
        clients: usize,
        /// Depth of the pipelined set run.
        #[arg(long, default_value_t = 16)]
        pipeline: usize,
        /// Systems (comma list of plain, lockstep-shm, lockstep-tcp).
        #[arg(
            long,
            default_value = "plain,lockstep-shm,lockstep-tcp",
            value_delimiter = ','
        )]
        systems: Vec<String>,
        /// Seconds each load (set, get, pipelined set) runs.
        #[arg(long, default_value_t = 5.0)]
        duration: f64,
        /// Work directory [default: target/bench-memcached].
        #[arg(long)]
        out: Option<PathBuf>,
        /// One JSON object per row instead of a table.
        #[arg(long)]
        json: bool,
        /// Keep each run's data and logs (under --out).
        #[arg(long)]
        keep: bool,
    },
    /// Rejoin time of a killed backup, and the first acknowledged write
    /// after both backups were killed, against the log's length, with
    /// snapshots on and off (starts its own 3-node Redis clusters).
    #[command(after_long_help = "Examples:
  lockstep bench restart --entries 1M,4M
  lockstep bench restart --entries 1M,4M,16M --dataset-mb 100 --json")]
    Restart {
        /// Log lengths in entries (comma list; k and M suffixes).
        #[arg(long, default_value = "1M,4M", value_parser = bench::restart::parse_entries)]
        entries: std::vec::Vec<u64>,
        /// Snapshot modes to compare (comma list of process, off).
        #[arg(long, default_value = "process,off", value_delimiter = ',')]
        modes: Vec<String>,
        /// `snapshot_every.entries` with snapshots on.
        #[arg(long, default_value_t = lockstep_common::config::DEFAULT_SNAPSHOT_EVERY.entries)]
        snapshot_every: u64,
        /// Megabytes of data loaded into Redis first (`DEBUG POPULATE`,
        /// 1000-byte values), as one log entry: the dataset an image holds.
        #[arg(long, default_value_t = 0)]
        dataset_mb: u64,
        /// Work directory [default: target/bench-restart].
        #[arg(long)]
        out: Option<PathBuf>,
        /// One JSON object per run instead of a table.
        #[arg(long)]
        json: bool,
        /// Keep each run's data and logs.
        #[arg(long)]
        keep: bool,
    },
    /// What snapshots cost the followers (CPU, CRIU's share, snapshots
    /// taken) under a SET load, against the dataset's size, with the image
    /// rule at each `snapshot_every.image_percent` given (0: off; starts its
    /// own 3-node Redis clusters).
    #[command(after_long_help = "Examples:
  lockstep bench snapshots
  lockstep bench snapshots --dataset-mb 0,200,800 --image-percent 0,100 --json")]
    Snapshots {
        /// Megabytes loaded into Redis first (comma list; `DEBUG POPULATE`,
        /// 1000-byte values): the dataset an image holds.
        #[arg(long, default_value = "0,200", value_delimiter = ',')]
        dataset_mb: Vec<u64>,
        /// `snapshot_every.image_percent` values to compare (comma list; 0:
        /// the rule off, a snapshot every `snapshot_every.entries`).
        #[arg(long, default_value = "0,100", value_delimiter = ',')]
        image_percent: Vec<u64>,
        /// SET requests of each measured run.
        #[arg(long, default_value_t = 1_000_000)]
        requests: u64,
        /// Work directory [default: target/bench-snapshots].
        #[arg(long)]
        out: Option<PathBuf>,
        /// One JSON object per run instead of a table.
        #[arg(long)]
        json: bool,
        /// Keep each run's data and logs.
        #[arg(long)]
        keep: bool,
    },
}

fn load(pos: Option<PathBuf>, flag: Option<PathBuf>) -> anyhow::Result<Config> {
    let path = flag
        .or(pos)
        .context("give the cluster config (e.g. --config cluster.toml)")?;
    let c = Config::load(&path)?;
    for w in &c.warnings {
        eprintln!("warning: {w}");
    }
    Ok(c)
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().filter_or("LOCKSTEP_LOG", "warn"))
        .init();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Status {
            config_pos,
            config,
            json,
        } => (|| {
            let path = config.or(config_pos);
            let c = load(path.clone(), None)?;
            let path = path.unwrap_or_default();
            // One line for a missing or exposed key instead of the same
            // error for every node; the queries then reuse it. Read only:
            // asking never creates the key.
            match c.existing_cluster_key() {
                Ok(_) => {}
                // No key yet: no node has started (the first creates it),
                // so each node shows as down, with how to start it.
                Err(KeyError::Io { path, source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    eprintln!(
                        "lockstep: no cluster key at {} yet: no node of this cluster has started here (`lockstep up` or the first follower creates it)",
                        path.display()
                    );
                }
                Err(e) => return Err(e.into()),
            }
            let nodes = status::query_all(&c, Duration::from_secs(2));
            let unreplicated = status::unreplicated_servers(&c, &nodes);
            if json {
                let mut j = status::to_json(&c, &path, &nodes);
                status::mark_unreplicated(&mut j, &unreplicated);
                println!("{j}");
            } else {
                print!("{}", status::to_table(&c, &path, &nodes));
                for (_, why) in &unreplicated {
                    println!("NOT OK: {why}");
                }
            }
            // Exit 1 unless a leader with a live majority takes writes, and
            // no node serves clients unreplicated.
            if status::health(&c, &nodes).is_err() || !unreplicated.is_empty() {
                std::process::exit(1);
            }
            Ok(())
        })(),
        Cmd::Up {
            config,
            server_cmd,
            node,
        } => up::run(&config, server_cmd, node),
        Cmd::Kill { config, node } => (|| {
            let c = load(Some(config), None)?;
            let killed = up::kill_node(&c, node)?;
            println!("killed node {node}: {killed}");
            Ok(())
        })(),
        Cmd::Bench {
            what: BenchCmd::Failover { config, rounds },
        } => bench::failover::run(&config, rounds),
        Cmd::Bench {
            what:
                BenchCmd::Follower {
                    transport,
                    durability,
                    ring_size,
                    sizes,
                    samples,
                    idle_us,
                    entries,
                    conns,
                    json,
                    keep,
                    servers_after_latency,
                },
        } => bench::follower::run(&bench::follower::Options {
            transport,
            durability,
            ring_size,
            sizes,
            samples,
            idle: Duration::from_micros(idle_us),
            entries,
            conns,
            json,
            keep,
            servers_after_latency,
        }),
        Cmd::Bench {
            what:
                BenchCmd::Redis {
                    out,
                    requests,
                    clients,
                    pipeline,
                    duration,
                    only,
                    quick,
                    keep,
                },
        } => bench::redis::run(&bench::redis::Options {
            out,
            requests: requests.unwrap_or(if quick { 5_000 } else { 50_000 }),
            clients,
            pipeline,
            duration: duration.map(Duration::from_secs_f64),
            only,
            keep,
        }),
        Cmd::Bench {
            what:
                BenchCmd::Memcached {
                    workers,
                    clients,
                    pipeline,
                    systems,
                    duration,
                    out,
                    json,
                    keep,
                },
        } => bench::memcached::run(&bench::memcached::Options {
            workers,
            clients,
            pipeline,
            systems,
            duration: Duration::from_secs_f64(duration.max(0.1)),
            out: out.unwrap_or_else(|| PathBuf::from("target/bench-memcached")),
            json,
            keep,
        }),
        Cmd::Bench {
            what:
                BenchCmd::Restart {
                    entries,
                    modes,
                    snapshot_every,
                    dataset_mb,
                    out,
                    json,
                    keep,
                },
        } => bench::restart::run(&bench::restart::Options {
            entries,
            modes,
            snapshot_every,
            dataset_mb,
            out: out.unwrap_or_else(|| PathBuf::from("target/bench-restart")),
            json,
            keep,
        }),
        Cmd::Bench {
            what:
                BenchCmd::Snapshots {
                    dataset_mb,
                    image_percent,
                    requests,
                    out,
                    json,
                    keep,
                },
        } => bench::snapshots::run(&bench::snapshots::Options {
            datasets_mb: dataset_mb,
            image_percents: image_percent,
            requests,
            out: out.unwrap_or_else(|| PathBuf::from("target/bench-snapshots")),
            json,
            keep,
        }),
        Cmd::Snapshot { config, node } => (|| {
            let c = load(Some(config), None)?;
            let seq = lockstep_common::control::take_snapshot(&c, node, Duration::from_secs(150))
                .map_err(|e| anyhow::anyhow!("node {node}: {e}"))?;
            println!(
                "node {node}: snapshot at seq {seq} in {}",
                c.node_data_dir(node)
                    .join("snapshots")
                    .join(format!("{seq:020}"))
                    .display()
            );
            Ok(())
        })(),
        Cmd::LaunchServer {
            log,
            env,
            inner,
            argv,
        } => {
            if inner {
                Err(launch::inner(&log, &env, &argv))
            } else {
                launch::launch(&log, &env, &argv).map(|code| std::process::exit(code))
            }
        }
        Cmd::Run {
            config,
            node,
            log,
            no_wait,
            argv,
        } => run::run(run::RunArgs {
            config,
            node,
            log,
            no_wait,
            argv,
        })
        .map(|code| std::process::exit(code)),
        Cmd::Verify(args) => verify::run(&args).map(|valid| {
            if !valid {
                std::process::exit(1);
            }
        }),
        Cmd::WatchServer { pid } => launch::watch(pid).map(|code| std::process::exit(code)),
        Cmd::Check { config, node } => (|| {
            let c = load(Some(config.clone()), None)?;
            if let Some(id) = node {
                c.node(id)?;
            }
            let mut problems = check::problems(&c);
            let host = check::host_findings(&c, node);
            problems.extend(host.errors);
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("lockstep: {}: {p}", config.display());
                }
                std::process::exit(1);
            }
            print!("{}", check::summary(&c, &config));
            for line in host.lines {
                println!("{line}");
            }
            Ok(())
        })(),
    };
    if let Err(e) = res {
        eprintln!("lockstep: {e:#}");
        std::process::exit(1);
    }
}
