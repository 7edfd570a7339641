//! Redis's own test suite — the `tests/` of the installed redis-server's
//! source, which `scripts/setup` fetches from Debian's source package into
//! `.cache/redis-suite/` — runs unit by unit against a plain redis-server
//! and, at the same time, through the leader of a 3-node lockstep cluster
//! (shm, the suite's commit mode). A test that passes plain must pass
//! through lockstep, a unit must not hang there, and after each unit every
//! replica's `DEBUG DIGEST` must agree. The units and the tests excluded
//! through lockstep (each with its reason) are in `redis_suite/units.toml`.
//!
//! The divergences the backups count (`divergence on connection …` in
//! their servers' logs) are reported per unit; the report (a table per
//! unit, as docs/development.md shows it) is printed and written to
//! `target/tmp/redis-suite-report.md`.

use lockstep_testkit::cluster;
#[path = "redis_suite/plan.rs"]
mod plan;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster::*;
use lockstep_common::config::REDIS_REPLICA_ARGS;
use lockstep_launcher::commands::redis_command;
use lockstep_launcher::process::{kill_and_reap, open_log, spawn_logged, Grouping};
use lockstep_testkit::poll::poll_until;
use plan::{parse_output, regressions, Plan, UnitRun};

/// How long the replicas may take to apply a unit's log and agree.
const SETTLE: Duration = Duration::from_secs(120);

/// The server's settings on both sides: a replica's, plus a unix socket
/// through which the harness reads each node's digest (a connection there
/// is no replicated client, so it does not give one node a client the
/// others lack, which would shift the client ids of the log's connections).
fn settings(data: &str) -> Vec<String> {
    ["--unixsocket".to_string(), format!("{data}/redis.sock")]
        .into_iter()
        .chain(REDIS_REPLICA_ARGS.iter().map(|a| a.to_string()))
        .collect()
}

#[test]
fn redis_test_suite_passes_through_lockstep_as_against_plain_redis() {
    let tree = suite_tree();
    let mut plan = Plan::parse(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/redis_suite/units.toml"),
        )
        .expect("read tests/redis_suite/units.toml"),
    )
    .unwrap_or_else(|e| panic!("tests/redis_suite/units.toml: {e}"));
    // LOCKSTEP_SUITE_UNITS=unit/a,unit/b runs just those (to chase one unit).
    if let Ok(only) = std::env::var("LOCKSTEP_SUITE_UNITS") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        plan.units.retain(|u| only.contains(&u.name.as_str()));
        assert!(
            !plan.units.is_empty(),
            "LOCKSTEP_SUITE_UNITS names no unit of units.toml"
        );
    }
    let timeout = Duration::from_secs(plan.unit_timeout_secs);

    let mut c = TestCluster::new(
        "redis-suite",
        Options {
            // The hyperloglog unit sends an 8 MB value Redis may read in
            // one turn: more than this ring's 8 MiB apply ring holds (the
            // backups take a turn's entries as the ring feeds them; they
            // stalled on it once, when a turn's space came free only at
            // its end).
            ring_size: "32MiB",
            ..Options::default()
        },
    );
    let command: Vec<String> = ["redis-server", "--port", "{port}", "--bind", "127.0.0.1"]
        .into_iter()
        .map(String::from)
        .chain(settings("{data}"))
        .chain(["--dir".into(), "{data}".into()])
        .collect();
    c.use_server_command(&command.iter().map(|a| a.as_str()).collect::<Vec<_>>());
    // Backups refuse their own clients before their servers see them (the
    // fixture's check that each server listens would otherwise be a client
    // of the backups only, and every later client id there would name
    // another client than on the leader); digests and client ids are read
    // through each node's unix socket, which every node gets alike.
    c.set_backup_clients("deny");
    c.start_all();
    let plain = PlainRedis::start(&c.dir.join("plain"));

    let plain_dir = workdir(&tree, &c.dir.join("suite-plain"));
    let lockstep_dir = workdir(&tree, &c.dir.join("suite-lockstep"));
    let started = Instant::now();
    let (plain_runs, lockstep) = std::thread::scope(|s| {
        let plain_side = s.spawn(|| {
            let mut runs = BTreeMap::new();
            for u in &plan.units {
                let (out, took) = run_unit(
                    &plain_dir,
                    plain.port,
                    &u.name,
                    &plan.tags,
                    &[],
                    timeout,
                    21111,
                );
                runs.insert(u.name.clone(), (parse_output(&u.name, &out), took));
            }
            runs
        });
        let lockstep = run_lockstep_side(&c, &plan, &lockstep_dir, timeout);
        (plain_side.join().expect("plain side"), lockstep)
    });
    let took = started.elapsed();

    let (problems, report) = judge(&plan, &plain_runs, &lockstep);
    let report = format!(
        "Redis's test suite ({}), tags {}, commit {}: {} s in all (both sides in parallel)\n\n{report}",
        tree.display(),
        plan.tags,
        commit_mode(),
        took.as_secs()
    );
    // The file has every divergence line; the output the first of each unit.
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("redis-suite-report.md");
    let _ = std::fs::write(
        &out,
        report.clone() + &divergence_lines(&lockstep, usize::MAX),
    );
    let report = report + &divergence_lines(&lockstep, 10);
    eprintln!("{report}\n(every divergence line in {})", out.display());
    assert!(
        problems.is_empty(),
        "Redis's test suite through lockstep:\n{}\n\n{report}",
        problems.join("\n")
    );
}

