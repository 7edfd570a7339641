//! Enough of the Redis Sentinel protocol (RESP2 over TCP) that unmodified
//! Sentinel clients find the leader and follow a failover: the cluster name
//! is the master name, the leader's app address the master's, the other
//! nodes' app addresses its replicas, the other nodes' `sentinel` addresses
//! the other sentinels. `SUBSCRIBE`/`PSUBSCRIBE` get a `+switch-master`
//! message whenever the leader this node follows changes.
//!
//! The decisions (what the node reports, each reply, each switch) are pure
//! functions of a [`Snapshot`]; [`serve`] only moves bytes.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockstep_common::control::NodeStatus;
use lockstep_common::Config;

/// The channel Sentinel announces a new master on.
pub const SWITCH_MASTER: &str = "+switch-master";

/// What this node's sentinel reports, from its config and status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The master name (the cluster name).
    pub name: String,
    /// The current leader's app address, when this node follows one.
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

impl Snapshot {
    /// What node `me` reports given its `status` and the `last` leader it
    /// knew of. A node that leads or follows a leader (not joining a view,
    /// not stale) names that leader; otherwise there is none.
    pub fn of(config: &Config, me: u64, status: &NodeStatus, last: Option<SocketAddr>) -> Self {
        let following = matches!(status.role.as_str(), "leader" | "backup" | "catching-up")
            && status.stale_reason.is_none()
            && status.leader != 0;
        let leader_id = if following { status.leader } else { 0 };
        let leader = config.node(leader_id).ok().map(|n| n.app);
        Snapshot {
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
            view: status.view,
            down_after_ms: config.election.session_timeout_ms,
        }
    }

    /// `SENTINEL master <name>`'s fields, when a master is known.
    fn master_fields(&self) -> Option<Vec<String>> {
        let addr = self.last_leader?;
        let flags = if self.leader.is_some() {
            "master"
        } else {
            "master,s_down,o_down"
        };
        let fields: Vec<(&str, String)> = vec![
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
        ];
        Some(
            fields
                .into_iter()
                .flat_map(|(k, v)| [k.to_string(), v])
                .collect(),
        )
    }

    fn replica_fields(&self, a: SocketAddr) -> Vec<String> {
        let master = self.last_leader;
        [
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
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect()
    }

    fn sentinel_fields(&self, a: SocketAddr) -> Vec<String> {
        [
            ("name", a.to_string()),
            ("ip", a.ip().to_string()),
            ("port", a.port().to_string()),
            ("runid", String::new()),
            ("flags", "sentinel".into()),
            ("voted-leader", "?".into()),
            ("voted-leader-epoch", "0".into()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect()
    }

    fn info(&self) -> String {
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

// ---------------------------------------------------------------------
// RESP

/// One RESP2 value to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `+text`
    Simple(String),
    /// `-text`
    Error(String),
    /// `:n`
    Int(i64),
    /// `$len text`
    Bulk(Vec<u8>),
    /// `*-1`
    NilArray,
    /// `*n ...`
    Array(Vec<Value>),
}

impl Value {
    fn bulk(s: impl AsRef<[u8]>) -> Value {
        Value::Bulk(s.as_ref().to_vec())
    }

    fn strings(v: Vec<String>) -> Value {
        Value::Array(v.into_iter().map(Value::bulk).collect())
    }

    /// The wire bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Value::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Value::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Value::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Value::NilArray => out.extend_from_slice(b"*-1\r\n"),
            Value::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for i in items {
                    i.encode_into(out);
                }
            }
        }
    }
}

/// A parsed command's arguments and the bytes of `buf` it used.
pub type Parsed = (Vec<Vec<u8>>, usize);

/// Parses one command from the front of `buf`: `Ok(Some((args, used)))`,
/// `Ok(None)` when more bytes are needed, `Err` on a protocol error. Takes
/// multibulk (`*2\r\n$4\r\nPING\r\n...`) and inline (`PING\r\n`) commands.
pub fn parse_command(buf: &[u8]) -> Result<Option<Parsed>, String> {
    const MAX: usize = 1 << 20;
    fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")?;
        Some((&buf[at..at + end], at + end + 2))
    }
    fn number(b: &[u8]) -> Result<i64, String> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("invalid length '{}'", String::from_utf8_lossy(b)))
    }
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        let Some(end) = buf.iter().position(|&b| b == b'\n') else {
            return if buf.len() > MAX {
                Err("too big inline request".into())
            } else {
                Ok(None)
            };
        };
        let text = String::from_utf8_lossy(&buf[..end]);
        let args = text
            .split_whitespace()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        return Ok(Some((args, end + 1)));
    }
    let Some((head, mut at)) = line(buf, 1) else {
        return Ok(None);
    };
    let n = number(head)?;
    if !(0..=1024).contains(&n) {
        return Err("invalid multibulk length".into());
    }
    let mut args = Vec::with_capacity(n as usize);
    for _ in 0..n {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(format!("expected '$', got '{}'", buf[at] as char));
        }
        let Some((len, next)) = line(buf, at + 1) else {
            return Ok(None);
        };
        let len = number(len)?;
        if !(0..=MAX as i64).contains(&len) {
            return Err("invalid bulk length".into());
        }
        let len = len as usize;
        if buf.len() < next + len + 2 {
            return Ok(None);
        }
        args.push(buf[next..next + len].to_vec());
        at = next + len + 2;
    }
    Ok(Some((args, at)))
}

