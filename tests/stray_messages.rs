//! Hostile or stray control messages against a running cluster (real
//! follower processes, real redis-server under the preload): a control
//! connection that cannot prove the cluster key is refused, also on shm
//! clusters without a configured key (the key is then the one generated in
//! `<data_dir>/cluster.key`); a view change that names a node outside the
//! config is refused; and one well-formed `Prepare` for a far newer view
//! does not stop the cluster for good.
//!
//! No assertion depends on wall-clock time: durations only bound how long
//! a test waits before it reports a hang (with the logs).

use lockstep_testkit::cluster;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::{bin_dir, Options, Resp, TestCluster, Value, ZookeeperServer};
use lockstep_common::control::{self, Request, Response};
use lockstep_common::handshake::{self, Channel, HandshakeError};

/// Bound on every wait: reaching it means a hang, not slowness.
const HANG: Duration = Duration::from_secs(180);

/// Sends `req` to node `to`'s control port over a connection that proved
/// node id `as_node` (0: the identity `lockstep status` uses) with the
/// cluster key — read as `lockstep status` reads it, from `data_dir` on a
/// keyless shm cluster; returns the answer.
fn send_as(c: &TestCluster, to: u64, as_node: u64, req: &Request) -> Response {
    let config = c.config();
    let addr = config.node(to).expect("node").control;
    let mut s = handshake::connect(
        addr,
        &config.cluster,
        config.cluster_key().expect("the cluster key"),
        as_node,
        Channel::Control,
        Duration::from_secs(10),
    )
    .expect("handshake with the cluster key");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    control::send_json(&mut s, req).expect("send request");
    control::recv_json(&mut s).expect("answer")
}

