//! Finding the leader of a cluster from its nodes' statuses.

use lockstep_common::control::NodeStatus;

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
