//! Counters and latency histograms, served as Prometheus text over HTTP.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds.
const BUCKETS_US: [u64; 14] = [
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000,
];

/// A fixed-bucket latency histogram (lock-free).
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(BUCKETS_US.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cum += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cum}", *b as f64 / 1e6);
        }
        cum += self.counts[BUCKETS_US.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count {cum}");
    }
}

/// Everything the follower counts.
#[derive(Default)]
pub struct Metrics {
    /// Entries stored.
    pub persisted_entries: AtomicU64,
    /// Acks posted to the leader.
    pub acks: AtomicU64,
    /// Entries applied to the local server.
    pub applied_entries: AtomicU64,
    /// Output divergences detected.
    pub divergences: AtomicU64,
    /// Fetches from a peer (catch-ups, and a view change's log syncs).
    pub catchups: AtomicU64,
    /// Entries fetched from peers.
    pub fetched_entries: AtomicU64,
    /// RocksDB append latency per batch.
    pub persist: Histogram,
    /// Entry visible in the ring → ack posted.
    pub ack: Histogram,
    /// Apply latency per entry (write + wait for the server to consume).
    pub apply: Histogram,
}

impl Metrics {
    /// Prometheus text exposition; `gauges` are (name, help, value).
    pub fn render(&self, gauges: &[(&str, &str, u64)]) -> String {
        let mut out = String::new();
        let counters = [
            (
                "lockstep_persisted_entries_total",
                "Entries stored in RocksDB",
                &self.persisted_entries,
            ),
            (
                "lockstep_acks_total",
                "Acks posted to the leader",
                &self.acks,
            ),
            (
                "lockstep_applied_entries_total",
                "Entries applied to the local server",
                &self.applied_entries,
            ),
            (
                "lockstep_divergences_total",
                "Output divergences from the leader",
                &self.divergences,
            ),
            (
                "lockstep_catchups_total",
                "Fetches from a peer (catch-ups, view change log syncs)",
                &self.catchups,
            ),
            (
                "lockstep_fetched_entries_total",
                "Entries fetched from peers",
                &self.fetched_entries,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        self.persist.render(
            "lockstep_persist_seconds",
            "RocksDB append latency per batch",
            &mut out,
        );
        self.ack.render(
            "lockstep_ack_seconds",
            "Entry seen in the ring to ack posted",
            &mut out,
        );
        self.apply.render(
            "lockstep_apply_seconds",
            "Apply latency per entry",
            &mut out,
        );
        out
    }
}

/// The roles `lockstep_role` has a series for (one is 1, the others 0).
pub const ROLES: [&str; 5] = ["leader", "backup", "catching-up", "joining", "stale"];

/// The node's state as gauges, for [`Metrics::render`]'s caller.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGauges<'a> {
    /// "leader", "backup", "catching-up", "joining" or "stale".
    pub role: &'a str,
    /// The server holds its lock on the region file (it runs and is attached).
    pub server_up: bool,
    /// The ZooKeeper session is connected; None in static election mode
    /// (no ZooKeeper: the gauge is left out).
    pub zookeeper_connected: Option<bool>,
    /// Committed entries this node's server has not applied yet.
    pub apply_lag_entries: u64,
    /// Time the server needs to apply them at its recent rate.
    pub apply_lag_seconds: f64,
    /// Entries per second the server applied recently.
    pub apply_rate: u64,
    /// A leader going on although fewer than a majority can apply.
    pub failover_backlog_grows: bool,
    /// Snapshots are asked for but fail (or cannot be taken at all).
    pub snapshot_failing: bool,
    /// Failed snapshot attempts in the current failing run.
    pub snapshot_failures: u64,
    /// Seq of the newest complete snapshot (0: none).
    pub newest_snapshot: u64,
    /// Entries the log holds.
    pub log_entries: u64,
    /// Bytes the log takes in the store.
    pub log_bytes: u64,
    /// The log is past `snapshot_degraded_after`.
    pub degraded: bool,
}

impl NodeGauges<'_> {
    /// Prometheus text of these gauges, with `lockstep_build_info`.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP lockstep_role The node's role: 1 for the role it has, 0 for the others\n# TYPE lockstep_role gauge"
        );
        for r in ROLES {
            let _ = writeln!(
                out,
                "lockstep_role{{role=\"{r}\"}} {}",
                u8::from(r == self.role)
            );
        }
        let _ = writeln!(
            out,
            "# HELP lockstep_build_info The follower's version (always 1)\n# TYPE lockstep_build_info gauge\nlockstep_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        let _ = writeln!(
            out,
            "# HELP lockstep_server_up 1 when the node's server runs attached to its region (holds its lock), 0 otherwise\n# TYPE lockstep_server_up gauge\nlockstep_server_up {}",
            u8::from(self.server_up)
        );
        if let Some(c) = self.zookeeper_connected {
            let _ = writeln!(
                out,
                "# HELP lockstep_zookeeper_connected 1 while the follower's ZooKeeper session is connected, 0 otherwise (exported only with election.mode = \"zookeeper\")\n# TYPE lockstep_zookeeper_connected gauge\nlockstep_zookeeper_connected {}",
                u8::from(c)
            );
        }
        let _ = writeln!(
            out,
            "# HELP lockstep_apply_lag_entries Committed entries the node's server has not applied yet\n# TYPE lockstep_apply_lag_entries gauge\nlockstep_apply_lag_entries {}",
            self.apply_lag_entries
        );
        let _ = writeln!(
            out,
            "# HELP lockstep_apply_lag_seconds Time the node's server needs to apply its backlog at its recent rate\n# TYPE lockstep_apply_lag_seconds gauge\nlockstep_apply_lag_seconds {:.3}",
            self.apply_lag_seconds
        );
        let _ = writeln!(
            out,
            "# HELP lockstep_apply_rate_entries_per_second Entries the node's server applied per second recently
# TYPE lockstep_apply_rate_entries_per_second gauge
lockstep_apply_rate_entries_per_second {}",
            self.apply_rate
        );
        let _ = writeln!(
            out,
            "# HELP lockstep_failover_backlog_grows 1 on a leader that goes on writing although fewer than a majority of the nodes can apply (a failover inherits a growing backlog), 0 otherwise
# TYPE lockstep_failover_backlog_grows gauge
lockstep_failover_backlog_grows {}",
            u8::from(self.failover_backlog_grows)
        );
        let gauges: [(&str, &str, u64); 6] = [
            (
                "lockstep_snapshot_failing",
                "1 while the config asks for snapshots and this node's fail or cannot be taken (see `lockstep status`), 0 otherwise",
                u64::from(self.snapshot_failing),
            ),
            (
                "lockstep_snapshot_failures",
                "Failed snapshot attempts since snapshots began failing (0 while they work)",
                self.snapshot_failures,
            ),
            (
                "lockstep_snapshot_seq",
                "Seq of the node's newest complete snapshot (0: none)",
                self.newest_snapshot,
            ),
            (
                "lockstep_log_entries",
                "Entries the node's log holds (compaction below a majority's snapshots keeps it short)",
                self.log_entries,
            ),
            (
                "lockstep_log_bytes",
                "Bytes the node's log takes in its store (RocksDB tables and memtables)",
                self.log_bytes,
            ),
            (
                "lockstep_degraded",
                "1 when the node's log holds more than snapshot_degraded_after times snapshot_every, 0 otherwise",
                u64::from(self.degraded),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
    }
}

