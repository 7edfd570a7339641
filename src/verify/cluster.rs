//! The cluster `lockstep verify` runs: three Redis nodes over the tcp
//! transport, each in a network namespace of its own, electing through a
//! private ZooKeeper in another, with the fault controls the nemesis
//! needs (kill, pause, restart, partition, ZooKeeper down).
//!
//! This process joins the clients' namespace at start: it reaches every
//! node and ZooKeeper through the bridge, as any outside client does, and
//! a partition can cut a node off from the others without cutting it off
//! from the clients (an isolated leader still takes requests: what a
//! deposed leader answers is what the checkers look at).

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::control::NodeStatus;
use lockstep_common::Config;
use lockstep_launcher::binaries::Binaries;
use lockstep_launcher::cluster_spec::ElectionSpec;
use lockstep_launcher::commands::{follower_command, preloaded_server, redis_on_host};
use lockstep_launcher::netns::{self, Net};
use lockstep_launcher::process::open_log;
use nix::sys::signal::Signal;

/// Which of a node's processes a process fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Its server and its follower (the host crashed or froze).
    Both,
    /// Its server only: its follower sees it go (and, killed, steps down).
    Server,
    /// Its follower only: its server lives on with nobody to commit or
    /// apply its inputs.
    Follower,
}

/// Prefix of every namespace `verify` creates.
const NET_PREFIX: &str = "lockstep-vf-";
/// ZooKeeper's client port, in its namespace.
const ZK_PORT: u16 = 2181;
/// The ZooKeeper session timeout of the nodes: a dead leader is replaced
/// about this long after it died.
pub const SESSION_MS: u64 = 2_000;
/// How long a process may take to start before `verify` gives up.
const START_LIMIT: Duration = Duration::from_secs(60);
/// How long a restarted node's server may take to attach: it may first
/// install a peer's snapshot or replay a long log.
const REBUILD_LIMIT: Duration = Duration::from_secs(300);
/// Each node's disk when disks may fill: its data dir on a tmpfs this big
/// (the log between snapshots and a few images fit many times over).
pub const DISK_BYTES: u64 = 512 << 20;
/// The file that fills a node's disk.
const FILLER: &str = "verify-disk-filler";

/// A node's processes.
#[derive(Default)]
struct Node {
    follower: Option<Child>,
    server: Option<Child>,
    /// Paused with SIGSTOP (continued on drop).
    paused: bool,
}

/// The cluster. Fields drop in order: processes first, the network last.
pub struct VerifyCluster {
    nodes: Vec<Node>,
    zk: Option<Child>,
    pub config: Arc<Config>,
    config_path: PathBuf,
    name: String,
    dir: PathBuf,
    bins: Binaries,
    zk_addr: SocketAddr,
    /// Data dirs mounted on a tmpfs of their own (unmounted on drop).
    disks: Vec<PathBuf>,
    pub net: Net,
}