/// Each side's run of a unit and how long it took.
type Runs = BTreeMap<String, (UnitRun, Duration)>;

/// What went wrong through lockstep (tests passing plain and not through
/// lockstep, and the lockstep side's own problems), and the report: the
/// table per unit and when the client ids parted.
fn judge(plan: &Plan, plain_runs: &Runs, lockstep: &LockstepSide) -> (Vec<String>, String) {
    let mut problems = lockstep.problems.clone();
    let mut table = String::from(
        "| unit | passed plain | passed through lockstep | divergences counted | plain s | lockstep s |\n|---|---|---|---|---|---|\n",
    );
    for u in &plan.units {
        let (p, ptook) = &plain_runs[&u.name];
        let Some((l, ltook)) = lockstep.runs.get(&u.name) else {
            table.push_str(&format!(
                "| {} | {} | not run | | {} | |\n",
                u.name,
                p.passed(),
                ptook.as_secs()
            ));
            continue;
        };
        problems.extend(regressions(&u.name, p, l));
        let excluded = if u.exclude.is_empty() {
            String::new()
        } else {
            format!(" ({} excluded)", u.exclude.len())
        };
        table.push_str(&format!(
            "| {} | {}/{} | {}/{}{} | {} | {} | {} |\n",
            u.name,
            p.passed(),
            p.tests.len(),
            l.passed(),
            l.tests.len(),
            excluded,
            lockstep.divergences.get(&u.name).map_or(0, |d| d.len()),
            ptook.as_secs(),
            ltook.as_secs()
        ));
    }
    let report = format!(
        "{table}\nClient ids: {}\n",
        lockstep
            .ids_apart
            .as_deref()
            .unwrap_or("the same on every node after every unit")
    );
    (problems, report)
}

/// The divergence lines the backups logged, per unit, at most `most` of
/// each.
fn divergence_lines(lockstep: &LockstepSide, most: usize) -> String {
    let mut out = String::new();
    for (unit, lines) in &lockstep.divergences {
        out.push_str(&format!(
            "\n{unit}: {} divergent entries counted\n",
            lines.len()
        ));
        for l in lines.iter().take(most) {
            out.push_str(&format!("  {l}\n"));
        }
    }
    out
}

/// What the lockstep side found.
#[derive(Default)]
struct LockstepSide {
    runs: Runs,
    /// Each unit's divergence lines from the backups' server logs.
    divergences: BTreeMap<String, Vec<String>>,
    /// Hangs, replicas that differ, a cluster that stopped applying.
    problems: Vec<String>,
    /// The first unit after which the nodes' client ids differ.
    ids_apart: Option<String>,
}

