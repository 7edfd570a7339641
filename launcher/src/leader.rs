//! Finding the leader of a cluster from its nodes' statuses.

use std::time::Duration;

use lockstep_common::control::{self, NodeStatus};
use lockstep_common::Config;

/// The (view, leader) of the highest view among `statuses`, when that
/// view's leader is among them and itself says it leads that view.
pub fn leading(statuses: &[NodeStatus]) -> Option<(u64, u64)> {
    let top = statuses.iter().map(|s| s.view).max()?;
    let leader = statuses
        .iter()
        .filter(|s| s.view == top)
        .map(|s| s.leader)
        .find(|&l| l != 0)?;
    let ls = statuses.iter().find(|s| s.node == leader)?;
    (ls.role == "leader" && ls.view == top).then_some((top, leader))
}

/// The statuses of the nodes `ids` that answer on their control channel
/// within `timeout` each.
pub fn statuses(config: &Config, ids: &[u64], timeout: Duration) -> Vec<NodeStatus> {
    ids.iter()
        .filter_map(|&id| control::query_status(config, id, timeout).ok())
        .collect()
}

/// The (view, leader) the nodes `among` report (see [`leading`]), asking
/// each with `timeout`.
pub fn find_leader(config: &Config, among: &[u64], timeout: Duration) -> Option<(u64, u64)> {
    leading(&statuses(config, among, timeout))
}
