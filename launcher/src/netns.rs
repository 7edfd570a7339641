//! A cluster's hosts in network namespaces: a bridge namespace and one
//! namespace per host (each node, any extra host such as ZooKeeper, and a
//! client host), each joined to the bridge by a veth pair created inside
//! the bridge namespace, so nothing is ever added to, or changed in, the
//! namespace the process runs in. Dropping a [`Net`] deletes its
//! namespaces, and the bridge and veth pairs with them.
//!
//! Faults: [`Net::link`] takes a node's port on the bridge down (it loses
//! everyone), [`Net::partition`] cuts any grouping of hosts apart with
//! routes inside their namespaces, and [`Net::heal`] removes those routes.
//!
//! Everything here needs the `ip` tool and CAP_NET_ADMIN and CAP_SYS_ADMIN
//! (in practice: root).
//!
//! ```no_run
//! use lockstep_launcher::netns::{in_netns, Net};
//! let net = Net::create("demo-", 90, 3, &[("zk", 200)]).unwrap();
//! // Node 1 loses ZooKeeper, and only ZooKeeper.
//! net.partition(&[&["1"], &["zk"]]).unwrap();
//! let node1 = net.host_path("1").unwrap();
//! let zk = std::net::SocketAddr::from((net.host_ip("zk").unwrap(), 2181));
//! let reached = in_netns(node1, move || {
//!     std::net::TcpStream::connect_timeout(&zk, std::time::Duration::from_secs(1)).is_ok()
//! })
//! .unwrap()
//! .join()
//! .unwrap();
//! assert!(!reached);
//! net.heal().unwrap();
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context, Result};

use crate::cluster_spec::ClusterSpec;

/// The port each node's server listens on in its namespace.
pub const APP_PORT: u16 = 6379;
/// The port each node's follower is controlled on in its namespace.
pub const CONTROL_PORT: u16 = 7100;

/// The name of the host the caller's own connections come from.
pub const CLIENT: &str = "client";
/// The last octet of [`CLIENT`]'s address.
const CLIENT_OCTET: u8 = 100;

/// The number of the next [`Net`] this process creates.
static NEXT_NET: AtomicU32 = AtomicU32::new(0);

/// Runs `ip` with `args`; Err with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    ip_output(args).map(|_| ())
}

