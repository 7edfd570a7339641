//! `lockstep status`: asks every node's follower over its control channel.

use std::time::Duration;

use lockstep_common::control::{self, NodeStatus};
use lockstep_common::Config;
use serde_json::json;

/// One node as seen from the CLI: its status, or why it is down.
pub struct NodeView {
    /// Node id.
    pub id: u64,
    /// Status when reachable.
    pub status: Result<NodeStatus, String>,
}

/// Asks node `id` for its status.
pub fn query(config: &Config, id: u64, timeout: Duration) -> Result<NodeStatus, String> {
    control::query_status(config, id, timeout)
}

/// Status of every node.
pub fn query_all(config: &Config, timeout: Duration) -> Vec<NodeView> {
    config
        .ids()
        .map(|id| NodeView {
            id,
            status: query(config, id, timeout),
        })
        .collect()
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

/// The stable JSON shape scripts rely on: `view`, `leader`, `nodes`.
pub fn to_json(config: &Config, nodes: &[NodeView]) -> serde_json::Value {
    let (view, leader) = cluster_view(nodes);
    let list: Vec<serde_json::Value> = nodes
        .iter()
        .map(|n| match &n.status {
            Ok(s) => json!({
                "node": n.id, "up": true, "role": s.role, "view": s.view, "leader": s.leader,
                "persisted": s.persisted, "committed": s.committed, "applied": s.applied,
                "lag": s.committed.saturating_sub(s.applied), "divergences": s.divergences,
                "server_pid": s.server_pid, "stale_reason": s.stale_reason,
            }),
            Err(e) => json!({ "node": n.id, "up": false, "role": "down", "error": e }),
        })
        .collect();
    json!({ "cluster": config.cluster, "view": view, "leader": leader, "nodes": list })
}

/// A compact table for people.
pub fn to_table(config: &Config, nodes: &[NodeView]) -> String {
    let (view, leader) = cluster_view(nodes);
    let mut out = format!("cluster {}  view {view}  leader {leader}\n", config.cluster);
    out.push_str(&format!(
        "{:>4}  {:<8} {:>5} {:>10} {:>10} {:>10} {:>6} {:>5}  {}\n",
        "node", "role", "view", "persisted", "committed", "applied", "lag", "div", "app"
    ));
    for n in nodes {
        let app = config
            .node(n.id)
            .map(|x| x.app.to_string())
            .unwrap_or_default();
        match &n.status {
            Ok(s) => out.push_str(&format!(
                "{:>4}  {:<8} {:>5} {:>10} {:>10} {:>10} {:>6} {:>5}  {}\n",
                n.id,
                s.role,
                s.view,
                s.persisted,
                s.committed,
                s.applied,
                s.committed.saturating_sub(s.applied),
                s.divergences,
                app
            )),
            Err(e) => out.push_str(&format!("{:>4}  {:<8} ({e})  {app}\n", n.id, "down")),
        }
    }
    for n in nodes {
        if let Ok(NodeStatus {
            stale_reason: Some(why),
            ..
        }) = &n.status
        {
            out.push_str(&format!(
                "node {} is stale: {why}; restart its server and follower\n",
                n.id
            ));
        }
    }
    out
}
