//! Time moves inside a turn, the same on every replica (preload's
//! `turn_time`): a busy script runs past Redis's busy threshold, so other
//! clients get `-BUSY` and `SCRIPT KILL`/`FUNCTION KILL` stop it (before,
//! the clock stood still inside the turn and the whole cluster stayed
//! wedged), and durations Redis measures inside a command are real on the
//! leader and equal on the backups. Real followers, real redis-server,
//! both commit modes (the suite's).

use lockstep_testkit::cluster;

use std::time::Duration;

use cluster::*;

const LIMIT: Duration = Duration::from_secs(60);

// One cluster at a time (`serial`): two busy scripts' clusters side by
// side on a 2-core machine have made a backup take a client's input at
// another of the script's nested polls than the leader did (a known open
// problem, see docs/concepts/guarantees.md); alone, each test checks what it
// names.

fn ok(reply: Value) {
    assert_eq!(reply, Value::Simple("OK".into()));
}

/// Waits until a `PING` on `probe` answers `-BUSY` (the script is past
/// the threshold); panics after a minute.
fn wait_busy(probe: &mut Resp) {
    let start = std::time::Instant::now();
    loop {
        match probe.cmd(&[b"PING"]).unwrap() {
            Value::Error(e) if e.starts_with("BUSY") => return,
            Value::Simple(s) if s == "PONG" => {}
            other => panic!("PING during the script answered {other:?}"),
        }
        assert!(
            start.elapsed() < LIMIT,
            "the script never became busy: time stands still in its turn"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Other clients' commands during the script are logged too: they must
/// reach every replica's server at the same point of the script.
fn busy_then_killed(c: &TestCluster, start: &[&[u8]], kill: &[&[u8]], killed: &str) {
    let mut admin = Resp::connect(c.app(1)).unwrap();
    ok(admin
        .cmd(&[b"CONFIG", b"SET", b"busy-reply-threshold", b"100"])
        .unwrap());
    ok(admin.cmd(&[b"SET", b"before", b"1"]).unwrap());
    let mut runner = Resp::connect(c.app(1)).unwrap();
    runner.set_read_timeout(LIMIT).unwrap();
    runner.send(start).unwrap();
    wait_busy(&mut admin);
    // A write during the script is refused, on every replica alike.
    match admin.cmd(&[b"SET", b"during", b"1"]).unwrap() {
        Value::Error(e) => assert!(e.starts_with("BUSY"), "SET answered {e}"),
        other => panic!("SET during the script answered {other:?}"),
    }
    ok(admin.cmd(kill).unwrap());
    match runner.read().unwrap() {
        Value::Error(e) => assert!(e.contains(killed), "the script ended with {e}"),
        other => panic!("the killed script answered {other:?}"),
    }
    assert_eq!(
        admin.cmd(&[b"PING"]).unwrap(),
        Value::Simple("PONG".into()),
        "the leader serves again"
    );
    ok(admin.cmd(&[b"SET", b"after", b"1"]).unwrap());
    assert_eq!(admin.cmd(&[b"EXISTS", b"during"]).unwrap(), Value::Int(0));
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

#[test]
fn a_busy_script_gets_busy_replies_and_script_kill_stops_it_everywhere() {
    let _serial = serial();
    let mut c = TestCluster::new("tt-script", Options::default());
    c.start_all();
    busy_then_killed(
        &c,
        &[b"EVAL", b"local i = 0 while true do i = i + 1 end", b"0"],
        &[b"SCRIPT", b"KILL"],
        "killed by user",
    );
}

#[test]
fn a_busy_function_is_stopped_by_function_kill_everywhere() {
    let _serial = serial();
    let mut c = TestCluster::new("tt-function", Options::default());
    c.start_all();
    let mut admin = Resp::connect(c.app(1)).unwrap();
    let lib = b"#!lua name=spinlib\nredis.register_function('spin', function() local i = 0 while true do i = i + 1 end end)";
    assert_eq!(
        admin.cmd(&[b"FUNCTION", b"LOAD", lib]).unwrap(),
        Value::Bulk(b"spinlib".to_vec())
    );
    busy_then_killed(
        &c,
        &[b"FCALL", b"spin", b"0"],
        &[b"FUNCTION", b"KILL"],
        "killed by user",
    );
}

/// The first slowlog entry's (id, timestamp, duration µs, command).
fn slowlog_head(addr: std::net::SocketAddr) -> (i64, i64, i64, Vec<u8>) {
    let mut r = Resp::connect(addr).unwrap();
    let Value::Array(entries) = r.cmd(&[b"SLOWLOG", b"GET", b"1"]).unwrap() else {
        panic!("SLOWLOG GET answered no array");
    };
    let Some(Value::Array(e)) = entries.first() else {
        panic!("{addr}: the slowlog is empty");
    };
    let int = |r: &Value| match r {
        Value::Int(i) => *i,
        other => panic!("slowlog field {other:?}"),
    };
    let Value::Array(argv) = &e[3] else {
        panic!("slowlog argv {:?}", e[3]);
    };
    let Value::Bulk(cmd) = &argv[0] else {
        panic!("slowlog argv {argv:?}");
    };
    (int(&e[0]), int(&e[1]), int(&e[2]), cmd.clone())
}

/// `DEBUG SLEEP` inside a turn takes its real time on the leader; the
/// slowlog and the latency monitor record it, and every backup records
/// the very same figures (its clock reads what the leader's did).
#[test]
fn durations_inside_a_command_are_real_and_the_same_everywhere() {
    let _serial = serial();
    let mut c = TestCluster::new("tt-slowlog", Options::default());
    c.start_all();
    let mut r = Resp::connect(c.app(1)).unwrap();
    ok(
        r.cmd(&[b"CONFIG", b"SET", b"slowlog-log-slower-than", b"100000"])
            .unwrap(),
    );
    ok(
        r.cmd(&[b"CONFIG", b"SET", b"latency-monitor-threshold", b"50"])
            .unwrap(),
    );
    ok(r.cmd(&[b"SLOWLOG", b"RESET"]).unwrap());
    ok(r.cmd(&[b"DEBUG", b"SLEEP", b"0.2"]).unwrap());
    ok(r.cmd(&[b"SET", b"k", b"v"]).unwrap());
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    // Before the slowlog is read: its entries name each node's own client
    // address (a reply that differs per node by design).
    c.assert_no_divergence();
    let leader = slowlog_head(c.app(1));
    assert_eq!(leader.3, b"DEBUG".to_vec(), "slowlog: {leader:?}");
    assert!(
        leader.2 >= 200_000,
        "DEBUG SLEEP 0.2 took {} µs by the leader's clock",
        leader.2
    );
    c.wait_converged(LIMIT);
    for id in 2..=3 {
        assert_eq!(
            slowlog_head(c.app(id)),
            leader,
            "node {id}'s slowlog differs from the leader's\n{}",
            c.logs()
        );
    }
    let latest = |id| {
        let mut r = Resp::connect(c.app(id)).unwrap();
        r.cmd(&[b"LATENCY", b"LATEST"]).unwrap()
    };
    let on_leader = latest(1);
    let Value::Array(events) = &on_leader else {
        panic!("LATENCY LATEST answered {on_leader:?}");
    };
    assert!(
        !events.is_empty(),
        "the latency monitor saw no event above 50 ms"
    );
    for id in 2..=3 {
        assert_eq!(latest(id), on_leader, "node {id}'s latency events differ");
    }
}

/// Redis's `LASTSAVE` (its start time, in a fresh data dir) on node `id`.
fn lastsave(c: &TestCluster, id: u64) -> i64 {
    match Resp::connect(c.app(id))
        .unwrap()
        .cmd(&[b"LASTSAVE"])
        .unwrap()
    {
        Value::Int(t) => t,
        other => panic!("LASTSAVE on node {id} answered {other:?}"),
    }
}

#[test]
fn a_fresh_server_is_dated_when_the_log_began_on_every_replica() {
    let _serial = serial();
    let mut c = TestCluster::new("tt-origin", Options::default());
    c.start_all();
    let origin_s = (c.origin_us(1) / 1_000_000) as i64;
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // Before: 946684800 (2000-01-01) everywhere, uptime 27 years.
    assert!(
        origin_s > now_s - 600 && origin_s <= now_s,
        "the log began at {origin_s}, now is {now_s}"
    );
    for id in 1..=3 {
        assert_eq!(c.origin_us(id), c.origin_us(1), "node {id}'s origin");
        assert_eq!(lastsave(&c, id), origin_s, "node {id}'s server start");
    }
    let info = match Resp::connect(c.app(1))
        .unwrap()
        .cmd(&[b"INFO", b"server"])
        .unwrap()
    {
        Value::Bulk(b) => String::from_utf8_lossy(&b).to_string(),
        other => panic!("INFO answered {other:?}"),
    };
    let uptime: i64 = info
        .lines()
        .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no uptime in {info}"));
    assert!((0..=600).contains(&uptime), "uptime {uptime} s\n{info}");
    // A replica rebuilt later replays the log from its start with a fresh
    // server: it is dated the same.
    let mut r = Resp::connect(c.app(1)).unwrap();
    ok(r.cmd(&[b"SET", b"k", b"v"]).unwrap());
    c.kill_follower(3);
    c.kill_server(3);
    std::fs::remove_dir_all(c.config().node_data_dir(3)).unwrap();
    c.restart_node(3);
    ok(r.cmd(&[b"SET", b"k2", b"v"]).unwrap());
    c.wait_converged(LIMIT);
    assert_eq!(c.origin_us(3), c.origin_us(1), "the rebuilt node's origin");
    assert_eq!(lastsave(&c, 3), origin_s, "the rebuilt node's server start");
    assert_eq!(
        r.cmd(&[b"LASTSAVE"]).unwrap(),
        Value::Int(origin_s),
        "LASTSAVE through the leader"
    );
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}
