//! [`ServerImage`] with CRIU (checkpoint/restore in userspace): a process
//! image of the node's server — its memory and every socket, the replay
//! connections (loopback connections inside the server) and clients'
//! alike, with their unread bytes — so Redis's hash-table layout, a
//! connection's `SELECT`, `MULTI` queue, RESP3, subscriptions and blocked
//! `BLPOP` all come back as they were.
//!
//! A server started through `lockstep launch-server` runs in a PID
//! namespace of its own as a session leader, so its pids are free again at
//! restore. One started any other way (from a shell, a supervisor,
//! systemd) is in its starter's session: CRIU refuses to dump a process
//! tree whose root does not lead its session unless told it is a "shell
//! job" (`--shell-job`: the restored server then joins the session of the
//! criu that restores it, here one in a process group of its own). Such a
//! server shares the follower's PID namespace, so its image restores only
//! while its pids (every thread's) are free on this host: [`ProcessFacts`]
//! records them beside the image and a restore that cannot work says so
//! before CRIU runs. The region is a
//! `MAP_SHARED` file in /dev/shm: CRIU does not copy it, it maps the file
//! at its path again (the follower recreated it by then). The preload's
//! apply stream position is written beside the image ([`STREAM_FILE`]):
//! the follower resumes that stream instead of starting a new one.
//!
//! An image names its node's region file, working directory, log and app
//! address ([`Origin`], written beside it): restored on another node (a
//! peer's snapshot installed), a relocated copy of it is restored instead
//! ([`relocate`](super::relocate)), and the restored preload takes this
//! node's identity.
//!
//! Needs CRIU 4.2 or newer (see `scripts/setup`) and root. [`Criu::find`]
//! says in one line why a machine cannot snapshot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use lockstep_common::region::Region;

use super::build_id;
use super::protobuf;
use super::relocate::{self, Origin, Relocation, ORIGIN_FILE};
use super::{Position, ServerImage, StreamState, STREAM_FILE};

/// The CRIU version `scripts/setup` builds (and caches in `.cache/`).
pub const CRIU_VERSION: &str = "4.2.1";
/// Overrides where criu is found.
pub const CRIU_ENV: &str = "LOCKSTEP_CRIU";

/// Options both directions need: established TCP connections (replay
/// connections and clients), the region's liveness lock, and no network
/// lock. CRIU's default locks each connection with two iptables rules
/// (and removes them after), one iptables run each: on 2 busy cores that
/// took 0.06–0.8 s per run, seconds per dump. Nothing needs it here: a
/// replay connection has both ends inside the frozen server, so no packet
/// moves on it; a direct client of a backup (`backup_clients`) has moved
/// on by the time an image is restored anyway.
const COMMON: [&str; 4] = [
    "--tcp-established",
    "--file-locks",
    "--network-lock",
    "skip",
];

/// The file in an image directory that holds its [`ProcessFacts`].
pub const PROCESS_FILE: &str = "process.json";

/// What a restore of an image must know about the process it was taken
/// of (`process.json`, written beside the image; an image without it was
/// taken of a server `lockstep launch-server` started).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessFacts {
    /// The server's pid as the follower saw it.
    pub pid: u64,
    /// Its threads' ids as the follower saw them (the pid among them).
    pub tids: Vec<u64>,
    /// It led its session: dumped and restored without `--shell-job`.
    pub session_leader: bool,
    /// It ran in a PID namespace of its own (its pids are free in a fresh
    /// one at restore); else in the follower's, where they must be free.
    pub own_pid_namespace: bool,
}

impl Default for ProcessFacts {
    fn default() -> Self {
        ProcessFacts {
            pid: 0,
            tids: Vec::new(),
            session_leader: true,
            own_pid_namespace: true,
        }
    }
}