impl VerifyCluster {
    /// Creates the network on `10.213.<subnet>.0/24`, makes the calling
    /// thread a client in it, and starts ZooKeeper, the followers and the
    /// servers, with logs and data under `dir`; with `small_disks`, each
    /// node's data dir is a tmpfs of [`DISK_BYTES`] (so it can fill); a
    /// snapshot every `snapshot_every` log entries.
    pub fn start(
        dir: &Path,
        subnet: u8,
        small_disks: bool,
        snapshot_every: u64,
    ) -> anyhow::Result<VerifyCluster> {
        let bins = Binaries::beside_current_exe()?;
        let net = Net::create(NET_PREFIX, subnet, 3, &[("zk", 200)]).context(
            "verify needs network namespaces (the `ip` tool and CAP_NET_ADMIN, e.g. root)",
        )?;
        netns::enter_netns_at(&Net::path(&net.client_ns))?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let zk_ip = net.host_ip("zk").context("no ZooKeeper host")?;
        let zk_addr = SocketAddr::from((zk_ip, ZK_PORT));
        let name = format!("vf{}", std::process::id());
        let config_path = dir.join("cluster.toml");
        // A key of this run's own: the cluster key authenticates the
        // nodes' connections to each other.
        let key = format!("verify-{:016x}{:016x}", rand_word(), rand_word());
        netns::netns_spec(&name, dir, &net, &format!("key = \"{key}\"\n"))
            .set("backup_clients", "deny")
            .section(&format!(
                "[snapshot_every]\nentries = {snapshot_every}\nimage_percent = 0"
            ))
            .election(ElectionSpec::ZooKeeper {
                connect: zk_addr.to_string(),
                session_timeout_ms: SESSION_MS,
            })
            .write(&config_path)?;
        let config = Arc::new(Config::load(&config_path)?);
        let mut c = VerifyCluster {
            nodes: (0..3).map(|_| Node::default()).collect(),
            zk: None,
            config,
            config_path,
            name,
            dir: dir.to_path_buf(),
            bins,
            zk_addr,
            disks: Vec::new(),
            net,
        };
        if small_disks {
            for id in c.ids() {
                c.mount_disk(id)?;
            }
        }
        c.start_zookeeper()?;
        for id in c.ids() {
            c.start_follower(id)?;
        }
        for id in c.ids() {
            c.start_server(id)?;
        }
        c.wait_healthy(START_LIMIT)?;
        Ok(c)
    }

    /// The node ids.
    pub fn ids(&self) -> Vec<u64> {
        self.config.ids().collect()
    }

    fn log(&self, what: &str) -> anyhow::Result<File> {
        let p = self.dir.join("logs").join(format!("{what}.log"));
        std::fs::create_dir_all(p.parent().expect("a parent"))?;
        open_log(&p, true).with_context(|| format!("cannot open {}", p.display()))
    }

