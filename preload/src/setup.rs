//! Process-wide state: configuration from the environment (and the key
//! of the cluster's entropy stream, derived from it), attaching to the
//! node's region, the refusal to run unreplicated, and the fork flag.
//!
//! Nothing happens at load time beyond resolving symbols (see `hooks`).
//! The environment is read at the first `listen` or `accept`; the region
//! is attached at the first `listen`/`accept` on the app address. Start
//! order does not matter: a region that is not there yet at `listen` (its
//! follower starts later, or the file is one a dead follower left behind)
//! is waited for by a small thread that looks again every
//! [`ATTACH_RETRY`] and attaches as soon as a running follower owns it
//! and is past its start-up (its heartbeat moves),
//! while the server starts and runs its event loop (clients it accepts
//! meanwhile are refused: nothing could replicate them). Any other failure
//! to attach, or an unusable config, stops the server with one line on
//! stderr at its first accept rather than serving clients unreplicated.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockstep_common::config::TransportKind;
use lockstep_common::region::{self, RegionError};
use lockstep_common::{Config, Region};
use once_cell::sync::OnceCell;

use crate::leader::engine::Engine;
use crate::sys;
use crate::sys::published::Published;

/// Set in a child after `fork`: every hook passes straight through.
static INERT: AtomicBool = AtomicBool::new(false);

const MODE_UNKNOWN: u8 = 0;
/// `LOCKSTEP_CONFIG` is not set: a plain pass-through library.
const MODE_OFF: u8 = 1;
/// Replication impossible and `LOCKSTEP_ALLOW_UNREPLICATED=1`.
const MODE_UNREPLICATED: u8 = 2;
/// Attached to the region.
const MODE_ATTACHED: u8 = 3;

static MODE: AtomicU8 = AtomicU8::new(MODE_UNKNOWN);

/// Who this process is, from `LOCKSTEP_CONFIG` and `LOCKSTEP_NODE`.
#[derive(Debug)]
pub struct Settings {
    /// The cluster config.
    pub config: Config,
    /// This node's id.
    pub me: u64,
    /// This node's app address.
    pub app: SocketAddr,
}

static SETTINGS: OnceCell<Option<Result<Settings, String>>> = OnceCell::new();
static ENTROPY_SEED: OnceCell<Option<[u8; 32]>> = OnceCell::new();
static ENGINE: Published<Engine> = Published::new();
static ATTACHING: Mutex<()> = Mutex::new(());
/// Set once a thread waits for the region (see [`attach_when_ready`]).
static WAITING: AtomicBool = AtomicBool::new(false);

/// How often a server started before its region looks for it again.
pub const ATTACH_RETRY: Duration = Duration::from_millis(100);

/// Why this process is not attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unattached {
    /// The region is not ready yet (no file, or no running follower owns
    /// it): worth waiting for.
    NotYet(String),
    /// Attaching cannot work (a bad config, a region of another layout,
    /// another server attached, ...).
    Failed(String),
}

impl Unattached {
    /// The reason, in one line.
    pub fn reason(&self) -> &str {
        match self {
            Unattached::NotYet(r) | Unattached::Failed(r) => r,
        }
    }
}

/// Whether this process is a forked child of the server.
#[inline]
pub fn inert() -> bool {
    INERT.load(Ordering::Relaxed)
}

extern "C" fn on_fork_child() {
    INERT.store(true, Ordering::Relaxed);
}

/// Whether `accept`/`listen` need a look (not in a forked child, not in a
/// process without `LOCKSTEP_CONFIG`, not after choosing to run
/// unreplicated).
#[inline]
pub fn active() -> bool {
    !inert() && matches!(MODE.load(Ordering::Relaxed), MODE_UNKNOWN | MODE_ATTACHED)
}

/// The attached engine, if any.
#[inline]
pub fn engine() -> Option<&'static Engine> {
    ENGINE.get()
}

/// The settings: None when `LOCKSTEP_CONFIG` is not set, else the parsed
/// config or one line saying why it is unusable. Read once.
pub fn settings() -> Option<&'static Result<Settings, String>> {
    let s = SETTINGS.get_or_init(load_settings).as_ref();
    if s.is_none() {
        MODE.store(MODE_OFF, Ordering::Relaxed);
    }
    s
}