impl ProcessFacts {
    /// What /proc says of process `pid` now.
    pub fn of(pid: u64) -> anyhow::Result<ProcessFacts> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("the server (pid {pid}) is gone"))?;
        let sessions = sessions_in_status(&status)
            .with_context(|| format!("cannot read the session of the server (pid {pid})"))?;
        // CRIU reads the session from inside the server's own PID
        // namespace: a leader outside it (a server started by a container
        // runtime's exec, or under `unshare --pid` without `setsid`) reads
        // as 0 there and no dump can succeed; said before CRIU runs.
        if sessions.innermost == 0 {
            anyhow::bail!(
                "the server (pid {pid}) is in a session whose leader is outside its PID namespace (started from a container runtime's exec, or in a PID namespace without a session of its own): CRIU cannot image it"
            );
        }
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
        let own_pid_namespace = ns(&pid.to_string()) != ns("self");
        let mut tids: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        tids.sort_unstable();
        Ok(ProcessFacts {
            pid,
            tids,
            session_leader: sessions.here == pid,
            own_pid_namespace,
        })
    }

    /// Reads `dir`'s `process.json` (the default when the image has none).
    pub fn read(dir: &Path) -> anyhow::Result<ProcessFacts> {
        match std::fs::read(dir.join(PROCESS_FILE)) {
            Ok(b) => serde_json::from_slice(&b).context("the image's process.json is unreadable"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ProcessFacts::default()),
            Err(e) => Err(e).context("cannot read the image's process.json"),
        }
    }

    /// Why the image cannot be restored on this host now (None: it can as
    /// far as pids go): a server that shared the follower's PID namespace
    /// gets its pids back only while nothing else holds them.
    /// `running(tid)` says whether a pid is taken now.
    pub fn pids_taken(&self, running: impl Fn(u64) -> bool) -> Option<String> {
        if self.own_pid_namespace {
            return None;
        }
        let mut pids = self.tids.clone();
        pids.push(self.pid);
        pids.sort_unstable();
        pids.dedup();
        let taken: Vec<String> = pids
            .into_iter()
            .filter(|&t| t != 0 && running(t))
            .map(|t| t.to_string())
            .collect();
        let (what, verb) = match taken.len() {
            0 => return None,
            1 => ("pid", "is"),
            _ => ("pids", "are"),
        };
        Some(format!(
            "the image's server (pid {}) ran in the follower's PID namespace and CRIU restores it with the same pids, but {what} {} {verb} taken on this host now; start servers with `lockstep run` (a PID namespace of their own, as `lockstep up` does) so their images restore whatever runs",
            self.pid,
            taken.join(", ")
        ))
    }
}

/// A process's session id as this follower sees it and as the process
/// itself sees it (from its own, innermost PID namespace).
#[derive(Debug, PartialEq, Eq)]
struct Sessions {
    here: u64,
    innermost: u64,
}

/// The `NSsid:` line of a `/proc/PID/status`: the session id in each PID
/// namespace the process is in, this procfs's first, its own last.
fn sessions_in_status(status: &str) -> Option<Sessions> {
    let ids: Vec<u64> = status
        .lines()
        .find_map(|l| l.strip_prefix("NSsid:"))?
        .split_whitespace()
        .map(|w| w.parse().ok())
        .collect::<Option<_>>()?;
    Some(Sessions {
        here: *ids.first()?,
        innermost: *ids.last()?,
    })
}

/// Whether pid `pid` is taken on this host (a zombie holds its pid too).
fn pid_taken(pid: u64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Takes and restores CRIU images of one node's server.
pub struct Criu {
    criu: PathBuf,
    region: Arc<Region>,
    /// This node's app address.
    app: std::net::SocketAddr,
    /// Where this node's last server stood ([`Criu::stop_server`] reads it
    /// before it stops the server): where a relocated image's directory
    /// and log go.
    last_server: std::sync::Mutex<Option<Origin>>,
    /// Where CRIU's logs and the restore's pid file go (the snapshots
    /// directory, beside the images).
    work: PathBuf,
}

/// Where criu is: `$LOCKSTEP_CRIU`, else `.cache/criu-<version>/criu` in a
/// directory above this executable (a build tree: `scripts/setup` put it
/// there), else `criu` on `PATH`.
pub fn locate() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(CRIU_ENV) {
        return Some(PathBuf::from(p));
    }
    let cached = format!(".cache/criu-{CRIU_VERSION}/criu");
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1) {
            let p = dir.join(&cached);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("criu"))
        .find(|p| p.is_file())
}