    /// Starts ZooKeeper in its namespace (again, after a kill: same data).
    pub fn start_zookeeper(&mut self) -> anyhow::Result<()> {
        let dir = self.dir.join("zookeeper");
        std::fs::create_dir_all(dir.join("data"))?;
        let cfg = dir.join("zoo.cfg");
        std::fs::write(
            &cfg,
            lockstep_launcher::zookeeper::standalone_config(&dir.join("data"), self.zk_addr, ""),
        )?;
        let log = self.log("zookeeper")?;
        let zk_ns = self.net.host_path("zk").context("no ZooKeeper host")?;
        let child = netns::spawn_in(
            &zk_ns,
            Command::new(lockstep_launcher::zookeeper::ZK_SERVER_SCRIPT)
                .arg("start-foreground")
                .arg(&cfg)
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
        )?;
        self.zk = Some(child);
        let start = Instant::now();
        while !lockstep_launcher::zookeeper::is_serving(self.zk_addr) {
            if let Some(st) = self.zk.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("ZooKeeper exited ({st}); see {}", dir.display());
            }
            if start.elapsed() > START_LIMIT {
                bail!("ZooKeeper on {} does not serve", self.zk_addr);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// Kills ZooKeeper (SIGKILL).
    pub fn kill_zookeeper(&mut self) {
        if let Some(mut c) = self.zk.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn start_follower(&mut self, id: u64) -> anyhow::Result<()> {
        self.spawn_follower(id)?;
        self.wait(
            &format!("node {id}'s follower to answer"),
            START_LIMIT,
            |c| c.status(id).is_ok(),
        )
    }

    fn spawn_follower(&mut self, id: u64) -> anyhow::Result<()> {
        let log = self.log(&format!("follower-{id}"))?;
        let child = netns::spawn_in(
            &self.net.node_path(id),
            follower_command(&self.bins.follower, &self.config_path, id)
                .env("LOCKSTEP_LOG", "info")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
        )?;
        self.nodes[id as usize - 1].follower = Some(child);
        Ok(())
    }

    /// Whether node `id`'s follower was started and has exited.
    pub fn follower_exited(&mut self, id: u64) -> bool {
        self.nodes[id as usize - 1]
            .follower
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some())
    }

    /// Mounts a tmpfs of [`DISK_BYTES`] on node `id`'s data dir.
    fn mount_disk(&mut self, id: u64) -> anyhow::Result<()> {
        let dir = self.config.node_data_dir(id);
        std::fs::create_dir_all(&dir)?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={DISK_BYTES},mode=0700"))
            .arg("lockstep-verify")
            .arg(&dir)
            .output()
            .context("cannot run mount (a small disk per node needs it, and root)")?;
        if !out.status.success() {
            bail!(
                "cannot mount a tmpfs on {} for the disk-full fault: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.disks.push(dir);
        Ok(())
    }

    /// Fills node `id`'s disk (the tmpfs of its data dir) to the last
    /// byte; returns how many bytes that took.
    pub fn fill_disk(&self, id: u64) -> anyhow::Result<u64> {
        let dir = self.config.node_data_dir(id);
        anyhow::ensure!(
            self.disks.contains(&dir),
            "node {id}'s data dir is not a disk of its own (start with the disk-full fault)"
        );
        let st = nix::sys::statvfs::statvfs(&dir)?;
        let mut free = st.blocks_available() as u64 * st.fragment_size() as u64;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(FILLER))?;
        // What statvfs says is free may be a little more than a file gets.
        while free > 0 {
            match nix::fcntl::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                nix::fcntl::FallocateFlags::empty(),
                0,
                free as i64,
            ) {
                Ok(()) => return Ok(free),
                Err(nix::errno::Errno::ENOSPC) => free = free.saturating_sub(1 << 20),
                Err(e) => bail!("cannot fill {}: {e}", dir.display()),
            }
        }
        Ok(0)
    }

    /// Frees what [`VerifyCluster::fill_disk`] took.
    pub fn free_disk(&self, id: u64) -> anyhow::Result<()> {
        let p = self.config.node_data_dir(id).join(FILLER);
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("cannot remove {}", p.display()))
            }
            _ => Ok(()),
        }
    }

    /// Kills node `id`, empties its data dir (the host lost its disk) and
    /// starts its follower, which must rebuild from a peer (a snapshot
    /// install, or the log); kills it again as soon as the first bytes of
    /// a peer's image arrive, or after `at_most` if none do. Left down
    /// (heal with [`VerifyCluster::restart`]); says what it interrupted.
    pub fn interrupt_rebuild(&mut self, id: u64, at_most: Duration) -> anyhow::Result<String> {
        self.kill(id);
        let dir = self.config.node_data_dir(id);
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            if p.is_dir() {
                std::fs::remove_dir_all(&p)?;
            } else {
                std::fs::remove_file(&p)?;
            }
        }
        let incoming = dir.join("snapshots").join("incoming");
        self.spawn_follower(id)?;
        let start = Instant::now();
        let what = loop {
            let stored = lockstep_launcher::disk::tree_bytes(&incoming);
            if stored > 0 {
                break format!("its install of a peer's image, {stored} bytes in");
            }
            if self.status(id).is_ok_and(|s| s.snapshot > 0) {
                break "after it installed a peer's image".to_string();
            }
            if start.elapsed() > at_most {
                break format!("{at_most:?} into its rebuild (no image arrived)");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        self.kill(id);
        Ok(what)
    }

    /// Starts node `id`'s server the way a node started by hand should
    /// be (`lockstep run`: a session and PID namespace of its own, which
    /// snapshots need) and waits until it is attached.
    fn start_server(&mut self, id: u64) -> anyhow::Result<()> {
        let app = self.config.node(id).context("no such node")?.app;
        let data = self.dir.join(format!("server-{id}"));
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data)?;
        let logs = self.dir.join("logs");
        let run_log = self.log(&format!("run-{id}"))?;
        let cmd = preloaded_server(
            &self.bins,
            &self.config_path,
            id,
            &redis_on_host(app, &data),
            &logs.join(format!("server-{id}.log")),
            true,
        );
        let mut cmd = cmd;
        let child = netns::spawn_in(
            &self.net.node_path(id),
            cmd.stdin(Stdio::null())
                .stdout(run_log.try_clone()?)
                .stderr(run_log),
        )?;
        self.nodes[id as usize - 1].server = Some(child);
        self.wait_attached(id)
    }

    /// Waits until node `id` runs an attached server (one it restored
    /// from a snapshot, or the one started for it).
    fn wait_attached(&self, id: u64) -> anyhow::Result<()> {
        self.wait(
            &format!("node {id}'s server to attach"),
            REBUILD_LIMIT,
            |c| c.status(id).map(|s| s.server_pid != 0).unwrap_or(false),
        )
    }

    /// Node `id`'s status over its control channel.
    pub fn status(&self, id: u64) -> Result<NodeStatus, String> {
        lockstep_common::control::query_status(&self.config, id, Duration::from_secs(1))
    }

    /// The node that leads, if the nodes agree on one.
    pub fn leader(&self) -> Option<u64> {
        lockstep_launcher::leader::find_leader(&self.config, &self.ids(), Duration::from_secs(1))
            .map(|(_, l)| l)
    }

    /// SIGKILLs every process of node `id` (its follower, its server,
    /// one its follower restored from a snapshot): the host crashed.
    pub fn kill(&mut self, id: u64) {
        let host = id.to_string();
        let _ = self.net.signal_all(&host, Signal::SIGKILL);
        let n = &mut self.nodes[id as usize - 1];
        for slot in [&mut n.server, &mut n.follower] {
            if let Some(mut c) = slot.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        n.paused = false;
        // Gone once nothing is left in its namespace (a restored server is
        // not our child; its lock on the region goes with it).
        let since = Instant::now();
        while self.net.pids_in(&host).is_ok_and(|p| !p.is_empty())
            && since.elapsed() < Duration::from_secs(10)
        {
            let _ = self.net.signal_all(&host, Signal::SIGKILL);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs node `id`'s follower only: its server lives on, attached
    /// to a region nobody keeps.
    pub fn kill_follower_only(&mut self, id: u64) {
        if let Some(mut c) = self.nodes[id as usize - 1].follower.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` to node `id`'s server only (the one started for it or
    /// one its follower restored); returns how many processes that was.
    pub fn signal_server(&self, id: u64, sig: Signal) -> anyhow::Result<usize> {
        let mut sent = 0;
        for pid in self.net.pids_in(&id.to_string())? {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "redis-server"
                && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).is_ok()
            {
                sent += 1;
            }
        }
        Ok(sent)
    }

    /// Pauses (SIGSTOP) or continues (SIGCONT) `part` of node `id`;
    /// returns how many processes got the signal.
    pub fn pause_part(&mut self, id: u64, part: Part, paused: bool) -> anyhow::Result<usize> {
        let sig = if paused {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        Ok(match part {
            Part::Both => self.pause(id, paused),
            Part::Server => self.signal_server(id, sig)?,
            Part::Follower => match &self.nodes[id as usize - 1].follower {
                Some(c) => usize::from(
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig).is_ok(),
                ),
                None => 0,
            },
        })
    }

    /// Starts a killed node again: its follower with its data dir, and a
    /// fresh server unless the follower restored one from its snapshot.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        self.kill(id);
        self.start_follower(id)?;
        if self.status(id).map(|s| s.server_pid != 0).unwrap_or(false) {
            return Ok(());
        }
        self.start_server(id)
    }

    /// Pauses (SIGSTOP) or continues (SIGCONT) every process of node `id`;
    /// returns how many.
    pub fn pause(&mut self, id: u64, paused: bool) -> usize {
        let sig = if paused {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let n = self.net.signal_all(&id.to_string(), sig).unwrap_or(0);
        self.nodes[id as usize - 1].paused = paused;
        n
    }

    /// Waits until `ok` holds, checking every 200 ms; an error names `what`.
    fn wait(
        &self,
        what: &str,
        limit: Duration,
        mut ok: impl FnMut(&VerifyCluster) -> bool,
    ) -> anyhow::Result<()> {
        let start = Instant::now();
        while !ok(self) {
            if start.elapsed() > limit {
                bail!(
                    "waited {limit:?} for {what}; the nodes:\n{}(logs in {})",
                    self.describe(),
                    self.dir.join("logs").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// Restarts every node that says it is stale (its server ran inputs
    /// the log dropped, as a deposed leader's may have: it must be rebuilt
    /// from the log), as `lockstep up`'s supervisor does; returns them.
    pub fn rebuild_stale(&mut self) -> anyhow::Result<Vec<u64>> {
        let stale: Vec<u64> = self
            .ids()
            .into_iter()
            .filter(|&id| {
                self.status(id)
                    .map(|s| s.role == "stale" || s.stale_reason.is_some())
                    .unwrap_or(false)
            })
            .collect();
        for &id in &stale {
            log::info!("verify: node {id} is stale: rebuilding it");
            self.restart(id)?;
        }
        // A follower that stopped by itself (it could not persist, say)
        // is started again, as `lockstep up`'s supervisor does.
        for id in self.ids() {
            if !stale.contains(&id) && self.follower_exited(id) {
                log::info!("verify: node {id}'s follower stopped: restarting the node");
                self.restart(id)?;
            }
        }
        Ok(stale)
    }

    /// Waits until a leader leads and every node applied what it
    /// committed (the cluster recovered), rebuilding stale nodes meanwhile.
    pub fn wait_healthy(&mut self, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            self.rebuild_stale()?;
            if self.healthy() {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!(
                    "waited {limit:?} for the cluster to recover (a leader, every node caught up); the nodes:\n{}(logs in {})",
                    self.describe(),
                    self.dir.join("logs").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A leader leads and every node applied what it committed.
    fn healthy(&self) -> bool {
        // One status query per node: the leader is found among them.
        let ids = self.ids();
        let all = lockstep_launcher::leader::statuses(&self.config, &ids, Duration::from_secs(1));
        let Some((view, leader)) = lockstep_launcher::leader::leading(&all) else {
            return false;
        };
        let Some(l) = all.iter().find(|s| s.node == leader) else {
            return false;
        };
        all.len() == ids.len()
            && all
                .iter()
                .all(|s| s.server_pid != 0 && s.applied >= l.committed && s.view == view)
    }

    /// Divergences counted by each node that answers.
    pub fn divergences(&self) -> Vec<(u64, u64)> {
        self.ids()
            .into_iter()
            .filter_map(|id| self.status(id).ok().map(|s| (id, s.divergences)))
            .collect()
    }

    /// One line per node.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for id in self.ids() {
            match self.status(id) {
                Ok(s) => out.push_str(&format!(
                    "  node {id}: {} of view {} (leader {}), committed {}, applied {}, divergences {}\n",
                    s.role, s.view, s.leader, s.committed, s.applied, s.divergences
                )),
                Err(e) => out.push_str(&format!("  node {id}: does not answer ({e})\n")),
            }
        }
        out
    }
}

/// 64 random bits from the kernel.
fn rand_word() -> u64 {
    let mut b = [0u8; 8];
    let _ = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    u64::from_le_bytes(b) ^ std::process::id() as u64
}

impl Drop for VerifyCluster {
    fn drop(&mut self) {
        for id in self.ids() {
            if self.nodes[id as usize - 1].paused {
                self.pause(id, false);
            }
            self.kill(id);
        }
        self.kill_zookeeper();
        for id in self.ids() {
            let _ = std::fs::remove_file(lockstep_common::region::region_path(&self.name, id));
        }
        for d in &self.disks {
            let _ = Command::new("umount").arg("-l").arg(d).status();
        }
    }
}
