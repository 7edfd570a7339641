//! `lockstep run --config C --node N -- SERVER…`: one node's server,
//! started as a person (or a systemd unit, or `lockstep up`) should start
//! it, with nothing left to get wrong by hand.
//!
//! What it does that a bare `LD_PRELOAD=… redis-server` does not:
//! - the preload and the config by absolute path (`ld.so` silently ignores
//!   a relative `LD_PRELOAD` that does not resolve from the server's
//!   directory, and a plain, unreplicated server then answers);
//! - the node id checked against the config, and the node's app address
//!   against this host (free to bind, an address of this host) before the
//!   server starts;
//! - it waits for the node's follower (its region, owned by a running
//!   follower whose heartbeat moves), so the server never runs ahead of it,
//!   and until the node knows when the cluster's log began, which it hands
//!   to the server (`LOCKSTEP_ORIGIN_US`: its start-up is dated then, on
//!   every replica);
//! - the server in a session and PID namespace of its own (see `launch`):
//!   what CRIU needs for the node's snapshots, whoever started `run`;
//! - it stays in the foreground, passes SIGTERM/SIGINT/SIGHUP on, says once
//!   when the server attached, and exits as the server did — with the
//!   server's last lines when it failed, since its output goes to its log.

use std::ffi::OsString;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lockstep_common::region::RegionError;
use lockstep_common::{Config, Region};
use lockstep_launcher::binaries::Binaries;

/// How often the region and the app address are looked at.
const LOOK: Duration = Duration::from_millis(100);
/// How long an app address in use may take to come free (a server of this
/// node that was just stopped closes its listener as it exits).
const PORT_GRACE: Duration = Duration::from_secs(5);

/// What `lockstep run` was asked for.
pub struct RunArgs {
    /// The cluster config.
    pub config: PathBuf,
    /// The node whose server this is.
    pub node: u64,
    /// The server's log (default `<data_dir>/logs/server-<node>.log`).
    pub log: Option<PathBuf>,
    /// Start at once, without waiting for the follower (the preload then
    /// attaches when the follower comes).
    pub no_wait: bool,
    /// The server command.
    pub argv: Vec<OsString>,
}

/// Runs the server; returns its exit code.
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let RunArgs {
        config,
        node,
        log,
        no_wait,
        argv,
    } = args;
    let config_path = std::fs::canonicalize(&config)
        .with_context(|| format!("cannot read config {}", config.display()))?;
    let cfg = Config::load(&config_path).map_err(|e| anyhow::anyhow!("{}", e.0))?;
    let app = cfg.node(node).map_err(|e| anyhow::anyhow!("{}", e.0))?.app;
    let argv = if argv.is_empty() {
        config_server(&cfg, node)?
    } else {
        argv
    };
    let Some(program) = argv.first() else {
        bail!("no server command after --");
    };
    if find_program(Path::new(program)).is_none() {
        bail!(
            "server program {:?} not found (not a file, nor in PATH)",
            program
        );
    }
    let bins = Binaries::beside_current_exe()?;
    let log = match log {
        Some(l) => l,
        None => cfg.data_dir.join("logs").join(format!("server-{node}.log")),
    };
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let log = absolute(&log)?;
    app_address_usable(node, app)?;
    let origin = if no_wait {
        lockstep_launcher::commands::region_origin(&cfg, node)
    } else {
        wait_for_follower(&cfg, node)?;
        let origin = Some(wait_for_origin(&cfg, node)?);
        // Meanwhile the follower may have restored the node's server
        // from a snapshot: it has the port then.
        app_address_usable(node, app)?;
        origin
    };
    let mut env = vec![
        format!("LD_PRELOAD={}", bins.preload.display()),
        format!("LOCKSTEP_CONFIG={}", config_path.display()),
        format!("LOCKSTEP_NODE={node}"),
    ];
    match origin {
        Some(us) => env.push(format!("LOCKSTEP_ORIGIN_US={us}")),
        None => eprintln!(
            "lockstep run: node {node}'s follower does not know when the cluster's log began: the server's start-up clock reads 2000-01-01, as on every replica started so"
        ),
    }
    eprintln!(
        "lockstep run: node {node}'s server {} (app {app}), its output in {}",
        shell_words(&argv),
        log.display()
    );
    let spec = cfg.region_spec(node);
    let size = std::fs::metadata(&log).map_or(0, |m| m.len());
    std::thread::spawn(move || say_when_attached(spec, node));
    let code = crate::launch::launch(&log, &env, &argv)?;
    if code != 0 {
        eprintln!(
            "lockstep run: node {node}'s server exited with {code}; the end of {}:",
            log.display()
        );
        for line in log_tail(&log, size, 10) {
            eprintln!("  {line}");
        }
    }
    Ok(code)
}

