//! The commit disciplines seen from a client, with real followers and real
//! servers: no reply (and no read) is ever visible before the inputs it may
//! depend on are committed, and the commit keeps moving when no reply waits.
//!
//! Runs in the suite's commit mode (`LOCKSTEP_TEST_COMMIT`): every check
//! here holds in both; in input mode the server itself waits instead of
//! its replies.

use lockstep_testkit::cluster;

use std::io::Write;
use std::time::Duration;

use cluster::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const LIMIT: Duration = Duration::from_secs(60);
/// How long a held reply is watched for not arriving. Not a speed bound:
/// the reply may not come at all while the backups are frozen.
const HELD: Duration = Duration::from_millis(700);

/// SIGSTOPs the processes it is given; SIGCONTs them when dropped (also
/// when a check fails), so that the cluster can stop cleanly.
struct Frozen(Vec<i32>);

impl Frozen {
    /// The followers of nodes `ids`.
    fn followers(c: &TestCluster, ids: &[u64]) -> Frozen {
        Frozen::pids(
            ids.iter()
                .map(|&id| c.status(id).expect("status").follower_pid),
        )
    }

    /// The servers of nodes `ids` (their followers keep storing and
    /// acking).
    fn servers(c: &TestCluster, ids: &[u64]) -> Frozen {
        Frozen::pids(
            ids.iter()
                .map(|&id| c.status(id).expect("status").server_pid),
        )
    }

