//! `lockstep check`: what can be known about a config before `lockstep up`
//! starts anything — the server program exists, the command gives each node
//! its own port, memcached runs one thread, `data_dir` is writable, a
//! generated cluster key file is private — and a summary in words of what
//! the config describes — and what this host offers the nodes: which of
//! their addresses are in use, whether the configured ZooKeeper answers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use lockstep_common::config::{BackupClients, CommitMode, Durability, ElectionMode, TransportKind};
use lockstep_common::Config;

/// Whether `prog` names an executable file: a path, or a name found in a
/// directory of `PATH`.
pub fn find_in_path(prog: &str) -> bool {
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

/// What is wrong with a server command (`field` names where it came from:
/// `server` in the config, or `--server-cmd`); one line per problem, each
/// naming the argument (`server[0]`) and what is expected.
pub fn server_problems(cmd: &[String], field: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Some(prog) = cmd.first() else {
        return vec![format!(
            "{field}: empty (expected a command such as [\"redis-server\", \"--port\", \"{{port}}\"])"
        )];
    };
    if !find_in_path(prog) {
        out.push(if prog.contains('/') {
            format!("{field}[0]: program {prog:?} not found or not executable (expected the path of an installed server)")
        } else {
            format!("{field}[0]: program {prog:?} not found on PATH (expected an installed server; scripts/setup installs redis-server and memcached)")
        });
    }
    if !cmd.iter().any(|a| a.contains("{port}")) {
        out.push(format!(
            "{field}: no argument holds {{port}}, so every node's server would listen on the same port (expected e.g. \"--port\", \"{{port}}\"; {{port}} becomes the port of the node's app address)"
        ));
    }
    let name = Path::new(prog)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if name == "memcached" {
        out.extend(memcached_problems(cmd, field));
    }
    out
}

/// memcached refuses to run as root without `-u`. Its worker threads
/// (`-t`, 4 by default) are event loops, which lockstep replicates (see
/// [`memcached_workers`]).
fn memcached_problems(cmd: &[String], field: &str) -> Vec<String> {
    let mut out = Vec::new();
    let user = cmd.iter().skip(1).any(|a| {
        a == "-u"
            || a == "--user"
            || a.starts_with("--user=")
            || (a.starts_with("-u") && a.len() > 2 && !a.starts_with("--"))
    });
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !user && root {
        out.push(format!(
            "{field}: memcached refuses to run as root without -u (expected \"-u\", \"root\", or run lockstep as another user)"
        ));
    }
    out
}

/// Whether `data_dir` can be used: it, or the directory it would be
/// created in, must be a directory this process can write (tried by
/// creating and removing a probe directory).
pub fn data_dir_problem(dir: &Path) -> Option<String> {
    let mut at: PathBuf = dir.to_path_buf();
    while !at.exists() {
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p.to_path_buf(),
            _ => {
                at = PathBuf::from(".");
                break;
            }
        }
    }
    if !at.is_dir() {
        return Some(format!(
            "data_dir: {} is not a directory (expected a directory, or a path one can be created at, for {})",
            at.display(),
            dir.display()
        ));
    }
    let probe = at.join(format!(".lockstep-check-{}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            None
        }
        Err(e) => Some(format!(
            "data_dir: cannot write in {}: {e} (expected a writable directory for {}: each node keeps its log there)",
            at.display(),
            dir.display()
        )),
    }
}

/// How many worker threads memcached command `cmd` runs (`-t N`,
/// `-tN`, `--threads N`, `--threads=N`; memcached's default is 4); None
/// when `cmd` is not memcached or the count is not a number.
pub fn memcached_workers(cmd: &[String]) -> Option<u32> {
    let name = Path::new(cmd.first()?).file_name()?.to_str()?;
    if name != "memcached" {
        return None;
    }
    let mut threads = "4";
    for (i, a) in cmd.iter().enumerate().skip(1) {
        let next = || cmd.get(i + 1).map(String::as_str).unwrap_or("");
        match a.as_str() {
            "-t" | "--threads" => threads = next(),
            _ if a.starts_with("--threads=") => threads = &a["--threads=".len()..],
            _ if a.starts_with("-t") && a.len() > 2 => threads = &a[2..],
            _ => {}
        }
    }
    threads.parse().ok()
}

