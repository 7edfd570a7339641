//! The faults `lockstep verify` injects, one at a time: each is applied,
//! held for a while, healed, and followed by a quiet spell in which the
//! cluster recovers before the next.

use std::time::{Duration, Instant};

use super::client::Recorder;
use super::cluster::{Part, VerifyCluster};
use super::report::FaultWindow;
use lockstep_launcher::rng::Rng;
use nix::sys::signal::Signal;

/// Which node a process fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whom {
    /// The node that leads now (node 1 when none does).
    Leader,
    /// A random other node.
    Backup,
}

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of a node's processes; the node is restarted on heal (a
    /// follower from its data dir, a server rebuilt from the log).
    Kill(Whom, Part),
    /// SIGSTOP of a node's processes (a long pause, a frozen VM); SIGCONT
    /// on heal.
    Pause(Whom, Part),
    /// SIGKILL of two nodes (a majority): nothing can commit until heal.
    KillMajority,
    /// The leader cut off from the other nodes and ZooKeeper (its
    /// clients still reach it).
    PartitionLeader,
    /// A random minority node cut off from the majority and ZooKeeper.
    PartitionHalves,
    /// The leader cut off from ZooKeeper only (it still reaches its peers).
    PartitionLeaderZookeeper,
    /// ZooKeeper killed; started again (same data) on heal.
    ZookeeperDown,
    /// Two nodes cut off from each other, the third reaching both (a
    /// bridge); ZooKeeper on one side.
    PartitionBridge,
    /// A backup's disk full (its data dir is a small tmpfs, filled to the
    /// last byte); freed on heal, and the node restarted (its follower
    /// stops at its first write that finds no room).
    DiskFullBackup,
    /// A backup loses its disk and, while it rebuilds from a peer (a
    /// snapshot install), is killed again; restarted on heal.
    InterruptInstall,
}

/// Every fault, by name.
pub const FAULTS: [(&str, Fault); 20] = [
    ("kill-leader", Fault::Kill(Whom::Leader, Part::Both)),
    (
        "kill-leader-server",
        Fault::Kill(Whom::Leader, Part::Server),
    ),
    (
        "kill-leader-follower",
        Fault::Kill(Whom::Leader, Part::Follower),
    ),
    ("kill-backup", Fault::Kill(Whom::Backup, Part::Both)),
    (
        "kill-backup-server",
        Fault::Kill(Whom::Backup, Part::Server),
    ),
    (
        "kill-backup-follower",
        Fault::Kill(Whom::Backup, Part::Follower),
    ),
    ("pause-leader", Fault::Pause(Whom::Leader, Part::Both)),
    (
        "pause-leader-server",
        Fault::Pause(Whom::Leader, Part::Server),
    ),
    (
        "pause-leader-follower",
        Fault::Pause(Whom::Leader, Part::Follower),
    ),
    ("pause-backup", Fault::Pause(Whom::Backup, Part::Both)),
    (
        "pause-backup-server",
        Fault::Pause(Whom::Backup, Part::Server),
    ),
    (
        "pause-backup-follower",
        Fault::Pause(Whom::Backup, Part::Follower),
    ),
    ("kill-majority", Fault::KillMajority),
    ("partition-leader", Fault::PartitionLeader),
    ("partition-halves", Fault::PartitionHalves),
    (
        "partition-leader-zookeeper",
        Fault::PartitionLeaderZookeeper,
    ),
    ("zookeeper-down", Fault::ZookeeperDown),
    ("partition-bridge", Fault::PartitionBridge),
    ("disk-full-backup", Fault::DiskFullBackup),
    ("interrupt-install", Fault::InterruptInstall),
];

impl Fault {
    pub fn name(self) -> &'static str {
        FAULTS
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .expect("every fault has a name")
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Fault, String> {
        FAULTS
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                let names: Vec<&str> = FAULTS.iter().map(|(n, _)| *n).collect();
                format!("unknown fault {s:?} (one of {})", names.join(", "))
            })
    }
}

/// What a fault did, to be healed.
enum Applied {
    Killed(Vec<u64>),
    Paused(u64, Part),
    Partitioned,
    ZookeeperKilled,
    DiskFilled(u64),
}

