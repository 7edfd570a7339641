//! What this node's sentinel reports (a [`SentinelView`] of its config and the
//! nodes' statuses), the `SENTINEL` subcommands' replies and the
//! `+switch-master` payload: pure functions, no I/O.

use std::net::SocketAddr;

use lockstep_common::control::NodeStatus;
use lockstep_common::resp::Value;
use lockstep_common::Config;

/// What this node's sentinel reports, from its config and status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelView {
    /// The master name (the cluster name).
    pub name: String,
    /// The app address of the leader that can commit, when there is one.
    pub leader: Option<SocketAddr>,
    /// The last leader known (the current one when there is one).
    pub last_leader: Option<SocketAddr>,
    /// App addresses of the nodes that do not lead.
    pub replicas: Vec<SocketAddr>,
    /// Sentinel addresses of the other nodes that have one.
    pub sentinels: Vec<SocketAddr>,
    /// Votes a failover needs (a majority).
    pub quorum: usize,
    /// The view (reported as the config epoch).
    pub view: u64,
    /// ZooKeeper session timeout (reported as down-after-milliseconds).
    pub down_after_ms: u64,
}

/// Whether `s` is a live member of `view` under `leader`: it leads or
/// backs it up (a backup still catching up stores and acks too) and is not
/// stale.
fn member_of(s: &NodeStatus, view: u64, leader: u64) -> bool {
    s.view == view
        && s.leader == leader
        && matches!(s.role.as_str(), "leader" | "backup" | "catching-up")
        && s.stale_reason.is_none()
}

/// The leader that can commit, as far as node `own.node` can tell: the
/// leader its own status follows, when that leader answers (`own` or one of
/// the `peers` that answered) as leader of the same view with its server
/// attached, and a majority of the nodes are live members of that view.
/// 0 when there is none: no leader known, or it cannot reach a majority.
pub fn committing_leader(majority: usize, own: &NodeStatus, peers: &[NodeStatus]) -> u64 {
    let (view, leader) = (own.view, own.leader);
    if leader == 0 || !member_of(own, view, leader) {
        return 0;
    }
    let answered = std::iter::once(own).chain(peers.iter().filter(|p| p.node != own.node));
    let live: Vec<&NodeStatus> = answered.filter(|s| member_of(s, view, leader)).collect();
    let leads = live
        .iter()
        .any(|s| s.node == leader && s.role == "leader" && s.server_pid != 0);
    if leads && live.len() >= majority {
        leader
    } else {
        0
    }
}

impl SentinelView {
    /// What node `me` reports given its `own` status, the statuses of the
    /// `peers` that answered and the `last` leader it knew of: the leader
    /// only while it can commit ([`committing_leader`]).
    pub fn of(
        config: &Config,
        me: u64,
        own: &NodeStatus,
        peers: &[NodeStatus],
        last: Option<SocketAddr>,
    ) -> Self {
        let leader_id = committing_leader(config.majority(), own, peers);
        let leader = config.node(leader_id).ok().map(|n| n.app);
        SentinelView {
            name: config.cluster.clone(),
            leader,
            last_leader: leader.or(last),
            replicas: config
                .nodes
                .iter()
                .filter(|n| n.id != leader_id)
                .map(|n| n.app)
                .collect(),
            sentinels: config
                .nodes
                .iter()
                .filter(|n| n.id != me)
                .filter_map(|n| n.sentinel)
                .collect(),
            quorum: config.majority(),
            view: own.view,
            down_after_ms: config.election.session_timeout_ms,
        }
    }

    /// `SENTINEL master <name>`'s fields, when a master is known.
    fn master_fields(&self) -> Option<Value> {
        let addr = self.last_leader?;
        let flags = if self.leader.is_some() {
            "master"
        } else {
            "master,s_down,o_down"
        };
        Some(Value::string_map(vec![
            ("name", self.name.clone()),
            ("ip", addr.ip().to_string()),
            ("port", addr.port().to_string()),
            ("runid", String::new()),
            ("flags", flags.into()),
            ("link-pending-commands", "0".into()),
            ("link-refcount", "1".into()),
            ("last-ping-sent", "0".into()),
            ("last-ok-ping-reply", "0".into()),
            ("last-ping-reply", "0".into()),
            ("down-after-milliseconds", self.down_after_ms.to_string()),
            ("info-refresh", "0".into()),
            ("role-reported", "master".into()),
            ("role-reported-time", "0".into()),
            ("config-epoch", self.view.to_string()),
            ("num-slaves", self.replicas.len().to_string()),
            ("num-other-sentinels", self.sentinels.len().to_string()),
            ("quorum", self.quorum.to_string()),
            ("failover-timeout", (2 * self.down_after_ms).to_string()),
            ("parallel-syncs", "1".into()),
        ]))
    }