/// Runs every unit through the cluster's leader; after each, waits until
/// every node applied it, compares the digests and collects the backups'
/// divergence lines. Stops at a unit that hangs (the cluster may be
/// wedged: what comes after would say nothing).
fn run_lockstep_side(c: &TestCluster, plan: &Plan, dir: &Path, timeout: Duration) -> LockstepSide {
    let mut side = LockstepSide::default();
    let logs: Vec<PathBuf> = (2..=c.nodes.len())
        .map(|id| c.dir.join(format!("server-{id}.log")))
        .collect();
    let mut read_to: Vec<u64> = logs.iter().map(|p| file_len(p)).collect();
    for u in &plan.units {
        let skips: Vec<&str> = u.exclude.iter().map(|x| x.test.as_str()).collect();
        let (out, took) = run_unit(
            dir,
            c.app(1).port(),
            &u.name,
            &plan.tags,
            &skips,
            timeout,
            23111,
        );
        let run = parse_output(&u.name, &out);
        let hung = took >= timeout;
        side.runs.insert(u.name.clone(), (run, took));
        if hung {
            side.problems.push(format!(
                "{}: hung through lockstep (stopped after {} s)",
                u.name,
                took.as_secs()
            ));
            break;
        }
        if !converged(c, SETTLE) {
            let status: Vec<String> = (1..=c.nodes.len() as u64)
                .map(|id| match c.status(id) {
                    Ok(s) => format!(
                        "node {id}: {} persisted {} applied {}",
                        s.role, s.persisted, s.applied
                    ),
                    Err(e) => format!("node {id}: {e}"),
                })
                .collect();
            side.problems.push(format!(
                "{}: the backups did not apply the unit's log within {SETTLE:?}\n{}\n{}",
                u.name,
                status.join("\n"),
                c.logs()
            ));
            break;
        }
        if let Some(d) = differing_digests(c) {
            side.problems.push(format!("{}: {d}", u.name));
        }
        let ids = client_ids(c);
        if ids.iter().any(|i| *i != ids[0]) && side.ids_apart.is_none() {
            side.ids_apart = Some(format!("{}: next client ids {ids:?}", u.name));
        }
        let mut lines = Vec::new();
        for (i, p) in logs.iter().enumerate() {
            let new = read_from(p, &mut read_to[i]);
            lines.extend(
                new.lines()
                    .filter(|l| l.contains("divergence on connection"))
                    .map(|l| {
                        format!(
                            "node {}: {}",
                            i + 2,
                            l.split_once("divergence ").map_or(l, |(_, r)| r)
                        )
                    }),
            );
        }
        if !lines.is_empty() {
            side.divergences.insert(u.name.clone(), lines);
        }
    }
    side
}

/// The unpacked suite for the installed redis-server's version; fails
/// naming `scripts/setup` when it is missing.
fn suite_tree() -> PathBuf {
    let out = Command::new("redis-server")
        .arg("--version")
        .output()
        .expect("redis-server not found on PATH: run scripts/setup");
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or_else(|| panic!("redis-server --version printed no version: {text}"));
    let tree =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(".cache/redis-suite/redis-{version}"));
    assert!(
        tree.join("runtest").exists(),
        "Redis {version}'s test suite is missing at {}: run scripts/setup (it fetches Debian's source package)",
        tree.display()
    );
    let tclsh = ["tclsh8.5", "tclsh8.6", "tclsh8.7"].iter().any(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        tclsh,
        "no tclsh 8.5+ on PATH (runtest needs it): run scripts/setup (package tcl)"
    );
    tree
}

/// A private copy of the suite for one side (runtest cleans and writes
/// `tests/tmp`), with `src/` holding the installed programs the tests run.
fn workdir(tree: &Path, dest: &Path) -> PathBuf {
    std::fs::create_dir_all(dest.join("src")).expect("suite dir");
    let ok = Command::new("cp")
        .arg("-a")
        .arg(tree.join("tests"))
        .arg(tree.join("runtest"))
        .arg(dest)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "cannot copy the suite from {}", tree.display());
    for prog in ["redis-server", "redis-cli", "redis-benchmark"] {
        if let Ok(o) = Command::new("sh")
            .args(["-c", &format!("command -v {prog}")])
            .output()
        {
            let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if !path.is_empty() {
                let _ = std::os::unix::fs::symlink(path, dest.join("src").join(prog));
            }
        }
    }
    dest.to_path_buf()
}

