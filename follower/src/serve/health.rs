//! Health for proxies and orchestrators, on each node's metrics address:
//! `GET /leader` answers 200 only on the node that leads and can commit
//! (HAProxy's `option httpchk GET /leader` sends clients there), `GET
//! /health` answers 200 when the node is a healthy member. Both answer
//! JSON; the decisions are pure functions of the node's status.

use lockstep_common::control::NodeStatus;
use lockstep_common::Config;
use serde_json::json;

use crate::node::Node;
use crate::serve::metrics::Reply;

/// Whether the node of `s` leads and can commit: leader role in its current
/// view (its preload active, which also means not stale: a stale node has
/// stepped down), its server attached, and its entries committing (none
/// waited `stall_ms` without the commit point moving: else no majority
/// acknowledges it).
pub fn leads(s: &NodeStatus, server_up: bool, stall_ms: u64) -> bool {
    s.role == "leader"
        && s.leader == s.node
        && s.stale_reason.is_none()
        && server_up
        && s.commit_wait_ms < stall_ms
}

/// Whether the node of `s` is a healthy member: its follower answers (it
/// does, if this runs), its server is attached, it is not stale, it
/// leads or follows a leader (not still joining a view, and caught up: a
/// `catching-up` backup is not healthy until its apply lag is within
/// `max_apply_lag`), and it is not degraded (its log past
/// `snapshot_degraded_after`: snapshots do not keep it short).
pub fn healthy(s: &NodeStatus, server_up: bool) -> bool {
    server_up
        && s.stale_reason.is_none()
        && s.degraded.is_none()
        && (s.role == "leader" || s.role == "backup")
}

/// `GET /leader`: 200 with `{"view","leader","app"}` on the leader; 503
/// elsewhere, with the leader this node knows of (`app` null when none).
pub fn leader_reply(config: &Config, s: &NodeStatus, server_up: bool) -> Reply {
    let app = |id: u64| config.node(id).ok().map(|n| n.app.to_string());
    if leads(s, server_up, config.election.session_timeout_ms) {
        Reply::json(
            200,
            &json!({ "view": s.view, "leader": s.node, "app": app(s.node) }),
        )
    } else {
        Reply::json(
            503,
            &json!({
                "view": s.view,
                "leader": s.leader,
                "app": if s.leader == 0 { None } else { app(s.leader) },
                "node": s.node,
                "role": s.role,
            }),
        )
    }
}

/// `GET /health`: 200 on a healthy member, 503 otherwise; the body says
/// what this node is.
pub fn health_reply(s: &NodeStatus, server_up: bool) -> Reply {
    Reply::json(
        if healthy(s, server_up) { 200 } else { 503 },
        &json!({
            "node": s.node,
            "role": s.role,
            "view": s.view,
            "leader": s.leader,
            "server_up": server_up,
            "stale_reason": s.stale_reason,
            "lag": s.committed.saturating_sub(s.applied),
            "apply_rate": s.apply_rate,
            "eta_seconds": s.lag_ms as f64 / 1000.0,
            "degraded": s.degraded,
            "snapshot_failing": s.snapshot_failing.as_ref().map(|f| json!({
                "for_seconds": f.for_ms as f64 / 1000.0,
                "failures": f.failures,
                "reason": f.reason,
                "fix": f.fix,
            })),
            "log_entries": s.log_entries,
            "log_bytes": s.log_bytes,
        }),
    )
}