    fn pids(pids: impl Iterator<Item = u64>) -> Frozen {
        let pids: Vec<i32> = pids.map(|p| p as i32).collect();
        assert!(
            pids.iter().all(|&p| p > 0),
            "every process running: {pids:?}"
        );
        for &p in &pids {
            kill(Pid::from_raw(p), Signal::SIGSTOP).expect("SIGSTOP");
        }
        Frozen(pids)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &p in &self.0 {
            let _ = kill(Pid::from_raw(p), Signal::SIGCONT);
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Asserts that `c` gets no reply within `HELD`.
fn assert_held(c: &mut Resp, what: &str) {
    c.set_read_timeout(HELD).unwrap();
    match c.read() {
        Err(e) if is_timeout(&e) => {}
        other => panic!("{what}: answered while no majority could store it: {other:?}"),
    }
    c.set_read_timeout(LIMIT).unwrap();
}

#[test]
fn no_reply_is_visible_before_its_input_is_committed() {
    let mut c = TestCluster::new("oc-held", Options::default());
    c.start_all();
    let mut writer = Resp::connect(c.app(1)).unwrap();
    let mut reader = Resp::connect(c.app(1)).unwrap();
    assert_eq!(
        writer.cmd(&[b"SET", b"k", b"old"]).unwrap(),
        Value::Simple("OK".into())
    );

    let frozen = Frozen::followers(&c, &[2, 3]);
    writer.send(&[b"SET", b"k", b"new"]).unwrap();
    assert_held(&mut writer, "SET k new");
    // A read from another connection is an input too: in output mode the
    // server already ran the SET, and this GET's reply would show it.
    reader.send(&[b"GET", b"k"]).unwrap();
    assert_held(&mut reader, "GET k");
    // Nothing closes or resets either connection meanwhile.
    assert_eq!(c.status(1).expect("leader status").role, "leader");

    drop(frozen);
    assert_eq!(writer.read().unwrap(), Value::Simple("OK".into()));
    assert_eq!(reader.read().unwrap(), Value::Bulk(b"new".to_vec()));
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

#[test]
fn a_connection_closed_by_the_server_waits_for_the_commit() {
    let mut c = TestCluster::new("oc-quit", Options::default());
    c.start_all();
    let mut client = Resp::connect(c.app(1)).unwrap();
    assert_eq!(
        client.cmd(&[b"SET", b"k", b"1"]).unwrap(),
        Value::Simple("OK".into())
    );
    let frozen = Frozen::followers(&c, &[2, 3]);
    // QUIT: the server replies and closes; neither may reach the client
    // before the commit.
    client.send(&[b"QUIT"]).unwrap();
    assert_held(&mut client, "QUIT");
    drop(frozen);
    assert_eq!(client.read().unwrap(), Value::Simple("OK".into()));
    let mut b = [0u8; 1];
    use std::io::Read;
    assert_eq!(
        client.stream().read(&mut b).unwrap(),
        0,
        "no EOF after QUIT"
    );
    c.wait_converged(LIMIT);
    c.assert_same_digest();
}

/// memcached's `noreply` commands produce no output at all: the leader's
/// follower must keep raising the commit point so the backups apply them.
#[test]
fn commands_without_replies_still_commit_and_apply() {
    let mut c = TestCluster::new(
        "oc-noreply",
        Options {
            server: Server::Memcached,
            ..Options::default()
        },
    );
    c.start_all();
    let mut s = std::net::TcpStream::connect(c.app(1)).unwrap();
    for i in 0..200 {
        write!(s, "set k{i} 0 0 2 noreply\r\nv{}\r\n", i % 10).unwrap();
    }
    s.flush().unwrap();
    // The backups apply all of it, though no reply ever waited (nothing
    // here reads from the leader until they have). Items are read one by
    // one: memcached's crawler dump can miss an item its LRU maintainer is
    // moving.
    let holds_all = |id: u64| {
        let Ok(mut m) = Memcache::connect(c.app(id)) else {
            return false;
        };
        (0..200).all(|i| {
            m.gets(&format!("k{i}"))
                .ok()
                .flatten()
                .is_some_and(|(_, v, _)| v == format!("v{}", i % 10).into_bytes())
        })
    };
    for id in 2..=3 {
        c.wait(
            &format!("node {id} to apply the noreply sets"),
            LIMIT,
            |_| holds_all(id),
        );
    }
    assert!(holds_all(1), "the leader holds every key");
    drop(s);
}

/// A RESP3 client (`HELLO 3`, as redis-py 8 sends by default): the HELLO
/// reply holds the connection's id, which may differ per node. With the
/// divergence check per input, at most those entries count, never every
/// later reply of the connection; and the data stays identical.
#[test]
fn a_resp3_hello_marks_at_most_its_own_entry() {
    let mut c = TestCluster::new("oc-resp3", Options::default());
    c.start_all();
    // Backups' client ids run apart from the leader's: a guest connection
    // on each backup takes an id there only.
    for id in 2..=3 {
        let mut g = Resp::connect(c.app(id)).unwrap();
        assert_eq!(g.cmd(&[b"PING"]).unwrap(), Value::Simple("PONG".into()));
    }
    const CONNS: usize = 4;
    let mut clients: Vec<Resp> = (0..CONNS)
        .map(|_| Resp::connect(c.app(1)).unwrap())
        .collect();
    for r in &mut clients {
        r.send(&[b"HELLO", b"3"]).unwrap();
        // A RESP3 map; its content does not matter here.
        assert!(matches!(r.read().unwrap(), Value::Map(_)));
    }
    for i in 0..50 {
        for (k, r) in clients.iter_mut().enumerate() {
            let key = format!("r3:{k}");
            let v = i.to_string();
            assert_eq!(
                r.cmd(&[b"SET", key.as_bytes(), v.as_bytes()]).unwrap(),
                Value::Simple("OK".into())
            );
        }
    }
    drop(clients);
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    for id in 2..=3 {
        let d = c.status(id).unwrap().divergences;
        assert!(
            d <= CONNS as u64,
            "node {id}: {d} divergent entries for {CONNS} HELLO replies: the check floods\n{}",
            c.logs()
        );
    }
}

/// Bounded apply lag: while no backup's server applies anything, the
/// leader takes at most `max_apply_lag` more entries (a majority still
/// stores and acks them all), then holds its next input until the
/// backups catch up; status shows the backlog meanwhile. So a failover
/// never inherits more than that to apply.
#[test]
fn the_leader_waits_while_the_backups_are_further_behind_than_max_apply_lag() {
    const LAG: u64 = 20;
    const WRITES: u64 = 200;
    let mut c = TestCluster::new(
        "oc-lag",
        Options {
            extra: format!("max_apply_lag = {LAG}\n"),
            ..Options::default()
        },
    );
    c.start_all();
    let mut client = Resp::connect(c.app(1)).unwrap();
    assert_eq!(client.cmd(&[b"INCR", b"n"]).unwrap(), Value::Int(1));
    c.wait_converged(LIMIT);

    let frozen = Frozen::servers(&c, &[2, 3]);
    // One INCR at a time: each is an entry of its own. Entries while the
    // servers are frozen: at most LAG (ticks count too).
    let mut answered = 1;
    client.set_read_timeout(HELD).unwrap();
    while answered < WRITES {
        client.send(&[b"INCR", b"n"]).unwrap();
        match client.read() {
            Ok(r) => {
                answered += 1;
                assert_eq!(r, Value::Int(answered as i64));
            }
            Err(e) if is_timeout(&e) => break,
            Err(e) => panic!("INCR {}: {e}", answered + 1),
        }
    }
    assert!(
        answered - 1 <= LAG,
        "the leader answered {} writes while no backup applied (max_apply_lag {LAG})",
        answered - 1
    );
    // The backlog is stored and committed, and status says how far
    // behind each backup is.
    for id in 2..=3 {
        let s = c.status(id).expect("backup status");
        assert!(
            s.committed > s.applied,
            "node {id} shows its backlog: {s:?}"
        );
    }

    drop(frozen);
    client.set_read_timeout(LIMIT).unwrap();
    answered += 1;
    assert_eq!(client.read().unwrap(), Value::Int(answered as i64));
    while answered < WRITES {
        answered += 1;
        assert_eq!(
            client.cmd(&[b"INCR", b"n"]).unwrap(),
            Value::Int(answered as i64)
        );
    }
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// memcached writes each connection's reply as soon as it has read the
/// request (not at the end of its loop's turn, as Redis does): those
/// replies are held until the turn ends and leave after one commit wait
/// (`held_output`). None may leave before the commit, nor out of order.
#[test]
fn memcached_replies_written_mid_turn_wait_for_the_commit() {
    mid_turn_replies_wait("1");
}

/// The same with four worker threads: a worker lets the turn lock go
/// before its commit wait (the workers' waits overlap), and still nothing
/// leaves before the commit.
#[test]
fn memcached_workers_replies_wait_for_the_commit_too() {
    mid_turn_replies_wait("4");
}

fn mid_turn_replies_wait(threads: &str) {
    let mut c = TestCluster::new(
        &format!("oc-mc-held-{threads}"),
        Options {
            server: Server::Memcached,
            ..Options::default()
        },
    );
    c.use_memcached("root", threads);
    c.start_all();
    // Other clients keep every worker busy meanwhile (with four workers
    // the turn lock then has waiters).
    let busy: Vec<_> = (0..4)
        .map(|t| {
            let addr = c.app(1);
            std::thread::spawn(move || {
                let Ok(mut m) = Memcache::connect(addr) else {
                    return;
                };
                for i in 0..300 {
                    if m.store("set", &format!("busy{t}-{i}"), 0, b"x", None)
                        .is_err()
                    {
                        return;
                    }
                }
            })
        })
        .collect();
    let mut a = Memcache::connect(c.app(1)).unwrap();
    assert_eq!(a.store("set", "k", 0, b"old", None).unwrap(), "STORED");
    let mut raw = std::net::TcpStream::connect(c.app(1)).unwrap();

    let frozen = Frozen::followers(&c, &[2, 3]);
    // Pipelined on one connection: a set, a get of it, an incr of a new
    // key: three replies the server writes within one turn.
    raw.write_all(b"set k 0 0 3\r\nnew\r\nget k\r\nset n 0 0 1\r\n7\r\nincr n 5\r\n")
        .unwrap();
    raw.set_read_timeout(Some(HELD)).unwrap();
    let mut b = [0u8; 256];
    use std::io::Read;
    match raw.read(&mut b) {
        Err(e) if is_timeout(&e) => {}
        other => panic!("memcached replied while no majority could store its inputs: {other:?}"),
    }
    drop(frozen);
    raw.set_read_timeout(Some(LIMIT)).unwrap();
    let want: &[u8] = b"STORED\r\nVALUE k 0 3\r\nnew\r\nEND\r\nSTORED\r\n12\r\n";
    let mut got = Vec::new();
    while got.len() < want.len() {
        let n = raw.read(&mut b).unwrap();
        assert!(
            n > 0,
            "connection closed after {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&b[..n]);
    }
    assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(want));
    for b in busy {
        b.join().unwrap();
    }
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
}

/// A client that sends much and reads nothing for a while: the replies
/// the socket cannot take stay held or are refused to the server
/// (`EAGAIN`, so it buffers them itself), and a reply larger than what a
/// connection may hold waits behind the held ones. Once the client reads,
/// every reply arrives whole and in order.
#[test]
fn a_client_that_reads_late_gets_every_reply_in_order() {
    let mut c = TestCluster::new("oc-slow-reader", Options::default());
    c.start_all();
    let mut setup = Resp::connect(c.app(1)).unwrap();
    let small = vec![b's'; 3000];
    let big = vec![b'B'; 200_000];
    assert_eq!(
        setup.cmd(&[b"SET", b"small", &small]).unwrap(),
        Value::Simple("OK".into())
    );
    assert_eq!(
        setup.cmd(&[b"SET", b"big", &big]).unwrap(),
        Value::Simple("OK".into())
    );
    let mut slow = Resp::connect(c.app(1)).unwrap();
    const N: usize = 3000;
    for i in 0..N {
        if i % 500 == 250 {
            slow.send(&[b"GET", b"big"]).unwrap();
        } else {
            slow.send(&[b"INCR", b"counter"]).unwrap();
            slow.send(&[b"GET", b"small"]).unwrap();
        }
    }
    // Meanwhile another client is served: the server did not block on the
    // slow one.
    assert_eq!(
        setup.cmd(&[b"SET", b"other", b"1"]).unwrap(),
        Value::Simple("OK".into())
    );
    let mut counter = 0;
    for i in 0..N {
        if i % 500 == 250 {
            assert_eq!(
                slow.read().unwrap(),
                Value::Bulk(big.clone()),
                "request {i}"
            );
        } else {
            counter += 1;
            assert_eq!(slow.read().unwrap(), Value::Int(counter), "request {i}");
            assert_eq!(
                slow.read().unwrap(),
                Value::Bulk(small.clone()),
                "request {i}"
            );
        }
    }
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    // The leader's Redis wrote less between two inputs than the backups'
    // (the slow socket refused some, which Redis sent later): its bytes
    // are a prefix of theirs, which is no divergence.
    c.assert_no_divergence();
}

/// A reply the leader holds past its turn (output commit does not wait
/// out a turn's commit while the loop has more to do: the next turn's
/// work overlaps it) leaves once it is committed, not when the next turn
/// ends: a client whose command ran just before another client's long
/// script gets its reply while the script still runs, as with Redis
/// alone. The backups' followers are frozen across the turn's end, so
/// the commit comes only while the script runs.
#[test]
fn a_reply_is_not_held_behind_the_next_turns_long_script() {
    let mut c = TestCluster::new("oc-deferred", Options::default());
    c.start_all();
    let mut a = Resp::connect(c.app(1)).unwrap();
    let mut b = Resp::connect(c.app(1)).unwrap();
    // Redis alone serves no other client during the script.
    assert_eq!(
        a.cmd(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"600000"])
            .unwrap(),
        Value::Simple("OK".into())
    );
    assert_eq!(b.cmd(&[b"PING"]).unwrap(), Value::Simple("PONG".into()));
    // A's turn lasts a second; B's script arrives meanwhile, so the loop
    // has work when A's turn ends, and the script is the next turn.
    a.send(&[b"DEBUG", b"SLEEP", b"1"]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let frozen = Frozen::followers(&c, &[2, 3]);
    // Seconds of work, a fixed count (the same on every replica): 400M
    // steps take about 2 s in plain Redis on this machine's cores (100M,
    // half a second, once ended before the check below looked).
    b.send(&[
        b"EVAL",
        b"local i = 0 while i < 400000000 do i = i + 1 end return i",
        b"0",
    ])
    .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    drop(frozen);
    assert_eq!(a.read().unwrap(), Value::Simple("OK".into()));
    // Held behind the script, A's reply would have left a moment before
    // B's; here the script runs on for seconds.
    std::thread::sleep(Duration::from_millis(200));
    let s = b.stream();
    s.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    match s.peek(&mut byte) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!(
            "A's reply came only with the script's ({other:?}): it was held behind the next turn"
        ),
    }
    s.set_nonblocking(false).unwrap();
    assert_eq!(b.read().unwrap(), Value::Int(400_000_000));
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}