/// Runs `ip` with `args`; its stdout, or Err with its stderr.
fn ip_output(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("cannot run `ip`")?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

/// Runs `commands` (`ip` command lines without the `ip`) in namespace `ns`
/// with one `ip -batch`; stops at the first that fails.
fn ip_batch(ns: &str, commands: &[String]) -> Result<()> {
    if commands.is_empty() {
        return Ok(());
    }
    let mut child = Command::new("ip")
        .args(["-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run `ip`")?;
    let script: String = commands.iter().map(|c| format!("{c}\n")).collect();
    let written = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes());
    let out = child.wait_with_output().context("wait for `ip -batch`")?;
    if !out.status.success() {
        bail!(
            "ip -n {ns} -batch: {}\n(commands: {})",
            String::from_utf8_lossy(&out.stderr).trim(),
            commands.join("; ")
        );
    }
    written.with_context(|| format!("ip -n {ns} -batch: write its commands"))
}

/// One host of a [`Net`].
#[derive(Clone, Debug)]
struct Host {
    /// "1", "2", … for nodes, the extra host's name, or [`CLIENT`].
    name: String,
    /// Its namespace.
    ns: String,
    /// Its address.
    ip: Ipv4Addr,
}

/// A network on 10.213.`subnet`.0/24: node N at .N on bridge port
/// `v{N-1}`, then any extra hosts, then the client host ([`CLIENT`]) at
/// .100.
///
/// Hosts are named "1", "2", … (the nodes), by the names of the extra
/// hosts (e.g. "zk"), and [`CLIENT`].
pub struct Net {
    /// Every namespace created, the bridge's first (deleted in reverse).
    namespaces: Vec<String>,
    /// The namespace holding the bridge.
    pub bridge_ns: String,
    /// Node N's namespace at index N-1.
    pub node_ns: Vec<String>,
    /// Node N's address at index N-1.
    pub node_ips: Vec<Ipv4Addr>,
    /// The namespace of the client host, for the caller's own connections.
    pub client_ns: String,
    /// Every host in bridge-port order: the nodes, the extra hosts, the
    /// client.
    hosts: Vec<Host>,
    /// The third octet of every address.
    subnet: u8,
}

/// Whether `what` may name an extra host (and a part of a namespace name).
fn valid_host_name(what: &str) -> bool {
    !what.is_empty()
        && what.len() <= 32
        && what
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !what.bytes().all(|b| b.is_ascii_digit())
        && what != CLIENT
        && what != "br"
}

impl Net {
    /// [`Net::create`] for a test that cannot run without it: panics naming
    /// what is missing (a test never passes by skipping).
    pub fn required(prefix: &str, subnet: u8, nodes: usize, extra: &[(&str, u8)]) -> Net {
        Net::create(prefix, subnet, nodes, extra).unwrap_or_else(|e| {
            panic!("this test needs network namespaces (the `ip` tool and CAP_NET_ADMIN, e.g. root): {e:#}")
        })
    }

    /// Creates the network of `nodes` nodes (at most 99) on
    /// 10.213.`subnet`.0/24. `prefix` (not empty; letters, digits, `-`,
    /// `_`) starts every namespace name (`<prefix><pid>-<n>-<what>`, `n`
    /// counting the networks of this process):
    /// namespaces of earlier runs with that prefix whose process is gone
    /// are removed first. `extra` names further hosts (letters, digits,
    /// `-`, `_`; not all digits, not "client") with the last octet of
    /// their address (not a node's, not 100, not 0 or 255).
    ///
    /// On an error, whatever was created is deleted again.
    pub fn create(prefix: &str, subnet: u8, nodes: usize, extra: &[(&str, u8)]) -> Result<Net> {
        if prefix.is_empty()
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            bail!("namespace prefix {prefix:?}: must be letters, digits, '-' or '_', not empty");
        }
        if nodes > 99 {
            bail!("{nodes} nodes: at most 99 (the client host is at .{CLIENT_OCTET})");
        }
        let mut octets: HashSet<u8> = (1..=nodes as u8).chain([CLIENT_OCTET]).collect();
        let mut names = HashSet::new();
        for &(what, last) in extra {
            if !valid_host_name(what) {
                bail!("extra host name {what:?}: must be letters, digits, '-' or '_', not all digits, not \"client\" or \"br\"");
            }
            if !names.insert(what) {
                bail!("extra host {what:?} given twice");
            }
            if last == 0 || last == 255 || !octets.insert(last) {
                bail!("extra host {what:?} at .{last}: that address is taken or reserved");
            }
        }
        remove_stale(prefix);
        let pid = std::process::id();
        // Several networks of one process (tests run in parallel) each get
        // names of their own.
        let seq = NEXT_NET.fetch_add(1, Ordering::Relaxed);
        let name = |what: &str| format!("{prefix}{pid}-{seq}-{what}");
        let addr = |last: u8| Ipv4Addr::new(10, 213, subnet, last);
        let mut hosts: Vec<Host> = (1..=nodes)
            .map(|i| Host {
                name: i.to_string(),
                ns: name(&format!("n{i}")),
                ip: addr(i as u8),
            })
            .collect();
        hosts.extend(extra.iter().map(|&(what, last)| Host {
            name: what.to_string(),
            ns: name(what),
            ip: addr(last),
        }));
        hosts.push(Host {
            name: CLIENT.to_string(),
            ns: name(CLIENT),
            ip: addr(CLIENT_OCTET),
        });
        let bridge_ns = name("br");
        let all_ns: HashSet<&str> = hosts
            .iter()
            .map(|h| h.ns.as_str())
            .chain([bridge_ns.as_str()])
            .collect();
        if all_ns.len() != hosts.len() + 1 {
            bail!("two hosts would share a namespace name: rename the extra hosts");
        }
        let mut net = Net {
            namespaces: Vec::new(),
            bridge_ns,
            node_ns: hosts[..nodes].iter().map(|h| h.ns.clone()).collect(),
            node_ips: hosts[..nodes].iter().map(|h| h.ip).collect(),
            client_ns: name(CLIENT),
            hosts,
            subnet,
        };
        // From here on, an error drops `net`, which deletes what exists.
        ip(&["netns", "add", &net.bridge_ns])?;
        net.namespaces.push(net.bridge_ns.clone());
        let b = net.bridge_ns.clone();
        ip(&["-n", &b, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &b, "link", "set", "br0", "up"])?;
        // Nodes first: node N is on bridge port v{N-1}.
        let leaves: Vec<(String, Ipv4Addr)> =
            net.hosts.iter().map(|h| (h.ns.clone(), h.ip)).collect();
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

    fn find(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Every host's name, in bridge-port order: "1", "2", … (the nodes),
    /// the extra hosts, [`CLIENT`].
    pub fn host_names(&self) -> impl Iterator<Item = &str> {
        self.hosts.iter().map(|h| h.name.as_str())
    }

    /// The namespace and address of host `name` (a node "1", "2", …, an
    /// extra host, or [`CLIENT`]).
    pub fn host(&self, name: &str) -> Option<(&str, Ipv4Addr)> {
        self.find(name).map(|h| (h.ns.as_str(), h.ip))
    }

    /// The address of host `name` (a node "1", "2", …, an extra host, or
    /// [`CLIENT`]).
    pub fn host_ip(&self, name: &str) -> Option<Ipv4Addr> {
        self.find(name).map(|h| h.ip)
    }

    /// The namespace of host `name` (a node "1", "2", …, an extra host, or
    /// [`CLIENT`]).
    pub fn host_ns(&self, name: &str) -> Option<&str> {
        self.find(name).map(|h| h.ns.as_str())
    }

    /// Where the namespace of host `name` is mounted (for [`in_netns`],
    /// [`spawn_in`], [`enter_netns_at`]).
    pub fn host_path(&self, name: &str) -> Option<PathBuf> {
        self.host_ns(name).map(Self::path)
    }

    /// Every process inside host `name`'s namespace now (a node's
    /// follower, its server, a server its follower restored, and their
    /// children): what a whole host's crash or pause reaches.
    pub fn pids_in(&self, name: &str) -> Result<Vec<u32>> {
        use std::os::unix::fs::MetadataExt;
        let path = self
            .host_path(name)
            .ok_or_else(|| anyhow!("no host {name:?} in this network"))?;
        let ino = std::fs::metadata(&path)
            .with_context(|| format!("{}", path.display()))?
            .ino();
        // /proc/PID/ns/net reads `net:[INODE]`, the namespace's inode.
        let want = format!("net:[{ino}]");
        Ok(std::fs::read_dir("/proc")
            .context("/proc")?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/net"))
                    .is_ok_and(|l| l.as_os_str() == want.as_str())
            })
            .collect())
    }

    /// Sends `signal` to every process inside host `name`'s namespace;
    /// returns how many it reached.
    pub fn signal_all(&self, name: &str, signal: nix::sys::signal::Signal) -> Result<usize> {
        let pids = self.pids_in(name)?;
        for &pid in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
        }
        Ok(pids.len())
    }

    /// Where namespace `ns` is mounted.
    pub fn path(ns: &str) -> PathBuf {
        PathBuf::from("/var/run/netns").join(ns)
    }

    /// Where node `id`'s namespace is mounted.
    ///
    /// # Panics
    ///
    /// If `id` is not a node of this network (see [`Net::host_path`]).
    pub fn node_path(&self, id: u64) -> PathBuf {
        self.host_path(&id.to_string())
            .unwrap_or_else(|| panic!("no node {id} in this network"))
    }

    /// Takes node `id`'s link (its port on the bridge) down or up: down,
    /// it reaches no other host and no host reaches it.
    pub fn link(&self, id: u64, up: bool) -> Result<()> {
        if id == 0 || id as usize > self.node_ns.len() {
            bail!("no node {id} in this network");
        }
        let port = format!("v{}", id - 1);
        ip(&[
            "-n",
            &self.bridge_ns,
            "link",
            "set",
            &port,
            if up { "up" } else { "down" },
        ])
    }

    /// Cuts the hosts of each group off from the hosts of every other
    /// group, both ways; hosts in no group still reach everyone, and the
    /// hosts of one group still reach each other. Hosts are named as in
    /// [`Net::host_ip`]: `partition(&[&["1"], &["zk"]])` isolates node 1
    /// from ZooKeeper only; `partition(&[&["1"], &["2", "3", "zk",
    /// "client"]])` isolates node 1 from everyone.
    ///
    /// Cuts add up until [`Net::heal`]; repeating one is harmless. An
    /// unknown host, or one named twice, is an error and changes nothing;
    /// an `ip` that fails midway may leave part of the cuts in place
    /// ([`Net::heal`] removes them).
    ///
    /// The bridge and links are not touched: each host gets a route for
    /// each address it must not reach, inside its own namespace.
    pub fn partition(&self, groups: &[&[&str]]) -> Result<()> {
        let mut seen = HashSet::new();
        let mut resolved: Vec<Vec<&Host>> = Vec::with_capacity(groups.len());
        for group in groups {
            let mut hosts = Vec::with_capacity(group.len());
            for &name in *group {
                let host = self.find(name).ok_or_else(|| {
                    anyhow!(
                        "partition: no host {name:?} in this network (hosts: {})",
                        self.host_names().collect::<Vec<_>>().join(", ")
                    )
                })?;
                if !seen.insert(name) {
                    bail!("partition: host {name:?} is named twice");
                }
                hosts.push(host);
            }
            resolved.push(hosts);
        }
        // Why `blackhole`: a packet routed there is discarded without a
        // word on the wire, as on a real partition where packets just
        // vanish. `prohibit` (or `unreachable`) would make the kernel
        // answer forwarded packets with ICMP errors and reads like a
        // firewall, not a lost network. Both ends of every cut get the
        // route, so nothing crosses either way: the peer's SYNs and
        // segments go unanswered, and established TCP connections see only
        // loss (they retransmit, and resume after `heal` unless they time
        // out first). What no route can hide: the kernel refuses to send a
        // host's own new packets into a blackhole, so its new connect() or
        // sendto() towards a cut-off peer fails at once with EINVAL
        // (`prohibit`: EACCES) rather than timing out.
        let mut routes: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (i, group) in resolved.iter().enumerate() {
            for other in &resolved[i + 1..] {
                for a in group {
                    for b in other {
                        for (from, to) in [(a, b), (b, a)] {
                            routes
                                .entry(from.ns.as_str())
                                .or_default()
                                .push(format!("route replace blackhole {}/32", to.ip));
                        }
                    }
                }
            }
        }
        for (ns, commands) in &routes {
            ip_batch(ns, commands).context("partition")?;
        }
        Ok(())
    }

    /// Removes every cut of [`Net::partition`]: each host reaches every
    /// other again (a link taken down by [`Net::link`] stays down).
    pub fn heal(&self) -> Result<()> {
        for host in &self.hosts {
            let shown = ip_output(&["-n", &host.ns, "-4", "route", "show", "type", "blackhole"])
                .context("heal")?;
            let commands: Vec<String> = shown
                .lines()
                .filter_map(|l| {
                    // Lines read "blackhole 10.213.S.H" (no /32).
                    let a = l.strip_prefix("blackhole ")?.split_whitespace().next()?;
                    a.parse::<Ipv4Addr>().ok().filter(|a| self.in_subnet(*a))
                })
                .map(|a| format!("route del blackhole {a}/32"))
                .collect();
            ip_batch(&host.ns, &commands).context("heal")?;
        }
        Ok(())
    }

    /// Whether `a` is in this network's 10.213.`subnet`.0/24.
    fn in_subnet(&self, a: Ipv4Addr) -> bool {
        let [x, y, z, _] = a.octets();
        (x, y, z) == (10, 213, self.subnet)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                log::warn!("network namespace cleanup: {e:#}");
            }
        }
    }
}