/// The config's `server` command for `node`, in a fresh data directory
/// (the follower rebuilds the server's state from the log: whatever an
/// earlier server left there would be applied twice), as `lockstep up`
/// starts it.
fn config_server(cfg: &Config, node: u64) -> anyhow::Result<Vec<OsString>> {
    let Some(template) = &cfg.server else {
        bail!("no server command after -- and no `server` in the config");
    };
    let args = crate::up::server_command(template, cfg, node)?;
    let data = cfg.data_dir.join(format!("server-{node}"));
    if data.exists() {
        std::fs::remove_dir_all(&data)
            .with_context(|| format!("cannot empty {}", data.display()))?;
    }
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
    Ok(args.into_iter().map(OsString::from).collect())
}

/// The app address can be listened on here: free (or freed within
/// [`PORT_GRACE`]) and an address of this host.
fn app_address_usable(node: u64, app: SocketAddr) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        match TcpListener::bind(app) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::AddrInUse && start.elapsed() < PORT_GRACE => {
                std::thread::sleep(LOOK);
            }
            Err(e) if e.kind() == ErrorKind::AddrInUse => bail!(
                "node {node}'s app address {app} is in use: is its server already running (or another program on that port)?"
            ),
            Err(e) if e.kind() == ErrorKind::AddrNotAvailable => bail!(
                "node {node}'s app address {app} is not an address of this host: is this host node {node}?"
            ),
            Err(e) => bail!("node {node}'s app address {app}: {e}"),
        }
    }
}

/// Waits until node `node`'s follower runs and owns its region (its
/// heartbeat moves): one line says so while it does not.
fn wait_for_follower(cfg: &Config, node: u64) -> anyhow::Result<()> {
    let spec = cfg.region_spec(node);
    let path = spec.default_path();
    let mut said = false;
    let mut before = None;
    loop {
        let ready = match Region::open(&path, &spec) {
            Ok(r) if r.owner_alive() => {
                let now = r.heartbeat();
                before.replace(now).is_some_and(|b| b != now)
            }
            Ok(_) => false,
            // Not there yet, or its follower is creating it just now.
            Err(RegionError::Missing(_) | RegionError::Unfinished { .. }) => false,
            Err(e) => bail!("node {node}'s region file {}: {e}", path.display()),
        };
        if ready {
            return Ok(());
        }
        if !said {
            said = true;
            eprintln!(
                "lockstep run: waiting for node {node}'s follower (region file {}): start it with `lockstep-follower --config … --node {node}`",
                path.display()
            );
        }
        std::thread::sleep(LOOK);
    }
}

/// Waits until node `node`'s follower knows when the cluster's log began
/// (a fresh cluster: once a majority of followers chose the first
/// leader; a node rebuilt from scratch: once it fetched the log's first
/// entry or a snapshot), which its server's clocks read until its first
/// turn; one line says so while it does not.
fn wait_for_origin(cfg: &Config, node: u64) -> anyhow::Result<u64> {
    let mut said = false;
    let spec = cfg.region_spec(node);
    loop {
        match Region::open(&spec.default_path(), &spec) {
            Ok(r) if r.origin_us() != 0 => return Ok(r.origin_us()),
            Ok(r) if r.owner_alive() => {}
            _ => bail!("node {node}'s follower stopped while this waited for it"),
        }
        if !said {
            said = true;
            eprintln!(
                "lockstep run: waiting for node {node}'s cluster to choose its first leader (the time its log begins dates the server's start): start a majority of its followers"
            );
        }
        std::thread::sleep(LOOK);
    }
}

/// Says once that the server attached to its region (its pid is there).
fn say_when_attached(spec: lockstep_common::RegionSpec, node: u64) {
    let path = spec.default_path();
    for _ in 0..600 {
        std::thread::sleep(LOOK);
        let Ok(r) = Region::open(&path, &spec) else {
            continue;
        };
        let pid = r.preload_pid();
        if pid != 0 {
            eprintln!(
                "lockstep run: node {node}'s server (pid {pid}) is attached to its region, as {:?} of view {}",
                r.role(),
                r.view()
            );
            return;
        }
    }
}

/// `program` as a path, or found in `PATH`.
fn find_program(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.is_file().then(|| program.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()
            .context("cannot read the current directory")?
            .join(p))
    }
}

/// The last `n` lines `log` got past byte `from`.
fn log_tail(log: &Path, from: u64, n: usize) -> Vec<String> {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(from as usize..).unwrap_or(&[]));
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines[lines.len().saturating_sub(n)..].to_vec()
}

/// The command as a shell would read it (see `up::shell_words`).
fn shell_words(argv: &[OsString]) -> String {
    let words: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    crate::up::shell_words(&words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_by_path_or_in_path() {
        assert!(find_program(Path::new("sh")).is_some());
        assert!(find_program(Path::new("/bin/sh")).is_some());
        assert!(find_program(Path::new("no-such-program-here")).is_none());
        assert!(find_program(Path::new("./no/such")).is_none());
    }

    #[test]
    fn a_port_in_use_is_reported_as_such() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // Held for the whole call: reported once the grace period is over.
        let e = app_address_usable(2, addr).unwrap_err().to_string();
        assert!(e.contains("is in use"), "{e}");
        drop(l);
        assert!(app_address_usable(2, addr).is_ok());
    }
}