/// Runs criu with `args`; Err with the log's last error line. `own_group`:
/// in a process group of its own (a `--shell-job` restore: the restored
/// server joins criu's session and group, which must not be the
/// follower's, or a Ctrl-C or hang-up meant for the follower would reach
/// it).
fn run_criu(
    criu: &Path,
    args: &[&std::ffi::OsStr],
    log: &Path,
    own_group: bool,
) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(criu);
    if own_group {
        cmd.process_group(0);
    }
    let out = cmd
        .args(args)
        .arg("-o")
        .arg(log)
        .output()
        .with_context(|| format!("cannot run {}", criu.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let why = text
        .lines()
        .rev()
        // The last error that says why: CRIU ends with `Dumping FAILED.`
        // or `Restoring FAILED.`, which does not.
        .find(|l| {
            l.starts_with("Error")
                && !l.contains("RLIMIT_NOFILE")
                && !l.contains("Dumping FAILED")
                && !l.contains("Restoring FAILED")
        })
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string());
    bail!(
        "criu {} failed ({}): {why} (log {})",
        args[0].to_string_lossy(),
        out.status,
        log.display()
    )
}

/// What CRIU recorded about a dump in the image's `stats-dump` (a
/// protobuf `StatsEntry` after two magics and a length): microseconds
/// frozen, and of that, writing memory. None: not readable.
fn dump_stats(dir: &Path) -> Option<(u64, u64)> {
    let b = std::fs::read(dir.join("stats-dump")).ok()?;
    let len = u32::from_le_bytes(b.get(8..12)?.try_into().ok()?) as usize;
    let entry = protobuf::parse(b.get(12..12 + len)?).ok()?;
    // Field 1 (dump), length-delimited, holds varint fields: 2 frozen_time,
    // 3 memdump_time.
    let dump = entry.first()?;
    if dump.num != 1 || dump.wire != protobuf::WIRE_LEN {
        return None;
    }
    let fields = protobuf::parse(&dump.bytes).ok()?;
    if fields.iter().any(|f| f.wire != protobuf::WIRE_VARINT) {
        return None;
    }
    Some((
        protobuf::varint_field(&fields, 2)?,
        protobuf::varint_field(&fields, 3)?,
    ))
}

/// Bytes in the files of `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

