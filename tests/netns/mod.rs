//! Test hosts in network namespaces: a bridge namespace and one namespace
//! per host, each joined to the bridge by a veth pair created inside the
//! bridge namespace, so nothing is ever added to the namespace the test
//! runs in. Dropping a [`Net`] deletes its namespaces, and the bridge and
//! veth pairs with them.
#![allow(dead_code)]

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread::JoinHandle;

use lockstep_launcher::cluster_spec::ClusterSpec;

/// Runs `ip`; Err with its stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A test network on 10.213.`subnet`.0/24: node N at .N on bridge port
/// `v{N-1}`, then any extra hosts, then the test's own client host at .100.
pub struct Net {
    namespaces: Vec<String>,
    /// The namespace holding the bridge.
    pub bridge_ns: String,
    /// Node N's namespace at index N-1.
    pub node_ns: Vec<String>,
    /// Node N's address at index N-1.
    pub node_ips: Vec<Ipv4Addr>,
    /// The namespace for the test's own connections.
    pub client_ns: String,
    hosts: Vec<(String, String, Ipv4Addr)>,
}

impl Net {
    /// [`Net::create`] for a test that cannot run without it: fails the test
    /// naming what is missing (a test never passes by skipping).
    pub fn required(prefix: &str, subnet: u8, nodes: usize, extra: &[(&str, u8)]) -> Net {
        Net::create(prefix, subnet, nodes, extra).unwrap_or_else(|e| {
            panic!("this test needs network namespaces (the `ip` tool and CAP_NET_ADMIN, e.g. root): {e}")
        })
    }

    /// Creates the network. `prefix` starts every namespace name
    /// (`<prefix><pid>-<what>`): namespaces of earlier runs with that
    /// prefix whose process is gone are removed first. `extra` names further
    /// hosts with the last octet of their address.
    pub fn create(
        prefix: &str,
        subnet: u8,
        nodes: usize,
        extra: &[(&str, u8)],
    ) -> Result<Net, String> {
        remove_stale(prefix);
        let pid = std::process::id();
        let name = |what: &str| format!("{prefix}{pid}-{what}");
        let addr = |last: u8| Ipv4Addr::new(10, 213, subnet, last);
        let mut net = Net {
            namespaces: Vec::new(),
            bridge_ns: name("br"),
            node_ns: (1..=nodes).map(|i| name(&format!("n{i}"))).collect(),
            node_ips: (1..=nodes).map(|i| addr(i as u8)).collect(),
            client_ns: name("client"),
            hosts: extra
                .iter()
                .map(|&(what, last)| (what.to_string(), name(what), addr(last)))
                .collect(),
        };
        ip(&["netns", "add", &net.bridge_ns])?;
        net.namespaces.push(net.bridge_ns.clone());
        let b = net.bridge_ns.clone();
        ip(&["-n", &b, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &b, "link", "set", "br0", "up"])?;
        // Nodes first: node N is on bridge port v{N-1}.
        let mut leaves: Vec<(String, Ipv4Addr)> = net
            .node_ns
            .iter()
            .cloned()
            .zip(net.node_ips.iter().copied())
            .collect();
        leaves.extend(net.hosts.iter().map(|(_, ns, a)| (ns.clone(), *a)));
        leaves.push((net.client_ns.clone(), addr(100)));
        for (i, (ns, a)) in leaves.iter().enumerate() {
            ip(&["netns", "add", ns])?;
            net.namespaces.push(ns.clone());
            let port = format!("v{i}");
            ip(&[
                "-n", &b, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ])?;
            ip(&["-n", &b, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &b, "link", "set", &port, "up"])?;
            ip(&["-n", ns, "addr", "add", &format!("{a}/24"), "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// The namespace and address of the extra host `what`.
    pub fn host(&self, what: &str) -> (&str, Ipv4Addr) {
        let (_, ns, a) = self
            .hosts
            .iter()
            .find(|(w, _, _)| w == what)
            .unwrap_or_else(|| panic!("no host {what} in this test network"));
        (ns, *a)
    }

    /// Where namespace `ns` is mounted.
    pub fn path(ns: &str) -> PathBuf {
        PathBuf::from("/var/run/netns").join(ns)
    }

    /// Where node `id`'s namespace is mounted.
    pub fn node_path(&self, id: u64) -> PathBuf {
        Self::path(&self.node_ns[id as usize - 1])
    }

    /// Takes node `id`'s link (its port on the bridge) down or up.
    pub fn link(&self, id: u64, up: bool) {
        let port = format!("v{}", id - 1);
        ip(&[
            "-n",
            &self.bridge_ns,
            "link",
            "set",
            &port,
            if up { "up" } else { "down" },
        ])
        .expect("ip link set");
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// Deletes namespaces named `<prefix><pid>-…` left behind by runs that were
/// killed before their cleanup ran (their pid is gone).
fn remove_stale(prefix: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(ns) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = ns.strip_prefix(prefix) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Makes the calling thread (or, in `pre_exec`, the child) enter the
/// network namespace open at `fd`. Threads it spawns later start there too.
pub fn enter_netns(fd: i32) -> std::io::Result<()> {
    // SAFETY: setns(2) on an open namespace fd; it changes only the calling
    // thread's network namespace and touches no memory.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes the calling thread enter the namespace at `path`.
pub fn enter_netns_at(path: &Path) {
    let ns = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    enter_netns(ns.as_raw_fd()).unwrap_or_else(|e| panic!("setns {}: {e}", path.display()));
}

/// Runs `f` on a thread inside the network namespace at `path`.
pub fn in_netns<T: Send + 'static>(
    path: PathBuf,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    std::thread::spawn(move || {
        enter_netns_at(&path);
        f()
    })
}

/// Spawns `cmd` so that it enters the namespace at `path` between fork and
/// exec.
pub fn spawn_in(path: &Path, cmd: &mut Command) -> Child {
    let ns = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let fd = ns.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setns(2), which is async-signal-safe; `ns` outlives the spawn.
    unsafe {
        cmd.pre_exec(move || enter_netns(fd));
    }
    let child = cmd.spawn().expect("spawn in netns");
    drop(ns);
    child
}

/// Tears a test cluster down: kills and reaps `children`, removes the
/// cluster's region files, and removes `dir` unless the test is failing
/// (its logs are the evidence).
pub fn tear_down<'a>(
    children: impl IntoIterator<Item = &'a mut Child>,
    cluster: &str,
    nodes: u64,
    dir: &Path,
) {
    for c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    for id in 1..=nodes {
        let _ = std::fs::remove_file(lockstep_common::region::region_path(cluster, id));
    }
    if !std::thread::panicking() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The port each node's server listens on in its namespace.
pub const APP_PORT: u16 = 6379;
/// The port each node's follower is controlled on in its namespace.
pub const CONTROL_PORT: u16 = 7100;

/// The config of a tcp cluster with one node per namespace of `net` (node
/// N at its namespace's address, serving on [`APP_PORT`], controlled on
/// [`CONTROL_PORT`]), data in `dir`, a static leader 1 (the caller may
/// change the election).
pub fn netns_spec(name: &str, dir: &Path, net: &Net) -> ClusterSpec {
    let ips: Vec<IpAddr> = net.node_ips.iter().map(|a| IpAddr::V4(*a)).collect();
    ClusterSpec::new(name, &dir.join("data"))
        .set("transport", "tcp")
        .set("ring_size", "8MiB")
        .set("backup_clients", "allow")
        .set("key", "test-cluster-key-0123456789")
        .set_lines(&crate::cluster::commit_line())
        .nodes_at(&ips, APP_PORT, CONTROL_PORT)
}