impl Node {
    /// Answers a request on the metrics address.
    pub(crate) fn http(&self, path: &str) -> Option<Reply> {
        match path {
            "/metrics" | "/" => Some(Reply::metrics(self.render_metrics())),
            "/leader" => Some(leader_reply(
                &self.config,
                &self.status(),
                self.region.server_attached(),
            )),
            "/health" => Some(health_reply(&self.status(), self.region.server_attached())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(node: u64, role: &str, leader: u64) -> NodeStatus {
        NodeStatus {
            node,
            view: 4,
            leader,
            role: role.into(),
            stale_reason: (role == "stale").then(|| "its server (pid 9) exited".to_string()),
            persisted: 1,
            committed: 1,
            applied: 1,
            divergences: 0,
            server_pid: 9,
            follower_pid: 8,
            ..NodeStatus::default()
        }
    }

    fn config() -> Config {
        let text = lockstep_testkit::config_fixture::ThreeNodeConfig::new(
            "cluster = \"h\"\ndata_dir = \"/tmp/lockstep-health-test\"\n",
        )
        .text();
        Config::parse(&text).unwrap()
    }

    #[test]
    fn only_the_leader_answers_200_on_leader() {
        let c = config();
        let r = leader_reply(&c, &status(2, "leader", 2), true);
        assert_eq!(r.status, 200);
        assert_eq!(
            r.body,
            "{\"app\":\"127.0.0.1:7002\",\"leader\":2,\"view\":4}\n"
        );
        let backup = leader_reply(&c, &status(1, "backup", 2), true);
        assert_eq!(backup.status, 503);
        assert!(
            backup.body.contains("\"app\":\"127.0.0.1:7002\""),
            "{}",
            backup.body
        );
        // Its server gone, a joining node, a stale one, none with a leader.
        assert_eq!(leader_reply(&c, &status(2, "leader", 2), false).status, 503);
        assert_eq!(leader_reply(&c, &status(2, "joining", 2), true).status, 503);
        assert_eq!(leader_reply(&c, &status(2, "stale", 2), true).status, 503);
        let none = leader_reply(&c, &status(3, "joining", 0), true);
        assert_eq!(none.status, 503);
        assert!(none.body.contains("\"app\":null"), "{}", none.body);
        // A leader whose entries stopped committing (no majority acks) for
        // a session timeout cannot serve: 503.
        let mut stuck = status(2, "leader", 2);
        stuck.commit_wait_ms = c.election.session_timeout_ms - 1;
        assert_eq!(leader_reply(&c, &stuck, true).status, 200);
        stuck.commit_wait_ms = c.election.session_timeout_ms;
        assert_eq!(leader_reply(&c, &stuck, true).status, 503);
    }

    #[test]
    fn healthy_members_answer_200_on_health() {
        assert_eq!(health_reply(&status(1, "leader", 1), true).status, 200);
        assert_eq!(health_reply(&status(2, "backup", 1), true).status, 200);
        assert_eq!(health_reply(&status(2, "backup", 1), false).status, 503);
        assert_eq!(health_reply(&status(2, "joining", 1), true).status, 503);
        let catching_up = health_reply(&status(2, "catching-up", 1), true);
        assert_eq!(catching_up.status, 503);
        assert!(
            catching_up.body.contains("\"role\":\"catching-up\""),
            "{}",
            catching_up.body
        );
        // Degraded (its log past snapshot_degraded_after): 503 saying why,
        // with the snapshots' failure.
        let mut degraded = status(2, "backup", 1);
        degraded.degraded = Some("its log holds 9000 entries".into());
        degraded.snapshot_failing = Some(lockstep_common::control::SnapshotFailing {
            for_ms: 5000,
            failures: 4,
            last_ms: 10,
            reason: "criu dump failed".into(),
            fix: "see the CRIU log".into(),
        });
        let r = health_reply(&degraded, true);
        assert_eq!(r.status, 503);
        assert!(
            r.body.contains("its log holds 9000 entries") && r.body.contains("criu dump failed"),
            "{}",
            r.body
        );
        degraded.degraded = None;
        assert_eq!(
            health_reply(&degraded, true).status,
            200,
            "failing but within the bound: said, not degraded"
        );
        let stale = health_reply(&status(2, "stale", 1), true);
        assert_eq!(stale.status, 503);
        assert!(
            stale.body.contains("its server (pid 9) exited"),
            "{}",
            stale.body
        );
    }
}
