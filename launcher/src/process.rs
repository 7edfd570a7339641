//! Launching the processes of a local cluster (followers, servers under the
//! preload, ZooKeeper) with their output in log files, stopping them, and
//! looking at what they left behind.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use nix::sys::signal::Signal;

/// How a launched process is tied to the one that launched it.
///
/// Both kinds but `Inherit` start a session of their own, and so (with
/// Linux's autogroup scheduling, on by default) their own share of the
/// CPU: a follower that shared a session with busy processes went
/// unscheduled for seconds at a time (two busy loops beside a 3-node
/// cluster on 2 cores: SET at one client averaged 88 requests/s, 4,300
/// with the followers in a session of their own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grouping {
    /// In the launcher's session and process group, like any child (the
    /// owner kills it when dropped; a terminal's Ctrl-C reaches it).
    Inherit,
    /// In a session of its own; the owner kills it when dropped.
    OwnSession,
    /// In a session of its own (a terminal's Ctrl-C reaches only the
    /// launcher, and the group can be signalled whole), sent SIGTERM when
    /// the spawning thread ends, also by SIGKILL: no orphans.
    OwnGroup,
}

/// Opens the log file of a launched process: appended to when `append` (a
/// restarted process keeps its predecessor's last words), else new.
pub fn open_log(path: &Path, append: bool) -> io::Result<File> {
    if append {
        OpenOptions::new().create(true).append(true).open(path)
    } else {
        File::create(path)
    }
}

/// Spawns `cmd` with no stdin and stdout and stderr into `log`.
pub fn spawn_logged(cmd: &mut Command, log: File, grouping: Grouping) -> io::Result<Child> {
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if grouping != Grouping::Inherit {
        let orphan_signal = grouping == Grouping::OwnGroup;
        // SAFETY: the closure runs in the forked child before exec and only
        // makes the setsid(2) and prctl(2) system calls, which are
        // async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                // A new session is also a new process group, led by the child.
                nix::unistd::setsid()?;
                if orphan_signal {
                    // Linux sends it when the spawning *thread* exits: keep
                    // the process on a thread that outlives it.
                    nix::sys::prctl::set_pdeathsig(Some(Signal::SIGTERM))?;
                }
                Ok(())
            });
        }
    }
    cmd.spawn()
}

/// The session process `pid` is in (field 6 of `/proc/PID/stat`), if it
/// lives.
pub fn session_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.split_whitespace().nth(3)?.parse().ok()
}

/// `/proc/PID/stat` of process `pid` from field 3 (its state) on, if it
/// lives (see [`after_name`]).
pub fn stat_fields(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    after_name(&stat).map(str::to_string)
}

/// A `/proc/PID/stat` line from field 3 on: the command name (field 2)
/// may hold spaces and parentheses, so fields count after its last `)`.
pub fn after_name(stat: &str) -> Option<&str> {
    stat.get(stat.rfind(')')? + 1..).map(str::trim_start)
}

/// SIGKILLs the child in `slot`, if any, and reaps it.
pub fn kill_and_reap(slot: &mut Option<Child>) {
    if let Some(mut c) = slot.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The first child of process `pid` (a server launcher's: the server), if
/// any.
pub fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// SIGKILLs the server a launcher in `slot` runs (`lockstep
/// launch-server`: the server is in a session of its own, out of reach of
/// the launcher's death), then the launcher, and reaps it.
pub fn kill_launched_and_reap(slot: &mut Option<Child>) {
    if let Some(server) = slot.as_ref().and_then(|c| first_child(c.id())) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(server as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    kill_and_reap(slot);
}

/// Whether `addr` can be bound now.
pub fn port_free(addr: SocketAddr) -> bool {
    TcpListener::bind(addr).is_ok()
}

/// The last non-empty line of a log file (why a child stopped, usually).
pub fn last_line(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

/// The last `n` lines of a log file (none when it cannot be read).
pub fn tail_lines(path: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// Every `*.log` directly in `dirs`, in path order, as a `--- path` line
/// and its last `n` lines: what a failure message shows of a cluster.
pub fn log_tails(dirs: &[&Path], n: usize) -> String {
    let mut paths: Vec<std::path::PathBuf> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    paths.sort();
    let mut out = String::new();
    for p in paths {
        out.push_str(&format!("--- {}\n", p.display()));
        for l in tail_lines(&p, n) {
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

/// Live processes (other than this one) whose command line or environment
/// contains `needle`, as "pid: cmdline". Zombies have neither, so they do
/// not count.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let read = |f: &str| std::fs::read(e.path().join(f)).unwrap_or_default();
        let cmdline = read("cmdline");
        let environ = read("environ");
        let hit = |b: &[u8]| b.windows(needle.len()).any(|w| w == needle.as_bytes());
        if !needle.is_empty() && (hit(&cmdline) || hit(&environ)) {
            let cmd: Vec<String> = cmdline
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).to_string())
                .collect();
            out.push(format!("{pid}: {}", cmd.join(" ").trim()));
        }
    }
    out
}

/// A flag raised by SIGINT, SIGTERM or SIGHUP: a launcher polls it to stop
/// what it started and return instead of dying with its children running.
pub fn stop_on_signals() -> io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tails_show_the_last_lines_of_each_log_in_path_order() {
        let d = std::env::temp_dir().join(format!("lockstep-log-tails-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("zk")).unwrap();
        std::fs::write(d.join("b.log"), "1\n2\n3\n").unwrap();
        std::fs::write(d.join("a.log"), "x\n").unwrap();
        std::fs::write(d.join("notes.txt"), "not a log\n").unwrap();
        std::fs::write(d.join("zk").join("z.log"), "z\n").unwrap();
        assert_eq!(tail_lines(&d.join("b.log"), 2), ["2", "3"]);
        assert!(tail_lines(&d.join("missing.log"), 2).is_empty());
        let shown = log_tails(&[&d, &d.join("zk")], 2);
        let want = format!(
            "--- {a}\nx\n--- {b}\n2\n3\n--- {z}\nz\n",
            a = d.join("a.log").display(),
            b = d.join("b.log").display(),
            z = d.join("zk").join("z.log").display()
        );
        assert_eq!(shown, want);
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn sleeper(grouping: Grouping) -> Child {
        let log = dev_null();
        spawn_logged(Command::new("sleep").arg("30"), log, grouping).expect("spawn sleep")
    }

    fn dev_null() -> File {
        OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null")
    }

    #[test]
    fn own_kinds_lead_a_session_of_their_own_and_inherit_shares_ours() {
        let session = |pid: u32| session_of(pid).expect("session of a live process");
        let ours = session(std::process::id());
        for grouping in [Grouping::OwnSession, Grouping::OwnGroup] {
            let mut c = Some(sleeper(grouping));
            let pid = c.as_ref().unwrap().id();
            // pre_exec ran before exec: the session exists once spawn returned.
            assert_eq!(session(pid), pid, "{grouping:?} leads its own session");
            kill_and_reap(&mut c);
        }
        let mut c = Some(sleeper(Grouping::Inherit));
        assert_eq!(
            session(c.as_ref().unwrap().id()),
            ours,
            "Inherit stays in ours"
        );
        kill_and_reap(&mut c);
    }
}