/// Answers a request path (None: 404).
type Route = dyn Fn(&str) -> Option<Reply> + Send + Sync;

/// One HTTP answer of the metrics address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Status code (200, 503, ...).
    pub status: u16,
    /// Content type of `body`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

impl Reply {
    /// Prometheus text exposition.
    pub fn metrics(body: String) -> Reply {
        Reply {
            status: 200,
            content_type: "text/plain; version=0.0.4",
            body,
        }
    }

    /// A JSON body with `status`.
    pub fn json(status: u16, body: &serde_json::Value) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: format!("{body}\n"),
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// The path of an HTTP request line (`GET /leader?x HTTP/1.1` → `/leader`)
/// and whether it is a `HEAD`; None for other methods.
fn request_path(line: &str) -> Option<(&str, bool)> {
    let mut words = line.split_whitespace();
    let head = match words.next()? {
        "GET" => false,
        "HEAD" => true,
        _ => return None,
    };
    let target = words.next()?;
    Some((target.split('?').next().unwrap_or(target), head))
}

fn answer(stream: std::net::TcpStream, route: &(dyn Fn(&str) -> Option<Reply> + Send + Sync)) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    // Skip the request headers.
    let mut h = String::new();
    while reader.read_line(&mut h).map(|n| n > 2).unwrap_or(false) {
        h.clear();
    }
    let (reply, head) = match request_path(&line) {
        Some((path, head)) => (
            route(path).unwrap_or(Reply {
                status: 404,
                content_type: "text/plain",
                body: "not found: try /metrics, /health or /leader\n".into(),
            }),
            head,
        ),
        None => (
            Reply {
                status: 405,
                content_type: "text/plain",
                body: "only GET and HEAD\n".into(),
            },
            false,
        ),
    };
    let mut s = &stream;
    let _ = write!(
        s,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        reply.status,
        reason(reply.status),
        reply.content_type,
        reply.body.len(),
        if head { "" } else { &reply.body }
    );
}

