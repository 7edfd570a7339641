//! Enough of the Redis Sentinel protocol (RESP2 and RESP3 over TCP) that
//! unmodified Sentinel clients find the leader and follow a failover: the
//! cluster name is the master name, the app address of the leader that can
//! commit the master's, the other nodes' app addresses its replicas, the
//! other nodes' `sentinel` addresses the other sentinels. `SUBSCRIBE`/
//! `PSUBSCRIBE` get a `+switch-master` message (a push message on a RESP3
//! connection) whenever that leader changes.
//!
//! The decisions (what the node reports, each reply, each switch) are pure
//! functions of a [`SentinelView`] (`snapshot`) and a connection's [`ClientConn`]
//! (`session`), encoded by `lockstep_common::resp`; [`serve`] only moves
//! bytes.

mod client;
mod glob;
mod view;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_common::control::NodeStatus;
use lockstep_common::resp::{parse_command, Value};

pub use client::{ClientConn, VERSION};
pub use view::{committing_leader, switch_master, SentinelView};

/// The channel Sentinel announces a new master on.
pub const SWITCH_MASTER: &str = "+switch-master";

/// How long the peers' statuses are reused before they are asked again.
pub const PEERS_FRESH_FOR: Duration = Duration::from_millis(200);

/// The other nodes' statuses as last asked, reused for a while so that a
/// burst of clients (and the switch watcher's polls) does not turn into a
/// burst of control connections.
pub struct PeerStatuses {
    fresh_for: Duration,
    last: Mutex<Option<(Instant, Vec<NodeStatus>)>>,
}

impl PeerStatuses {
    /// An empty cache whose answers stay fresh for `fresh_for`.
    pub fn new(fresh_for: Duration) -> Self {
        PeerStatuses {
            fresh_for,
            last: Mutex::new(None),
        }
    }

    /// The statuses, from the cache while fresh, else from `ask` (one
    /// caller asks; the others wait for its answer).
    pub fn get(&self, ask: impl FnOnce() -> Vec<NodeStatus>) -> Vec<NodeStatus> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some((at, s)) if at.elapsed() < self.fresh_for => s.clone(),
            _ => {
                let s = ask();
                *last = Some((Instant::now(), s.clone()));
                s
            }
        }
    }
}

// ---------------------------------------------------------------------
// Serving

/// Gives this node's current snapshot.
pub type Source = dyn Fn() -> SentinelView + Send + Sync;

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
            let ids = AtomicU64::new(1);
            for stream in listener.incoming().flatten() {
                let source = source.clone();
                let subscribers = subscribers.clone();
                let id = ids.fetch_add(1, Ordering::Relaxed);
                let _ = std::thread::Builder::new()
                    .name("sentinel-conn".into())
                    .spawn(move || {
                        let _ = connection(stream, id, &*source, &subscribers);
                    });
            }
        })?;
    Ok(())
}

fn connection(
    mut s: TcpStream,
    id: u64,
    source: &Source,
    subscribers: &Subscribers,
) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let _ = s.set_nodelay(true);
    let mut session = ClientConn::new(id);
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
                        v.encode_into(session.proto, &mut out);
                    }
                    if session.quit {
                        s.write_all(&out)?;
                        return Ok(());
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    Value::Error(format!("ERR Protocol error: {e}"))
                        .encode_into(session.proto, &mut out);
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
                    v.encode_into(session.proto, &mut out);
                }
            }
        }
        if !out.is_empty() {
            s.write_all(&out)?;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use lockstep_common::Config;

    pub(crate) fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], p))
    }

    pub(crate) fn config() -> Config {
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

    /// Node `node`'s status in view 5 with `leader`, its server attached.
    pub(crate) fn status(node: u64, role: &str, leader: u64) -> NodeStatus {
        NodeStatus {
            node,
            view: 5,
            leader,
            role: role.into(),
            server_pid: 100 + node,
            ..Default::default()
        }
    }

    /// The snapshot of node 1 when every node answers in view 5 with
    /// `leader` leading.
    pub(crate) fn all_up(leader: u64) -> SentinelView {
        let role = |id| if id == leader { "leader" } else { "backup" };
        let peers = [status(2, role(2), leader), status(3, role(3), leader)];
        SentinelView::of(&config(), 1, &status(1, role(1), leader), &peers, None)
    }

    #[test]
    fn peer_statuses_are_reused_while_fresh() {
        let cache = PeerStatuses::new(Duration::from_secs(3600));
        assert_eq!(cache.get(|| vec![status(2, "backup", 1)]).len(), 1);
        assert_eq!(cache.get(|| panic!("asked again while fresh")).len(), 1);
        let stale = PeerStatuses::new(Duration::ZERO);
        assert!(stale.get(Vec::new).is_empty());
        assert_eq!(stale.get(|| vec![status(3, "backup", 1)])[0].node, 3);
    }

    #[test]
    fn serves_both_protocols_over_tcp() {
        let snap = all_up(2);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        drop(l);
        let last = Arc::new(Mutex::new(None));
        serve(a, Arc::new(move || snap.clone()), last).unwrap();
        let mut s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut expect = |send: &[u8], want: &[u8]| {
            s.write_all(send).unwrap();
            let mut got = vec![0u8; want.len()];
            s.read_exact(&mut got).unwrap();
            assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));
        };
        expect(
            b"*1\r\n$4\r\nPING\r\nROLE\r\n",
            b"+PONG\r\n*2\r\n$8\r\nsentinel\r\n*1\r\n$4\r\nshop\r\n",
        );
        expect(b"SENTINEL get-master-addr-by-name nope\r\n", b"*-1\r\n");
        let hello = b"%6\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$8\r\nsentinel\r\n$7\r\nmodules\r\n*0\r\n";
        expect(b"HELLO 3\r\n", hello);
        expect(b"SENTINEL get-master-addr-by-name nope\r\n", b"_\r\n");
        expect(
            b"SUBSCRIBE +switch-master\r\n",
            b">3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n",
        );
        // RESP3: other commands still run while subscribed.
        expect(b"PING\r\n", b"+PONG\r\n");
        // A protocol error is answered as Redis answers it, then closes.
        expect(b"*x\r\n", b"-ERR Protocol error: invalid length 'x'\r\n");
        assert_eq!(s.read(&mut [0u8; 1]).unwrap(), 0);
    }
}
