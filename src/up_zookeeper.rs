//! The private ZooKeeper `lockstep up` started: restarted with the same data
//! dir and port when it exits, with backoff, one line per step (returned to the caller). Starting it
//! does not block `up`'s loop (the JVM takes seconds): each [`Keeper::poll`]
//! moves one step on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockstep_launcher::zookeeper::{is_serving, ZookeeperServer, START_LIMIT};

use crate::supervisor::backoff;

/// Where the kept ZooKeeper stands.
enum State {
    /// It serves.
    Serving(ZookeeperServer),
    /// Started at the instant; not serving yet.
    Starting(ZookeeperServer, Instant),
    /// Not running; the next start is due then.
    Down(Instant),
}

/// A private ZooKeeper kept running.
pub struct Keeper {
    dir: PathBuf,
    addr: SocketAddr,
    state: State,
    /// Starts that failed (or served less than a minute) in a row.
    failures: u32,
    /// When it last began to serve.
    serving_since: Instant,
}

/// A ZooKeeper that served this long counts as healthy again: the next
/// failure restarts it after the shortest pause.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

impl Keeper {
    /// Keeps `zk` (serving, with its data in `dir`).
    pub fn new(zk: ZookeeperServer, dir: PathBuf) -> Keeper {
        Keeper {
            dir,
            addr: zk.addr(),
            state: State::Serving(zk),
            failures: 0,
            serving_since: Instant::now(),
        }
    }

    /// One step: notices an exit, starts it again when due, notices that
    /// it serves again; says each step.
    pub fn poll(&mut self, out: &mut Vec<String>) {
        let now = Instant::now();
        let state = std::mem::replace(&mut self.state, State::Down(now));
        self.state = match state {
            State::Serving(mut zk) => {
                if !zk.exited() {
                    State::Serving(zk)
                } else {
                    if self.serving_since.elapsed() >= HEALTHY_AFTER {
                        self.failures = 0;
                    }
                    self.down(
                        format!("ZooKeeper exited (log {})", zk.log_path().display()),
                        out,
                    )
                }
            }
            State::Starting(mut zk, since) => {
                if zk.exited() {
                    self.down(
                        format!(
                            "ZooKeeper exited while starting (log {})",
                            zk.log_path().display()
                        ),
                        out,
                    )
                } else if is_serving(self.addr) {
                    out.push(format!(
                        "ZooKeeper serves again at {} (pid {})",
                        self.addr,
                        zk.pid()
                    ));
                    self.serving_since = now;
                    State::Serving(zk)
                } else if since.elapsed() > START_LIMIT {
                    zk.stop();
                    self.down(
                        format!(
                            "ZooKeeper did not serve within {START_LIMIT:?} (log {})",
                            zk.log_path().display()
                        ),
                        out,
                    )
                } else {
                    State::Starting(zk, since)
                }
            }
            State::Down(due) if now < due => State::Down(due),
            State::Down(_) => {
                out.push(format!(
                    "starting ZooKeeper again at {} (data in {})",
                    self.addr,
                    self.dir.display()
                ));
                match ZookeeperServer::spawn(&self.dir, self.addr.port()) {
                    Ok(zk) => State::Starting(zk, now),
                    Err(e) => self.down(format!("cannot start ZooKeeper: {e:#}"), out),
                }
            }
        };
    }

    /// It is not running because of `why`: the next start after a pause.
    fn down(&mut self, why: String, out: &mut Vec<String>) -> State {
        let pause = backoff(self.failures);
        self.failures += 1;
        out.push(if pause.is_zero() {
            format!("{why}: restarting it now with the same data and port")
        } else {
            format!(
                "{why}: restarting it in {}s with the same data and port",
                pause.as_secs()
            )
        });
        State::Down(Instant::now() + pause)
    }

    /// Stops it (if it runs).
    pub fn stop(&mut self) {
        match &mut self.state {
            State::Serving(zk) | State::Starting(zk, _) => zk.stop(),
            State::Down(_) => {}
        }
        self.state = State::Down(Instant::now() + Duration::from_secs(3600));
    }
}