/// Whether this process may be a lockstep server, without reading the
/// config (a clock hook may run inside the allocator, under its lock, so
/// it must not allocate): the config read said so, or before it is read,
/// `LOCKSTEP_CONFIG` is set.
pub fn may_serve() -> bool {
    match SETTINGS.get() {
        Some(s) => matches!(s, Some(Ok(_))),
        None => crate::sys::env_is_set(c"LOCKSTEP_CONFIG"),
    }
}

/// The key of the cluster's entropy stream (see `entropy`); None in a
/// process that is not a lockstep server (no or an unusable
/// `LOCKSTEP_CONFIG`).
pub fn entropy_seed() -> Option<[u8; 32]> {
    *ENTROPY_SEED.get_or_init(|| match settings() {
        Some(Ok(s)) => Some(crate::determinism::entropy::derive(&s.config.cluster)),
        _ => None,
    })
}

fn load_settings() -> Option<Result<Settings, String>> {
    let path = std::env::var_os("LOCKSTEP_CONFIG")?;
    crate::logger::init_from_env();
    Some(parse_settings(
        Path::new(&path),
        std::env::var("LOCKSTEP_NODE").ok().as_deref(),
    ))
}

fn parse_settings(path: &Path, node: Option<&str>) -> Result<Settings, String> {
    let node = node.ok_or("LOCKSTEP_NODE is not set (it names this node's id in the config)")?;
    let me: u64 = node
        .trim()
        .parse()
        .map_err(|_| format!("LOCKSTEP_NODE={node:?} is not a node id"))?;
    let config = Config::load(path).map_err(|e| e.0)?;
    let app = config
        .node(me)
        .map_err(|e| format!("LOCKSTEP_NODE: {}", e.0))?
        .app;
    for w in &config.warnings {
        log::warn!("{w}");
    }
    Ok(Settings { config, me, app })
}

/// Whether a listening socket bound to `local` is the app listener for
/// the configured `app` address: same port, and the same address unless
/// either side is a wildcard.
pub fn is_app_addr(local: SocketAddr, app: SocketAddr) -> bool {
    fn canon(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        }
    }
    let (l, a) = (canon(local.ip()), canon(app.ip()));
    local.port() == app.port() && (l.is_unspecified() || a.is_unspecified() || l == a)
}

/// Attaches to this node's region (once; retried after a failure).
pub fn attach() -> Result<&'static Engine, Unattached> {
    attach_when(|_| true)
}

/// [`attach`], once `ready` says the region (owned by a running follower)
/// may be attached to.
fn attach_when(ready: impl FnOnce(&Region) -> bool) -> Result<&'static Engine, Unattached> {
    if let Some(e) = ENGINE.get() {
        return Ok(e);
    }
    let _g = ATTACHING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = ENGINE.get() {
        return Ok(e);
    }
    let s = match settings() {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err(Unattached::Failed(e.clone())),
        None => return Err(Unattached::Failed("LOCKSTEP_CONFIG is not set".into())),
    };
    let spec = s.config.region_spec(s.me);
    let path = spec.default_path();
    let region = Region::open(&path, &spec).map_err(unattached)?;
    if !region.owner_alive() {
        // Left behind by a follower that is gone: the next one resets or
        // replaces it, and would refuse to start beside a server on it.
        return Err(Unattached::NotYet(format!(
            "region file {} has no running follower",
            path.display()
        )));
    }
    if !ready(&region) {
        return Err(Unattached::NotYet(format!(
            "the follower of region file {} is starting",
            path.display()
        )));
    }
    // Held until this process exits: the follower watches it.
    region
        .attach_server()
        .map_err(|e| Unattached::Failed(e.to_string()))?;
    let engine =
        Engine::new(s.config.clone(), s.me, Arc::new(region)).map_err(Unattached::Failed)?;
    engine.region.set_preload_pid(host_pid());
    // From now on a forked child (Redis BGSAVE) must not act for us. A
    // fork before this point (a daemonising server) keeps a working copy.
    sys::at_fork_child(on_fork_child);
    log::info!(
        "node {} attached to {} (role {:?}, view {})",
        s.me,
        engine.region.path().display(),
        engine.region.role(),
        engine.region.view()
    );
    let (used, began) = (
        crate::determinism::clock::origin_us(),
        engine.region.origin_us(),
    );
    if began != 0 && used != began {
        log::warn!(
            "node {}: this server's start-up clock read {} µs since the epoch, but the cluster's log began at {began}: its LASTSAVE and uptime differ from its replicas' (its data does not); start it with `lockstep run`, which hands it the log's start",
            s.me,
            used
        );
    }
    crate::backup::region_host::start(
        engine.region.clone(),
        s.app,
        s.config.max_entry,
        take_identity,
    );
    let engine = ENGINE.publish(engine);
    MODE.store(MODE_ATTACHED, Ordering::Relaxed);
    Ok(engine)
}