/// When faults come.
pub struct Schedule {
    /// Quiet time before the first fault.
    pub warmup: Duration,
    /// How long each fault is held.
    pub hold: Duration,
    /// Quiet time after each heal.
    pub quiet: Duration,
}

/// The node the faults aimed at the leader take: the leader if one is
/// known now, else node 1.
fn leader_or_first(c: &VerifyCluster) -> u64 {
    c.leader().unwrap_or(1)
}

/// The node a process fault aimed at `whom` hits.
fn pick(c: &VerifyCluster, whom: Whom, leader: u64, rng: &mut Rng) -> u64 {
    match whom {
        Whom::Leader => leader,
        Whom::Backup => other(c, leader, rng),
    }
}

/// A node other than `not`, chosen by `rng`.
fn other(c: &VerifyCluster, not: u64, rng: &mut Rng) -> u64 {
    let others: Vec<u64> = c.ids().into_iter().filter(|&i| i != not).collect();
    others[rng.below(others.len() as u64) as usize]
}

/// Applies `fault`; returns what it did in words and how to heal it.
fn apply(c: &mut VerifyCluster, fault: Fault, rng: &mut Rng) -> anyhow::Result<(String, Applied)> {
    let leader = leader_or_first(c);
    Ok(match fault {
        Fault::Kill(whom, part) => {
            let id = pick(c, whom, leader, rng);
            let what = match part {
                Part::Both => {
                    c.kill(id);
                    format!("node {id} killed")
                }
                Part::Server => match c.signal_server(id, Signal::SIGKILL)? {
                    0 => format!("node {id} runs no server now: nothing killed"),
                    n => format!("node {id}'s server killed ({n} process)"),
                },
                Part::Follower => {
                    c.kill_follower_only(id);
                    format!("node {id}'s follower killed")
                }
            };
            (what, Applied::Killed(vec![id]))
        }
        Fault::Pause(whom, part) => {
            let id = pick(c, whom, leader, rng);
            let what = match (part, c.pause_part(id, part, true)?) {
                (_, 0) => format!("node {id} runs no such process now: nothing paused"),
                (Part::Both, _) => format!("node {id} paused"),
                (Part::Server, _) => format!("node {id}'s server paused"),
                (Part::Follower, _) => format!("node {id}'s follower paused"),
            };
            (what, Applied::Paused(id, part))
        }
        Fault::KillMajority => {
            let b = other(c, leader, rng);
            c.kill(leader);
            c.kill(b);
            (
                format!("nodes {leader} and {b} killed"),
                Applied::Killed(vec![leader, b]),
            )
        }
        Fault::PartitionLeader | Fault::PartitionHalves => {
            let lone = if fault == Fault::PartitionLeader {
                leader
            } else {
                c.ids()[rng.below(3) as usize]
            };
            let lone_name = lone.to_string();
            let mut rest: Vec<String> = c
                .ids()
                .into_iter()
                .filter(|&i| i != lone)
                .map(|i| i.to_string())
                .collect();
            rest.push("zk".into());
            let rest: Vec<&str> = rest.iter().map(|s| s.as_str()).collect();
            c.net.partition(&[&[lone_name.as_str()], &rest])?;
            (
                format!("node {lone} cut off from {}", rest.join(", ")),
                Applied::Partitioned,
            )
        }
        Fault::PartitionLeaderZookeeper => {
            let lone = leader.to_string();
            c.net.partition(&[&[lone.as_str()], &["zk"]])?;
            (
                format!("node {leader} cut off from ZooKeeper"),
                Applied::Partitioned,
            )
        }
        Fault::ZookeeperDown => {
            c.kill_zookeeper();
            ("ZooKeeper killed".to_string(), Applied::ZookeeperKilled)
        }
        Fault::PartitionBridge => {
            let mut ids = c.ids();
            rng.shuffle(&mut ids);
            let (x, bridge, y) = (ids[0], ids[1], ids[2]);
            let (xs, ys) = (x.to_string(), y.to_string());
            c.net.partition(&[&[xs.as_str(), "zk"], &[ys.as_str()]])?;
            (
                format!(
                    "nodes {x} and {y} cut off from each other, node {bridge} reaching both; ZooKeeper with node {x}"
                ),
                Applied::Partitioned,
            )
        }
        Fault::DiskFullBackup => {
            let id = other(c, leader, rng);
            let bytes = c.fill_disk(id)?;
            (
                format!("node {id}'s disk filled ({} MiB more)", bytes >> 20),
                Applied::DiskFilled(id),
            )
        }
        Fault::InterruptInstall => {
            let id = other(c, leader, rng);
            let what = c.interrupt_rebuild(id, Duration::from_secs(5))?;
            (
                format!("node {id} lost its data dir and was killed during {what}"),
                Applied::Killed(vec![id]),
            )
        }
    })
}

