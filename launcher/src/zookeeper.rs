//! A private standalone ZooKeeper from the Debian package, for `lockstep up`
//! (when the configured one is not reachable) and for integration tests.
//!
//! It runs `zkServer.sh start-foreground` with its own `zoo.cfg` (never the
//! system's `/etc/zookeeper/conf`, which would use port 2181) in its own
//! process group, and stops that whole group when dropped.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::process::{open_log, spawn_logged, Grouping};

/// The Debian package's start script.
pub const ZK_SERVER_SCRIPT: &str = "/usr/share/zookeeper/bin/zkServer.sh";

/// How long `start` waits for the server to serve (a cold JVM on a busy
/// 2-core machine can take several seconds).
pub const START_LIMIT: Duration = Duration::from_secs(90);

/// A running private ZooKeeper; dropping it stops it.
pub struct ZookeeperServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

/// The `srvr` four-letter answer of the ZooKeeper at `addr`, if any.
pub fn srvr(addr: SocketAddr, timeout: Duration) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    s.write_all(b"srvr").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Whether a ZooKeeper serves at `addr`: `srvr` reports a `Mode:`. (It
/// answers `ruok` before it accepts sessions, so `ruok` is not enough.)
pub fn is_serving(addr: SocketAddr) -> bool {
    srvr(addr, Duration::from_secs(2)).is_some_and(|r| r.contains("Mode:"))
}

/// Whether 127.0.0.1:`port` can be bound now.
fn port_free(port: u16) -> bool {
    crate::process::port_free(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

/// The `zoo.cfg` of a ZooKeeper with its data in `data`, serving clients
/// on `addr`, with `extra` lines (an ensemble member's `server.N` lines).
/// Short ticks allow short sessions (`minSessionTimeout`), so elections
/// notice a dead node quickly.
pub fn standalone_config(data: &Path, addr: SocketAddr, extra: &str) -> String {
    format!(
        "tickTime=100\nminSessionTimeout=200\nmaxSessionTimeout=60000\ninitLimit=50\nsyncLimit=20\n\
         dataDir={}\nclientPort={}\nclientPortAddress={}\nadmin.enableServer=false\n\
         4lw.commands.whitelist=srvr,ruok,stat\n{extra}",
        data.display(),
        addr.port(),
        addr.ip()
    )
}

impl ZookeeperServer {
    /// Starts a standalone ZooKeeper on 127.0.0.1:`port` with its data,
    /// config and log in `dir`, and waits until it serves.
    pub fn start(dir: &Path, port: u16) -> Result<ZookeeperServer> {
        let mut zk = Self::spawn(dir, port)?;
        zk.wait_ready(START_LIMIT)?;
        Ok(zk)
    }

    /// Starts one on the first of up to five ports from `next_port` that is
    /// free when it starts and that it could bind. A port found free a
    /// moment earlier can be taken by then on a shared machine (other jobs
    /// bind loopback ports too).
    pub fn start_on_free_port(
        dir: &Path,
        mut next_port: impl FnMut() -> u16,
    ) -> Result<ZookeeperServer> {
        let mut taken = Vec::new();
        for _ in 0..5 {
            let port = next_port();
            if !port_free(port) {
                taken.push(port);
                continue;
            }
            match Self::start(dir, port) {
                // The JVM takes seconds to bind and exits (silently) when
                // the port was taken meanwhile; it is held by another now.
                Err(_) if !port_free(port) => taken.push(port),
                other => return other,
            }
        }
        bail!("cannot start ZooKeeper: ports {taken:?} were all in use")
    }

    /// Starts it without waiting.
    pub fn spawn(dir: &Path, port: u16) -> Result<ZookeeperServer> {
        Self::spawn_with(dir, port, "")
    }

    /// Starts it without waiting, with `extra` lines in its `zoo.cfg` (an
    /// ensemble member's `server.N` lines; its `myid` is written first).
    fn spawn_with(dir: &Path, port: u16, extra: &str) -> Result<ZookeeperServer> {
        if !Path::new(ZK_SERVER_SCRIPT).exists() {
            bail!(
                "{ZK_SERVER_SCRIPT} not found: install the zookeeper package (scripts/setup does)"
            );
        }
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        if !port_free(port) {
            bail!("cannot start ZooKeeper: port {addr} is in use");
        }
        let data = dir.join("data");
        std::fs::create_dir_all(&data)
            .with_context(|| format!("cannot create {}", data.display()))?;
        let cfg = dir.join("zoo.cfg");
        let text = standalone_config(&data, addr, extra);
        std::fs::write(&cfg, text).with_context(|| format!("cannot write {}", cfg.display()))?;
        let log_path = dir.join("zookeeper.log");
        let log = open_log(&log_path, false)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let mut cmd = Command::new(ZK_SERVER_SCRIPT);
        cmd.arg("start-foreground").arg(&cfg).current_dir(dir);
        // Its own group: a terminal's Ctrl-C reaches only our process, and
        // `stop` can signal the script and the JVM together; it stops with
        // us if we die without dropping (e.g. SIGKILL).
        let child = spawn_logged(&mut cmd, log, Grouping::OwnGroup)
            .with_context(|| format!("cannot start {ZK_SERVER_SCRIPT}"))?;
        log::info!(
            "started ZooKeeper pid {} on {addr} (config {})",
            child.id(),
            cfg.display()
        );
        Ok(ZookeeperServer {
            child: Some(child),
            port,
            dir: dir.to_path_buf(),
        })
    }

    /// Waits until it serves (`srvr` reports a mode); fails early when the
    /// process exits, with the tail of its log.
    pub fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    self.child = None;
                    bail!("ZooKeeper exited at start ({st}): {}", self.log_tail());
                }
            }
            if is_serving(self.addr()) {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!(
                    "ZooKeeper on {} did not serve within {limit:?}: {}",
                    self.addr(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Its client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Its client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id of its process (group leader); 0 once stopped.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Its log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("zookeeper.log")
    }

    fn log_tail(&self) -> String {
        let tail = crate::process::tail_lines(&self.log_path(), 5);
        format!("{} (log {})", tail.join(" / "), self.log_path().display())
    }

    /// Whether its process has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Kills the whole process group with SIGKILL (a crash) and reaps it.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
        log::info!("killed ZooKeeper on {}", self.addr());
    }

    /// Stops the whole process group: SIGTERM, then SIGKILL after a grace
    /// period.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = Pid::from_raw(child.id() as i32);
        let _ = killpg(pgid, Signal::SIGTERM);
        let start = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if start.elapsed() > Duration::from_secs(10) => {
                    let _ = killpg(pgid, Signal::SIGKILL);
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        // Anything the script left in its group.
        let _ = killpg(pgid, Signal::SIGKILL);
        log::info!("stopped ZooKeeper on {}", self.addr());
    }
}

/// A ZooKeeper ensemble of real servers on loopback ports, each in its own
/// directory; dropping it stops them all.
pub struct ZookeeperEnsemble {
    members: Vec<ZookeeperServer>,
}

impl ZookeeperEnsemble {
    /// Starts one member per `(client, quorum, election)` port triple, with
    /// its data in `dir/member-N`, and waits until every member serves.
    pub fn start(dir: &Path, ports: &[(u16, u16, u16)]) -> Result<ZookeeperEnsemble> {
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, quorum, election))| {
                format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1)
            })
            .collect();
        let mut members = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let d = dir.join(format!("member-{}", i + 1));
            std::fs::create_dir_all(d.join("data"))
                .with_context(|| format!("cannot create {}", d.display()))?;
            std::fs::write(d.join("data").join("myid"), format!("{}\n", i + 1))
                .with_context(|| format!("cannot write the myid in {}", d.display()))?;
            members.push(ZookeeperServer::spawn_with(&d, *client, &servers)?);
        }
        let mut e = ZookeeperEnsemble { members };
        for m in &mut e.members {
            m.wait_ready(START_LIMIT)?;
        }
        Ok(e)
    }

    /// The connect string naming every member (`h:p,h:p,h:p`).
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| m.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Member `i` (0-based).
    pub fn member(&mut self, i: usize) -> &mut ZookeeperServer {
        &mut self.members[i]
    }
}

impl Drop for ZookeeperServer {
    fn drop(&mut self) {
        self.stop();
    }
}