/// This process was restored from an image taken on another node, and its
/// region is now node `node`'s (the follower that restored it relocated
/// the image's files and sockets): from now on it is that node, with that
/// node's app address (returned; None when the config has no such node or
/// its transport cannot open, said in one line).
pub fn take_identity(node: u64) -> Option<SocketAddr> {
    let _g = ATTACHING.lock().unwrap_or_else(|p| p.into_inner());
    let old = ENGINE.get()?;
    if old.me == node {
        return Some(old.app);
    }
    match Engine::new(old.config.clone(), node, old.region.clone()) {
        Ok(engine) => {
            let engine = ENGINE.publish(engine);
            log::warn!(
                "restored from an image of node {}: this server is node {} now (app {})",
                old.me,
                node,
                engine.app
            );
            Some(engine.app)
        }
        Err(e) => {
            log::error!(
                "restored from an image of node {} onto node {node}, which cannot be this server: {e}",
                old.me
            );
            None
        }
    }
}

/// Why a region could not be opened, as a reason to wait or to give up.
fn unattached(e: RegionError) -> Unattached {
    match e {
        // Not there yet, or its follower is creating it just now.
        RegionError::Missing(_) | RegionError::Unfinished { .. } => {
            Unattached::NotYet(e.to_string())
        }
        e => Unattached::Failed(e.to_string()),
    }
}

