//! `lockstep status`: asks every node's follower over its control channel,
//! and says whether the cluster can take writes (a leader with a live
//! majority).

use std::io::ErrorKind;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use lockstep_common::control::{self, NodeStatus};
use lockstep_common::Config;
use serde_json::json;

/// One node as seen from the CLI: its status, or why it is down.
pub struct NodeView {
    /// Node id.
    pub id: u64,
    /// Status when reachable; otherwise why not, in words.
    pub status: Result<NodeStatus, String>,
}

/// Asks node `id` for its status.
pub fn query(config: &Config, id: u64, timeout: Duration) -> Result<NodeStatus, String> {
    control::query_status(config, id, timeout)
}

/// Why node `id` did not answer (`error` is what the query said): a
/// follower that is not running reads as such, not as a refused handshake.
fn why_down(config: &Config, id: u64, error: String, timeout: Duration) -> String {
    let Ok(node) = config.node(id) else {
        return error;
    };
    match TcpStream::connect_timeout(&node.control, timeout) {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => format!(
            "the follower is not running (nothing listens on {})",
            node.control
        ),
        Err(e) => format!("the follower at {} is unreachable: {e}", node.control),
        Ok(_) if error.contains("timed out") || error.contains("temporarily unavailable") => {
            format!(
                "the follower at {} is slow: it accepts connections but did not answer within {timeout:?} ({error})",
                node.control
            )
        }
        Ok(_) => format!("the follower at {} answers, but: {error}", node.control),
    }
}

/// Whether a node that did not answer (`error` from [`query_all`]) is only
/// slow (its follower accepts connections: a loaded machine), not down.
pub fn is_slow(error: &str) -> bool {
    error.contains(" is slow: ")
}

/// `down` or `slow` for a node that did not answer.
pub fn unanswered_role(error: &str) -> &'static str {
    if is_slow(error) {
        "slow"
    } else {
        "down"
    }
}

/// Status of every node.
pub fn query_all(config: &Config, timeout: Duration) -> Vec<NodeView> {
    config
        .ids()
        .map(|id| NodeView {
            id,
            status: query(config, id, timeout).map_err(|e| why_down(config, id, e, timeout)),
        })
        .collect()
}

/// Nodes where something serves clients on the node's app address while no
/// server is attached to the node's region: a server started without the
/// preload (or with a relative `LD_PRELOAD` that `ld.so` ignored), whose
/// clients nothing replicates. Each with one line saying so. A preloaded
/// server waiting for its follower is not one: it refuses each client at
/// once (a refusal line, then the end of the connection), where a plain
/// server keeps a silent connection open.
pub fn unreplicated_servers(config: &Config, nodes: &[NodeView]) -> Vec<(u64, String)> {
    nodes
        .iter()
        // Not a node whose server is attached and applying (a backup's
        // server may let guests in by choice: `backup_clients = "allow"`).
        .filter(|n| {
            n.status
                .as_ref()
                .map_or(true, |s| s.server_pid == 0 || s.stale_reason.is_some())
        })
        .filter_map(|n| {
            let app = config.node(n.id).ok()?.app;
            serves_silently(app).then(|| {
                (
                    n.id,
                    format!(
                        "node {}: something serves clients on its app address {app} but no server is attached to its region: its clients are NOT replicated (a server started without the preload, or with a relative LD_PRELOAD path ld.so ignored); stop it and start it with `lockstep run --config … --node {}`",
                        n.id, n.id
                    ),
                )
            })
        })
        .collect()
}

