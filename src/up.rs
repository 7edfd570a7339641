//! `lockstep up`: a whole local cluster from one config — a private
//! ZooKeeper when the election needs one and none is reachable, each node's
//! follower and its server under the preload — until Ctrl-C, then a clean
//! stop that leaves no process and no region file behind.
//!
//! Every child runs in its own process group (a terminal's Ctrl-C reaches
//! only `lockstep up`, which then stops servers before followers) and gets
//! SIGTERM from the kernel if `lockstep up` dies without cleaning up.
//!
//! While it runs, `lockstep up` heals the nodes by itself ([`Cluster::heal`]):
//! a node whose server or follower exited, or whose follower reports it
//! `stale`, is stopped (what is left of it) and started again — its follower
//! with its data dir, which rebuilds a fresh server from the log and a peer —
//! with a growing pause between failed attempts.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::config::ElectionMode;
use lockstep_common::region;
use lockstep_common::Config;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::status;
use lockstep_launcher::binaries::Binaries;
use lockstep_launcher::commands::{follower_command, preloaded_server};
use lockstep_launcher::process::{
    last_line, open_log, port_free, spawn_logged, stop_on_signals, Grouping,
};
use lockstep_launcher::zookeeper::ZookeeperServer;

use crate::supervisor::{Command as Heal, Observation, Supervisor, STOP_GRACE};
use crate::up_zookeeper::Keeper;

/// How long a server that exited at start may take to be replaced by its
/// follower's installed snapshot (stop, then restore: under a second).
const REPLACE_GRACE: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Server,
    Follower,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Server => "server",
            Kind::Follower => "follower",
        }
    }
}

struct Proc {
    kind: Kind,
    /// The node it belongs to.
    node: u64,
    what: String,
    log: PathBuf,
    child: Child,
    exited: bool,
    /// " (exit status …)" once reaped by `reap`.
    how: String,
    /// `lockstep up` stopped it on purpose: its exit is no news.
    stopping: bool,
    /// A server the follower restored from a snapshot, which `child` (a
    /// `watch-server`) stands in for: its pid.
    watched: Option<u32>,
}

impl Proc {
    fn pgid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// SIGKILLs the server itself, not only its launcher or watcher: a
    /// server runs in a session of its own (see `launch`).
    fn kill_server(&self) {
        if self.kind != Kind::Server {
            return;
        }
        let pid = self
            .watched
            .or_else(|| lockstep_launcher::process::first_child(self.child.id()));
        if let Some(pid) = pid {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }
}

/// The processes `up` started; dropping it stops them all.
pub struct Cluster {
    config: Config,
    procs: Vec<Proc>,
    zookeeper: Option<Keeper>,
    stopped: bool,
    /// The server command template the nodes run.
    cmd: Vec<String>,
    /// The config file the children get (canonical path).
    config_path: PathBuf,
    /// The binaries the children run.
    bins: Binaries,
    /// What [`Cluster::heal`] decides about each node (none watched until
    /// started).
    heal: Supervisor,
    /// The nodes this `up` runs (all, or the one of `--node`).
    ids: Vec<u64>,
}

/// Expands `{port}`, `{host}`, `{data}`, `{node}` in a server command.
pub fn server_command(
    template: &[String],
    config: &Config,
    id: u64,
) -> anyhow::Result<Vec<String>> {
    let node = config.node(id)?;
    let data = config.data_dir.join(format!("server-{id}"));
    Ok(template
        .iter()
        .map(|a| {
            a.replace("{port}", &node.app.port().to_string())
                .replace("{host}", &node.app.ip().to_string())
                .replace("{data}", &data.display().to_string())
                .replace("{node}", &id.to_string())
        })
        .collect())
}

/// The first `host:port` of a ZooKeeper connect string (`h1:p,h2:p/chroot`).
fn zookeeper_addr(connect: &str) -> anyhow::Result<SocketAddr> {
    let first = connect.split(['/', ',']).next().unwrap_or("").trim();
    first
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("election.zookeeper: cannot resolve {first:?} (want host:port)"))
}

/// Starts a private ZooKeeper when the election needs one and the
/// configured one does not answer; `None` when not needed or reachable.
fn ensure_zookeeper(
    config: &Config,
    say: &dyn Fn(&str),
) -> anyhow::Result<Option<ZookeeperServer>> {
    if config.election.mode != ElectionMode::Zookeeper {
        return Ok(None);
    }
    let addr = zookeeper_addr(&config.election.zookeeper)?;
    let members = config.election.zookeeper.split('/').next().unwrap_or("");
    if members.contains(',') {
        // An ensemble: never replaced by a private server; the followers
        // reach whichever members answer.
        say(&format!("using the ZooKeeper ensemble {members}"));
        return Ok(None);
    }
    if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
        say(&format!("using the ZooKeeper at {addr}"));
        return Ok(None);
    }
    if !addr.ip().is_loopback() {
        bail!("election.zookeeper: nothing answers at {addr}, and a private ZooKeeper can only be started on a loopback address");
    }
    let dir = config.data_dir.join("zookeeper");
    say(&format!(
        "no ZooKeeper answers at {addr}: starting a private one (data in {})",
        dir.display()
    ));
    let zk = ZookeeperServer::start(&dir, addr.port())?;
    say(&format!("ZooKeeper serves at {addr} (pid {})", zk.pid()));
    Ok(Some(zk))
}