impl Criu {
    /// CRIU for the server attached to `region`, logging into `work`; Err
    /// with one line saying why this machine cannot snapshot (no criu,
    /// `criu check` fails, not root).
    pub fn find(
        region: Arc<Region>,
        work: &Path,
        app: std::net::SocketAddr,
    ) -> Result<Criu, String> {
        let Some(criu) = locate() else {
            return Err(format!(
                "no criu found (${CRIU_ENV}, .cache/criu-{CRIU_VERSION}/criu from scripts/setup, or PATH)"
            ));
        };
        if !nix::unistd::geteuid().is_root() {
            return Err(format!("{} needs root", criu.display()));
        }
        match Command::new(&criu).arg("check").output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stderr);
                let why = text
                    .lines()
                    .find(|l| l.starts_with("Error"))
                    .unwrap_or("")
                    .to_string();
                return Err(format!("`{} check` fails: {why}", criu.display()));
            }
            Err(e) => return Err(format!("cannot run {}: {e}", criu.display())),
        }
        Ok(Criu {
            criu,
            region,
            app,
            last_server: std::sync::Mutex::new(None),
            work: work.to_path_buf(),
        })
    }

    /// The criu binary in use.
    pub fn binary(&self) -> &Path {
        &self.criu
    }

    /// The files whose build ids an image of `pid` records: its
    /// executable and the preload it mapped.
    fn binaries_of(pid: u64) -> anyhow::Result<Vec<PathBuf>> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("cannot read the server's executable (pid {pid})"))?;
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let preload = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.ends_with("liblockstep.so"))
            .map(PathBuf::from)
            .context("the server has no liblockstep.so mapped")?;
        Ok(vec![exe, preload])
    }

    /// This node's server `pid` as an image records it: the node, its app
    /// address and region, the server's working directory and stdio files.
    fn origin_of(&self, pid: u64) -> Origin {
        let link = |what: &str| std::fs::read_link(format!("/proc/{pid}/{what}")).ok();
        let file = |fd: u32| link(&format!("fd/{fd}")).filter(|p| p.is_absolute() && p.is_file());
        Origin {
            node: self.region.node(),
            app: self.app,
            region: self.region.path().to_path_buf(),
            cwd: link("cwd"),
            stdio: (0..3).map(file).collect(),
        }
    }

    /// Where an image taken as `from` goes on this node: this node's last
    /// server's directory and stdio when it had one, else `from`'s paths
    /// with the node id swapped.
    fn here(&self, from: &Origin) -> Origin {
        let me = self.region.node();
        let last = self
            .last_server
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let swap = |p: &Option<PathBuf>| {
            p.as_deref()
                .and_then(|p| relocate::swap_node_id(p, from.node, me))
        };
        let (cwd, stdio) = match last {
            Some(o) if o.cwd.is_some() => (o.cwd, o.stdio),
            _ => (swap(&from.cwd), from.stdio.iter().map(swap).collect()),
        };
        Origin {
            node: me,
            app: self.app,
            region: self.region.path().to_path_buf(),
            cwd,
            stdio,
        }
    }

    /// The image in `dir` as this node restores it: `dir` itself when it
    /// was taken here, else a relocated copy beside the snapshots.
    fn for_this_node(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        let from: Origin = match std::fs::read(dir.join(ORIGIN_FILE)) {
            Ok(b) => serde_json::from_slice(&b).context("the image's origin.json is unreadable")?,
            // Taken before images said where: by this node.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(dir.to_path_buf()),
            Err(e) => return Err(e).context("cannot read the image's origin.json"),
        };
        if from.node == self.region.node() {
            return Ok(dir.to_path_buf());
        }
        let here = self.here(&from);
        // CRIU reopens them by path: a node whose server never ran here
        // may not have them yet.
        if let Some(cwd) = &here.cwd {
            std::fs::create_dir_all(cwd)
                .with_context(|| format!("cannot create {}", cwd.display()))?;
        }
        for f in here.stdio.iter().flatten() {
            if let Some(dir) = f.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(f)
                .with_context(|| format!("cannot create {}", f.display()))?;
        }
        let relocation = Relocation::between(&from, &here);
        let copy = self.work.join("relocated");
        let _ = std::fs::remove_dir_all(&copy);
        let changes = relocation.copy_image(dir, &copy)?;
        log::info!(
            "node {}'s image moved to node {}: {} paths and {} socket addresses rewritten ({:?})",
            from.node,
            here.node,
            changes.paths,
            changes.addrs,
            relocation
        );
        Ok(copy)
    }
}

