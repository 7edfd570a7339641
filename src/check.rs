//! `lockstep check`: what can be known about a config before `lockstep up`
//! starts anything — the server program exists, the command gives each node
//! its own port, memcached runs one thread, `data_dir` is writable, a
//! generated cluster key file is private — and a summary in words of what
//! the config describes.

use std::path::{Path, PathBuf};

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
    use lockstep_launcher::config_fixture::ThreeNodeConfig;

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