/// `lockstep up --node N` starts no ZooKeeper: the configured one must
/// answer.
fn require_zookeeper(config: &Config, say: &dyn Fn(&str)) -> anyhow::Result<()> {
    if config.election.mode != ElectionMode::Zookeeper {
        return Ok(());
    }
    let addr = zookeeper_addr(&config.election.zookeeper)?;
    if TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err() {
        bail!(
            "election.zookeeper: nothing answers at {addr}; `lockstep up --node` does not start ZooKeeper: run it (an ensemble for production) and try again"
        );
    }
    say(&format!("using the ZooKeeper at {addr}"));
    Ok(())
}

/// Spawns `cmd` in its own process group with SIGTERM on our death; its
/// output goes to `log` (appended to when `append`: a restarted process
/// keeps its predecessor's last words).
fn spawn(mut cmd: Command, log: &Path, append: bool) -> anyhow::Result<Child> {
    let out = open_log(log, append).with_context(|| format!("cannot create {}", log.display()))?;
    Ok(spawn_logged(&mut cmd, out, Grouping::OwnGroup)?)
}

impl Cluster {
    /// Checks everything that can be checked before starting anything;
    /// removes region files no running node uses.
    fn preflight(
        config: &Config,
        cmd: &[String],
        ids: &[u64],
        say: &dyn Fn(&str),
    ) -> anyhow::Result<()> {
        if cmd.is_empty() {
            bail!("no server command: set `server = [...]` in the config or pass --server-cmd");
        }
        // The same rules as `lockstep check`: the program exists, each
        // node gets its own port, memcached runs one thread.
        let field = if config.server.as_deref() == Some(cmd) {
            "server"
        } else {
            "--server-cmd"
        };
        if let Some(problem) = crate::check::server_problems(cmd, field).into_iter().next() {
            bail!("{problem}");
        }
        if let Some(problem) = crate::check::data_dir_problem(&config.data_dir) {
            bail!("{problem}");
        }
        // Every control and region handshake proves the cluster key, shm
        // included. A keyless config keeps it in data_dir: create it (or
        // check the one there) before any node starts, so a bad key file
        // is one line here rather than in every follower's log.
        config.cluster_key()?;
        for n in config.nodes.iter().filter(|n| ids.contains(&n.id)) {
            let mut addrs = vec![("app", n.app), ("control", n.control)];
            if let Some(m) = n.metrics {
                addrs.push(("metrics", m));
            }
            for (field, a) in addrs {
                if !port_free(a) {
                    bail!(
                        "port in use: nodes.{field} {a} of node {} (is another cluster running?)",
                        n.id
                    );
                }
            }
        }
        if ids.iter().any(|&id| config.node_data_dir(id).exists()) {
            say(&format!(
                "{} holds an earlier run's log: each server's state is rebuilt from it (remove the directory for an empty cluster)",
                config.data_dir.display()
            ));
        }
        // Every app and control port is free, so no server or follower of
        // these nodes runs: a region file left now is stale.
        for &id in ids {
            let path = region::region_path(&config.cluster, id);
            if path.exists() {
                say(&format!(
                    "removing stale region file {} (no node of cluster {:?} is running)",
                    path.display(),
                    config.cluster
                ));
                std::fs::remove_file(&path)
                    .with_context(|| format!("cannot remove stale {}", path.display()))?;
            }
        }
        Ok(())
    }

    /// Starts every node (and ZooKeeper when needed); returns once all are
    /// ready. On error or when `stop` is raised, everything started so far
    /// is stopped.
    pub fn start(
        config: Config,
        config_path: &Path,
        cmd: &[String],
        bins: &Binaries,
        stop: &AtomicBool,
        say: &dyn Fn(&str),
    ) -> anyhow::Result<Cluster> {
        let ids: Vec<u64> = config.ids().collect();
        Self::start_nodes(config, config_path, cmd, bins, stop, say, &ids, true)
    }