/// Runs one unit against the server on `port`; returns its output and how
/// long it ran (`timeout` when it was stopped: it hung).
fn run_unit(
    dir: &Path,
    port: u16,
    unit: &str,
    tags: &str,
    skips: &[&str],
    timeout: Duration,
    baseport: u16,
) -> (String, Duration) {
    let out_path = dir.join(format!("{}.out", unit.replace('/', "_")));
    let log = open_log(&out_path, false).expect("runtest output file");
    let mut cmd = Command::new("./runtest");
    cmd.current_dir(dir)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--single",
            unit,
        ])
        .args([
            "--durable",
            "--tags",
            tags,
            "--baseport",
            &baseport.to_string(),
        ]);
    for s in skips {
        cmd.args(["--skiptest", s]);
    }
    let started = Instant::now();
    let mut child = spawn_logged(&mut cmd, log, Grouping::OwnGroup)
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut took = timeout;
    while started.elapsed() < timeout {
        if child.try_wait().ok().flatten().is_some() {
            took = started.elapsed();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // runtest's test client is a child of its own: stop the whole group.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
    (std::fs::read_to_string(&out_path).unwrap_or_default(), took)
}

/// Whether every node applied everything the leader persisted, within
/// `limit`.
fn converged(c: &TestCluster, limit: Duration) -> bool {
    poll_until(limit, Duration::from_millis(100), || {
        let l = c.status(1)?;
        let behind = (2..=c.nodes.len() as u64).any(|id| {
            c.status(id)
                .map(|s| s.applied < l.persisted || s.persisted < l.persisted)
                .unwrap_or(true)
        });
        if behind {
            Err(String::new())
        } else {
            Ok(())
        }
    })
    .is_ok()
}

/// None when every node's digest comes to equal the leader's (the
/// leader's timers go on expiring keys, the backups follow a moment
/// later); else which node differs.
fn differing_digests(c: &TestCluster) -> Option<String> {
    let digest = |id: u64| unix_command(&sock(c, id), &["DEBUG", "DIGEST"]);
    let start = Instant::now();
    loop {
        let leader = digest(1);
        let differing: Vec<String> = (2..=c.nodes.len() as u64)
            .filter_map(|id| {
                let d = digest(id);
                (d != leader).then(|| {
                    format!(
                        "node {id}'s data differ from the leader's (DEBUG DIGEST {d} != {leader})"
                    )
                })
            })
            .collect();
        if differing.is_empty() {
            return None;
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Some(differing.join("; "));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The one-line reply to `args` through a server's unix socket (an error
/// as text).
fn unix_command(sock: &Path, args: &[&str]) -> String {
    let ask = || -> std::io::Result<String> {
        let mut s = UnixStream::connect(sock)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes())?;
        let mut got = Vec::new();
        let mut b = [0u8; 128];
        while !got.ends_with(b"\r\n") {
            let n = s.read(&mut b)?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&b[..n]);
        }
        Ok(String::from_utf8_lossy(&got).trim().to_string())
    };
    ask().unwrap_or_else(|e| format!("(no reply from {}: {e})", sock.display()))
}

/// Node `id`'s unix socket.
fn sock(c: &TestCluster, id: u64) -> PathBuf {
    c.dir.join(format!("server-{id}/redis.sock"))
}

/// Whether the replicas number their clients alike: each node gets one
/// unix-socket client now, so its id is the same everywhere unless a
/// node created clients the others did not (see the report).
fn client_ids(c: &TestCluster) -> Vec<String> {
    (1..=c.nodes.len() as u64)
        .map(|id| unix_command(&sock(c, id), &["CLIENT", "ID"]))
        .collect()
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// What `p` gained since `*at`; moves `*at` to its end.
fn read_from(p: &Path, at: &mut u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(p) {
        if f.seek(SeekFrom::Start(*at)).is_ok() {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            *at += bytes.len() as u64;
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    text
}

/// A plain redis-server (no preload) with the cluster's settings, stopped
/// when dropped.
struct PlainRedis {
    port: u16,
    child: Option<Child>,
}

impl PlainRedis {
    fn start(dir: &Path) -> PlainRedis {
        std::fs::create_dir_all(dir).expect("plain server dir");
        let port = free_port();
        let args = settings(&dir.display().to_string());
        let args: Vec<&str> = args.iter().map(|a| a.as_str()).collect();
        let mut cmd = redis_command(port, dir, &args);
        let log = open_log(&dir.join("server.log"), false).expect("plain server log");
        // In a session of its own, as each runtest is: under Linux's
        // autogroup scheduling the plain side's work then does not come out
        // of the CPU share of the cluster's followers (which starved them:
        // a unit ran 4x slower through lockstep than alone).
        let child = spawn_logged(cmd.stdin(Stdio::null()), log, Grouping::OwnSession)
            .expect("start redis-server");
        let server = PlainRedis {
            port,
            child: Some(child),
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        poll_until(Duration::from_secs(30), Duration::from_millis(50), || {
            TcpStream::connect(addr)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .expect("plain redis-server listening");
        server
    }
}

impl Drop for PlainRedis {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}