/// The region is not ready at `listen` (`why`): a small thread of the
/// preload's own attaches as soon as it is, so that a server started
/// before its follower joins the cluster without a restart. One line says
/// so; the thread ends once attached (or when attaching fails for another
/// reason, which the first accept then reports).
pub fn attach_when_ready(why: &str) {
    if WAITING.swap(true, Ordering::Relaxed) {
        return;
    }
    log::warn!("{why}: waiting for this node's follower; the server attaches when it is ready (its clients are refused until then)");
    let spawned = std::thread::Builder::new()
        .name("lockstep-attach".into())
        .spawn(|| {
            // Its own calls (open, mmap, the applier's start) pass through.
            crate::reentry::own_thread();
            let mut heartbeat = None;
            loop {
                std::thread::sleep(ATTACH_RETRY);
                // A forked child, or serving unreplicated by choice now.
                if !active() {
                    return;
                }
                // Only once its follower's heartbeat moved: a starting
                // follower resets a region it reuses just after claiming it
                // (and refuses a server attached before), and its heartbeat
                // moves only after that.
                let moved = |r: &Region| {
                    let now = r.heartbeat();
                    heartbeat.replace(now).is_some_and(|before| before != now)
                };
                match attach_when(moved) {
                    Ok(_) => return,
                    Err(Unattached::NotYet(_)) => {}
                    Err(Unattached::Failed(e)) => {
                        log::error!("cannot attach: {e}");
                        WAITING.store(false, Ordering::Relaxed);
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        WAITING.store(false, Ordering::Relaxed);
        log::error!("cannot start the thread that waits for the region: {e}");
    }
}

/// Whether a thread waits for the region (see [`attach_when_ready`]).
pub fn waiting_for_region() -> bool {
    WAITING.load(Ordering::Relaxed) && ENGINE.get().is_none()
}

/// Whether `LOCKSTEP_ALLOW_UNREPLICATED=1`: the server serves clients
/// unreplicated when replication is impossible.
pub fn unreplicated_allowed() -> bool {
    std::env::var("LOCKSTEP_ALLOW_UNREPLICATED").is_ok_and(|v| v.trim() == "1")
}

/// Before the server changes its user id (a server that drops its
/// privileges after starting, memcached `-u nobody`): reads the settings
/// and opens the region files this process will map — its own and, with
/// the shm transport, every peer's, all mode 0600 and the followers' —
/// while it still may ([`region::open_ahead`]). Once per process; a file
/// not there yet is left to be opened by path later, as usual.
pub fn before_privilege_drop() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if inert() || ENGINE.get().is_some() || DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let Some(Ok(s)) = settings() else {
        return;
    };
    let ids: Vec<u64> = match s.config.transport {
        TransportKind::Shm => s.config.ids().collect(),
        _ => vec![s.me],
    };
    for id in ids {
        let path = s.config.region_spec(id).default_path();
        match region::open_ahead(&path) {
            Ok(()) => log::info!(
                "opened {} before the server's user id changes",
                path.display()
            ),
            Err(e) => log::warn!(
                "cannot open {} before the server's user id changes: {e}",
                path.display()
            ),
        }
    }
}

/// This process's pid as the follower and `lockstep` see it: a server in a
/// PID namespace of its own (so that its image can be restored) is pid 1
/// there, but the host's `/proc` (the launcher mounts no other) names it by
/// its host pid.
fn host_pid() -> u64 {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse().ok())
        .unwrap_or(std::process::id() as u64)
}

/// Replication is impossible for `reason`. Stops the server with one line
/// on stderr, unless `LOCKSTEP_ALLOW_UNREPLICATED=1`: then warns once and
/// lets everything through from now on.
pub fn cannot_replicate(reason: &str) {
    let allow = unreplicated_allowed();
    let mut line = String::with_capacity(256);
    if allow {
        if MODE.swap(MODE_UNREPLICATED, Ordering::Relaxed) != MODE_UNREPLICATED {
            line.push_str("lockstep: WARNING: cannot replicate: ");
            line.push_str(reason);
            line.push_str("; serving clients UNREPLICATED because LOCKSTEP_ALLOW_UNREPLICATED=1\n");
            sys::write_all(2, line.as_bytes());
        }
        return;
    }
    line.push_str("lockstep: cannot replicate: ");
    line.push_str(reason);
    line.push_str("; refusing to serve (set LOCKSTEP_ALLOW_UNREPLICATED=1 to run unreplicated)\n");
    sys::write_all(2, line.as_bytes());
    sys::exit_now(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_address_matching() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(is_app_addr(a("127.0.0.1:7001"), a("127.0.0.1:7001")));
        assert!(is_app_addr(a("0.0.0.0:7001"), a("127.0.0.1:7001")));
        assert!(is_app_addr(a("[::]:7001"), a("127.0.0.1:7001")));
        assert!(is_app_addr(
            a("[::ffff:127.0.0.1]:7001"),
            a("127.0.0.1:7001")
        ));
        assert!(is_app_addr(a("10.0.0.5:7001"), a("0.0.0.0:7001")));
        assert!(!is_app_addr(a("127.0.0.1:7002"), a("127.0.0.1:7001")));
        assert!(!is_app_addr(a("10.0.0.5:7001"), a("127.0.0.1:7001")));
    }

    #[test]
    fn a_region_not_there_or_half_created_is_waited_for_any_other_is_not() {
        let dir = std::env::temp_dir().join(format!("lockstep-setup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = |node| lockstep_common::RegionSpec {
            cluster: "setup-test".into(),
            node,
            ring_size: 1 << 20,
        };
        let path = dir.join("region");
        let open = |node| Region::open(&path, &spec(node)).map_err(unattached);
        assert!(matches!(open(1), Err(Unattached::NotYet(_))));
        // Created, not yet sized (the follower is between the two steps).
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(open(1), Err(Unattached::NotYet(_))));
        std::fs::remove_file(&path).unwrap();
        let created = Region::create(&path, &spec(1)).unwrap();
        assert!(open(1).is_ok());
        assert!(matches!(open(2), Err(Unattached::Failed(e)) if e.contains("belongs to node 1")));
        drop(created);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn settings_errors_are_one_line() {
        let e = parse_settings(Path::new("/nonexistent.toml"), None).unwrap_err();
        assert!(e.starts_with("LOCKSTEP_NODE is not set"), "{e}");
        let e = parse_settings(Path::new("/nonexistent.toml"), Some("x")).unwrap_err();
        assert!(e.contains("not a node id"), "{e}");
        let e = parse_settings(Path::new("/nonexistent.toml"), Some("1")).unwrap_err();
        assert!(e.contains("cannot read config"), "{e}");
        assert!(!e.contains('\n'));
    }
}