/// Serves HTTP `GET`s on `addr` from background threads (one per
/// connection: a slow client delays no health check); `route(path)`
/// answers a path, None is a 404.
pub fn serve(addr: SocketAddr, route: Arc<Route>) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr)?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let route = route.clone();
                let _ = std::thread::Builder::new()
                    .name("http".into())
                    .spawn(move || answer(stream, &*route));
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.persist.observe(Duration::from_micros(3));
        m.persist.observe(Duration::from_millis(500));
        let text = m.render(&[("lockstep_view", "view", 2)]);
        assert!(
            text.contains("lockstep_persist_seconds_bucket{le=\"0.000005\"} 1"),
            "{text}"
        );
        assert!(text.contains("lockstep_persist_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("lockstep_persist_seconds_count 2"));
        assert!(text.contains("lockstep_view 2"));
    }

    #[test]
    fn node_gauges_follow_prometheus_conventions() {
        let mut g = NodeGauges {
            role: "backup",
            server_up: true,
            zookeeper_connected: None,
            apply_lag_entries: 7,
            apply_lag_seconds: 0.25,
            apply_rate: 1200,
            failover_backlog_grows: false,
            snapshot_failing: true,
            snapshot_failures: 3,
            newest_snapshot: 0,
            log_entries: 12_000,
            log_bytes: 5 << 20,
            degraded: true,
        };
        let mut text = String::new();
        g.render(&mut text);
        for want in [
            "lockstep_snapshot_failing 1\n",
            "lockstep_snapshot_failures 3\n",
            "lockstep_snapshot_seq 0\n",
            "lockstep_log_entries 12000\n",
            "lockstep_log_bytes 5242880\n",
            "lockstep_degraded 1\n",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        assert!(
            text.contains("lockstep_role{role=\"backup\"} 1\n"),
            "{text}"
        );
        for r in ["leader", "joining", "stale"] {
            assert!(
                text.contains(&format!("lockstep_role{{role=\"{r}\"}} 0\n")),
                "{text}"
            );
        }
        assert!(text.contains(&format!(
            "lockstep_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        )));
        assert!(text.contains("lockstep_server_up 1\n"), "{text}");
        assert!(!text.contains("lockstep_zookeeper_connected"), "{text}");
        assert!(text.contains("lockstep_apply_lag_entries 7\n"), "{text}");
        assert!(
            text.contains("lockstep_apply_rate_entries_per_second 1200\n"),
            "{text}"
        );
        assert!(
            text.contains("lockstep_failover_backlog_grows 0\n"),
            "{text}"
        );
        assert!(
            text.contains("lockstep_apply_lag_seconds 0.250\n"),
            "{text}"
        );
        g.zookeeper_connected = Some(false);
        g.server_up = false;
        let mut text = String::new();
        g.render(&mut text);
        assert!(text.contains("lockstep_zookeeper_connected 0\n"), "{text}");
        assert!(text.contains("lockstep_server_up 0\n"), "{text}");
        // Every sample has its HELP and TYPE.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} gauge")), "{line}");
            assert!(text.contains(&format!("# HELP {name} ")), "{line}");
        }
    }

    #[test]
    fn http_routes_paths_with_status_codes() {
        assert_eq!(
            request_path("GET /leader HTTP/1.1\r\n"),
            Some(("/leader", false))
        );
        assert_eq!(
            request_path("HEAD /health?x=1 HTTP/1.0"),
            Some(("/health", true))
        );
        assert_eq!(request_path("POST /leader HTTP/1.1"), None);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        serve(
            addr,
            Arc::new(|path| match path {
                "/up" => Some(Reply::json(200, &serde_json::json!({"ok": true}))),
                "/down" => Some(Reply::json(503, &serde_json::json!({"ok": false}))),
                _ => None,
            }),
        )
        .unwrap();
        let get = |req: &str| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            std::io::Read::read_to_string(&mut s, &mut out).unwrap();
            out
        };
        let up = get("GET /up HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(up.starts_with("HTTP/1.1 200 OK\r\n"), "{up}");
        assert!(up.contains("Content-Type: application/json"), "{up}");
        assert!(up.ends_with("\r\n\r\n{\"ok\":true}\n"), "{up}");
        let down = get("GET /down HTTP/1.0\r\n\r\n");
        assert!(
            down.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{down}"
        );
        let head = get("HEAD /down HTTP/1.0\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 503") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
        assert!(get("GET /nope HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("DELETE /up HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 405"));
    }
}