/// Everything `check` finds wrong beyond what loading the config checks.
pub fn problems(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(cmd) = &config.server {
        out.extend(server_problems(cmd, "server"));
        let workers = memcached_workers(cmd).unwrap_or(1);
        if workers > 1 && config.backup_clients == BackupClients::Allow {
            out.push(format!(
                "backup_clients: \"allow\" with memcached's {workers} worker threads: memcached hands each connection to the next worker in turn, so a client a backup took would move every later replicated connection to another worker than the leader's; backups refuse their own clients with several workers (expected backup_clients = \"deny\", or \"-t\", \"1\")"
            ));
        }
    }
    out.extend(data_dir_problem(&config.data_dir));
    out.extend(key_file_problem(config));
    out
}

/// What is wrong with an existing generated key file (readable by others,
/// unreadable, empty). A missing one is fine: the first node creates it,
/// and `check` itself creates nothing.
pub fn key_file_problem(config: &Config) -> Option<String> {
    let path = config.cluster_key_path()?;
    if !path.exists() {
        return None;
    }
    lockstep_common::config::generate_or_read_key(&path)
        .err()
        .map(|e| format!("key: {e}"))
}

/// What `check` found on this host. `errors` stop the node about to start
/// (`--node N`); the rest are lines of the summary.
#[derive(Debug, Default)]
pub struct HostFindings {
    /// What keeps the node about to start from starting, one line each.
    pub errors: Vec<String>,
    /// Summary lines (`ports`, `zookeeper`), warnings among them.
    pub lines: Vec<String>,
}

/// How long a probe of an address waits (connect, and an answer).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What holds a TCP address on this host.
#[derive(Debug, PartialEq, Eq)]
pub enum PortUse {
    /// It can be bound.
    Free,
    /// Taken, and a socket listens on its port (a running program: this
    /// node, or another program).
    Listening,
    /// Taken, though nothing listens on its port (a socket bound to it
    /// without listening, such as an outgoing connection's).
    Bound,
    /// Not an address of this host.
    NotHere,
    /// It cannot be bound for another reason (a port below 1024, say).
    Refused(String),
}

/// What holds `addr` on this host: tried by binding it (the way a server
/// would, so a connection in TIME_WAIT does not count), and when it is
/// taken, whether a socket listens on its port (from /proc/net/tcp*,
/// without connecting: a connection to a running node's app port would be
/// a client of its server, replicated).
pub fn port_use(addr: SocketAddr) -> PortUse {
    match TcpListener::bind(addr) {
        Ok(_) => PortUse::Free,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if listening_on(addr.port()) {
                PortUse::Listening
            } else {
                PortUse::Bound
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => PortUse::NotHere,
        Err(e) => PortUse::Refused(e.to_string()),
    }
}

/// Whether a TCP socket of this network namespace listens on `port` (any
/// local address): a line of /proc/net/tcp or tcp6 in state 0A. Unknown
/// (no /proc) reads as not listening.
fn listening_on(port: u16) -> bool {
    let want = format!("{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|table| {
            table.lines().skip(1).any(|l| {
                let mut cols = l.split_whitespace();
                let local = cols.nth(1).unwrap_or("");
                let state = cols.nth(1).unwrap_or("");
                state == "0A" && local.rsplit(':').next() == Some(want.as_str())
            })
        })
    })
}