impl ServerImage for Criu {
    fn take(&self, dir: &Path, upto: Position) -> anyhow::Result<Vec<(String, String)>> {
        let pid = self.region.preload_pid();
        if pid == 0 || !self.region.server_attached() {
            bail!("no server attached");
        }
        let a = self.region.apply();
        let (epoch, start_seq) = a.epoch();
        let state = StreamState {
            epoch,
            start_seq,
            pos: a.head(),
            applied: a.applied(),
            waiters: a.bell_waiters(),
        };
        if state.applied != upto.seq || state.pos != a.tail() {
            bail!(
                "the server is not at seq {} (applied {}, read to {} of {})",
                upto.seq,
                state.applied,
                state.pos,
                a.tail()
            );
        }
        let mut ids = Vec::new();
        for b in Self::binaries_of(pid)? {
            let id =
                build_id::of_file(&b).with_context(|| format!("cannot read {}", b.display()))?;
            ids.push((b.to_string_lossy().into_owned(), id));
        }
        let facts = ProcessFacts::of(pid)?;
        let log = self.work.join("criu-dump.log");
        let t = Instant::now();
        let pid_s = pid.to_string();
        let mut args: Vec<&std::ffi::OsStr> = vec!["dump".as_ref(), "-t".as_ref(), pid_s.as_ref()];
        args.extend(["-D".as_ref(), dir.as_os_str(), "--leave-running".as_ref()]);
        args.extend(COMMON.iter().map(std::ffi::OsStr::new));
        // A server that does not lead its session (started from a shell,
        // by a supervisor, by systemd): CRIU dumps it only as a shell job.
        if !facts.session_leader {
            args.push("--shell-job".as_ref());
        }
        run_criu(&self.criu, &args, &log, false)?;
        std::fs::write(dir.join(PROCESS_FILE), serde_json::to_vec(&facts)?)?;
        // A loop thread that had just finished its turn may park on the
        // doorbell (and count itself) while the dump runs: counted after
        // it, such a thread is never missing from the count (a restored
        // thread not yet parked counts itself again: one wake too many,
        // never one too few).
        let state = StreamState {
            waiters: state.waiters.max(a.bell_waiters()),
            ..state
        };
        std::fs::write(dir.join(STREAM_FILE), serde_json::to_vec(&state)?)?;
        std::fs::write(
            dir.join(ORIGIN_FILE),
            serde_json::to_vec(&self.origin_of(pid))?,
        )?;
        let (frozen, memdump) = dump_stats(dir).unwrap_or_default();
        log::info!(
            "image of the server (pid {pid}) at seq {}: {:.1} MB, dump {} ms, frozen {:.1} ms (memory {:.1} ms)",
            upto.seq,
            dir_bytes(dir) as f64 / 1e6,
            t.elapsed().as_millis(),
            frozen as f64 / 1000.0,
            memdump as f64 / 1000.0
        );
        Ok(ids)
    }

    fn restore(&self, dir: &Path, at: Position) -> anyhow::Result<()> {
        let state: StreamState = serde_json::from_slice(
            &std::fs::read(dir.join(STREAM_FILE)).context("the image has no stream state")?,
        )?;
        if state.applied != at.seq {
            bail!(
                "the image's stream is at seq {}, not {}",
                state.applied,
                at.seq
            );
        }
        let facts = ProcessFacts::read(dir)?;
        if let Some(why) = facts.pids_taken(pid_taken) {
            bail!("{why}");
        }
        // Before the server runs again: its preload compares the stream's
        // epoch with its own at once, and a different one would end every
        // replay connection.
        self.region.apply().resume(
            state.epoch,
            state.start_seq,
            state.pos,
            state.applied,
            state.waiters,
        );
        let pidfile = self.work.join("restored.pid");
        let _ = std::fs::remove_file(&pidfile);
        let log = self.work.join("criu-restore.log");
        let t = Instant::now();
        let images = self.for_this_node(dir)?;
        let mut args: Vec<&std::ffi::OsStr> = vec!["restore".as_ref(), "-D".as_ref()];
        args.extend([images.as_os_str(), "--restore-detached".as_ref()]);
        args.extend(COMMON.iter().map(std::ffi::OsStr::new));
        args.extend(["--pidfile".as_ref(), pidfile.as_os_str()]);
        // Dumped as a shell job: restored as one (CRIU wants the option
        // on both sides), in criu's own group and session.
        if !facts.session_leader {
            args.push("--shell-job".as_ref());
        }
        let restored = run_criu(&self.criu, &args, &log, !facts.session_leader);
        if images != dir {
            let _ = std::fs::remove_dir_all(&images);
        }
        let pid = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<u64>().ok());
        if let Err(e) = restored {
            // Kept apart: the next try's log would overwrite the one that
            // says why this one failed.
            let kept = self.work.join("criu-restore-failed.log");
            let e = match std::fs::rename(&log, &kept) {
                Ok(()) => anyhow::anyhow!(
                    "{}",
                    format!("{e:#}")
                        .replace(&log.display().to_string(), &kept.display().to_string())
                ),
                Err(_) => e,
            };
            // A restore that failed late may have left its process running
            // (it wrote the pid file): never leave an orphan server behind.
            if let Some(pid) = pid {
                log::warn!("the failed restore left pid {pid} behind: stopping it");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(e);
        }
        let pid = pid.context("criu wrote no pid file, or no pid in it")?;
        // The restored preload attached long ago: the follower learns its
        // pid here.
        self.region.set_preload_pid(pid);
        log::info!(
            "restored the server (pid {pid}) at seq {} in {} ms",
            at.seq,
            t.elapsed().as_millis()
        );
        Ok(())
    }

