//! lockstep-follower: the per-node process. Polls the node's region, stores
//! entries in RocksDB, acks them to the leader, applies committed entries to
//! the local server, serves the control channel and metrics.

use lockstep_follower::node;
use lockstep_follower::runtime::RegionOnStop;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use lockstep_common::Config;

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "lockstep-follower",
    version,
    about = "lockstep per-node follower process"
)]
struct Args {
    /// Cluster config (TOML).
    #[arg(long)]
    config: PathBuf,
    /// This node's id.
    #[arg(long)]
    node: u64,
    /// Leave the region file in /dev/shm on a clean stop (SIGTERM,
    /// SIGINT), which otherwise removes it: for a supervisor that removes
    /// it itself, and with transport = "shm" where a peer's server dropped
    /// its user id (it cannot open a new file).
    #[arg(long)]
    keep_region: bool,
}

fn main() {
    env_logger::Builder::from_env(
        env_logger::Env::default().filter_or("LOCKSTEP_LOG", "info,zookeeper=off"),
    )
    .format_timestamp_millis()
    .init();
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("lockstep-follower: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let config = Config::load(&args.config)?;
    for w in &config.warnings {
        log::warn!("{}: {w}", args.config.display());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let node = node::Node::start(config, args.node, stop)?;
    node.run(if args.keep_region {
        RegionOnStop::Keep
    } else {
        RegionOnStop::Remove
    })
}