/// Every address of each node (`app`, `control`, `metrics`, `sentinel`)
/// as this host holds it: a line for those in use; for `starting` (the
/// node about to be started by hand), an address it cannot take is an
/// error. Another node's address in use is no error: that node may run.
pub fn port_findings(config: &Config, starting: Option<u64>) -> HostFindings {
    let mut found = HostFindings::default();
    let mut checked = 0;
    for n in &config.nodes {
        let mut addrs = vec![("app", n.app), ("control", n.control)];
        addrs.extend(n.metrics.map(|a| ("metrics", a)));
        addrs.extend(n.sentinel.map(|a| ("sentinel", a)));
        let own = starting == Some(n.id);
        for (field, addr) in addrs {
            let (what, whose) = match port_use(addr) {
                PortUse::Free => {
                    checked += 1;
                    continue;
                }
                PortUse::Listening => (
                    "in use: a program listens on it",
                    if own {
                        // The server binds the app address, the follower
                        // the others.
                        let who = if field == "app" { "server" } else { "follower" };
                        format!("node {}'s {who} runs already, or another program holds its port: stop it first, or give the node another address", n.id)
                    } else {
                        format!("node {} runs, or another program holds its port", n.id)
                    },
                ),
                PortUse::Bound => (
                    "in use: a socket that does not listen is bound to it",
                    "another program holds it".to_string(),
                ),
                PortUse::NotHere if !own => continue,
                PortUse::NotHere => (
                    "is not an address of this host",
                    format!("expected an address of the host node {} runs on", n.id),
                ),
                PortUse::Refused(e) => {
                    let line = format!("node {}: {field} {addr} cannot be taken here: {e}", n.id);
                    if own {
                        found.errors.push(line);
                    } else {
                        found.lines.push(format!("  ports      warning: {line}"));
                    }
                    continue;
                }
            };
            checked += 1;
            let line = format!("node {}: {field} {addr} {what} ({whose})", n.id);
            if own {
                found.errors.push(line);
            } else {
                found.lines.push(format!("  ports      warning: {line}"));
            }
        }
    }
    if found.lines.is_empty() && found.errors.is_empty() {
        found.lines.push(format!(
            "  ports      every node address of this host is free ({checked} checked)"
        ));
    }
    found
}

/// What a ZooKeeper member said to `srvr`, in words.
#[derive(Debug, PartialEq, Eq)]
pub enum ZookeeperAnswer {
    /// It serves: its `Mode:` (standalone, leader, follower) and version.
    Serves(String),
    /// It answers, but `srvr` is not among its four-letter commands
    /// (`4lw.commands.whitelist`): whether it serves cannot be told here.
    CommandsOff,
    /// It accepted the connection but said nothing sensible.
    Odd(String),
    /// Nothing answered (refused, or silent within the timeout).
    Silent(String),
}

/// Asks the ZooKeeper at `addr` `srvr` (a four-letter command, over TCP).
pub fn ask_zookeeper(addr: SocketAddr, timeout: Duration) -> ZookeeperAnswer {
    let mut s = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(s) => s,
        Err(e) => return ZookeeperAnswer::Silent(e.to_string()),
    };
    let _ = s.set_read_timeout(Some(timeout));
    let _ = s.set_write_timeout(Some(timeout));
    if let Err(e) = s.write_all(b"srvr") {
        return ZookeeperAnswer::Silent(e.to_string());
    }
    let mut out = Vec::new();
    if let Err(e) = s.take(64 * 1024).read_to_end(&mut out) {
        if out.is_empty() {
            return ZookeeperAnswer::Silent(format!("no answer to srvr: {e}"));
        }
    }
    let out = String::from_utf8_lossy(&out);
    if out.contains("not in the whitelist") || out.contains("not executed") {
        return ZookeeperAnswer::CommandsOff;
    }
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    match field("Mode:") {
        Some(mode) => {
            let version = field("Zookeeper version:")
                .map(|v| v.split([',', '-']).next().unwrap_or("").trim().to_string())
                .unwrap_or_default();
            ZookeeperAnswer::Serves(if version.is_empty() {
                mode
            } else {
                format!("{mode}, ZooKeeper {version}")
            })
        }
        None if out.trim().is_empty() => ZookeeperAnswer::Odd(
            "it closed the connection without a word (its four-letter commands may be off, or it is not ZooKeeper)".into(),
        ),
        None => ZookeeperAnswer::Odd(format!(
            "its answer to srvr has no Mode: line ({:?})",
            out.lines().next().unwrap_or("")
        )),
    }
}