/// Deletes namespaces named `<prefix><pid>-…` left behind by runs that were
/// killed before their cleanup ran (their pid is gone).
fn remove_stale(prefix: &str) {
    let Ok(list) = ip_output(&["netns", "list"]) else {
        return;
    };
    for line in list.lines() {
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

/// Opens the namespace mounted at `path`.
fn open_netns(path: &Path) -> Result<File> {
    File::open(path).with_context(|| format!("open network namespace {}", path.display()))
}

/// Makes the calling thread enter the namespace at `path`.
pub fn enter_netns_at(path: &Path) -> Result<()> {
    let ns = open_netns(path)?;
    enter_netns(ns.as_raw_fd()).with_context(|| format!("setns {}", path.display()))
}

/// A thread started by [`in_netns`], inside its namespace.
#[derive(Debug)]
pub struct NetnsThread<T> {
    /// None only when the thread could not enter the namespace, and then
    /// [`in_netns`] returned an error instead of this.
    handle: JoinHandle<Option<T>>,
}

impl<T> NetnsThread<T> {
    /// Waits for the thread; Err with the panic's payload if it panicked
    /// (as [`JoinHandle::join`]).
    pub fn join(self) -> std::thread::Result<T> {
        self.handle
            .join()
            .map(|v| v.expect("in_netns hands out only threads that entered their namespace"))
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

/// Runs `f` on a new thread inside the network namespace at `path`
/// (sockets it opens stay in that namespace wherever they are used
/// later). Returns once the thread is inside; Err, without running `f`, if
/// it cannot get there.
pub fn in_netns<T: Send + 'static>(
    path: impl AsRef<Path>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<NetnsThread<T>> {
    let path = path.as_ref();
    let ns = open_netns(path)?;
    let (entered_tx, entered_rx) = mpsc::sync_channel(1);
    let handle = std::thread::Builder::new()
        .spawn(move || {
            let entered = enter_netns(ns.as_raw_fd());
            drop(ns);
            let ok = entered.is_ok();
            let _ = entered_tx.send(entered);
            ok.then(f)
        })
        .context("spawn a thread")?;
    match entered_rx.recv() {
        Ok(Ok(())) => Ok(NetnsThread { handle }),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e).with_context(|| format!("setns {}", path.display()))
        }
        Err(_) => {
            let _ = handle.join();
            bail!("the thread for {} ended before entering it", path.display())
        }
    }
}

/// Spawns `cmd` so that it enters the namespace at `path` between fork and
/// exec. Spawn `cmd` only this once: the namespace it enters is set for
/// this spawn.
pub fn spawn_in(path: &Path, cmd: &mut Command) -> Result<Child> {
    let ns = open_netns(path)?;
    let fd = ns.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only
    // calls setns(2), which is async-signal-safe; `ns` outlives the spawn.
    unsafe {
        cmd.pre_exec(move || enter_netns(fd));
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("spawn {:?} in {}", cmd.get_program(), path.display()));
    drop(ns);
    child
}

/// Tears a cluster in namespaces down: kills and reaps `children`, removes
/// the cluster's region files, and removes `dir` unless the calling thread
/// is panicking (a failing test's logs are the evidence).
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

/// The config of a tcp cluster with one node per namespace of `net` (node
/// N at its namespace's address, serving on [`APP_PORT`], controlled on
/// [`CONTROL_PORT`]), data in `dir`/data, a static leader 1 (the caller
/// may change the election), a fixed test `key`, and then `lines` (TOML
/// `key = value` lines, e.g. the commit mode `commit = "input"`, or the
/// cluster's own `key`), which override those settings.
pub fn netns_spec(name: &str, dir: &Path, net: &Net, lines: &str) -> ClusterSpec {
    let ips: Vec<IpAddr> = net.node_ips.iter().map(|a| IpAddr::V4(*a)).collect();
    ClusterSpec::new(name, &dir.join("data"))
        .set("transport", "tcp")
        .set("ring_size", "8MiB")
        .set("backup_clients", "allow")
        .set("key", "test-cluster-key-0123456789")
        .set_lines(lines)
        .nodes_at(&ips, APP_PORT, CONTROL_PORT)
}