    fn stop_server(&self) -> anyhow::Result<()> {
        let pid = self.region.preload_pid();
        if pid == 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Ok(());
        }
        *self.last_server.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.origin_of(pid));
        // The pid word goes first: the heartbeat takes an attached pid
        // whose lock is gone for a crash, and told the replica so between
        // this kill and the end of the wait below (a fresh node installing
        // a snapshot then served nothing; seen in CI).
        self.region.set_preload_pid(0);
        // The server is the first process of its own PID namespace
        // (`lockstep launch-server`): killing it ends the namespace.
        let target = nix::unistd::Pid::from_raw(pid as i32);
        if let Err(e) = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL) {
            self.region.set_preload_pid(pid);
            return Err(e).with_context(|| format!("cannot stop the server (pid {pid})"));
        }
        let since = Instant::now();
        // Not this process's child: gone once /proc no longer shows it
        // running (a zombie waits for its parent, and holds nothing).
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
            !st.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        }) {
            if since.elapsed() > std::time::Duration::from_secs(10) {
                self.region.set_preload_pid(pid);
                bail!("the server (pid {pid}) did not stop within 10 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_that_cannot_snapshot_says_why_in_one_line() {
        use lockstep_common::region::RegionSpec;
        let spec = RegionSpec {
            cluster: "nocriu".into(),
            node: 1,
            ring_size: 1 << 20,
        };
        let region = Arc::new(Region::anonymous(&spec).unwrap());
        // Only this test reads the variable in this process.
        std::env::set_var(CRIU_ENV, "/nonexistent/criu");
        let e = Criu::find(
            region,
            &std::env::temp_dir(),
            "127.0.0.1:1".parse().unwrap(),
        )
        .err();
        std::env::remove_var(CRIU_ENV);
        let e = e.expect("no criu there");
        assert!(e.contains("/nonexistent/criu") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn a_process_is_a_shell_job_unless_it_leads_its_session() {
        // The command name may hold spaces and parentheses.
        // A server in a PID namespace of its own whose session leader is
        // outside it: 870 here, 0 (invisible) inside.
        let status = "Name:\tredis (a) b\nNSpid:\t900\t1\nNSsid:\t870\t0\nVmPeak:\t1 kB\n";
        let s = |here, innermost| Some(Sessions { here, innermost });
        assert_eq!(sessions_in_status(status), s(870, 0));
        assert_eq!(sessions_in_status("NSsid:\t3999\n"), s(3999, 3999));
        assert_eq!(sessions_in_status("Name:\tx\n"), None);
        assert_eq!(sessions_in_status("NSsid:\n"), None);
        assert_eq!(sessions_in_status("NSsid:\t12\tx\n"), None);
        // This test process: its facts, or (started by a container
        // runtime's exec, as CI's is, so its session leader is invisible)
        // the one-line refusal CRIU's dump would otherwise fail on.
        let me = std::process::id() as u64;
        let sid = nix::unistd::getsid(None).unwrap().as_raw() as u64;
        match ProcessFacts::of(me) {
            Ok(facts) => {
                assert_ne!(sid, 0, "an invisible session must be refused");
                assert!(!facts.own_pid_namespace, "the same namespace as itself");
                assert!(facts.tids.contains(&me), "{facts:?}");
                assert_eq!(facts.session_leader, sid == me);
            }
            Err(e) => {
                assert_eq!(sid, 0, "{e:#}");
                let e = format!("{e:#}");
                assert!(
                    e.contains("outside its PID namespace") && !e.contains('\n'),
                    "{e}"
                );
            }
        }
        // A child that leads a session of its own (setsid(1) execs in
        // place): visible wherever this test runs, and a session leader.
        let mut child = std::process::Command::new("setsid")
            .args(["sleep", "30"])
            .spawn()
            .expect("setsid(1) (util-linux) is needed");
        let pid = child.id() as u64;
        // setsid(1) has called setsid() once /proc shows sleep in its place.
        let facts = (0..500)
            .find_map(|_| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                if comm.trim() != "sleep" {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    return None;
                }
                ProcessFacts::of(pid).ok()
            })
            .expect("the child's facts");
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            facts.session_leader && !facts.own_pid_namespace,
            "{facts:?}"
        );
        assert_eq!(facts.tids, vec![pid]);
    }

    #[test]
    fn an_image_of_a_server_in_the_hosts_pid_namespace_needs_its_pids_free() {
        let facts = ProcessFacts {
            pid: 100,
            tids: vec![100, 101, 102],
            session_leader: false,
            own_pid_namespace: false,
        };
        assert_eq!(facts.pids_taken(|_| false), None);
        let why = facts.pids_taken(|t| t == 101).unwrap();
        assert!(
            why.contains("pid 101 is taken") && why.contains("lockstep run") && !why.contains('\n'),
            "{why}"
        );
        let why = facts.pids_taken(|_| true).unwrap();
        assert!(why.contains("pids 100, 101, 102 are taken"), "{why}");
        // In a PID namespace of its own (launch-server), or an image from
        // before process.json: the pids are free in the fresh namespace.
        let own = ProcessFacts {
            own_pid_namespace: true,
            ..facts
        };
        assert_eq!(own.pids_taken(|_| true), None);
        assert_eq!(ProcessFacts::default().pids_taken(|_| true), None);
        let d = std::env::temp_dir().join(format!("lockstep-criu-facts-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(ProcessFacts::read(&d).unwrap(), ProcessFacts::default());
        std::fs::write(d.join(PROCESS_FILE), serde_json::to_vec(&own).unwrap()).unwrap();
        assert_eq!(ProcessFacts::read(&d).unwrap(), own);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_frozen_time_is_read_from_a_stats_image() {
        let d = std::env::temp_dir().join(format!("lockstep-criu-stats-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        // A stats-dump CRIU 4.2.1 wrote: frozen 2731082 µs, memdump 3266 µs.
        let img: [u8; 50] = [
            0x40, 0x59, 0x10, 0x55, 0x06, 0x33, 0x09, 0x57, 0x26, 0, 0, 0, 0x0a, 0x24, 0x08, 0x9e,
            0x03, 0x10, 0xca, 0xd8, 0xa6, 0x01, 0x18, 0xc2, 0x19, 0x20, 0x90, 0x0e, 0x28, 0x99,
            0x08, 0x30, 0x00, 0x38, 0xf4, 0x06, 0x40, 0x00, 0x48, 0x00, 0x50, 0x08, 0x58, 0x08,
            0x60, 0x00, 0x68, 0x00, 0x70, 0x00,
        ];
        std::fs::write(d.join("stats-dump"), img).unwrap();
        assert_eq!(dump_stats(&d), Some((2_731_082, 3266)));
        std::fs::write(d.join("stats-dump"), &img[..20]).unwrap();
        assert_eq!(dump_stats(&d), None, "truncated");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
