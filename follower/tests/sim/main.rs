//! The simulated cluster: the real [`Replica`]s of `lockstep_follower::protocol`
//! over a deterministic network with drops, delays, duplicates (and so
//! reordering), partitions, crash-restarts with storage kept (the lazily
//! saved commit point lost), servers that die; seeded and reproducible.
//! Every other seed takes snapshots through all of it (`cluster::images`):
//! the replicas' snapshot rounds decide who images its server, how far
//! each log is deleted and who installs a peer's image, and the cluster
//! carries that out on model servers and logs.
//! The leader is the real `LeaderWriter` appending into real rings (small
//! ones: long runs wrap, and flow control refuses inputs while a majority
//! has not acked the space they would reuse); followers read them with
//! the real `RingReader` (see `cluster`).
//! Safety is checked after every step (`Cluster::check`, and on every
//! commit and view start); liveness once faults stop: a leader commits a
//! new input within a bound.
//!
//! `cargo test -p lockstep-follower --test sim` runs 10,000 seeds in about
//! 6 s (about 1,600 seeds/s on one core of a machine where the sim with a
//! modelled leader ran them in 3 s: the real writer and readers encode,
//! checksum and copy every entry; the follower and common crates are built
//! with opt-level 2 in dev and test builds, see the workspace Cargo.toml). The
//! long run: `LOCKSTEP_SIM_SEEDS=1000000 cargo test --release -p lockstep-follower --test sim random_runs`
//! (`LOCKSTEP_SIM_FIRST` picks the first seed; a failing seed is printed,
//! rerun it alone with `LOCKSTEP_SIM_FIRST=<seed> LOCKSTEP_SIM_SEEDS=1`).

mod cluster;
mod rng;
mod scenarios;
mod snapshots;

use cluster::{Cluster, Faults, SnapshotCounts};
use lockstep_common::config::SnapshotEvery;
use lockstep_follower::protocol::LeaderChoice;

/// Snapshots in the seeds that take them: every 10 entries (a run
/// commits one or two hundred), the image rule off (log bytes are not
/// simulated).
const SNAPSHOT_EVERY: SnapshotEvery = SnapshotEvery {
    entries: 10,
    bytes: 0,
    image_percent: 0,
};

/// How long, once faults stop, a leader may take to commit a new input.
const LIVENESS_BOUND_MS: u64 = 3000;

/// One seeded run: random faults for a while, then healing and a check
/// that the cluster commits again. Returns how many client inputs the
/// leader's writer refused for a full ring, and what its snapshots did.
pub fn run_seed(seed: u64) -> (u64, SnapshotCounts) {
    let mut rng = rng::Rng::new(seed ^ 0x5eed);
    let n = if rng.percent(70) { 3 } else { 5 };
    let election = if rng.percent(50) {
        LeaderChoice::Zookeeper
    } else {
        LeaderChoice::Static { leader: 1 }
    };
    // Every other seed takes snapshots, compacts and installs them
    // through the faults (by the seed, so that the others run as before).
    let every = seed.is_multiple_of(2).then_some(SNAPSHOT_EVERY);
    let mut c = Cluster::with_snapshots(n, election, seed, every);
    c.faults = Faults {
        drop: rng.below(10),
        duplicate: rng.below(10),
        max_delay: 1 + rng.below(8),
    };
    let fault_ms = 300 + rng.below(500);
    let mut t = 0;
    while t < fault_ms {
        let burst = 5 + rng.below(40);
        c.run(burst, 1 + rng.below(4));
        t += burst;
        let id = 1 + rng.below(n);
        match rng.below(12) {
            0 => c.crash(id, rng.percent(50)),
            1 | 2 if c.nodes[id as usize - 1].replica.is_none() => c.start(id),
            3 => c.isolate(id),
            4 => {
                let other = rng.below(n + 1);
                if other != id {
                    c.cut.insert((id.min(other), id.max(other)));
                }
            }
            5 | 6 => c.heal(),
            7 if rng.percent(20) => c.kill_server(id),
            _ => {}
        }
    }
    // Faults stop: links heal, crashed and stale nodes restart (a stale
    // node's operator restarts it, rebuilding its server from the log).
    c.faults = Faults::NONE;
    c.heal();
    for id in 1..=n {
        let node = &c.nodes[id as usize - 1];
        if node.replica.is_none() || node.stale || !node.server_alive {
            if node.replica.is_some() {
                c.crash(id, false);
            }
            c.start(id);
        }
    }
    let before = c.commit_point();
    let mut waited = 0;
    while waited < LIVENESS_BOUND_MS {
        c.run(10, 2);
        waited += 10;
        if c.serving().is_some() && c.commit_point() > before {
            return (c.refused_full, c.snapshot_counts);
        }
    }
    panic!(
        "seed {seed}: no leader committed within {LIVENESS_BOUND_MS} ms after faults stopped (commit point {before}, serving {:?})",
        c.serving()
    );
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn random_runs() {
    let seeds = env_u64("LOCKSTEP_SIM_SEEDS", 10_000);
    let first = env_u64("LOCKSTEP_SIM_FIRST", 1);
    let start = std::time::Instant::now();
    let (mut refused, mut refusing) = (0, 0);
    let mut snaps = SnapshotCounts::default();
    for seed in first..first + seeds {
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok((n, s)) => {
                refused += n;
                refusing += u64::from(n > 0);
                snaps.images += s.images;
                snaps.compactions += s.compactions;
                snaps.installs += s.installs;
                snaps.restores += s.restores;
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                "seed {seed} failed: {msg}\nrerun: LOCKSTEP_SIM_FIRST={seed} LOCKSTEP_SIM_SEEDS=1"
            );
            }
        }
    }
    eprintln!(
        "{seeds} seeds in {:?}; the ring was full for {refused} inputs in {refusing} seeds; snapshots: {snaps:?}",
        start.elapsed()
    );
}