    /// Starts the nodes `ids` of the config (`lockstep up --node N`: one);
    /// returns once they are ready. A private ZooKeeper is started when
    /// the election needs one, none answers and `own_zookeeper` allows it;
    /// otherwise an unreachable ZooKeeper is an error.
    #[allow(clippy::too_many_arguments)]
    pub fn start_nodes(
        config: Config,
        config_path: &Path,
        cmd: &[String],
        bins: &Binaries,
        stop: &AtomicBool,
        say: &dyn Fn(&str),
        ids: &[u64],
        own_zookeeper: bool,
    ) -> anyhow::Result<Cluster> {
        for &id in ids {
            config.node(id)?;
        }
        Self::preflight(&config, cmd, ids, say)?;
        let config_path = config_path
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", config_path.display()))?;
        let logs = config.data_dir.join("logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
        let mut cluster = Cluster {
            config: config.clone(),
            procs: Vec::new(),
            zookeeper: None,
            stopped: false,
            cmd: cmd.to_vec(),
            config_path: config_path.clone(),
            bins: bins.clone(),
            heal: Supervisor::new(),
            ids: ids.to_vec(),
        };
        cluster.zookeeper = if own_zookeeper {
            ensure_zookeeper(&config, say)?
                .map(|zk| Keeper::new(zk, config.data_dir.join("zookeeper")))
        } else {
            require_zookeeper(&config, say)?;
            None
        };
        for &id in ids {
            cluster.spawn_follower(id, &config_path, bins, say, false)?;
        }
        cluster.wait_for(
            "followers",
            stop,
            |c| {
                c.ids
                    .iter()
                    .all(|&id| status::query(&c.config, id, Duration::from_millis(500)).is_ok())
            },
            Duration::from_secs(60),
        )?;
        for &id in ids {
            cluster.start_server(id, cmd, &config_path, bins, say, false)?;
        }
        cluster.wait_servers(ids, stop)?;
        let now = Instant::now();
        for &id in ids {
            cluster.heal.watch(id, now);
        }
        Ok(cluster)
    }

    fn spawn_follower(
        &mut self,
        id: u64,
        config_path: &Path,
        bins: &Binaries,
        say: &dyn Fn(&str),
        append: bool,
    ) -> anyhow::Result<()> {
        let n = self.config.node(id)?.clone();
        say(&format!(
            "starting follower of node {} (control {})",
            n.id, n.control
        ));
        let log = self
            .config
            .data_dir
            .join("logs")
            .join(format!("follower-{}.log", n.id));
        let mut c = follower_command(&bins.follower, config_path, n.id);
        // `up` removes the region files itself once it stops the cluster;
        // a healed node's follower keeps the file its peers' servers map
        // (one that dropped its user id could not open a new one).
        c.arg("--keep-region");
        let child = spawn(c, &log, append)
            .with_context(|| format!("cannot start {}", bins.follower.display()))?;
        self.procs.push(Proc {
            kind: Kind::Follower,
            node: id,
            what: format!("follower of node {}", n.id),
            log,
            child,
            exited: false,
            how: String::new(),
            stopping: false,
            watched: None,
        });
        Ok(())
    }

    /// Starts node `id`'s server, unless its follower restored one from a
    /// snapshot (its status names a server already): then a `watch-server`
    /// stands in for it.
    fn start_server(
        &mut self,
        id: u64,
        cmd: &[String],
        config_path: &Path,
        bins: &Binaries,
        say: &dyn Fn(&str),
        append: bool,
    ) -> anyhow::Result<()> {
        // The region, not the status: it answers however busy the
        // follower is.
        let Some(restored) = attached_server(&self.config, id) else {
            return self.spawn_server(id, cmd, config_path, bins, say, append);
        };
        say(&format!(
            "node {id}: its follower restored the server from a snapshot (pid {restored})"
        ));
        self.watch_server(id, restored)
    }

    /// Takes server `pid`, which node `id`'s follower restored from a
    /// snapshot (nobody's child here), as the node's: a `lockstep
    /// watch-server` stands in for it.
    fn watch_server(&mut self, id: u64, pid: u64) -> anyhow::Result<()> {
        let log = self.server_log(id);
        let mut c = Command::new(&self.bins.lockstep);
        c.args(["watch-server", "--pid", &pid.to_string()]);
        let child = spawn(c, &log, true).context("cannot start lockstep watch-server")?;
        self.push_server(id, log, child, Some(pid as u32));
        Ok(())
    }

    /// Node `id`'s server log.
    fn server_log(&self, id: u64) -> PathBuf {
        self.config
            .data_dir
            .join("logs")
            .join(format!("server-{id}.log"))
    }

    /// Records node `id`'s server: `child` is its launcher, or the watcher
    /// of the restored server `watched`.
    fn push_server(&mut self, id: u64, log: PathBuf, child: Child, watched: Option<u32>) {
        self.procs.push(Proc {
            kind: Kind::Server,
            node: id,
            what: format!("server of node {id}"),
            log,
            child,
            exited: false,
            how: String::new(),
            stopping: false,
            watched,
        });
    }

    fn spawn_server(
        &mut self,
        id: u64,
        cmd: &[String],
        config_path: &Path,
        bins: &Binaries,
        say: &dyn Fn(&str),
        append: bool,
    ) -> anyhow::Result<()> {
        let args = server_command(cmd, &self.config, id)?;
        // A fresh server: the follower rebuilds its state from the log, so
        // whatever an earlier server left there (a dump.rdb after a SAVE)
        // would be applied twice.
        let data = self.config.data_dir.join(format!("server-{id}"));
        if data.exists() {
            std::fs::remove_dir_all(&data)
                .with_context(|| format!("cannot empty {}", data.display()))?;
        }
        std::fs::create_dir_all(&data)
            .with_context(|| format!("cannot create {}", data.display()))?;
        say(&format!(
            "starting server of node {id}: {}",
            shell_words(&args)
        ));
        let log = self.server_log(id);
        let mut server = Command::new(&args[0]);
        // In a PID namespace of its own: its image can be restored.
        server.args(&args[1..]);
        let c = preloaded_server(bins, config_path, id, &server, &log, true);
        let child =
            spawn(c, &log, append).with_context(|| format!("cannot start server `{}`", args[0]))?;
        self.push_server(id, log, child, None);
        Ok(())
    }

    /// Waits until the servers of `ids` are attached, past joining, and
    /// accept connections.
    fn wait_servers(&mut self, ids: &[u64], stop: &AtomicBool) -> anyhow::Result<()> {
        self.wait_for(
            "servers",
            stop,
            |c| {
                ids.iter().all(|&id| {
                    let Ok(n) = c.config.node(id) else {
                        return false;
                    };
                    status::query(&c.config, id, Duration::from_millis(500))
                        .map(|s| s.server_pid != 0 && s.role != "joining")
                        .unwrap_or(false)
                        && TcpStream::connect_timeout(&n.app, Duration::from_millis(300)).is_ok()
                })
            },
            Duration::from_secs(120),
        )
    }

    /// Starts node `id` again (after `kill_node`): a fresh server, the
    /// follower with its data dir; returns once it serves its role.
    pub fn restart_node(
        &mut self,
        id: u64,
        config_path: &Path,
        bins: &Binaries,
        stop: &AtomicBool,
        say: &dyn Fn(&str),
    ) -> anyhow::Result<()> {
        self.stop_node_now(id);
        let config_path = config_path
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", config_path.display()))?;
        self.spawn_follower(id, &config_path, bins, say, true)?;
        self.wait_for(
            "follower",
            stop,
            |c| status::query(&c.config, id, Duration::from_millis(500)).is_ok(),
            Duration::from_secs(60),
        )?;
        let cmd = self.cmd.clone();
        self.start_server(id, &cmd, &config_path, bins, say, true)?;
        self.wait_servers(&[id], stop)
    }

    /// Stops what is left of node `id` (SIGTERM to its process groups,
    /// SIGKILL after a grace period) and forgets its processes; blocks.
    pub fn stop_node_now(&mut self, id: u64) {
        self.signal_node(id, Signal::SIGTERM);
        let start = Instant::now();
        let mut killed = false;
        while self.procs.iter_mut().any(|p| p.node == id && !p.exited) {
            if !killed && start.elapsed() > STOP_GRACE {
                self.signal_node(id, Signal::SIGKILL);
                killed = true;
            }
            self.reap();
            std::thread::sleep(Duration::from_millis(20));
        }
        self.forget_node(id);
    }

    /// Sends `sig` to the process group of each of node `id`'s processes
    /// still running, and marks them as stopped on purpose.
    fn signal_node(&mut self, id: u64, sig: Signal) -> Vec<String> {
        let mut hit = Vec::new();
        for p in self.procs.iter_mut().filter(|p| p.node == id && !p.exited) {
            p.stopping = true;
            if sig == Signal::SIGKILL {
                p.kill_server();
            }
            let _ = killpg(p.pgid(), sig);
            hit.push(format!("its {} (pid {})", p.kind.name(), p.child.id()));
        }
        hit
    }

    /// Once all of node `id`'s processes exited: SIGKILL whatever they
    /// left in their groups (a Redis BGSAVE child holds the server's lock
    /// on the region, and a new follower refuses to start beside it), then
    /// forget them.
    fn forget_node(&mut self, id: u64) {
        for p in self.procs.iter().filter(|p| p.node == id) {
            p.kill_server();
            // ESRCH when the group is empty.
            let _ = killpg(p.pgid(), Signal::SIGKILL);
        }
        self.procs.retain(|p| p.node != id);
        kill_attached_server(&self.config, id);
    }

    /// Node `id`'s server exited and another is attached to its region:
    /// its follower replaced the server by a snapshot it installed (a
    /// peer's image, see docs/guide/snapshots.md). `up` watches that one
    /// from now on; returns whether it did. Sees only exits already reaped
    /// (the caller's `reap_lines`, or `wait_for`'s reaping).
    pub fn adopt_replaced_server(&mut self, id: u64, say: &dyn Fn(&str)) -> bool {
        if self.exited_kind(id, Kind::Server).is_none() {
            return false;
        }
        let Some(pid) = attached_server(&self.config, id) else {
            return false;
        };
        match self.adopt(id, pid, say) {
            Ok(()) => true,
            Err(e) => {
                say(&format!("node {id}: {e}"));
                false
            }
        }
    }

    /// Watches server `pid`, which node `id`'s follower restored, in place
    /// of the one that exited.
    fn adopt(&mut self, id: u64, pid: u64, say: &dyn Fn(&str)) -> Result<(), String> {
        self.watch_server(id, pid)
            .map_err(|e| format!("cannot watch its new server (pid {pid}): {e:#}"))?;
        self.procs
            .retain(|p| !(p.node == id && p.kind == Kind::Server && p.exited));
        say(&format!(
            "node {id}: its follower replaced the server by an installed snapshot (pid {pid})"
        ));
        Ok(())
    }

    /// Node `id`'s server exited while `up` waits for it to start: its
    /// follower may be replacing it by a snapshot it installs (it stops the
    /// server, then restores the image). Waits a moment for that, and
    /// adopts the new server; false when none came.
    fn await_replaced_server(&mut self, id: u64) -> bool {
        let start = Instant::now();
        while start.elapsed() < REPLACE_GRACE {
            if attached_server(&self.config, id).is_some() {
                return self.adopt_replaced_server(id, &|m| log::info!("{m}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The first process of node `id` (server, then follower) that exited.
    fn exited_proc(&self, id: u64) -> Option<&Proc> {
        [Kind::Server, Kind::Follower].into_iter().find_map(|k| {
            self.procs
                .iter()
                .find(|p| p.node == id && p.kind == k && p.exited)
        })
    }

    /// Node `id`'s process of kind `kind` if it exited.
    fn exited_kind(&self, id: u64, kind: Kind) -> Option<&Proc> {
        self.procs
            .iter()
            .find(|p| p.node == id && p.kind == kind && p.exited)
    }

    /// One heal step for every node: call it often (every 100 ms or so),
    /// after [`Cluster::reap_lines`]. `fresh`: every node's status when
    /// the caller just asked (staleness of running nodes is checked only
    /// then). Never blocks for long and never fails: a failed restart is
    /// retried after a pause (`backoff`), and `say` tells each step. The
    /// decisions are [`Supervisor`]'s; this gathers what it needs and
    /// carries out its commands.
    pub fn heal(&mut self, fresh: Option<&[status::NodeView]>, say: &dyn Fn(&str)) {
        for id in self.heal.nodes() {
            let status = if self.heal.wants_status(id) {
                Some(
                    status::query(&self.config, id, Duration::from_millis(500))
                        .map_err(|e| e.to_string()),
                )
            } else {
                fresh
                    .and_then(|v| v.iter().find(|n| n.id == id))
                    .map(|n| n.status.clone())
            };
            let server_exited = self.exited_kind(id, Kind::Server).map(|p| p.how.clone());
            let app = self.config.node(id).ok().map(|n| n.app);
            let accepts = move || {
                app.is_some_and(|a| {
                    TcpStream::connect_timeout(&a, Duration::from_millis(300)).is_ok()
                })
            };
            let obs = Observation {
                now: Instant::now(),
                follower_exited: self.exited_kind(id, Kind::Follower).map(|p| p.how.clone()),
                replacement: server_exited
                    .as_ref()
                    .and_then(|_| attached_server(&self.config, id)),
                server_exited,
                exit_why: self.exit_why(id),
                alive: self.procs.iter().any(|p| p.node == id && !p.exited),
                status,
                accepts: &accepts,
            };
            let mut commands = self.heal.step(id, &obs);
            while !commands.is_empty() {
                let mut more = Vec::new();
                for c in commands {
                    if let Err(why) = self.carry_out(id, c, say) {
                        more = self.heal.failed(id, &why, Instant::now());
                        break;
                    }
                }
                commands = more;
            }
        }
    }

    /// Carries out one of the supervisor's commands for node `id`; `Err`:
    /// why it failed (the supervisor then restarts the node).
    fn carry_out(&mut self, id: u64, c: Heal, say: &dyn Fn(&str)) -> Result<(), String> {
        match c {
            Heal::Say(m) => say(&m),
            Heal::Adopt(pid) => self.adopt(id, pid, say)?,
            Heal::Terminate => {
                let hit = self.signal_node(id, Signal::SIGTERM);
                if !hit.is_empty() {
                    say(&format!("node {id}: stopping {}", hit.join(", ")));
                }
            }
            Heal::Kill => {
                let hit = self.signal_node(id, Signal::SIGKILL);
                say(&format!(
                    "node {id}: {} ignored SIGTERM for {STOP_GRACE:?}: SIGKILL",
                    hit.join(", ")
                ));
            }
            Heal::Forget => self.forget_node(id),
            Heal::StartFollower => {
                let (path, bins) = (self.config_path.clone(), self.bins.clone());
                self.spawn_follower(id, &path, &bins, say, true)
                    .map_err(|e| format!("{e:#}"))?;
            }
            Heal::StartServer => {
                let (cmd, path, bins) = (
                    self.cmd.clone(),
                    self.config_path.clone(),
                    self.bins.clone(),
                );
                self.start_server(id, &cmd, &path, &bins, say, true)
                    .map_err(|e| format!("{e:#}"))?;
            }
        }
        Ok(())
    }

    /// Why a starting node failed, when one of its processes exited: which
    /// one, how, and the last line of its log.
    fn exit_why(&self, id: u64) -> Option<String> {
        let p = self.exited_proc(id)?;
        let last = last_line(&p.log);
        Some(format!(
            "its {} exited{}{}",
            p.kind.name(),
            p.how,
            if last.is_empty() {
                String::new()
            } else {
                format!(": {last}")
            }
        ))
    }

    fn wait_for(
        &mut self,
        what: &str,
        stop: &AtomicBool,
        ready: impl Fn(&Cluster) -> bool,
        limit: Duration,
    ) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if let Some(p) = self.reap().into_iter().next() {
                let (kind, node) = (self.procs[p].kind, self.procs[p].node);
                if kind == Kind::Server && self.await_replaced_server(node) {
                    continue;
                }
                let p = &self.procs[p];
                let why = last_line(&p.log);
                bail!(
                    "{} exited while waiting for the {what}{}{} (log {})",
                    p.what,
                    p.how,
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(": {why}")
                    },
                    p.log.display()
                );
            }
            if stop.load(Ordering::Relaxed) {
                bail!("interrupted while waiting for the {what}; stopped everything");
            }
            if ready(self) {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!(
                    "the {what} did not become ready within {limit:?} (see the logs in {})",
                    self.config.data_dir.join("logs").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Indexes of processes that exited since the last call.
    fn reap(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, p) in self.procs.iter_mut().enumerate() {
            if !p.exited {
                if let Ok(Some(st)) = p.child.try_wait() {
                    p.exited = true;
                    p.how = format!(" ({st})");
                    out.push(i);
                }
            }
        }
        out
    }

    /// One line per process that exited since the last call.
    pub fn reap_lines(&mut self) -> Vec<String> {
        let dead = self.reap();
        let mut lines: Vec<String> = dead
            .into_iter()
            .filter(|&i| !self.procs[i].stopping)
            .map(|i| format!("{} exited{}", self.procs[i].what, self.procs[i].how))
            .collect();
        if let Some(zk) = self.zookeeper.as_mut() {
            zk.poll(&mut lines);
        }
        lines
    }

    /// Stops servers, then followers (SIGTERM to each process group, then
    /// SIGKILL after a grace period), then ZooKeeper, and removes the
    /// region files. Idempotent.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        for kind in [Kind::Server, Kind::Follower] {
            for p in self
                .procs
                .iter_mut()
                .filter(|p| p.kind == kind && !p.exited)
            {
                let _ = killpg(p.pgid(), Signal::SIGTERM);
            }
            let start = Instant::now();
            for p in self.procs.iter_mut().filter(|p| p.kind == kind) {
                while !p.exited {
                    match p.child.try_wait() {
                        Ok(Some(_)) | Err(_) => p.exited = true,
                        Ok(None) if start.elapsed() > STOP_GRACE => {
                            log::warn!("{} ignored SIGTERM for {STOP_GRACE:?}: SIGKILL", p.what);
                            p.kill_server();
                            let _ = killpg(p.pgid(), Signal::SIGKILL);
                            let _ = p.child.wait();
                            p.exited = true;
                        }
                        Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                // Whatever it forked and left in its group (e.g. a Redis
                // BGSAVE child); ESRCH when the group is empty.
                let _ = killpg(p.pgid(), Signal::SIGKILL);
            }
        }
        if let Some(mut zk) = self.zookeeper.take() {
            zk.stop();
        }
        for &id in &self.ids {
            let _ = std::fs::remove_file(region::region_path(&self.config.cluster, id));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A command line as a shell would need it (empty arguments quoted).
pub(crate) fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if a.is_empty() || a.contains(char::is_whitespace) {
                format!("'{a}'")
            } else {
                a.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The leader that goes on although fewer than a majority can apply, and
/// what it says (see `apply_lag`).
fn failover_backlog(nodes: &[status::NodeView]) -> Option<(u64, String)> {
    nodes.iter().find_map(|n| {
        let s = n.status.as_ref().ok()?;
        Some((n.id, s.failover_backlog.clone()?))
    })
}

/// The line to print when the failover backlog warning changed.
fn backlog_change(before: &Option<(u64, String)>, now: &Option<(u64, String)>) -> Option<String> {
    match (before, now) {
        (b, Some((id, why))) if b.as_ref() != now.as_ref() => Some(format!("node {id} leads: {why}")),
        (Some((id, _)), None) => Some(format!(
            "node {id} leads with a majority able to apply again: the failover backlog is bounded (max_apply_lag)"
        )),
        _ => None,
    }
}

/// One compact state line: view, leader, and per node its role (`slow`
/// when its follower accepts connections but answers late, `down` when
/// not at all) and divergences, then ZooKeeper when nodes lost it. Counters
/// are left out: the line changes only when the cluster's state does
/// (`lockstep status` has the counters).
fn progress_line(config: &Config, nodes: &[status::NodeView]) -> String {
    let (view, leader) = status::cluster_view(nodes);
    let per: Vec<String> = nodes
        .iter()
        .map(|n| match &n.status {
            Ok(s) => {
                let mut x = format!("n{} {}", n.id, s.role);
                if s.divergences > 0 {
                    x.push_str(&format!(" DIVERGED {}", s.divergences));
                }
                x
            }
            Err(e) => format!("n{} {}", n.id, status::unanswered_role(e)),
        })
        .collect();
    let mut line = format!("view {view} leader {leader} | {}", per.join(" | "));
    let lost: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.status.as_ref().ok())
        .filter(|s| s.zookeeper_down_ms.is_some())
        .map(|s| s.node.to_string())
        .collect();
    if !lost.is_empty() {
        line.push_str(&format!(
            " | ZooKeeper {} unreachable from node{} {}",
            config.election.zookeeper,
            if lost.len() == 1 { "" } else { "s" },
            lost.join(", ")
        ));
    }
    line
}

/// Runs `lockstep up` until SIGINT/SIGTERM: every node of the config, or
/// with `node` only that one (one node per host; no ZooKeeper started).
pub fn run(config_path: &Path, server_cmd: Vec<String>, node: Option<u64>) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    if let Some(id) = node {
        config
            .node(id)
            .map_err(|e| anyhow::anyhow!("--node: {e}"))?;
    }
    for w in &config.warnings {
        eprintln!("warning: {w}");
    }
    let cmd = if server_cmd.is_empty() {
        config.server.clone().unwrap_or_default()
    } else {
        server_cmd
    };
    let stop = stop_on_signals().context("cannot install signal handlers")?;
    let bins = Binaries::beside_current_exe()?;
    let say = |m: &str| println!("{} lockstep up: {m}", status::utc_clock(Duration::ZERO));
    let mut cluster = match node {
        None => Cluster::start(config.clone(), config_path, &cmd, &bins, &stop, &say)?,
        Some(id) => Cluster::start_nodes(
            config.clone(),
            config_path,
            &cmd,
            &bins,
            &stop,
            &say,
            &[id],
            false,
        )?,
    };
    if let Some(id) = node {
        return run_one(&config, config_path, id, &mut cluster, &stop, &say);
    }
    let nodes = status::query_all(&config, Duration::from_secs(1));
    let (view, leader) = status::cluster_view(&nodes);
    let app = config
        .node(leader)
        .map(|n| n.app.to_string())
        .unwrap_or_default();
    say(&format!(
        "ready — view {view}, leader node {leader}: connect your clients to {app}"
    ));
    for n in config.nodes.iter().filter(|n| n.id != leader) {
        say(&format!(
            "  node {} (backup) at {}{}",
            n.id,
            n.app,
            match config.backup_clients {
                lockstep_common::config::BackupClients::Allow =>
                    ": reads only, writes there are NOT replicated",
                lockstep_common::config::BackupClients::Deny =>
                    ": refuses clients (backup_clients = \"deny\")",
            }
        ));
    }
    say(&format!(
        "logs in {}; `lockstep status {}` for details; Ctrl-C stops everything",
        config.data_dir.join("logs").display(),
        config_path.display()
    ));
    say("a node whose server or follower exits, or that turns stale, is restarted by itself");
    let mut last_line = String::new();
    let mut last_backlog = None;
    let mut last_print = Instant::now() - Duration::from_secs(60);
    let mut last_query = Instant::now() - Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) {
        for dead in cluster.reap_lines() {
            say(&dead);
        }
        // Every node's status once a second: staleness for `heal`, and the
        // state line when the state changed (at most every 2 s).
        let fresh = (last_query.elapsed() >= Duration::from_secs(1)).then(|| {
            last_query = Instant::now();
            status::query_all(&config, Duration::from_millis(500))
        });
        cluster.heal(fresh.as_deref(), &say);
        if let Some(nodes) = &fresh {
            let backlog = failover_backlog(nodes);
            if let Some(line) = backlog_change(&last_backlog, &backlog) {
                say(&line);
            }
            last_backlog = backlog;
            if last_print.elapsed() >= Duration::from_secs(2) {
                let line = progress_line(&config, nodes);
                if line != last_line {
                    say(&line);
                    last_line = line;
                    last_print = Instant::now();
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    say("stopping (servers, then followers)");
    cluster.stop();
    say("stopped; no process or region file left");
    Ok(())
}

/// `lockstep up --node N` once node `id` runs: heals it until SIGINT/SIGTERM.
fn run_one(
    config: &Config,
    config_path: &Path,
    id: u64,
    cluster: &mut Cluster,
    stop: &AtomicBool,
    say: &dyn Fn(&str),
) -> anyhow::Result<()> {
    let role = status::query(config, id, Duration::from_secs(1))
        .map(|s| s.role)
        .unwrap_or_else(|_| "unknown".into());
    let app = config
        .node(id)
        .map(|n| n.app.to_string())
        .unwrap_or_default();
    say(&format!(
        "ready — node {id} runs as {role}, its server at {app}; logs in {}; `lockstep status {}` for the cluster; SIGINT/SIGTERM stops this node",
        config.data_dir.join("logs").display(),
        config_path.display()
    ));
    say(&format!(
        "node {id} is restarted by itself when its server or follower exits or it turns stale"
    ));
    let mut last_role = role;
    let mut last_query = Instant::now() - Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) {
        for dead in cluster.reap_lines() {
            say(&dead);
        }
        let fresh = (last_query.elapsed() >= Duration::from_secs(1)).then(|| {
            last_query = Instant::now();
            vec![status::NodeView {
                id,
                status: status::query(config, id, Duration::from_millis(500)),
            }]
        });
        cluster.heal(fresh.as_deref(), say);
        if let Some(Ok(s)) = fresh.as_ref().map(|v| &v[0].status) {
            if s.role != last_role {
                say(&format!("node {id} is now {} (view {})", s.role, s.view));
                last_role = s.role.clone();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    say(&format!("stopping node {id} (server, then follower)"));
    cluster.stop();
    say("stopped; no process or region file of this node left");
    Ok(())
}

/// The pid of the server attached to node `id`'s region, if one is.
fn attached_server(config: &Config, id: u64) -> Option<u64> {
    let spec = config.region_spec(id);
    let r = region::Region::open(&spec.default_path(), &spec).ok()?;
    let pid = r.preload_pid();
    (pid != 0 && r.server_attached()).then_some(pid)
}

/// SIGKILLs a server still attached to node `id`'s region that none of
/// `up`'s processes stands for (one a follower restored from a snapshot
/// before it died), and waits a moment for its exit: a new follower
/// refuses to start beside it.
fn kill_attached_server(config: &Config, id: u64) {
    let Some(pid) = attached_server(config, id) else {
        return;
    };
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    let start = Instant::now();
    while attached_server(config, id).is_some() && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILLs node `id`'s follower (pid from its status) and server (pid from
/// the status, or from the region file when the follower is already down).
pub fn kill_node(config: &Config, id: u64) -> anyhow::Result<String> {
    config.node(id)?;
    let (mut server, mut follower) = (0u64, 0u64);
    if let Ok(s) = status::query(config, id, Duration::from_secs(1)) {
        server = s.server_pid;
        follower = s.follower_pid;
    }
    if server == 0 {
        let spec = config.region_spec(id);
        if let Ok(r) = region::Region::open(&spec.default_path(), &spec) {
            server = r.preload_pid();
        }
    }
    let mut done = Vec::new();
    for (what, pid) in [("server", server), ("follower", follower)] {
        if pid != 0 && kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
            done.push(format!("{what} pid {pid}"));
        }
    }
    if done.is_empty() {
        bail!("node {id} has no running server or follower");
    }
    Ok(done.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_common::control::NodeStatus;

    #[test]
    fn the_failover_backlog_is_said_when_it_starts_changes_and_ends() {
        let grows = Some((2, "only 1 of 3 nodes can apply (…)".to_string()));
        assert_eq!(backlog_change(&None, &None), None);
        assert_eq!(
            backlog_change(&None, &grows).as_deref(),
            Some("node 2 leads: only 1 of 3 nodes can apply (…)")
        );
        assert_eq!(backlog_change(&grows, &grows), None);
        let other = Some((3, "only 1 of 3 nodes can apply (…)".to_string()));
        assert!(backlog_change(&grows, &other).is_some_and(|l| l.starts_with("node 3 leads: ")));
        assert!(backlog_change(&grows, &None)
            .is_some_and(|l| l.starts_with("node 2 leads with a majority able to apply again")));
        let nodes = [
            status::NodeView {
                id: 1,
                status: Err("down".into()),
            },
            status::NodeView {
                id: 2,
                status: Ok(NodeStatus {
                    failover_backlog: grows.as_ref().map(|g| g.1.clone()),
                    ..NodeStatus::default()
                }),
            },
        ];
        assert_eq!(failover_backlog(&nodes), grows);
    }

    #[test]
    fn the_state_line_has_no_counters_and_tells_slow_from_down() {
        let config = Config::parse(
            &lockstep_testkit::config_fixture::ThreeNodeConfig::new(
                "cluster = \"t\"\ndata_dir = \"/tmp/lockstep-up-line\"\n",
            )
            .text(),
        )
        .unwrap();
        let node = |id: u64, role: &str, applied: u64| status::NodeView {
            id,
            status: Ok(NodeStatus {
                node: id,
                view: 2,
                leader: 1,
                role: role.into(),
                applied,
                committed: applied,
                ..NodeStatus::default()
            }),
        };
        let slow = status::NodeView {
            id: 3,
            status: Err("the follower at 127.0.0.1:7103 is slow: it accepts connections but did not answer within 500ms (timed out)".into()),
        };
        let a = progress_line(
            &config,
            &[node(1, "leader", 10), node(2, "backup", 10), slow],
        );
        assert_eq!(a, "view 2 leader 1 | n1 leader | n2 backup | n3 slow");
        let down = status::NodeView {
            id: 3,
            status: Err("the follower is not running (nothing listens on 127.0.0.1:7103)".into()),
        };
        let mut lost = node(2, "backup", 99);
        if let Ok(s) = &mut lost.status {
            s.zookeeper_down_ms = Some(1500);
        }
        let b = progress_line(&config, &[node(1, "leader", 99), lost, down]);
        assert_eq!(
            b,
            "view 2 leader 1 | n1 leader | n2 backup | n3 down | ZooKeeper 127.0.0.1:2181 unreachable from node 2"
        );
    }
}
