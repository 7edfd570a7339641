//! `lockstep up`: a whole local cluster from one config — a private
//! ZooKeeper when the election needs one and none is reachable, each node's
//! follower and its server under the preload — until Ctrl-C, then a clean
//! stop that leaves no process and no region file behind.
//!
//! Every child runs in its own process group (a terminal's Ctrl-C reaches
//! only `lockstep up`, which then stops servers before followers) and gets
//! SIGTERM from the kernel if `lockstep up` dies without cleaning up.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::config::ElectionMode;
use lockstep_common::region;
use lockstep_common::Config;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use crate::status;
use crate::zookeeper_server::ZookeeperServer;

/// How long a stopping process may take after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Where the built binaries are: next to the running `lockstep`.
pub struct Binaries {
    /// lockstep-follower.
    pub follower: PathBuf,
    /// liblockstep.so.
    pub preload: PathBuf,
}

impl Binaries {
    /// Finds the follower and the preload beside the current executable.
    pub fn locate() -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe().context("cannot find the lockstep executable")?;
        let dir = exe.parent().context("executable has no directory")?;
        let b = Binaries {
            follower: dir.join("lockstep-follower"),
            preload: dir.join("liblockstep.so"),
        };
        for p in [&b.follower, &b.preload] {
            if !p.exists() {
                bail!(
                    "{} is missing: build the workspace first (cargo build --workspace)",
                    p.display()
                );
            }
        }
        Ok(b)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Server,
    Follower,
}

struct Proc {
    kind: Kind,
    what: String,
    log: PathBuf,
    child: Child,
    exited: bool,
    /// " (exit status …)" once reaped by `reap`.
    how: String,
}

impl Proc {
    fn pgid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }
}

/// The processes `up` started; dropping it stops them all.
pub struct Cluster {
    config: Config,
    procs: Vec<Proc>,
    zookeeper: Option<ZookeeperServer>,
    stopped: bool,
    /// The server command template the nodes run.
    cmd: Vec<String>,
}

fn port_free(addr: SocketAddr) -> bool {
    TcpListener::bind(addr).is_ok()
}

fn find_in_path(prog: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if prog.contains('/') {
        return runnable(Path::new(prog));
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| runnable(&d.join(prog))))
        .unwrap_or(false)
}

/// The last non-empty line of a log file (why a child stopped, usually).
fn last_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
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

/// Spawns `cmd` in its own process group with SIGTERM on our death.
fn spawn(mut cmd: Command, log: &Path) -> anyhow::Result<Child> {
    let out = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only
    // makes the prctl(2) system call, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // The kernel sends it when the spawning thread (our main
            // thread) ends, also by SIGKILL: no orphans.
            nix::sys::prctl::set_pdeathsig(Some(Signal::SIGTERM))?;
            Ok(())
        });
    }
    Ok(cmd.spawn()?)
}