/// With `election.mode = "zookeeper"`: whether each member of the connect
/// string answers. For `starting` (a node about to be started by hand),
/// none answering is an error: its follower cannot start without one.
/// Otherwise a warning: `lockstep up` starts a private one on a loopback
/// address.
pub fn zookeeper_findings(config: &Config, starting: Option<u64>) -> HostFindings {
    let mut found = HostFindings::default();
    if config.election.mode != ElectionMode::Zookeeper {
        return found;
    }
    let connect = &config.election.zookeeper;
    let members = connect.split('/').next().unwrap_or("");
    let mut serving = 0;
    let mut silent = Vec::new();
    for m in members.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let Some(addr) = m.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
            found.errors.push(format!(
                "election.zookeeper: cannot resolve {m:?} (expected host:port)"
            ));
            continue;
        };
        let line = match ask_zookeeper(addr, PROBE_TIMEOUT) {
            ZookeeperAnswer::Serves(mode) => {
                serving += 1;
                format!("{addr} serves ({mode})")
            }
            ZookeeperAnswer::CommandsOff => {
                // It answered: a follower can most likely use it.
                serving += 1;
                format!("{addr} answers, but its four-letter command srvr is off (add it to 4lw.commands.whitelist to have it checked here)")
            }
            ZookeeperAnswer::Odd(why) => format!("warning: {addr} accepts connections, but {why}"),
            ZookeeperAnswer::Silent(why) => {
                silent.push(addr);
                format!("warning: nothing answers at {addr} ({why})")
            }
        };
        found.lines.push(format!("  zookeeper  {line}"));
    }
    if serving == 0 && !silent.is_empty() {
        match starting {
            Some(id) => found.errors.push(format!(
                "election.zookeeper: no ZooKeeper answers at {members}: node {id}'s follower cannot start without one (start ZooKeeper first)"
            )),
            None => found.lines.push(format!(
                "  zookeeper  {}; a node started by hand, or by `lockstep up --node`, needs it running",
                if members.contains(',') {
                    "`lockstep up` never replaces an ensemble".to_string()
                } else if silent[0].ip().is_loopback() {
                    format!("`lockstep up` starts a private one at {}", silent[0])
                } else {
                    format!("`lockstep up` cannot start one at {} (not a loopback address)", silent[0])
                }
            )),
        }
    }
    found
}

/// Everything `check` finds on this host: [`port_findings`], then
/// [`zookeeper_findings`].
pub fn host_findings(config: &Config, starting: Option<u64>) -> HostFindings {
    let mut found = port_findings(config, starting);
    let zk = zookeeper_findings(config, starting);
    found.errors.extend(zk.errors);
    found.lines.extend(zk.lines);
    found
}

/// A byte count in the largest binary unit that divides it.
fn size(n: u64) -> String {
    for (unit, name) in [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{} {name}", n / unit);
        }
    }
    format!("{n} bytes")
}

/// An argument as a shell would need it.
fn shell_word(a: &str) -> String {
    if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'') {
        format!("'{}'", a.replace('\'', "'\\''"))
    } else {
        a.to_string()
    }
}

