//! Three nodes over the tcp transport, each node (its redis-server under the
//! preload and its lockstep-follower) inside its own network namespace that
//! this test creates. The namespaces are joined by veth pairs to a bridge
//! that lives in a fourth namespace of the test's own; the clients run in a
//! fifth. Every address is private and exists only inside these namespaces:
//! nothing is added to, or changed in, the namespace the test runs in.
//!
//! Without `ip` or CAP_NET_ADMIN the test fails, naming what is missing.

use lockstep_testkit::cluster;

use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cluster::{bin_dir, redis_digest, redis_mixed_workload, Resp, Value};
use lockstep_common::control::NodeStatus;
use lockstep_common::Config;
use lockstep_launcher::netns::{self, Net};

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(180);
const NODES: usize = 3;
/// Prefix of every namespace this file creates (`<prefix><pid>-…`).
const NS_PREFIX: &str = "lockstep-tcpns-";

/// Runs `f` on a thread inside namespace `ns` and returns its result; a
/// panic in `f` is re-raised here.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    match netns::in_netns(Net::path(ns), f)
        .expect("enter the namespace")
        .join()
    {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// The processes of the cluster, each started with `ip netns exec`; all
/// killed on drop (also when the test panics), and the region files and
/// (on success) the temp directory removed.
struct Procs {
    name: String,
    dir: PathBuf,
    config_path: PathBuf,
    node_ns: Vec<String>,
    children: Vec<Child>,
}

impl Procs {
    fn new(net: &Net) -> Procs {
        let name = format!("t{}-tcpns", std::process::id());
        let dir = std::env::temp_dir().join(format!("lockstep-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config_path = dir.join("cluster.toml");
        netns::netns_spec(&name, &dir, net, &cluster::commit_line())
            .write(&config_path)
            .unwrap();
        Procs {
            name,
            dir,
            config_path,
            node_ns: net.node_ns.clone(),
            children: Vec::new(),
        }
    }

    fn log(&self, what: &str, id: u64) -> File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{what}-{id}.log")))
            .unwrap()
    }

    /// `ip netns exec <node id's namespace> <program>` (ip execs the
    /// program, so the child is the program itself).
    fn in_node(&self, id: u64, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.node_ns[id as usize - 1], program]);
        c
    }

    fn start_follower(&mut self, id: u64) {
        let log = self.log("follower", id);
        let child = self
            .in_node(id, &bin_dir().join("lockstep-follower").to_string_lossy())
            .arg("--config")
            .arg(&self.config_path)
            .args(["--node", &id.to_string()])
            .env("LOCKSTEP_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn follower");
        self.children.push(child);
    }

    fn start_server(&mut self, id: u64, app: SocketAddr) {
        let data = self.dir.join(format!("server-{id}"));
        std::fs::create_dir_all(&data).unwrap();
        let log = self.log("server", id);
        let mut cmd = self.in_node(id, "redis-server");
        lockstep_launcher::commands::under_preload(
            &mut cmd,
            &bin_dir().join("liblockstep.so"),
            &self.config_path,
            id,
        );
        let child = cmd
            .args([
                "--port",
                &app.port().to_string(),
                "--bind",
                &app.ip().to_string(),
            ])
            // Clients come from another namespace (not loopback); every
            // address here is private to the test's namespaces.
            .args(["--protected-mode", "no"])
            .args(lockstep_common::config::REDIS_REPLICA_ARGS)
            .arg("--dir")
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn server");
        self.children.push(child);
    }

    /// The last lines of every log, for failure messages.
    fn logs(&self) -> String {
        lockstep_launcher::process::log_tails(&[&self.dir], 15)
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        netns::tear_down(
            self.children.iter_mut(),
            &self.name,
            self.node_ns.len() as u64,
            &self.dir,
        );
    }
}

/// Polls `cond` (run in the caller's namespace) until it holds; panics
/// with the logs after [`HANG`].
fn wait(procs_logs: &dyn Fn() -> String, what: &str, mut cond: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < HANG {
        match cond() {
            Ok(()) => return,
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "timed out waiting for {what} (last: {last})\n{}",
        procs_logs()
    );
}

fn status(config: &Config, id: u64) -> Result<NodeStatus, String> {
    lockstep_common::control::query_status(config, id, Duration::from_secs(5))
}

#[test]
fn tcp_transport_across_network_namespaces_leaves_identical_replicas() {
    let net = Net::required(NS_PREFIX, 77, NODES, &[]);
    let procs = Procs::new(&net);
    let client_ns = net.client_ns.clone();
    // Everything that talks to the cluster runs in the client namespace;
    // `procs` moves there too so that a panic kills the processes before
    // `net` deletes the namespaces.
    in_ns(&client_ns, move || run(procs));
    drop(net);
}

fn run(mut procs: Procs) {
    let config = Config::load(&procs.config_path).expect("config");
    let apps: Vec<SocketAddr> = config.nodes.iter().map(|n| n.app).collect();
    let logs = |p: &Procs| p.logs();
    for id in 1..=NODES as u64 {
        procs.start_follower(id);
        wait(
            &|| logs(&procs),
            &format!("follower {id} answering"),
            || status(&config, id).map(|_| ()),
        );
    }
    for id in 1..=NODES as u64 {
        let app = apps[id as usize - 1];
        procs.start_server(id, app);
        wait(
            &|| logs(&procs),
            &format!("server {id} listening and attached"),
            || {
                std::net::TcpStream::connect_timeout(&app, Duration::from_secs(1))
                    .map_err(|e| e.to_string())?;
                match status(&config, id)?.server_pid {
                    0 => Err("server not attached to its region".into()),
                    _ => Ok(()),
                }
            },
        );
    }
    wait(&|| logs(&procs), "node 1 leading", || {
        match status(&config, 1)?.role.as_str() {
            "leader" => Ok(()),
            r => Err(format!("node 1 is {r}")),
        }
    });

    let (threads, ops) = (8, 300);
    redis_mixed_workload(apps[0], threads, ops);

    wait(
        &|| logs(&procs),
        "every node applied the leader's log",
        || {
            let leader = status(&config, 1)?;
            for id in 1..=NODES as u64 {
                let s = status(&config, id)?;
                if s.persisted < leader.persisted || s.applied < leader.persisted {
                    return Err(format!(
                        "node {id}: persisted {} applied {} < leader's {}",
                        s.persisted, s.applied, leader.persisted
                    ));
                }
            }
            Ok(())
        },
    );

    let leader_digest = redis_digest(apps[0]);
    for (i, &app) in apps.iter().enumerate().skip(1) {
        assert_eq!(
            redis_digest(app),
            leader_digest,
            "node {} differs from the leader\n{}",
            i + 1,
            procs.logs()
        );
    }
    let pushes = threads as i64 * (0..ops).filter(|i| i % 7 < 2).count() as i64;
    for (i, &app) in apps.iter().enumerate() {
        let mut r = Resp::connect(app).unwrap();
        assert_eq!(
            r.cmd(&[b"LLEN", b"shared:list"]).unwrap(),
            Value::Int(pushes),
            "list length on node {}",
            i + 1
        );
    }
    for id in 1..=NODES as u64 {
        let s = status(&config, id).unwrap();
        assert_eq!(
            s.divergences,
            0,
            "node {id} saw divergences\n{}",
            procs.logs()
        );
        assert_eq!(
            s.role,
            if id == 1 { "leader" } else { "backup" },
            "node {id}"
        );
    }
    eprintln!(
        "tcp over namespaces: {} entries replicated to {} nodes, digest {leader_digest}",
        status(&config, 1).unwrap().persisted,
        NODES
    );
}