impl Cluster {
    /// Checks everything that can be checked before starting anything;
    /// removes region files no running node uses.
    fn preflight(config: &Config, cmd: &[String], say: &dyn Fn(&str)) -> anyhow::Result<()> {
        if cmd.is_empty() {
            bail!("no server command: set `server = [...]` in the config or pass --server-cmd");
        }
        if !find_in_path(&cmd[0]) {
            bail!(
                "server program `{}` not found (is it installed? scripts/setup installs redis-server and memcached)",
                cmd[0]
            );
        }
        if !cmd.iter().any(|a| a.contains("{port}")) {
            eprintln!("warning: the server command has no {{port}}: every node's server may try the same port");
        }
        for n in &config.nodes {
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
        if config.ids().any(|id| config.node_data_dir(id).exists()) {
            say(&format!(
                "{} holds an earlier run's log: each server's state is rebuilt from it (remove the directory for an empty cluster)",
                config.data_dir.display()
            ));
        }
        // Every app and control port is free, so no server or follower of
        // this cluster runs: a region file left now is stale.
        for id in config.ids() {
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
        Self::preflight(&config, cmd, say)?;
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
        };
        cluster.zookeeper = ensure_zookeeper(&config, say)?;
        for id in config.ids() {
            cluster.spawn_follower(id, &config_path, bins, say)?;
        }
        cluster.wait_for(
            "followers",
            stop,
            |c| {
                c.config
                    .ids()
                    .all(|id| status::query(&c.config, id, Duration::from_millis(500)).is_ok())
            },
            Duration::from_secs(60),
        )?;
        for id in config.ids() {
            cluster.spawn_server(id, cmd, &config_path, bins, say)?;
        }
        let ids: Vec<u64> = config.ids().collect();
        cluster.wait_servers(&ids, stop)?;
        Ok(cluster)
    }

    fn spawn_follower(
        &mut self,
        id: u64,
        config_path: &Path,
        bins: &Binaries,
        say: &dyn Fn(&str),
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
        let mut c = Command::new(&bins.follower);
        c.arg("--config")
            .arg(config_path)
            .arg("--node")
            .arg(n.id.to_string());
        let child =
            spawn(c, &log).with_context(|| format!("cannot start {}", bins.follower.display()))?;
        self.procs.push(Proc {
            kind: Kind::Follower,
            what: format!("follower of node {}", n.id),
            log,
            child,
            exited: false,
            how: String::new(),
        });
        Ok(())
    }

    fn spawn_server(
        &mut self,
        id: u64,
        cmd: &[String],
        config_path: &Path,
        bins: &Binaries,
        say: &dyn Fn(&str),
    ) -> anyhow::Result<()> {
        let args = server_command(cmd, &self.config, id)?;
        let data = self.config.data_dir.join(format!("server-{id}"));
        std::fs::create_dir_all(&data)
            .with_context(|| format!("cannot create {}", data.display()))?;
        say(&format!(
            "starting server of node {id}: {}",
            shell_words(&args)
        ));
        let log = self
            .config
            .data_dir
            .join("logs")
            .join(format!("server-{id}.log"));
        let mut c = Command::new(&args[0]);
        c.args(&args[1..])
            .env("LD_PRELOAD", &bins.preload)
            .env("LOCKSTEP_CONFIG", config_path)
            .env("LOCKSTEP_NODE", id.to_string());
        let child = spawn(c, &log).with_context(|| format!("cannot start server `{}`", args[0]))?;
        self.procs.push(Proc {
            kind: Kind::Server,
            what: format!("server of node {id}"),
            log,
            child,
            exited: false,
            how: String::new(),
        });
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
        let name = |k: &str| format!("{k} of node {id}");
        for p in &mut self.procs {
            if p.what == name("server") || p.what == name("follower") {
                let _ = p.child.wait();
            }
        }
        self.procs
            .retain(|p| p.what != name("server") && p.what != name("follower"));
        let config_path = config_path
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", config_path.display()))?;
        self.spawn_follower(id, &config_path, bins, say)?;
        self.wait_for(
            "follower",
            stop,
            |c| status::query(&c.config, id, Duration::from_millis(500)).is_ok(),
            Duration::from_secs(60),
        )?;
        let cmd = self.cmd.clone();
        self.spawn_server(id, &cmd, &config_path, bins, say)?;
        self.wait_servers(&[id], stop)
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
            .map(|i| format!("{} exited{}", self.procs[i].what, self.procs[i].how))
            .collect();
        if let Some(zk) = self.zookeeper.as_mut() {
            if zk.exited() {
                lines.push(format!(
                    "ZooKeeper exited (log {})",
                    zk.log_path().display()
                ));
                self.zookeeper = None;
            }
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
        for id in self.config.ids() {
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
fn shell_words(args: &[String]) -> String {
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

/// One compact progress line: view, leader, and per node its role,
/// commit/applied and divergences.
fn progress_line(nodes: &[status::NodeView]) -> String {
    let (view, leader) = status::cluster_view(nodes);
    let per: Vec<String> = nodes
        .iter()
        .map(|n| match &n.status {
            Ok(s) => {
                let mut x = format!("n{} {} applied {}/{}", n.id, s.role, s.applied, s.committed);
                if s.divergences > 0 {
                    x.push_str(&format!(" DIVERGED {}", s.divergences));
                }
                x
            }
            Err(_) => format!("n{} down", n.id),
        })
        .collect();
    format!("view {view} leader {leader} | {}", per.join(" | "))
}

/// Runs `lockstep up` until SIGINT/SIGTERM.
pub fn run(config_path: &Path, server_cmd: Vec<String>) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    for w in &config.warnings {
        eprintln!("warning: {w}");
    }
    let cmd = if server_cmd.is_empty() {
        config.server.clone().unwrap_or_default()
    } else {
        server_cmd
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let bins = Binaries::locate()?;
    let say = |m: &str| println!("lockstep up: {m}");
    let mut cluster = Cluster::start(config.clone(), config_path, &cmd, &bins, &stop, &say)?;
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
    let mut last_line = String::new();
    let mut last = Instant::now() - Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) {
        for dead in cluster.reap_lines() {
            say(&dead);
        }
        // A progress line when something changed, at most every 2 s.
        if last.elapsed() > Duration::from_secs(2) {
            let line = progress_line(&status::query_all(&config, Duration::from_millis(500)));
            if line != last_line {
                say(&line);
                last_line = line;
            }
            last = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    say("stopping (servers, then followers)");
    cluster.stop();
    say("stopped; no process or region file left");
    Ok(())
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