/// Whether glob `pattern` (`*`, `?`, literal bytes) matches `s`.
pub fn glob(pattern: &[u8], s: &[u8]) -> bool {
    match pattern.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && glob(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && glob(rest, &s[1..]),
    }
}

// ---------------------------------------------------------------------
// Sessions

/// One connection's protocol state.
#[derive(Debug, Default)]
pub struct Session {
    channels: Vec<Vec<u8>>,
    patterns: Vec<Vec<u8>>,
    /// Set by `QUIT`: close after the reply.
    pub quit: bool,
}

fn lower(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_ascii_lowercase()
}

impl Session {
    /// Whether the connection is in subscribe mode.
    pub fn subscribed(&self) -> bool {
        !self.channels.is_empty() || !self.patterns.is_empty()
    }

    fn count(&self) -> i64 {
        (self.channels.len() + self.patterns.len()) as i64
    }

    /// The replies to one command (several for (un)subscribing to several
    /// channels).
    pub fn handle(&mut self, snap: &Snapshot, args: &[Vec<u8>]) -> Vec<Value> {
        let Some(cmd) = args.first() else {
            return vec![];
        };
        let cmd = lower(cmd);
        let rest = &args[1..];
        match cmd.as_str() {
            "subscribe" | "psubscribe" | "unsubscribe" | "punsubscribe" => {
                self.subscription(&cmd, rest)
            }
            "ping" if self.subscribed() => vec![Value::Array(vec![
                Value::bulk("pong"),
                Value::bulk(rest.first().cloned().unwrap_or_default()),
            ])],
            "quit" => {
                self.quit = true;
                vec![Value::Simple("OK".into())]
            }
            _ if self.subscribed() => vec![Value::Error(format!(
                "ERR Can't execute '{cmd}': only (P)SUBSCRIBE / (P)UNSUBSCRIBE / PING / QUIT are allowed in this context"
            ))],
            "ping" => vec![match rest.first() {
                Some(m) => Value::Bulk(m.clone()),
                None => Value::Simple("PONG".into()),
            }],
            "role" => vec![Value::Array(vec![
                Value::bulk("sentinel"),
                Value::Array(vec![Value::bulk(&snap.name)]),
            ])],
            "info" => vec![Value::bulk(snap.info())],
            "client" => vec![Value::Simple("OK".into())],
            "sentinel" => vec![sentinel_command(snap, rest)],
            _ => vec![Value::Error(format!("ERR unknown command '{cmd}'"))],
        }
    }