fn heal(c: &mut VerifyCluster, applied: Applied) -> anyhow::Result<()> {
    match applied {
        Applied::Killed(ids) => {
            for id in ids {
                c.restart(id)?;
            }
        }
        Applied::Paused(id, part) => {
            c.pause_part(id, part, false)?;
        }
        Applied::Partitioned => c.net.heal()?,
        Applied::ZookeeperKilled => c.start_zookeeper()?,
        Applied::DiskFilled(id) => {
            c.free_disk(id)?;
            // A follower that cannot persist stops (fail-stop), now or at
            // its next write (RocksDB keeps a write error until reopened):
            // the node starts again once there is room, as a supervisor
            // would start it.
            c.restart(id)?;
        }
    }
    Ok(())
}

/// Injects `faults` in turn (shuffled by `rng`, each at least once when
/// time allows) until `until`; returns each fault's window, and why it
/// stopped early if a fault could not be applied or healed.
pub fn run(
    c: &mut VerifyCluster,
    faults: &[Fault],
    schedule: &Schedule,
    until: Instant,
    recorder: &Recorder,
    rng: &mut Rng,
) -> (Vec<FaultWindow>, Option<anyhow::Error>) {
    let mut windows = Vec::new();
    let stopped = inject(c, faults, schedule, until, recorder, rng, &mut windows).err();
    (windows, stopped)
}

fn inject(
    c: &mut VerifyCluster,
    faults: &[Fault],
    schedule: &Schedule,
    until: Instant,
    recorder: &Recorder,
    rng: &mut Rng,
    windows: &mut Vec<FaultWindow>,
) -> anyhow::Result<()> {
    let mut order: Vec<Fault> = Vec::new();
    std::thread::sleep(schedule.warmup);
    while !faults.is_empty() && Instant::now() + schedule.hold < until {
        if order.is_empty() {
            order = faults.to_vec();
            rng.shuffle(&mut order);
        }
        let fault = order.pop().expect("refilled above");
        let start_ns = recorder.now_ns();
        let (detail, applied) = apply(c, fault, rng)?;
        log::info!("verify: {}: {detail}", fault.name());
        std::thread::sleep(schedule.hold);
        if let Err(e) = heal(c, applied) {
            windows.push(FaultWindow {
                fault: fault.name().to_string(),
                detail: format!("{detail}; the heal failed"),
                start_ns,
                end_ns: recorder.now_ns(),
            });
            return Err(e.context(format!("healing {} ({detail})", fault.name())));
        }
        let rebuilt = c.rebuild_stale()?;
        let detail = if rebuilt.is_empty() {
            detail
        } else {
            format!("{detail}; stale after the heal, rebuilt: {rebuilt:?}")
        };
        windows.push(FaultWindow {
            fault: fault.name().to_string(),
            detail,
            start_ns,
            end_ns: recorder.now_ns(),
        });
        std::thread::sleep(schedule.quiet);
        // A deposed leader learns it is stale once it hears the new view.
        for id in c.rebuild_stale()? {
            if let Some(w) = windows.last_mut() {
                w.detail
                    .push_str(&format!("; node {id} stale after it, rebuilt"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_by_name_and_say_which_exist() {
        for (name, f) in FAULTS {
            assert_eq!(name.parse::<Fault>(), Ok(f));
            assert_eq!(f.name(), name);
        }
        let e = "flood".parse::<Fault>().unwrap_err();
        assert!(
            e.contains("kill-leader") && e.contains("zookeeper-down"),
            "{e}"
        );
    }
}