/// What the config describes, in words, one node per line.
pub fn summary(config: &Config, path: &Path) -> String {
    let n = config.nodes.len();
    let majority = config.majority();
    let mut out = format!(
        "{} is valid: cluster {:?}, {n} node{} (a majority is {majority}: {} may fail)\n",
        path.display(),
        config.cluster,
        if n == 1 { "" } else { "s" },
        n - majority
    );
    let transport = match config.transport {
        TransportKind::Shm => {
            "shm: all nodes on this host, writing into each other's shared memory"
        }
        TransportKind::Tcp => {
            "tcp: one-sided writes emulated over TCP, peers authenticated by the cluster key"
        }
        TransportKind::Rdma => {
            "rdma: RDMA verbs (needs an RDMA device and a build with --features rdma)"
        }
    };
    out.push_str(&format!("  transport  {transport}\n"));
    let election = match config.election.mode {
        ElectionMode::Static => format!(
            "static: node {} leads (no election: while it is down, nothing is written)",
            config.election.leader
        ),
        ElectionMode::Zookeeper => format!(
            "through ZooKeeper at {}, session timeout {} ms (a failover takes about that long)",
            config.election.zookeeper, config.election.session_timeout_ms
        ),
    };
    out.push_str(&format!("  election   {election}\n"));
    let commit = match config.commit {
        CommitMode::Output => {
            "output: the server runs each input at once, its replies wait until a majority stored every input before them"
        }
        CommitMode::Input => "input: the server sees an input only once a majority stored it",
    };
    out.push_str(&format!("  commit     {commit}\n"));
    let durability = match config.durability {
        Durability::MemoryAck => "memory-ack: an acknowledged input survives process crashes",
        Durability::Fsync => "fsync: an acknowledged input survives power loss",
    };
    out.push_str(&format!("  durability {durability}\n"));
    out.push_str(&format!(
        "  log        ring of {} per node, inputs split into entries of at most {}; backups at most {} behind{}\n",
        size(config.ring_size),
        size(config.max_entry as u64),
        if config.max_apply_lag == 0 {
            "any number of entries".to_string()
        } else {
            format!("{} entries", config.max_apply_lag)
        },
        if config.max_apply_lag == 0 { " (no bound)" } else { "" }
    ));
    out.push_str(&format!(
        "  data       {} (node N keeps its log in node-N)\n",
        config.data_dir.display()
    ));
    let key = match config.cluster_key_path() {
        Some(path) => format!(
            "{} (generated by the first node that starts, mode 0600): whoever can read it may control the cluster",
            path.display()
        ),
        None => "configured (key / key_file): every peer and CLI client proves it".to_string(),
    };
    out.push_str(&format!("  key        {key}\n"));
    let backups = match config.backup_clients {
        BackupClients::Deny => match config.protocol {
            lockstep_common::config::Protocol::Redis => {
                "deny: backups answer every client with one -READONLY error naming the leader's address, then close"
            }
            lockstep_common::config::Protocol::Memcached => {
                "deny: backups answer every client with one SERVER_ERROR naming the leader's address, then close"
            }
            lockstep_common::config::Protocol::Other => {
                "deny: backups close every client without a reply (set protocol = \"redis\" or \"memcached\" for one naming the leader); clients talk to the leader"
            }
        },
        BackupClients::Allow => {
            "allow: backups accept clients, and writes sent there are NOT replicated (the replicas then differ)"
        }
    };
    out.push_str(&format!("  backups    {backups}\n"));
    match &config.server {
        Some(cmd) => out.push_str(&format!(
            "  server     {}\n",
            cmd.iter().map(|a| shell_word(a)).collect::<Vec<_>>().join(" ")
        )),
        None => out.push_str(
            "  server     not set: `lockstep up` needs --server-cmd (or start each server under the preload yourself)\n",
        ),
    }
    for node in &config.nodes {
        out.push_str(&format!(
            "  node {:<2}    app {}  control {}  metrics {}{}\n",
            node.id,
            node.app,
            node.control,
            node.metrics
                .map(|m| m.to_string())
                .unwrap_or_else(|| "none".into()),
            if config.election.mode == ElectionMode::Static && node.id == config.election.leader {
                "  (leader)"
            } else {
                ""
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_testkit::config_fixture::ThreeNodeConfig;

    fn cmd(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn server_program_and_port() {
        assert!(server_problems(&cmd(&["sh", "-c", "{port}"]), "server").is_empty());
        let p = server_problems(&cmd(&["no-such-server-xyz", "--port", "{port}"]), "server");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("server[0]: program \"no-such-server-xyz\" not found on PATH"),
            "{p:?}"
        );
        let p = server_problems(&cmd(&["/nonexistent/redis-server"]), "--server-cmd");
        assert!(
            p[0].starts_with("--server-cmd[0]: program \"/nonexistent/redis-server\" not found")
        );
        assert!(
            p[1].starts_with("--server-cmd: no argument holds {port}"),
            "{p:?}"
        );
        assert!(server_problems(&[], "server")[0].starts_with("server: empty"));
    }

    #[test]
    fn memcached_worker_threads_are_counted() {
        let workers = |args: &[&str]| {
            let mut c = cmd(&["memcached", "-u", "root", "-p", "{port}"]);
            c.extend(cmd(args));
            memcached_workers(&c)
        };
        assert_eq!(workers(&[]), Some(4));
        assert_eq!(workers(&["-t", "1"]), Some(1));
        assert_eq!(workers(&["-t1"]), Some(1));
        assert_eq!(workers(&["--threads=2"]), Some(2));
        assert_eq!(workers(&["--threads", "8"]), Some(8));
        assert_eq!(workers(&["-t", "x"]), None);
        assert_eq!(memcached_workers(&cmd(&["redis-server", "-t", "4"])), None);
        // Worker threads are no problem of the command itself.
        let c = cmd(&["memcached", "-u", "root", "-t", "4", "-p", "{port}"]);
        assert!(server_problems(&c, "server")
            .iter()
            .all(|p| p.starts_with("server[0]: program")));
    }

    #[test]
    fn data_dir_must_be_writable() {
        assert_eq!(
            data_dir_problem(&std::env::temp_dir().join("lockstep-check-x/y")),
            None
        );
        let p = data_dir_problem(Path::new("/proc/lockstep-check/data")).expect("/proc");
        assert!(p.starts_with("data_dir: cannot write in /proc:"), "{p}");
        let file = std::env::temp_dir().join(format!("lockstep-check-file-{}", std::process::id()));
        std::fs::write(&file, "x").unwrap();
        let p = data_dir_problem(&file.join("data")).expect("under a file");
        assert!(p.contains("is not a directory"), "{p}");
        let _ = std::fs::remove_file(&file);
    }

    #[test]
    fn a_port_is_free_listened_on_or_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(port_use(addr), PortUse::Listening);
        drop(listener);
        assert_eq!(port_use(addr), PortUse::Free);
        // Bound, never listening (socket2 is not a dependency: a connected
        // socket's own end is such an address).
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let own_end = client.local_addr().unwrap();
        assert_eq!(port_use(own_end), PortUse::Bound);
        drop((client, listener));
    }

    /// A ZooKeeper stand-in on a loopback port answering `answer` (None:
    /// closing without a word) to one connection.
    fn fake_zookeeper(answer: Option<&'static str>) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut cmd = [0u8; 4];
            s.read_exact(&mut cmd).unwrap();
            assert_eq!(&cmd, b"srvr");
            if let Some(a) = answer {
                s.write_all(a.as_bytes()).unwrap();
            }
        });
        addr
    }

    #[test]
    fn zookeepers_answers_are_told_apart() {
        let t = Duration::from_secs(30);
        let serving = fake_zookeeper(Some(
            "Zookeeper version: 3.8.0-5a02a05eddb59aee6ac762f7ea82e92a68eb9c0f, built on 2022-02-25 08:49 UTC\nLatency min/avg/max: 0/0.0/0\nMode: standalone\nNode count: 5\n",
        ));
        assert_eq!(
            ask_zookeeper(serving, t),
            ZookeeperAnswer::Serves("standalone, ZooKeeper 3.8.0".into())
        );
        let off = fake_zookeeper(Some(
            "srvr is not executed because it is not in the whitelist.\n",
        ));
        assert_eq!(ask_zookeeper(off, t), ZookeeperAnswer::CommandsOff);
        let mute = fake_zookeeper(None);
        assert!(
            matches!(ask_zookeeper(mute, t), ZookeeperAnswer::Odd(w) if w.contains("without a word"))
        );
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let nobody = closed.local_addr().unwrap();
        drop(closed);
        assert!(matches!(
            ask_zookeeper(nobody, t),
            ZookeeperAnswer::Silent(_)
        ));
    }

    #[test]
    fn summary_is_words() {
        let text = ThreeNodeConfig::new(
            r#"cluster = "demo"
data_dir = "/tmp/lockstep-demo"
server = ["redis-server", "--port", "{port}", "--save", ""]
[election]
mode = "zookeeper"
"#,
        )
        .metrics(1, "127.0.0.1:7201")
        .text();
        let c = Config::parse(&text).unwrap();
        let s = summary(&c, Path::new("demo.toml"));
        assert!(
            s.starts_with(
                "demo.toml is valid: cluster \"demo\", 3 nodes (a majority is 2: 1 may fail)"
            ),
            "{s}"
        );
        assert!(s.contains("through ZooKeeper at 127.0.0.1:2181"), "{s}");
        assert!(s.contains("ring of 64 MiB per node"), "{s}");
        assert!(s.contains("redis-server --port {port} --save ''"), "{s}");
        assert!(
            s.contains(
                "node 1     app 127.0.0.1:7001  control 127.0.0.1:7101  metrics 127.0.0.1:7201"
            ),
            "{s}"
        );
        assert!(
            s.contains("node 2     app 127.0.0.1:7002  control 127.0.0.1:7102  metrics none"),
            "{s}"
        );
        for debug in ["Shm", "Zookeeper", "Some(", "Output", "MemoryAck", "Deny"] {
            assert!(!s.contains(debug), "{debug} in {s}");
        }
    }
}
