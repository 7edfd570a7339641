//! Starting a node's server in a PID namespace of its own, and standing in
//! for a server that a follower restored from a snapshot.
//!
//! A process image (see the follower's `snapshot` module) is restored with
//! the pids it was taken with; only a fresh PID namespace guarantees they
//! are free. So `lockstep launch-server` unshares the PID namespace and
//! starts itself again as the namespace's first process (`--inner`), which
//! becomes a session leader (CRIU dumps a session whole), points its stdio
//! at the server's log, closes every other fd (nothing of the launcher's
//! may end up in the image) and execs the server: the server is pid 1 of
//! its namespace. The outer launcher stays: it is what `lockstep up` and
//! the tests hold as "the server" — it passes SIGTERM, SIGINT and SIGHUP
//! on and exits as the server did.
//!
//! No parent-death signal is set: CRIU restores it, and a restored server
//! would get it the moment `criu restore` exits. Whoever SIGKILLs a
//! launcher kills the server by its pid too (the region names it).
//!
//! `lockstep watch-server --pid P` is the launcher's stand-in for a server
//! that a follower restored (not our child): it passes the same signals on
//! and exits when the server is gone.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The signals a launcher or watcher passes on to its server.
const PASSED_ON: [i32; 3] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGHUP,
];

/// How often a launcher or watcher looks at its server and its signals.
const LOOK: Duration = Duration::from_millis(20);

/// The last signal of [`PASSED_ON`] received (0: none since the last look).
fn signal_flag() -> anyhow::Result<Arc<AtomicUsize>> {
    let last = Arc::new(AtomicUsize::new(0));
    for sig in PASSED_ON {
        signal_hook::flag::register_usize(sig, last.clone(), sig as usize)
            .context("cannot install signal handlers")?;
    }
    Ok(last)
}

/// Passes a signal received since the last call on to `pid`.
fn pass_on(last: &AtomicUsize, pid: Pid) {
    let sig = last.swap(0, Ordering::Relaxed);
    if let Ok(sig) = Signal::try_from(sig as i32) {
        let _ = kill(pid, sig);
    }
}

/// `lockstep launch-server --log LOG [--env K=V]… -- PROGRAM ARGS…`: runs
/// the server in a new PID namespace (see the module doc) and exits as it
/// did.
pub fn launch(log: &Path, env: &[String], argv: &[OsString]) -> anyhow::Result<i32> {
    if argv.is_empty() {
        bail!("no server command after --");
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID)
        .context("cannot create a PID namespace for the server (root needed)")?;
    let me = std::env::current_exe().context("cannot find the lockstep executable")?;
    let mut inner = Command::new(me);
    inner
        .arg("launch-server")
        .arg("--inner")
        .arg("--log")
        .arg(log);
    for e in env {
        inner.arg("--env").arg(e);
    }
    inner.arg("--").args(argv).stdin(Stdio::null());
    let last = signal_flag()?;
    let mut child = inner
        .spawn()
        .with_context(|| format!("cannot start {:?}", argv[0]))?;
    let pid = Pid::from_raw(child.id() as i32);
    loop {
        pass_on(&last, pid);
        if let Some(status) = child.try_wait()? {
            use std::os::unix::process::ExitStatusExt;
            return Ok(status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
        }
        std::thread::sleep(LOOK);
    }
}

/// The namespace's first process: session leader, stdio on the log, no
/// other fd, then the server (see the module doc). Returns only on error.
pub fn inner(log: &Path, env: &[String], argv: &[OsString]) -> anyhow::Error {
    let err = (|| -> anyhow::Result<std::io::Error> {
        nix::unistd::setsid().context("setsid")?;
        close_inherited_fds();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        // Stdio as plain files (the log, /dev/null): what a process image
        // can hold; pipes or a terminal of the launcher's could not be
        // restored without it.
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        for e in env {
            let (k, v) = e.split_once('=').context("--env wants KEY=VALUE")?;
            cmd.env(k, v);
        }
        Ok(cmd.exec())
    })();
    match err {
        Ok(e) => anyhow::Error::new(e).context(format!("cannot run {:?}", argv[0])),
        Err(e) => e,
    }
}

/// Closes every fd but stdio (std's own fds are close-on-exec; inherited
/// ones, e.g. a test harness's, need not be).
fn close_inherited_fds() {
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // The directory's own fd is among them: closed too, harmlessly.
        let _ = nix::unistd::close(fd);
    }
}

/// Whether process `pid` still runs (a zombie does not).
pub fn running(pid: u32) -> bool {
    lockstep_launcher::process::stat_fields(pid).is_some_and(|f| !f.starts_with(['Z', 'X']))
}

/// `lockstep watch-server --pid P`: passes signals on to `pid` and returns
/// once it is gone.
pub fn watch(pid: u32) -> anyhow::Result<i32> {
    let last = signal_flag()?;
    let target = Pid::from_raw(pid as i32);
    while running(pid) {
        pass_on(&last, target);
        std::thread::sleep(LOOK);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_a_reaped_child_does_not() {
        assert!(running(std::process::id()));
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!running(pid));
    }
}