/// Whether a connection to `app` is accepted and then kept open, silent,
/// for a moment (a plain server waiting for a request).
fn serves_silently(app: std::net::SocketAddr) -> bool {
    use std::io::Read;
    let Ok(mut s) = TcpStream::connect_timeout(&app, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

/// The JSON of [`to_json`] with the nodes of [`unreplicated_servers`]
/// marked (`unreplicated_server`) and the cluster not healthy.
pub fn mark_unreplicated(json: &mut serde_json::Value, found: &[(u64, String)]) {
    if found.is_empty() {
        return;
    }
    if let Some(list) = json["nodes"].as_array_mut() {
        for n in list {
            let id = n["node"].as_u64().unwrap_or(0);
            if let Some((_, why)) = found.iter().find(|(i, _)| *i == id) {
                n["unreplicated_server"] = json!(why);
            }
        }
    }
    json["healthy"] = json!(false);
    let lines: Vec<&str> = found.iter().map(|(_, w)| w.as_str()).collect();
    json["problem"] = json!(lines.join("; "));
}

/// The view and leader the reachable nodes agree on (highest view wins).
pub fn cluster_view(nodes: &[NodeView]) -> (u64, u64) {
    nodes
        .iter()
        .filter_map(|n| n.status.as_ref().ok())
        .map(|s| (s.view, s.leader))
        .max()
        .unwrap_or((0, 0))
}

/// Whether the cluster is ok: it can take writes (a leader that answers,
/// leads the newest view any node is in, and sees a majority of the nodes,
/// itself included, answering as members of that view) and no node is
/// degraded (its log past `snapshot_degraded_after`). `Err` says what is
/// missing, and that ZooKeeper is unreachable when nodes say so.
pub fn health(config: &Config, nodes: &[NodeView]) -> Result<(), String> {
    writable(config, nodes)?;
    match degraded_nodes(nodes).as_slice() {
        [] => Ok(()),
        ids => Err(format!(
            "{} degraded: snapshots do not keep {} log short (see each node's line)",
            node_list(ids),
            if ids.len() == 1 { "its" } else { "their" }
        )),
    }
}

/// Whether the cluster can take writes (see [`health`]; degraded nodes
/// aside).
pub fn writable(config: &Config, nodes: &[NodeView]) -> Result<(), String> {
    commit_path(config, nodes).map_err(|why| match zookeeper_problem(config, nodes) {
        Some(zk) => format!("{why}; {zk}"),
        None => why,
    })
}

/// The answering nodes that say they are degraded.
pub fn degraded_nodes(nodes: &[NodeView]) -> Vec<u64> {
    nodes
        .iter()
        .filter_map(|n| n.status.as_ref().ok())
        .filter(|s| s.degraded.is_some())
        .map(|s| s.node)
        .collect()
}

/// `node 2` or `nodes 2, 3`.
fn node_list(ids: &[u64]) -> String {
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    format!(
        "node{} {}",
        if ids.len() == 1 { "" } else { "s" },
        list.join(", ")
    )
}

/// A node's snapshots failing, in one line: `snapshots failing since
/// HH:MM:SS UTC (N s, K attempts): REASON; log N entries, M MiB; fix: …`.
pub fn snapshot_failing_line(s: &NodeStatus) -> Option<String> {
    let f = s.snapshot_failing.as_ref()?;
    let attempts = if f.failures == 0 {
        "none can be taken".to_string()
    } else {
        format!(
            "{} failed attempt{}",
            f.failures,
            if f.failures == 1 { "" } else { "s" }
        )
    };
    Some(format!(
        "snapshots failing since {} UTC ({} s, {attempts}): {}; log {} entries, {:.1} MiB; fix: {}",
        utc_clock(Duration::from_millis(f.for_ms)),
        f.for_ms / 1000,
        f.reason,
        s.log_entries,
        s.log_bytes as f64 / (1 << 20) as f64,
        f.fix
    ))
}

/// `HH:MM:SS` (UTC) of a moment `ago` before now.
pub fn utc_clock(ago: Duration) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let t = now.saturating_sub(ago).as_secs() % 86_400;
    format!("{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
}

/// What the answering nodes say of ZooKeeper, when some have no session:
/// `ZooKeeper unreachable at ADDR since HH:MM:SS UTC (N s; nodes 1, 2)`.
pub fn zookeeper_problem(config: &Config, nodes: &[NodeView]) -> Option<String> {
    let down: Vec<(u64, u64)> = nodes
        .iter()
        .filter_map(|n| n.status.as_ref().ok())
        .filter_map(|s| s.zookeeper_down_ms.map(|ms| (s.node, ms)))
        .collect();
    let longest = down.iter().map(|d| d.1).max()?;
    let ids: Vec<String> = down.iter().map(|d| d.0.to_string()).collect();
    Some(format!(
        "ZooKeeper unreachable at {} since {} UTC ({} s; node{} {}): no failover until it is back",
        config.election.zookeeper,
        utc_clock(Duration::from_millis(longest)),
        longest / 1000,
        if ids.len() == 1 { "" } else { "s" },
        ids.join(", ")
    ))
}

fn commit_path(config: &Config, nodes: &[NodeView]) -> Result<(), String> {
    let (view, leader) = cluster_view(nodes);
    if nodes.iter().all(|n| n.status.is_err()) {
        return Err("no node answers".into());
    }
    if leader == 0 {
        return Err(format!(
            "no leader in view {view} (a view change may be under way)"
        ));
    }
    let Some(l) = nodes.iter().find(|n| n.id == leader) else {
        return Err(format!("leader {leader} is not in the config"));
    };
    match &l.status {
        Err(_) => {
            return Err(format!(
                "node {leader}, leader of view {view}, does not answer"
            ))
        }
        Ok(s) if s.role != "leader" || s.view != view => {
            return Err(format!(
                "node {leader} is named leader of view {view} but is {} in view {}",
                s.role, s.view
            ))
        }
        Ok(s) if s.commit_wait_ms >= config.election.session_timeout_ms => {
            return Err(format!(
            "node {leader} leads view {view}, but no majority acknowledged its entries for {} ms",
            s.commit_wait_ms
        ))
        }
        Ok(_) => {}
    }
    let live = nodes
        .iter()
        .filter_map(|n| n.status.as_ref().ok())
        .filter(|s| {
            s.view == view
                && s.leader == leader
                && matches!(s.role.as_str(), "leader" | "backup" | "catching-up")
        })
        .count();
    let majority = config.majority();
    if live < majority {
        return Err(format!(
            "only {live} of {} nodes are live members of view {view}; a majority is {majority}",
            config.nodes.len()
        ));
    }
    Ok(())
}

/// A catching-up node's progress: entries left, apply rate and ETA.
pub fn catching_up_line(s: &NodeStatus) -> String {
    let left = s.committed.saturating_sub(s.applied);
    if s.apply_rate == 0 {
        format!("catching up: {left} entries left to apply (no rate measured yet); `backup` once within max_apply_lag")
    } else {
        format!(
            "catching up: {left} entries left to apply at {} entries/s, about {:.1} s; `backup` once within max_apply_lag",
            s.apply_rate,
            s.lag_ms as f64 / 1000.0
        )
    }
}

/// How to bring node `id` back by hand.
fn start_hint(config_path: &Path, id: u64) -> String {
    format!(
        "start its follower (`lockstep-follower --config {} --node {id}`) and then its server under the preload, or let a running `lockstep up` restart it",
        config_path.display()
    )
}

/// The stable JSON shape scripts rely on: `view`, `leader`, `leader_app`,
/// `healthy`, `nodes` (each with `app`).
pub fn to_json(config: &Config, config_path: &Path, nodes: &[NodeView]) -> serde_json::Value {
    let (view, leader) = cluster_view(nodes);
    let app = |id: u64| config.node(id).ok().map(|n| n.app.to_string());
    let health = health(config, nodes);
    // Named only while it can commit: a client sent there would wait.
    let leader = if writable(config, nodes).is_ok() {
        leader
    } else {
        0
    };
    let list: Vec<serde_json::Value> = nodes
        .iter()
        .map(|n| match &n.status {
            Ok(s) => json!({
                "node": n.id, "up": true, "app": app(n.id), "role": s.role, "view": s.view,
                "leader": s.leader, "persisted": s.persisted, "committed": s.committed,
                "applied": s.applied, "lag": s.committed.saturating_sub(s.applied),
                "lag_seconds": s.lag_ms as f64 / 1000.0,
                "divergences": s.divergences, "server_pid": s.server_pid,
                "stale_reason": s.stale_reason, "apply_rate": s.apply_rate,
                "failover_backlog": s.failover_backlog,
                "zookeeper_down_ms": s.zookeeper_down_ms,
                "commit_wait_ms": s.commit_wait_ms,
                "snapshot": s.snapshot, "snapshot_bytes": s.snapshot_bytes,
                "bytes_since_snapshot": s.bytes_since_snapshot,
                "oldest": s.oldest, "snapshotting": s.snapshotting,
                "log_entries": s.log_entries, "log_bytes": s.log_bytes,
                "snapshot_failing": snapshot_failing_line(s),
                "snapshot_failures": s.snapshot_failing.as_ref().map(|f| f.failures),
                "degraded": s.degraded,
            }),
            Err(e) => json!({
                "node": n.id, "up": false, "app": app(n.id), "role": unanswered_role(e), "error": e,
                "hint": start_hint(config_path, n.id),
            }),
        })
        .collect();
    json!({
        "cluster": config.cluster,
        "view": view,
        "leader": leader,
        "leader_app": if leader == 0 { None } else { app(leader) },
        "healthy": health.is_ok(),
        "problem": health.err(),
        "zookeeper_problem": zookeeper_problem(config, nodes),
        "degraded": degraded_nodes(nodes),
        "nodes": list,
    })
}

/// A compact table for people, then a line per node that needs a hand,
/// then whether the cluster takes writes.
pub fn to_table(config: &Config, config_path: &Path, nodes: &[NodeView]) -> String {
    let (view, leader) = cluster_view(nodes);
    let mut out = format!("cluster {}  view {view}  leader {leader}\n", config.cluster);
    out.push_str(&format!(
        "{:>4}  {:<11} {:>5} {:>10} {:>10} {:>10} {:>6} {:>7} {:>5}  {}\n",
        "node", "role", "view", "persisted", "committed", "applied", "lag", "lag s", "div", "app"
    ));
    for n in nodes {
        let app = config
            .node(n.id)
            .map(|x| x.app.to_string())
            .unwrap_or_default();
        match &n.status {
            Ok(s) => out.push_str(&format!(
                "{:>4}  {:<11} {:>5} {:>10} {:>10} {:>10} {:>6} {:>7.3} {:>5}  {}\n",
                n.id,
                s.role,
                s.view,
                s.persisted,
                s.committed,
                s.applied,
                s.committed.saturating_sub(s.applied),
                s.lag_ms as f64 / 1000.0,
                s.divergences,
                app
            )),
            Err(e) => out.push_str(&format!(
                "{:>4}  {:<11} {:>5} {:>10} {:>10} {:>10} {:>6} {:>5}  {app}\n",
                n.id,
                unanswered_role(e),
                "-",
                "-",
                "-",
                "-",
                "-",
                "-"
            )),
        }
    }
    for n in nodes {
        match &n.status {
            Err(e) if is_slow(e) => out.push_str(&format!("node {} is slow: {e}\n", n.id)),
            Err(e) => out.push_str(&format!(
                "node {} is down: {e}; {}\n",
                n.id,
                start_hint(config_path, n.id)
            )),
            Ok(NodeStatus {
                stale_reason: Some(why),
                ..
            }) => out.push_str(&format!(
                "node {} is stale: {why}; restart its server and follower\n",
                n.id
            )),
            Ok(s) if s.server_pid == 0 => out.push_str(&format!(
                "node {}: no server is attached; start its server: `lockstep run --config {} --node {}`\n",
                n.id,
                config_path.display(),
                n.id
            )),
            Ok(s) if s.role == "catching-up" => {
                out.push_str(&format!("node {}: {}\n", n.id, catching_up_line(s)))
            }
            Ok(NodeStatus {
                failover_backlog: Some(why),
                ..
            }) => out.push_str(&format!("node {} leads: {why}\n", n.id)),
            Ok(_) => {}
        }
        if let Ok(s) = &n.status {
            if let Some(line) = snapshot_failing_line(s) {
                out.push_str(&format!("node {}: {line}\n", n.id));
            }
            if let Some(why) = &s.degraded {
                out.push_str(&format!("node {} is degraded: {why}\n", n.id));
            }
        }
    }
    match health(config, nodes) {
        Err(why) if writable(config, nodes).is_ok() => out.push_str(&format!(
            "DEGRADED: node {leader} leads view {view} with a live majority (clients write to {}), but {why}\n",
            config
                .node(leader)
                .map(|n| n.app.to_string())
                .unwrap_or_default()
        )),
        Ok(()) => {
            out.push_str(&format!(
                "ok: node {leader} leads view {view} with a live majority; clients write to {}\n",
                config
                    .node(leader)
                    .map(|n| n.app.to_string())
                    .unwrap_or_default()
            ));
            if let Some(zk) = zookeeper_problem(config, nodes) {
                out.push_str(&format!("warning: {zk}\n"));
            }
        }
        Err(why) => out.push_str(&format!("NOT OK: no leader with a live majority: {why}\n")),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockstep_testkit::config_fixture::ThreeNodeConfig;

    /// Three nodes, no options.
    fn config_text() -> String {
        ThreeNodeConfig::new("cluster = \"t\"\ndata_dir = \"/tmp/lockstep-status-test\"\n").text()
    }

    fn up(id: u64, role: &str, view: u64, leader: u64) -> NodeView {
        NodeView {
            id,
            status: Ok(NodeStatus {
                node: id,
                view,
                leader,
                role: role.into(),
                stale_reason: None,
                persisted: 10,
                committed: 10,
                applied: 10,
                divergences: 0,
                server_pid: 100 + id,
                follower_pid: 200 + id,
                ..NodeStatus::default()
            }),
        }
    }

    fn down(id: u64) -> NodeView {
        NodeView {
            id,
            status: Err("the follower is not running (nothing listens on 127.0.0.1:7103)".into()),
        }
    }

    #[test]
    fn a_leader_with_a_majority_is_healthy() {
        let c = Config::parse(&config_text()).unwrap();
        let nodes = [up(1, "leader", 2, 1), up(2, "backup", 2, 1), down(3)];
        assert_eq!(health(&c, &nodes), Ok(()));
        let j = to_json(&c, Path::new("c.toml"), &nodes);
        assert_eq!(j["healthy"], true);
        assert_eq!(j["leader_app"], "127.0.0.1:7001");
        assert_eq!(j["nodes"][2]["app"], "127.0.0.1:7003");
        assert_eq!(j["nodes"][2]["role"], "down");
        let t = to_table(&c, Path::new("c.toml"), &nodes);
        assert!(
            t.contains("node 3 is down: the follower is not running"),
            "{t}"
        );
        assert!(
            t.contains("lockstep-follower --config c.toml --node 3"),
            "{t}"
        );
        assert!(t.contains("ok: node 1 leads view 2"), "{t}");
        assert!(!t.contains("handshake"), "{t}");
    }

    #[test]
    fn a_catching_up_node_and_a_growing_failover_backlog_are_shown() {
        let c = Config::parse(&config_text()).unwrap();
        let mut leader = up(1, "leader", 2, 1);
        if let Ok(s) = &mut leader.status {
            s.failover_backlog = Some("only 1 of 3 nodes can apply (nodes 2, 3 have …)".into());
        }
        let mut rejoining = up(2, "catching-up", 2, 1);
        if let Ok(s) = &mut rejoining.status {
            (s.committed, s.applied, s.apply_rate, s.lag_ms) = (150_000, 30_000, 120_000, 1000);
        }
        let nodes = [leader, rejoining, up(3, "backup", 2, 1)];
        // A catching-up node acks: it is a live member, not a healthy backup.
        assert_eq!(health(&c, &nodes), Ok(()));
        let t = to_table(&c, Path::new("c.toml"), &nodes);
        assert!(
            t.contains("node 2: catching up: 120000 entries left to apply at 120000 entries/s, about 1.0 s"),
            "{t}"
        );
        assert!(
            t.contains("node 1 leads: only 1 of 3 nodes can apply"),
            "{t}"
        );
        let j = to_json(&c, Path::new("c.toml"), &nodes);
        assert_eq!(j["nodes"][1]["role"], "catching-up");
        assert_eq!(j["nodes"][1]["lag"], 120_000);
        assert_eq!(j["nodes"][1]["apply_rate"], 120_000);
        assert_eq!(j["nodes"][1]["lag_seconds"], 1.0);
        assert!(j["nodes"][0]["failover_backlog"]
            .as_str()
            .is_some_and(|w| w.starts_with("only 1 of 3")));
        assert!(j["nodes"][2]["failover_backlog"].is_null());
    }

    #[test]
    fn failing_snapshots_are_said_and_a_degraded_node_makes_the_cluster_not_ok() {
        let c = Config::parse(&config_text()).unwrap();
        let mut failing = up(2, "backup", 2, 1);
        if let Ok(s) = &mut failing.status {
            s.snapshot_failing = Some(lockstep_common::control::SnapshotFailing {
                for_ms: 90_000,
                failures: 7,
                last_ms: 100,
                reason: "criu dump failed (exit status: 1): Error: forced".into(),
                fix: "see the CRIU log".into(),
            });
            (s.log_entries, s.log_bytes) = (9000, 3 << 20);
        }
        let nodes = [up(1, "leader", 2, 1), failing, up(3, "backup", 2, 1)];
        // Within the bound: said, still ok.
        assert_eq!(health(&c, &nodes), Ok(()));
        let t = to_table(&c, Path::new("c.toml"), &nodes);
        assert!(
            t.contains("node 2: snapshots failing since ")
                && t.contains("(90 s, 7 failed attempts): criu dump failed")
                && t.contains("log 9000 entries, 3.0 MiB; fix: see the CRIU log"),
            "{t}"
        );
        assert!(t.contains("ok: node 1 leads view 2"), "{t}");
        let mut nodes = nodes;
        if let Ok(s) = &mut nodes[1].status {
            s.degraded = Some("its log holds 9000 entries".into());
        }
        let why = health(&c, &nodes).unwrap_err();
        assert!(why.contains("node 2 degraded"), "{why}");
        let t = to_table(&c, Path::new("c.toml"), &nodes);
        assert!(
            t.contains("node 2 is degraded: its log holds 9000 entries"),
            "{t}"
        );
        assert!(
            t.contains("DEGRADED: node 1 leads view 2 with a live majority"),
            "{t}"
        );
        let j = to_json(&c, Path::new("c.toml"), &nodes);
        assert_eq!(j["healthy"], false, "{j}");
        assert_eq!(j["leader"], 1, "still writable: {j}");
        assert_eq!(j["degraded"], serde_json::json!([2]), "{j}");
        assert_eq!(j["nodes"][1]["snapshot_failures"], 7, "{j}");
        assert!(j["nodes"][1]["snapshot_failing"]
            .as_str()
            .is_some_and(|l| l.contains("Error: forced")));
        assert!(j["nodes"][0]["degraded"].is_null(), "{j}");
    }

    #[test]
    fn no_majority_no_leader_or_all_down_is_not() {
        let c = Config::parse(&config_text()).unwrap();
        let alone = [up(1, "leader", 2, 1), down(2), down(3)];
        assert!(health(&c, &alone).unwrap_err().contains("only 1 of 3"));
        let mut stuck = [up(1, "leader", 2, 1), up(2, "backup", 2, 1), down(3)];
        if let Ok(s) = &mut stuck[0].status {
            s.commit_wait_ms = 5000;
        }
        assert!(health(&c, &stuck)
            .unwrap_err()
            .contains("no majority acknowledged its entries for 5000 ms"));
        let stale = [up(1, "leader", 2, 1), up(2, "stale", 2, 1), down(3)];
        assert!(health(&c, &stale).is_err());
        let leaderless = [
            up(1, "joining", 3, 0),
            up(2, "backup", 2, 1),
            up(3, "backup", 2, 1),
        ];
        assert!(health(&c, &leaderless)
            .unwrap_err()
            .contains("no leader in view 3"));
        let leader_down = [down(1), up(2, "backup", 2, 1), up(3, "backup", 2, 1)];
        assert!(health(&c, &leader_down)
            .unwrap_err()
            .contains("does not answer"));
        let none = [down(1), down(2), down(3)];
        assert_eq!(health(&c, &none).unwrap_err(), "no node answers");
        let j = to_json(&c, Path::new("c.toml"), &none);
        assert_eq!(j["healthy"], false);
        assert_eq!(j["leader"], 0);
        assert!(j["leader_app"].is_null());
        let t = to_table(&c, Path::new("c.toml"), &none);
        assert!(
            t.contains("NOT OK: no leader with a live majority: no node answers"),
            "{t}"
        );
    }

    #[test]
    fn no_commit_path_names_no_leader_and_zookeeper_away_is_said() {
        let c = Config::parse(&config_text()).unwrap();
        let mut alone = [up(1, "leader", 2, 1), down(2), down(3)];
        let j = to_json(&c, Path::new("c.toml"), &alone);
        assert_eq!(j["leader"], 0, "{j}");
        assert!(j["leader_app"].is_null(), "{j}");
        if let Ok(s) = &mut alone[0].status {
            s.zookeeper_down_ms = Some(65_000);
        }
        let why = health(&c, &alone).unwrap_err();
        assert!(why.contains("only 1 of 3"), "{why}");
        assert!(
            why.contains("ZooKeeper unreachable at 127.0.0.1:2181 since ")
                && why.contains("(65 s; node 1)"),
            "{why}"
        );
        // Serving without ZooKeeper: healthy, with a warning.
        let mut serving = [up(1, "leader", 2, 1), up(2, "backup", 2, 1), down(3)];
        for n in &mut serving {
            if let Ok(s) = &mut n.status {
                s.zookeeper_down_ms = Some(3_000);
            }
        }
        assert_eq!(health(&c, &serving), Ok(()));
        let t = to_table(&c, Path::new("c.toml"), &serving);
        assert!(t.contains("ok: node 1 leads view 2"), "{t}");
        assert!(
            t.contains("warning: ZooKeeper unreachable at 127.0.0.1:2181"),
            "{t}"
        );
        assert!(t.contains("nodes 1, 2"), "{t}");
    }
}
