//! `lockstep up`: a whole local cluster from one config — each node's
//! follower and its server under the preload — until Ctrl-C, then a clean
//! stop that leaves no process and no region file behind.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::region;
use lockstep_common::Config;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::status;

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

struct Proc {
    what: String,
    child: Child,
    exited: bool,
}

/// The processes `up` started; dropping it stops them all.
pub struct Cluster {
    config: Config,
    procs: Vec<Proc>,
}

fn port_free(addr: SocketAddr) -> bool {
    TcpListener::bind(addr).is_ok()
}

fn find_in_path(prog: &str) -> bool {
    if prog.contains('/') {
        return Path::new(prog).exists();
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).exists()))
        .unwrap_or(false)
}

/// Expands `{port}`, `{host}`, `{data}`, `{node}` in a server command.
pub fn server_command(template: &[String], config: &Config, id: u64) -> anyhow::Result<Vec<String>> {
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

impl Cluster {
    /// Checks everything that can be checked before starting anything.
    fn preflight(config: &Config, cmd: &[String]) -> anyhow::Result<()> {
        if cmd.is_empty() {
            bail!("no server command: set `server = [...]` in the config or pass --server-cmd");
        }
        if !find_in_path(&cmd[0]) {
            bail!("server program `{}` not found (is it installed? scripts/setup installs redis-server and memcached)", cmd[0]);
        }
        for n in &config.nodes {
            let mut addrs = vec![("app", n.app), ("control", n.control)];
            if let Some(m) = n.metrics {
                addrs.push(("metrics", m));
            }
            for (field, a) in addrs {
                if !port_free(a) {
                    bail!("port in use: nodes.{field} {a} of node {} (is another cluster running?)", n.id);
                }
            }
            let path = region::region_path(&config.cluster, n.id);
            if path.exists() {
                bail!(
                    "region file {} exists: another cluster {:?} is running, or a stale file is left (remove it)",
                    path.display(),
                    config.cluster
                );
            }
        }
        Ok(())
    }

    /// Starts every node; returns once all are ready.
    pub fn start(config: Config, config_path: &Path, cmd: &[String], bins: &Binaries, say: &dyn Fn(&str)) -> anyhow::Result<Cluster> {
        Self::preflight(&config, cmd)?;
        let config_path = config_path
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", config_path.display()))?;
        let logs = config.data_dir.join("logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create {}", logs.display()))?;
        let mut cluster = Cluster {
            config: config.clone(),
            procs: Vec::new(),
        };
        for n in &config.nodes {
            say(&format!("starting follower of node {} (control {})", n.id, n.control));
            let log = File::create(logs.join(format!("follower-{}.log", n.id)))?;
            let child = Command::new(&bins.follower)
                .arg("--config")
                .arg(&config_path)
                .arg("--node")
                .arg(n.id.to_string())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("cannot start {}", bins.follower.display()))?;
            cluster.procs.push(Proc {
                what: format!("follower of node {}", n.id),
                child,
                exited: false,
            });
        }
        cluster.wait_for(
            "followers",
            |c| c.config.nodes.iter().all(|n| status::query(&c.config, n.id, Duration::from_millis(500)).is_ok()),
            Duration::from_secs(30),
        )?;
        for n in &config.nodes {
            let args = server_command(cmd, &config, n.id)?;
            std::fs::create_dir_all(config.data_dir.join(format!("server-{}", n.id)))?;
            say(&format!("starting server of node {}: {}", n.id, args.join(" ")));
            let log = File::create(logs.join(format!("server-{}.log", n.id)))?;
            let child = Command::new(&args[0])
                .args(&args[1..])
                .env("LD_PRELOAD", &bins.preload)
                .env("LOCKSTEP_CONFIG", &config_path)
                .env("LOCKSTEP_NODE", n.id.to_string())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("cannot start {}", args[0]))?;
            cluster.procs.push(Proc {
                what: format!("server of node {}", n.id),
                child,
                exited: false,
            });
        }
        cluster.wait_for(
            "servers",
            |c| {
                c.config.nodes.iter().all(|n| {
                    TcpStream::connect_timeout(&n.app, Duration::from_millis(300)).is_ok()
                        && status::query(&c.config, n.id, Duration::from_millis(500))
                            .map(|s| s.server_pid != 0 && s.role != "joining")
                            .unwrap_or(false)
                })
            },
            Duration::from_secs(60),
        )?;
        Ok(cluster)
    }

    fn wait_for(&mut self, what: &str, ready: impl Fn(&Cluster) -> bool, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if let Some(dead) = self.reap().into_iter().next() {
                bail!("{dead} while waiting for the {what} (see the logs in {})", self.config.data_dir.join("logs").display());
            }
            if ready(self) {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!("the {what} did not become ready within {limit:?} (see the logs in {})", self.config.data_dir.join("logs").display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Notes processes that exited since the last call.
    pub fn reap(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for p in &mut self.procs {
            if !p.exited {
                if let Ok(Some(st)) = p.child.try_wait() {
                    p.exited = true;
                    out.push(format!("{} exited ({st})", p.what));
                }
            }
        }
        out
    }

    /// Stops servers, then followers (SIGTERM, then SIGKILL after a grace
    /// period), and removes the region files.
    pub fn stop(&mut self) {
        for kind in ["server", "follower"] {
            for p in self.procs.iter_mut().filter(|p| p.what.starts_with(kind) && !p.exited) {
                let _ = kill(Pid::from_raw(p.child.id() as i32), Signal::SIGTERM);
            }
            let start = Instant::now();
            for p in self.procs.iter_mut().filter(|p| p.what.starts_with(kind)) {
                while !p.exited {
                    if let Ok(Some(_)) | Err(_) = p.child.try_wait() {
                        p.exited = true;
                        break;
                    }
                    if start.elapsed() > Duration::from_secs(10) {
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        p.exited = true;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
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
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let bins = Binaries::locate()?;
    let say = |m: &str| println!("lockstep up: {m}");
    let mut cluster = Cluster::start(config.clone(), config_path, &cmd, &bins, &say)?;
    let nodes = status::query_all(&config, Duration::from_secs(1));
    let (view, leader) = status::cluster_view(&nodes);
    let app = config.node(leader).map(|n| n.app.to_string()).unwrap_or_default();
    println!("lockstep up: ready — view {view}, leader node {leader}: connect to {app}");
    println!("lockstep up: Ctrl-C stops everything");
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        for dead in cluster.reap() {
            println!("lockstep up: {dead}");
        }
        if last.elapsed() > Duration::from_secs(5) {
            let nodes = status::query_all(&config, Duration::from_millis(500));
            let line: Vec<String> = nodes
                .iter()
                .map(|n| match &n.status {
                    Ok(s) => format!("n{} {} c{} a{}", n.id, s.role, s.committed, s.applied),
                    Err(_) => format!("n{} down", n.id),
                })
                .collect();
            println!("lockstep up: {}", line.join(" | "));
            last = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("lockstep up: stopping");
    cluster.stop();
    println!("lockstep up: stopped");
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
