//! `lockstep`: the command line of a lockstep cluster.

mod failover_bench;
mod status;
mod up;
mod zookeeper_server;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use lockstep_common::Config;

#[derive(Parser)]
#[command(name = "lockstep", version, about = "Replicated, fault-tolerant unmodified servers")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Shows view, leader, and per-node persisted/committed/applied/lag/divergences.
    Status {
        /// Cluster config (positional or --config).
        config_pos: Option<PathBuf>,
        /// Cluster config.
        #[arg(long)]
        config: Option<PathBuf>,
        /// One JSON object (keys `view`, `leader`, `nodes` are stable).
        #[arg(long)]
        json: bool,
    },
    /// Starts a whole local cluster (followers, servers under the preload) until Ctrl-C.
    Up {
        /// Cluster config.
        config: PathBuf,
        /// Server command (overrides `server` in the config); {port}, {host}, {data}, {node} are expanded.
        #[arg(long, num_args = 1.., allow_hyphen_values = true)]
        server_cmd: Vec<String>,
    },
    /// SIGKILLs a node's server and follower (fault demos and tests).
    Kill {
        /// Cluster config.
        config: PathBuf,
        /// Node to kill.
        #[arg(long)]
        node: u64,
    },
    /// Checks a config file and prints what it describes.
    Check {
        /// Cluster config.
        config: PathBuf,
    },
    /// Benchmarks (figures, not tests).
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// SIGKILL the leader, time until the new leader acknowledges a write;
    /// restarts the killed node between rounds (needs election.mode = "zookeeper").
    Failover {
        /// Cluster config (started by the bench, like `lockstep up`).
        config: PathBuf,
        /// Rounds.
        #[arg(long, default_value_t = 20)]
        rounds: usize,
    },
}

fn load(pos: Option<PathBuf>, flag: Option<PathBuf>) -> anyhow::Result<Config> {
    let path = flag.or(pos).context("give the cluster config (e.g. --config cluster.toml)")?;
    let c = Config::load(&path)?;
    for w in &c.warnings {
        eprintln!("warning: {w}");
    }
    Ok(c)
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().filter_or("LOCKSTEP_LOG", "warn")).init();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Status { config_pos, config, json } => (|| {
            let c = load(config_pos, config)?;
            let nodes = status::query_all(&c, Duration::from_secs(2));
            if json {
                println!("{}", status::to_json(&c, &nodes));
            } else {
                print!("{}", status::to_table(&c, &nodes));
            }
            Ok(())
        })(),
        Cmd::Up { config, server_cmd } => up::run(&config, server_cmd),
        Cmd::Kill { config, node } => (|| {
            let c = load(Some(config), None)?;
            let killed = up::kill_node(&c, node)?;
            println!("killed node {node}: {killed}");
            Ok(())
        })(),
        Cmd::Bench {
            what: BenchCmd::Failover { config, rounds },
        } => failover_bench::run(&config, rounds),
        Cmd::Check { config } => (|| {
            let c = load(Some(config), None)?;
            println!(
                "cluster {}: {} nodes, transport {:?}, ring {} bytes, election {:?}",
                c.cluster,
                c.nodes.len(),
                c.transport,
                c.ring_size,
                c.election.mode
            );
            Ok(())
        })(),
    };
    if let Err(e) = res {
        eprintln!("lockstep: {e:#}");
        std::process::exit(1);
    }
}