    fn replica_fields(&self, a: SocketAddr) -> Value {
        let master = self.last_leader;
        Value::string_map(vec![
            ("name", a.to_string()),
            ("ip", a.ip().to_string()),
            ("port", a.port().to_string()),
            ("runid", String::new()),
            ("flags", "slave".into()),
            ("role-reported", "slave".into()),
            (
                "master-host",
                master.map(|m| m.ip().to_string()).unwrap_or_default(),
            ),
            (
                "master-port",
                master.map(|m| m.port()).unwrap_or(0).to_string(),
            ),
            (
                "master-link-status",
                if self.leader.is_some() { "ok" } else { "err" }.into(),
            ),
            ("slave-priority", "100".into()),
        ])
    }

    fn sentinel_fields(&self, a: SocketAddr) -> Value {
        Value::string_map(vec![
            ("name", a.to_string()),
            ("ip", a.ip().to_string()),
            ("port", a.port().to_string()),
            ("runid", String::new()),
            ("flags", "sentinel".into()),
            ("voted-leader", "?".into()),
            ("voted-leader-epoch", "0".into()),
        ])
    }

    /// The `INFO` text (a bulk string in both protocols, as Sentinel sends it).
    pub(super) fn info(&self) -> String {
        let mut s = String::from(
            "# Server\r\nredis_mode:sentinel\r\n\r\n# Sentinel\r\nsentinel_tilt:0\r\nsentinel_running_scripts:0\r\nsentinel_scripts_queue_length:0\r\nsentinel_simulate_failure_flags:0\r\n",
        );
        match self.last_leader {
            Some(a) => s.push_str(&format!(
                "sentinel_masters:1\r\nmaster0:name={},status={},address={a},slaves={},sentinels={}\r\n",
                self.name,
                if self.leader.is_some() { "ok" } else { "odown" },
                self.replicas.len(),
                self.sentinels.len() + 1
            )),
            None => s.push_str("sentinel_masters:0\r\n"),
        }
        s
    }

    /// The reply to `SENTINEL <args>`.
    pub(super) fn sentinel_command(&self, args: &[Vec<u8>]) -> Value {
        let Some(sub) = args.first() else {
            return Value::Error("ERR wrong number of arguments for 'sentinel' command".into());
        };
        let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
        let name_ok = || args.get(1).is_some_and(|n| n == self.name.as_bytes());
        let no_such = || Value::Error("ERR No such master with that name".into());
        match sub.as_str() {
            "get-master-addr-by-name" => match self.leader {
                Some(a) if name_ok() => {
                    Value::strings(vec![a.ip().to_string(), a.port().to_string()])
                }
                _ => Value::NullArray,
            },
            "masters" => Value::Array(self.master_fields().into_iter().collect()),
            "master" => match self.master_fields() {
                Some(f) if name_ok() => f,
                _ => no_such(),
            },
            "replicas" | "slaves" if name_ok() => Value::Array(
                self.replicas
                    .iter()
                    .map(|&a| self.replica_fields(a))
                    .collect(),
            ),
            "sentinels" if name_ok() => Value::Array(
                self.sentinels
                    .iter()
                    .map(|&a| self.sentinel_fields(a))
                    .collect(),
            ),
            "replicas" | "slaves" | "sentinels" => no_such(),
            "myid" => Value::bulk(format!("{:040x}", 0)),
            _ => Value::Error(format!("ERR Unknown sentinel subcommand '{sub}'")),
        }
    }
}