    fn subscription(&mut self, cmd: &str, names: &[Vec<u8>]) -> Vec<Value> {
        let kind = cmd;
        let plain = matches!(cmd, "subscribe" | "unsubscribe");
        let subscribing = !cmd.contains("unsub");
        if subscribing && names.is_empty() {
            return vec![Value::Error(format!(
                "ERR wrong number of arguments for '{cmd}' command"
            ))];
        }
        let names: Vec<Vec<u8>> = if !subscribing && names.is_empty() {
            if plain {
                self.channels.clone()
            } else {
                self.patterns.clone()
            }
        } else {
            names.to_vec()
        };
        let mut out = Vec::new();
        for name in &names {
            let list = if plain {
                &mut self.channels
            } else {
                &mut self.patterns
            };
            if subscribing {
                if !list.contains(name) {
                    list.push(name.clone());
                }
            } else {
                list.retain(|n| n != name);
            }
            out.push(Value::Array(vec![
                Value::bulk(kind),
                Value::Bulk(name.clone()),
                Value::Int(self.count()),
            ]));
        }
        if out.is_empty() {
            out.push(Value::Array(vec![
                Value::bulk(kind),
                Value::NilArray,
                Value::Int(self.count()),
            ]));
        }
        out
    }

    /// The messages this session gets for `payload` published on `channel`.
    pub fn deliver(&self, channel: &str, payload: &str) -> Vec<Value> {
        let mut out = Vec::new();
        if self.channels.iter().any(|c| c == channel.as_bytes()) {
            out.push(Value::Array(vec![
                Value::bulk("message"),
                Value::bulk(channel),
                Value::bulk(payload),
            ]));
        }
        for p in &self.patterns {
            if glob(p, channel.as_bytes()) {
                out.push(Value::Array(vec![
                    Value::bulk("pmessage"),
                    Value::Bulk(p.clone()),
                    Value::bulk(channel),
                    Value::bulk(payload),
                ]));
            }
        }
        out
    }
}

fn sentinel_command(snap: &Snapshot, args: &[Vec<u8>]) -> Value {
    let Some(sub) = args.first() else {
        return Value::Error("ERR wrong number of arguments for 'sentinel' command".into());
    };
    let sub = lower(sub);
    let name_ok = || args.get(1).is_some_and(|n| n == snap.name.as_bytes());
    let no_such = || Value::Error("ERR No such master with that name".into());
    match sub.as_str() {
        "get-master-addr-by-name" => match snap.leader {
            Some(a) if name_ok() => Value::strings(vec![a.ip().to_string(), a.port().to_string()]),
            _ => Value::NilArray,
        },
        "masters" => Value::Array(
            snap.master_fields()
                .into_iter()
                .map(Value::strings)
                .collect(),
        ),
        "master" => match snap.master_fields() {
            Some(f) if name_ok() => Value::strings(f),
            _ => no_such(),
        },
        "replicas" | "slaves" if name_ok() => Value::Array(
            snap.replicas
                .iter()
                .map(|&a| Value::strings(snap.replica_fields(a)))
                .collect(),
        ),
        "sentinels" if name_ok() => Value::Array(
            snap.sentinels
                .iter()
                .map(|&a| Value::strings(snap.sentinel_fields(a)))
                .collect(),
        ),
        "replicas" | "slaves" | "sentinels" => no_such(),
        "myid" => Value::bulk(format!("{:040x}", 0)),
        _ => Value::Error(format!("ERR Unknown sentinel subcommand '{sub}'")),
    }
}

// ---------------------------------------------------------------------
// Serving

/// Gives this node's current snapshot.
pub type Source = dyn Fn() -> Snapshot + Send + Sync;

/// Subscribers waiting for `+switch-master` payloads.
type Subscribers = Arc<Mutex<Vec<Sender<String>>>>;

/// Serves the Sentinel protocol on `addr` (one thread per connection) and
/// watches `source` for leader switches. `last` holds the last leader known,
/// shared with `source`.
pub fn serve(
    addr: SocketAddr,
    source: Arc<Source>,
    last: Arc<Mutex<Option<SocketAddr>>>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    let subscribers: Subscribers = Arc::default();
    let subs = subscribers.clone();
    let src = source.clone();
    std::thread::Builder::new()
        .name("sentinel-watch".into())
        .spawn(move || loop {
            let snap = src();
            let mut known = last.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(payload) = switch_master(&snap.name, *known, snap.leader) {
                log::info!("sentinel: {SWITCH_MASTER} {payload}");
                subs.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|s| s.send(payload.clone()).is_ok());
            }
            if snap.leader.is_some() {
                *known = snap.leader;
            }
            drop(known);
            std::thread::sleep(Duration::from_millis(100));
        })?;
    std::thread::Builder::new()
        .name("sentinel".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let source = source.clone();
                let subscribers = subscribers.clone();
                let _ = std::thread::Builder::new()
                    .name("sentinel-conn".into())
                    .spawn(move || {
                        let _ = connection(stream, &*source, &subscribers);
                    });
            }
        })?;
    Ok(())
}