/// `INCR key` on a fresh connection to `addr`: the new value, or why not.
fn incr(addr: SocketAddr, key: &str) -> Result<i64, String> {
    let mut r = Resp::connect_with(addr, Duration::from_secs(2), Duration::from_secs(10))
        .map_err(|e| format!("connect: {e}"))?;
    match r.cmd(&[b"INCR", key.as_bytes()]) {
        Ok(Value::Int(v)) => Ok(v),
        Ok(other) => Err(format!("answered {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// The value of `key` on the server at `addr` (0 when unset).
fn get_int(addr: SocketAddr, key: &str) -> i64 {
    let mut r = Resp::connect(addr).expect("connect");
    match r.cmd(&[b"GET", key.as_bytes()]).expect("GET") {
        Value::Bulk(b) => String::from_utf8_lossy(&b).parse().expect("integer"),
        Value::Null => 0,
        other => panic!("GET answered {other:?}"),
    }
}

/// Removes the configured key from the (not yet used) config: an shm
/// cluster then uses the key its first node generates in `data_dir`.
fn keyless(c: &mut TestCluster) {
    c.change_config(|s| s.unset("key"));
    assert!(c.config().key.is_none());
}

/// A 3-node shm cluster without a configured key, serving.
fn started(test: &str) -> TestCluster {
    let mut c = TestCluster::new(test, Options::default());
    keyless(&mut c);
    c.start_all();
    c
}

/// `lockstep status --config …`: exit code, stdout, stderr.
fn lockstep_status(c: &TestCluster) -> (i32, String, String) {
    let out = Command::new(bin_dir().join("lockstep"))
        .arg("status")
        .arg("--config")
        .arg(&c.config_path)
        .output()
        .expect("run lockstep status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn follower_log(c: &TestCluster, id: u64) -> String {
    std::fs::read_to_string(c.dir.join(format!("follower-{id}.log"))).unwrap_or_default()
}

/// The node that leads now, if one does.
fn leader(c: &TestCluster) -> Option<u64> {
    (1..=c.nodes.len() as u64).find(|&id| c.status(id).map(|s| s.role == "leader").unwrap_or(false))
}

/// The cluster acknowledges `n` INCRs of `key` on the leader in a row
/// (retrying refused or failed ones); returns the last value acknowledged.
fn acknowledged_incrs(c: &TestCluster, key: &str, n: usize) -> i64 {
    let start = Instant::now();
    let mut last = 0;
    let mut done = 0;
    let mut last_error = String::new();
    while done < n {
        let Some(l) = leader(c) else {
            last_error = "no leader".into();
            std::thread::sleep(Duration::from_millis(50));
            assert!(start.elapsed() < HANG, "no leader\n{}", c.logs());
            continue;
        };
        match incr(c.app(l), key) {
            Ok(v) => {
                assert!(v > last, "INCR answered {v} after {last}");
                last = v;
                done += 1;
            }
            Err(e) => {
                last_error = e;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        assert!(
            start.elapsed() < HANG,
            "writes did not get through ({done} of {n}; last error: {last_error})\n{}",
            c.logs()
        );
    }
    last
}

/// Issue 14 on shm: the control port used to let any local process in
/// (no key configured, so the handshake proved nothing). Now the followers
/// share a generated key, private to the user they run as: a connection
/// that proves no key or a wrong one is refused and logged, while
/// `lockstep status`, which reads the key file, works.
#[test]
fn a_control_connection_without_the_key_is_refused_on_shm() {
    let c = started("stray-nokey");
    let config = c.config();
    let path = config.cluster_key_path().expect("a keyless config");
    assert_eq!(path, config.data_dir.join("cluster.key"));
    let meta = std::fs::metadata(&path).expect("the followers generated the key");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let before = acknowledged_incrs(&c, "stray:ctr", 20);
    let view = c.status(2).unwrap().view;

    // "": what a keyless cluster's handshake proved before; then a wrong
    // key. Neither as the CLI identity nor as a member.
    for key in ["", "a-wrong-key-0123456789abcdef"] {
        for as_node in [0, 3] {
            let addr = config.node(2).unwrap().control;
            match handshake::connect(
                addr,
                &config.cluster,
                key,
                as_node,
                Channel::Control,
                Duration::from_secs(10),
            ) {
                Err(HandshakeError::Refused { reason, .. }) => assert!(
                    reason.contains(&format!(
                        "authentication failed for node {as_node}: wrong cluster key"
                    )),
                    "{reason}"
                ),
                Err(e) => panic!("key {key:?} as node {as_node}: {e}"),
                Ok(_) => panic!("a control connection with key {key:?} as node {as_node} got in"),
            }
        }
    }
    // The follower says so in its log (written right after the refusal).
    c.wait("the refusals logged", HANG, |c| {
        let log = follower_log(c, 2);
        log.contains("authentication failed for node 0: wrong cluster key")
            && log.contains("authentication failed for node 3: wrong cluster key")
    });

    // `lockstep status` reads the key file and sees the whole cluster.
    let (code, out, err) = lockstep_status(&c);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("view {view}  leader 1")), "{out}");
    assert!(!out.contains("down"), "{out}");
    // A key file others can read is refused, naming the file, before
    // anything is sent; the running followers keep the key they read.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, out, err) = lockstep_status(&c);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&path.display().to_string()) && err.contains("chmod 600"),
        "{err}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Nothing changed the view, and writes go on.
    assert_eq!(c.status(2).unwrap().view, view);
    let after = acknowledged_incrs(&c, "stray:ctr", 50);
    assert_eq!(after, before + 50);
}

#[test]
fn a_view_change_naming_a_stranger_is_refused() {
    let c = started("stray-member");
    let before = acknowledged_incrs(&c, "stray:ctr", 20);
    let view = c.status(2).unwrap().view;

    // Issue 14's message: candidate 9 (not a member), sent with the
    // identity `lockstep status` uses (and the key it reads from data_dir).
    let stray = Request::Prepare {
        view: view + 1000,
        candidate: 9,
    };
    match send_as(&c, 2, 0, &stray) {
        Response::Error(e) => assert!(
            e.contains("candidate 9 is not a member of the cluster"),
            "{e}"
        ),
        other => panic!("a Prepare for candidate 9 was answered {other:?}"),
    }
    // A connection that proved id 9 with the key is no member either.
    assert!(matches!(send_as(&c, 2, 9, &stray), Response::Error(_)));
    // A member's Prepare, sent by someone else.
    let relayed = Request::Prepare {
        view: view + 1000,
        candidate: 3,
    };
    match send_as(&c, 2, 0, &relayed) {
        Response::Error(e) => assert!(e.contains("must come from node 3"), "{e}"),
        other => panic!("a relayed Prepare was answered {other:?}"),
    }
    // A stranger's NewView and log transfer.
    let nv = Request::NewView {
        view: view + 1000,
        leader: 9,
        last: 1,
    };
    assert!(matches!(send_as(&c, 2, 9, &nv), Response::Error(_)));
    assert!(matches!(
        send_as(&c, 2, 0, &Request::Fetch { from: 1, to: 0 }),
        Response::Error(_)
    ));
    // Status stays open to the CLI.
    assert!(matches!(
        send_as(&c, 2, 0, &Request::Status),
        Response::Status(_)
    ));

    // Nothing was promised: node 2 is still in the leader's view, and the
    // refusal was logged naming the id.
    assert_eq!(c.status(2).unwrap().view, view);
    let log = follower_log(&c, 2);
    assert!(
        log.contains("refused Prepare of view") && log.contains("candidate 9 is not a member"),
        "{log}"
    );

    // Writes go on, and every node ends with the same state.
    let after = acknowledged_incrs(&c, "stray:ctr", 200);
    assert_eq!(after, before + 200);
    c.wait_converged(HANG);
    c.assert_same_digest();
    for id in 1..=3 {
        assert_eq!(get_int(c.app(id), "stray:ctr"), after, "node {id}");
    }
}

/// A 3-node cluster electing through a private ZooKeeper, serving.
fn zk_started(test: &str) -> (TestCluster, ZookeeperServer) {
    let mut c = TestCluster::new(test, Options::default());
    keyless(&mut c);
    let zk = c.start_zookeeper(2000);
    c.start_nodes();
    c.wait("a leader", HANG, |c| leader(c).is_some());
    (c, zk)
}

/// Issue 14's stall: with the cluster key (on shm the one in `data_dir`,
/// which a local attacker must be able to read), a member that is not the leader
/// sends one backup a `Prepare` for the leader's view + 1000, and that
/// backup promises it. The view never starts; the cluster must move past
/// it and acknowledge writes again, losing nothing acknowledged.
fn promised_view_that_never_starts(c: &TestCluster) {
    let before = acknowledged_incrs(c, "stray:ctr", 20);
    let old = leader(c).expect("a leader");
    let view = c.status(old).unwrap().view;
    let (backup, rogue) = match old {
        1 => (2, 3),
        2 => (3, 1),
        _ => (1, 2),
    };
    let stray = Request::Prepare {
        view: view + 1000,
        candidate: rogue,
    };
    match send_as(c, backup, rogue, &stray) {
        Response::Promise(p) => assert_eq!(p.node, backup),
        other => panic!("the stray Prepare was answered {other:?}"),
    }
    assert_eq!(c.status(backup).unwrap().view, view + 1000);

    // Writes get through again (the first ones may fail while the leader
    // finds its writes fenced and moves on).
    let after = acknowledged_incrs(c, "stray:ctr", 100);
    assert!(after >= before + 100, "{after} after {before}");
    let now = leader(c).expect("a leader");
    let new_view = c.status(now).unwrap().view;
    assert!(
        new_view > view + 1000,
        "the cluster serves in view {new_view}, the stray view was {}",
        view + 1000
    );
    let log = follower_log(c, now);
    assert!(log.contains("trying a view above it") || log.contains("starting a view above it"));

    // Nothing acknowledged is lost, and every node holds the same state.
    c.wait_converged_on(
        &[now]
            .into_iter()
            .chain((1..=3).filter(|&i| i != now))
            .collect::<Vec<_>>(),
        HANG,
    );
    let digest = cluster::redis_digest(c.app(now));
    for id in 1..=3 {
        assert_eq!(
            cluster::redis_digest(c.app(id)),
            digest,
            "node {id} differs from the leader\n{}",
            c.logs()
        );
        let v = get_int(c.app(id), "stray:ctr");
        assert!(v >= after, "node {id}: counter {v}, acknowledged {after}");
    }
    c.assert_no_divergence();
}

#[test]
fn a_promised_view_that_never_starts_does_not_stall_static_election() {
    let c = started("stray-view");
    promised_view_that_never_starts(&c);
}

#[test]
fn a_promised_view_that_never_starts_does_not_stall_the_tcp_transport() {
    // The leader learns the newer view from the region server's fence
    // notices instead of reading the peer's region.
    let mut c = TestCluster::new(
        "stray-view-tcp",
        Options {
            transport: "tcp",
            ..Options::default()
        },
    );
    c.start_all();
    promised_view_that_never_starts(&c);
}

#[test]
fn a_promised_view_that_never_starts_does_not_stall_zookeeper_election() {
    let (c, _zk) = zk_started("stray-view-zk");
    promised_view_that_never_starts(&c);
}