/// The `+switch-master` payload when the leader went from `last` to `now`
/// (`<name> <old-ip> <old-port> <new-ip> <new-port>`); None when there is no
/// new leader or it did not change. An unknown old leader reads as the new.
pub fn switch_master(
    name: &str,
    last: Option<SocketAddr>,
    now: Option<SocketAddr>,
) -> Option<String> {
    let new = now?;
    if last == Some(new) {
        return None;
    }
    let old = last.unwrap_or(new);
    Some(format!(
        "{name} {} {} {} {}",
        old.ip(),
        old.port(),
        new.ip(),
        new.port()
    ))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{addr, all_up, config, status};
    use super::super::ClientConn;
    use super::*;
    use lockstep_common::resp::Proto;

    fn ask(snap: &SentinelView, cmd: &str) -> String {
        let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        let mut out = Vec::new();
        for v in ClientConn::new(1).handle(snap, &args) {
            out.extend(v.encode(Proto::Resp2));
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_leader_is_named_only_while_it_can_commit() {
        let c = config();
        let s = all_up(2);
        assert_eq!(s.leader, Some(addr(7002)));
        assert_eq!(s.replicas, vec![addr(7001), addr(7003)]);
        assert_eq!(s.sentinels, vec![addr(7302)]);
        assert_eq!(s.quorum, 2);
        let own = status(1, "backup", 2);
        let leader = status(2, "leader", 2);
        // The leader and this backup: a majority.
        assert_eq!(committing_leader(2, &own, std::slice::from_ref(&leader)), 2);
        // The leader does not answer (dead, or unreachable from here).
        let s = SentinelView::of(&c, 1, &own, &[status(3, "backup", 2)], Some(addr(7002)));
        assert_eq!(s.leader, None);
        assert_eq!(s.last_leader, Some(addr(7002)));
        // The leader answers, but no majority is a live member of its view.
        assert_eq!(committing_leader(2, &status(2, "leader", 2), &[]), 0);
        let mut joining = status(1, "joining", 2);
        assert_eq!(
            committing_leader(2, &status(2, "leader", 2), &[joining.clone()]),
            0
        );
        let mut newer = status(3, "backup", 2);
        newer.view = 6;
        assert_eq!(committing_leader(2, &status(2, "leader", 2), &[newer]), 0);
        // This node is not following (joining, stale, no leader).
        assert_eq!(
            committing_leader(2, &joining, std::slice::from_ref(&leader)),
            0
        );
        joining.role = "stale".into();
        joining.stale_reason = Some("x".into());
        assert_eq!(
            committing_leader(2, &joining, std::slice::from_ref(&leader)),
            0
        );
        assert_eq!(
            committing_leader(2, &status(1, "backup", 0), std::slice::from_ref(&leader)),
            0
        );
        // The leader's server is not attached, or it no longer leads.
        let mut serverless = leader.clone();
        serverless.server_pid = 0;
        assert_eq!(committing_leader(2, &own, &[serverless]), 0);
        assert_eq!(committing_leader(2, &own, &[status(2, "backup", 2)]), 0);
        // A peer's answer about this node itself does not count twice.
        assert_eq!(
            committing_leader(2, &status(1, "leader", 1), &[status(1, "backup", 1)]),
            0
        );
    }

    #[test]
    fn replies() {
        let s = all_up(1);
        assert_eq!(ask(&s, "PING"), "+PONG\r\n");
        assert_eq!(
            ask(&s, "SENTINEL get-master-addr-by-name shop"),
            "*2\r\n$9\r\n127.0.0.1\r\n$4\r\n7001\r\n"
        );
        assert_eq!(ask(&s, "sentinel GET-MASTER-ADDR-BY-NAME other"), "*-1\r\n");
        assert_eq!(
            ask(&s, "ROLE"),
            "*2\r\n$8\r\nsentinel\r\n*1\r\n$4\r\nshop\r\n"
        );
        let m = ask(&s, "SENTINEL master shop");
        assert!(m.starts_with("*40\r\n$4\r\nname\r\n$4\r\nshop\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nport\r\n$4\r\n7001\r\n"), "{m}");
        assert!(m.contains("$5\r\nflags\r\n$6\r\nmaster\r\n"), "{m}");
        assert!(m.contains("$10\r\nnum-slaves\r\n$1\r\n2\r\n"), "{m}");
        assert!(
            m.contains("$19\r\nnum-other-sentinels\r\n$1\r\n1\r\n"),
            "{m}"
        );
        assert!(m.contains("$6\r\nquorum\r\n$1\r\n2\r\n"), "{m}");
        assert_eq!(ask(&s, "SENTINEL masters"), format!("*1\r\n{m}"));
        assert_eq!(
            ask(&s, "SENTINEL master nope"),
            "-ERR No such master with that name\r\n"
        );
        let r = ask(&s, "SENTINEL replicas shop");
        assert!(
            r.starts_with("*2\r\n*20\r\n$4\r\nname\r\n$14\r\n127.0.0.1:7002\r\n"),
            "{r}"
        );
        assert!(r.contains("$5\r\nflags\r\n$5\r\nslave\r\n"), "{r}");
        assert!(r.contains("127.0.0.1:7003"), "{r}");
        assert_eq!(ask(&s, "SENTINEL slaves shop"), r);
        let t = ask(&s, "SENTINEL sentinels shop");
        assert!(
            t.starts_with("*1\r\n*14\r\n$4\r\nname\r\n$14\r\n127.0.0.1:7302\r\n"),
            "{t}"
        );
        assert!(t.contains("$8\r\nsentinel\r\n"), "{t}");
        let i = ask(&s, "INFO");
        assert!(i.contains("# Sentinel\r\n"), "{i}");
        assert!(
            i.contains(
                "master0:name=shop,status=ok,address=127.0.0.1:7001,slaves=2,sentinels=2\r\n"
            ),
            "{i}"
        );
        assert!(ask(&s, "FLUSHALL").starts_with("-ERR unknown command"));
        assert!(ask(&s, "SENTINEL bogus").starts_with("-ERR Unknown sentinel subcommand"));
    }

    #[test]
    fn resp3_replies_are_maps_and_nulls() {
        let s = all_up(1);
        let mut session = ClientConn::new(7);
        let mut ask3 = |cmd: &str| {
            let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
            let mut out = Vec::new();
            for v in session.handle(&s, &args) {
                out.extend(v.encode(session.proto));
            }
            String::from_utf8(out).unwrap()
        };
        assert!(ask3("HELLO 3").starts_with("%6\r\n"));
        let m = ask3("SENTINEL master shop");
        assert!(m.starts_with("%20\r\n$4\r\nname\r\n$4\r\nshop\r\n"), "{m}");
        assert_eq!(ask3("SENTINEL masters"), format!("*1\r\n{m}"));
        let r = ask3("SENTINEL replicas shop");
        assert!(r.starts_with("*2\r\n%10\r\n$4\r\nname\r\n"), "{r}");
        assert!(ask3("SENTINEL sentinels shop").starts_with("*1\r\n%7\r\n"));
        assert_eq!(
            ask3("SENTINEL get-master-addr-by-name shop"),
            "*2\r\n$9\r\n127.0.0.1\r\n$4\r\n7001\r\n"
        );
        assert_eq!(ask3("SENTINEL get-master-addr-by-name nope"), "_\r\n");
        assert!(ask3("INFO").starts_with("$"), "INFO stays a bulk string");
    }

    #[test]
    fn no_leader_is_nil_or_down() {
        let c = config();
        let none = SentinelView::of(&c, 1, &status(1, "joining", 0), &[], None);
        assert_eq!(
            ask(&none, "SENTINEL get-master-addr-by-name shop"),
            "*-1\r\n"
        );
        assert_eq!(ask(&none, "SENTINEL masters"), "*0\r\n");
        assert!(ask(&none, "INFO").contains("sentinel_masters:0\r\n"));
        let was = SentinelView::of(&c, 1, &status(1, "joining", 0), &[], Some(addr(7002)));
        assert_eq!(
            ask(&was, "SENTINEL get-master-addr-by-name shop"),
            "*-1\r\n"
        );
        let m = ask(&was, "SENTINEL masters");
        assert!(m.contains("master,s_down,o_down"), "{m}");
        assert!(ask(&was, "INFO").contains("status=odown,address=127.0.0.1:7002"));
    }

    #[test]
    fn switch_master_payloads() {
        let payload = switch_master("shop", Some(addr(7001)), Some(addr(7002))).unwrap();
        assert_eq!(payload, "shop 127.0.0.1 7001 127.0.0.1 7002");
        assert_eq!(
            switch_master("shop", Some(addr(7002)), Some(addr(7002))),
            None
        );
        assert_eq!(switch_master("shop", Some(addr(7002)), None), None);
        assert_eq!(
            switch_master("shop", None, Some(addr(7003))).unwrap(),
            "shop 127.0.0.1 7003 127.0.0.1 7003"
        );
    }
}