fn connection(mut s: TcpStream, source: &Source, subscribers: &Subscribers) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let _ = s.set_nodelay(true);
    let mut session = Session::default();
    let mut events: Option<Receiver<String>> = None;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let mut out = Vec::new();
        loop {
            match parse_command(&buf) {
                Ok(Some((args, used))) => {
                    buf.drain(..used);
                    let snap = source();
                    for v in session.handle(&snap, &args) {
                        v.encode_into(&mut out);
                    }
                    if session.quit {
                        s.write_all(&out)?;
                        return Ok(());
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    Value::Error(format!("ERR Protocol error: {e}")).encode_into(&mut out);
                    s.write_all(&out)?;
                    return Ok(());
                }
            }
        }
        if session.subscribed() && events.is_none() {
            let (tx, rx) = channel();
            subscribers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(tx);
            events = Some(rx);
        }
        if let Some(rx) = &events {
            while let Ok(payload) = rx.try_recv() {
                for v in session.deliver(SWITCH_MASTER, &payload) {
                    v.encode_into(&mut out);
                }
            }
        }
        if !out.is_empty() {
            s.write_all(&out)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    fn config() -> Config {
        Config::parse(
            r#"
cluster = "shop"
data_dir = "/tmp/lockstep-sentinel-unit"
[election]
mode = "zookeeper"
session_timeout_ms = 2000
[[nodes]]
id = 1
app = "127.0.0.1:7001"
control = "127.0.0.1:7101"
sentinel = "127.0.0.1:7301"
[[nodes]]
id = 2
app = "127.0.0.1:7002"
control = "127.0.0.1:7102"
sentinel = "127.0.0.1:7302"
[[nodes]]
id = 3
app = "127.0.0.1:7003"
control = "127.0.0.1:7103"
"#,
        )
        .unwrap()
    }

    fn status(role: &str, leader: u64) -> NodeStatus {
        NodeStatus {
            node: 1,
            view: 5,
            leader,
            role: role.into(),
            ..Default::default()
        }
    }

    fn ask(snap: &Snapshot, cmd: &str) -> String {
        let args: Vec<Vec<u8>> = cmd.split(' ').map(|s| s.as_bytes().to_vec()).collect();
        let mut out = Vec::new();
        for v in Session::default().handle(snap, &args) {
            out.extend(v.encode());
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn snapshot_names_the_leader_only_while_following_one() {
        let c = config();
        let s = Snapshot::of(&c, 1, &status("backup", 2), None);
        assert_eq!(s.leader, Some(addr(7002)));
        assert_eq!(s.replicas, vec![addr(7001), addr(7003)]);
        assert_eq!(s.sentinels, vec![addr(7302)]);
        assert_eq!(s.quorum, 2);
        let s = Snapshot::of(&c, 1, &status("joining", 2), Some(addr(7002)));
        assert_eq!(s.leader, None);
        assert_eq!(s.last_leader, Some(addr(7002)));
        let mut stale = status("stale", 1);
        stale.stale_reason = Some("x".into());
        assert_eq!(Snapshot::of(&c, 1, &stale, None).leader, None);
        assert_eq!(Snapshot::of(&c, 1, &status("backup", 0), None).leader, None);
    }

    #[test]
    fn replies() {
        let c = config();
        let s = Snapshot::of(&c, 1, &status("leader", 1), None);
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
        assert_eq!(ask(&s, "CLIENT SETNAME x"), "+OK\r\n");
    }

    #[test]
    fn no_leader_is_nil_or_down() {
        let c = config();
        let none = Snapshot::of(&c, 1, &status("joining", 0), None);
        assert_eq!(
            ask(&none, "SENTINEL get-master-addr-by-name shop"),
            "*-1\r\n"
        );
        assert_eq!(ask(&none, "SENTINEL masters"), "*0\r\n");
        assert!(ask(&none, "INFO").contains("sentinel_masters:0\r\n"));
        let was = Snapshot::of(&c, 1, &status("joining", 0), Some(addr(7002)));
        assert_eq!(
            ask(&was, "SENTINEL get-master-addr-by-name shop"),
            "*-1\r\n"
        );
        let m = ask(&was, "SENTINEL masters");
        assert!(m.contains("master,s_down,o_down"), "{m}");
        assert!(ask(&was, "INFO").contains("status=odown,address=127.0.0.1:7002"));
    }

    #[test]
    fn subscriptions_and_switch_master() {
        let c = config();
        let s = Snapshot::of(&c, 1, &status("backup", 2), None);
        let mut session = Session::default();
        let sub: Vec<Vec<u8>> = vec![b"SUBSCRIBE".to_vec(), b"+switch-master".to_vec()];
        assert_eq!(
            session.handle(&s, &sub)[0].encode(),
            b"*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n".to_vec()
        );
        let psub: Vec<Vec<u8>> = vec![b"psubscribe".to_vec(), b"*".to_vec()];
        assert_eq!(
            session.handle(&s, &psub)[0].encode(),
            b"*3\r\n$10\r\npsubscribe\r\n$1\r\n*\r\n:2\r\n".to_vec()
        );
        assert!(session.subscribed());
        let info: Vec<Vec<u8>> = vec![b"INFO".to_vec()];
        assert!(matches!(&session.handle(&s, &info)[0], Value::Error(_)));
        let ping: Vec<Vec<u8>> = vec![b"PING".to_vec()];
        assert_eq!(
            session.handle(&s, &ping)[0].encode(),
            b"*2\r\n$4\r\npong\r\n$0\r\n\r\n".to_vec()
        );
        let payload = switch_master("shop", Some(addr(7001)), Some(addr(7002))).unwrap();
        assert_eq!(payload, "shop 127.0.0.1 7001 127.0.0.1 7002");
        let msgs = session.deliver(SWITCH_MASTER, &payload);
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            msgs[0].encode(),
            b"*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$34\r\nshop 127.0.0.1 7001 127.0.0.1 7002\r\n".to_vec()
        );
        assert!(msgs[1]
            .encode()
            .starts_with(b"*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n"));
        let unsub: Vec<Vec<u8>> = vec![b"UNSUBSCRIBE".to_vec()];
        assert_eq!(
            session.handle(&s, &unsub)[0].encode(),
            b"*3\r\n$11\r\nunsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n".to_vec()
        );
        assert_eq!(session.deliver(SWITCH_MASTER, &payload).len(), 1);
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

    #[test]
    fn commands_parse_in_both_forms_and_in_pieces() {
        let full = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\nrest";
        assert_eq!(
            parse_command(full).unwrap(),
            Some((vec![b"PING".to_vec(), b"hi".to_vec()], full.len() - 4))
        );
        for cut in 0..full.len() - 4 {
            assert_eq!(parse_command(&full[..cut]).unwrap(), None, "{cut}");
        }
        assert_eq!(
            parse_command(b"sentinel masters\r\n").unwrap(),
            Some((vec![b"sentinel".to_vec(), b"masters".to_vec()], 18))
        );
        assert!(parse_command(b"*x\r\n").is_err());
        assert!(parse_command(b"*1\r\n:3\r\n").is_err());
        assert!(glob(b"*", b"+switch-master"));
        assert!(glob(b"+switch-*", b"+switch-master"));
        assert!(!glob(b"+sdown", b"+switch-master"));
        assert!(glob(b"+s?itch-master", b"+switch-master"));
    }

    #[test]
    fn serves_over_tcp() {
        let c = config();
        let snap = Snapshot::of(&c, 1, &status("backup", 2), None);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        let last = Arc::new(Mutex::new(None));
        serve(a, Arc::new(move || snap.clone()), last).unwrap();
        let mut s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"*1\r\n$4\r\nPING\r\nROLE\r\n").unwrap();
        let want = b"+PONG\r\n*2\r\n$8\r\nsentinel\r\n*1\r\n$4\r\nshop\r\n";
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, want.to_vec());
    }
}
