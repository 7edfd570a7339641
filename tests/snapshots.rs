//! Snapshots of a backup's server (CRIU process images, see the follower's
//! `snapshot` module), with real Redis and memcached, real CRIU (built by
//! `scripts/setup`; a machine without it fails these tests naming it): a
//! backup snapshots under load, is killed, restores the image and replays
//! only the tail; the replicas agree (digests, random picks, every
//! connection's replies); connection state taken mid-way survives; a
//! corrupt image or one of another build is refused with one line; a
//! follower killed while snapshotting recovers.

use lockstep_testkit::cluster;

use std::path::PathBuf;
use std::time::Duration;

use lockstep_launcher::disk::tree_bytes;

use cluster::{
    assert_acked_counters, bin_dir, cli_status, free_port, http_get, BackgroundLoad, Memcache,
    Options, Resp, Server, TestCluster, Value,
};

const LIMIT: Duration = Duration::from_secs(120);

/// Has node `id` snapshot its server; returns the snapshot's seq.
fn snapshot(c: &TestCluster, id: u64) -> u64 {
    lockstep_common::control::take_snapshot(&c.config(), id, Duration::from_secs(150))
        .unwrap_or_else(|e| panic!("node {id} could not snapshot: {e}\n{}", c.logs()))
}

/// The directory of node `id`'s snapshot at `seq`.
fn snapshot_dir(c: &TestCluster, id: u64, seq: u64) -> PathBuf {
    c.config()
        .node_data_dir(id)
        .join("snapshots")
        .join(format!("{seq:020}"))
}

/// Node `id`'s follower log.
fn follower_log(c: &TestCluster, id: u64) -> String {
    std::fs::read_to_string(c.dir.join(format!("follower-{id}.log"))).unwrap_or_default()
}

/// Waits until node `id` applied everything the leader (node 1) persisted
/// by now.
fn wait_applied_here(c: &TestCluster, id: u64) -> u64 {
    wait_applied_from(c, 1, id)
}

/// Waits until node `id` applied everything `leader` persisted by now.
fn wait_applied_from(c: &TestCluster, leader: u64, id: u64) -> u64 {
    let target = c.status(leader).expect("leader status").persisted;
    c.wait("the node applied the leader's log so far", LIMIT, |c| {
        c.status(id).is_ok_and(|s| s.applied >= target)
    });
    target
}

/// Kills node `id` (follower and server), then starts its follower, which
/// must restore its server from a snapshot; returns the follower log line
/// that says where applying resumed.
fn kill_and_restore(c: &mut TestCluster, id: u64) -> String {
    c.kill_follower(id);
    c.kill_server(id);
    let pid = c.start_follower_restoring(id);
    assert!(
        pid.is_some(),
        "node {id} did not restore its server from a snapshot\n{}",
        c.logs()
    );
    c.wait("the restored node applies", LIMIT, |c| {
        follower_log(c, id).contains("(restored server)")
    });
    let log = follower_log(c, id);
    // The figures (seen with --nocapture): image size, freeze and restore
    // times.
    for l in log.lines() {
        if l.contains("image of the server") || l.contains("restored the server (pid") {
            eprintln!("{l}");
        }
    }
    log.lines()
        .rev()
        .find(|l| l.contains("(restored server)"))
        .unwrap_or_default()
        .to_string()
}

/// The file `program` on PATH is (links resolved: what a process image
/// records).
fn on_path(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .and_then(|p| p.canonicalize().ok())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

fn ok(r: std::io::Result<Value>) -> Value {
    r.expect("redis answers")
}

#[test]
fn redis_backup_restores_its_snapshot_and_replays_only_the_tail() {
    let mut c = TestCluster::new("snapredis", Options::default());
    c.start_all();
    let leader = c.app(1);
    let load = BackgroundLoad::start(leader, 2);
    load.wait_more(&c, 2000, LIMIT);

    // Connection state that the snapshot must carry, set up on the leader
    // (each connection is a replay connection in every backup's server).
    let mut selected = Resp::connect(leader).unwrap();
    assert_eq!(
        ok(selected.cmd(&[b"SELECT", b"3"])),
        Value::Simple("OK".into())
    );
    ok(selected.cmd(&[b"CLIENT", b"SETNAME", b"selector"]));
    ok(selected.cmd(&[b"SET", b"in:db3", b"before"]));
    let mut multi = Resp::connect(leader).unwrap();
    assert_eq!(ok(multi.cmd(&[b"MULTI"])), Value::Simple("OK".into()));
    assert_eq!(
        ok(multi.cmd(&[b"INCR", b"multi:ctr"])),
        Value::Simple("QUEUED".into())
    );
    let mut resp3 = Resp::connect(leader).unwrap();
    ok(resp3.cmd(&[b"HELLO", b"3"]));
    ok(resp3.cmd(&[b"HSET", b"h3", b"field", b"value"]));
    // HELLO's reply names the connection's client id, which differs on a
    // backup that served direct clients (the fixture's readiness probes):
    // counted as a divergence by every backup, snapshots or not. Count
    // them now; the rest of the test must add none.
    ok(resp3.cmd(&[b"PING"]));
    let mut subscriber = Resp::connect(leader).unwrap();
    ok(subscriber.cmd(&[b"SUBSCRIBE", b"news"]));
    let mut blocked = Resp::connect(leader).unwrap();
    blocked.send(&[b"BLPOP", b"wakeup", b"0"]).unwrap();
    // A large set for random picks: their answers depend on the hash
    // table's layout, which a reloaded dump would not reproduce.
    let mut picker = Resp::connect(leader).unwrap();
    for chunk in 0..20 {
        let members: Vec<Vec<u8>> = (0..200)
            .map(|i| format!("m{}", chunk * 200 + i).into_bytes())
            .collect();
        let mut args: Vec<&[u8]> = vec![b"SADD", b"big"];
        args.extend(members.iter().map(|m| m.as_slice()));
        ok(picker.cmd(&args));
    }

    wait_applied_here(&c, 3);
    let target = wait_applied_here(&c, 2);
    let before: Vec<u64> = (1..=3)
        .map(|id| c.status(id).unwrap().divergences)
        .collect();
    let seq = snapshot(&c, 2);
    assert!(seq >= target, "snapshot at {seq}, before {target}");
    let meta = std::fs::read_to_string(snapshot_dir(&c, 2, seq).join("meta.json")).unwrap();
    let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(meta["position"]["seq"], seq);
    let ids = meta["build_ids"].as_array().unwrap();
    let names: Vec<&str> = ids.iter().map(|p| p[0].as_str().unwrap()).collect();
    assert_eq!(
        names[0],
        on_path("redis-server").display().to_string(),
        "{ids:?}"
    );
    assert!(names[1].ends_with("liblockstep.so"), "{ids:?}");
    load.wait_more(&c, 2000, LIMIT);

    // Node 2 goes down; the connections go on without it.
    c.kill_follower(2);
    c.kill_server(2);
    load.wait_more(&c, 2000, LIMIT);
    assert_eq!(
        ok(multi.cmd(&[b"INCR", b"multi:ctr"])),
        Value::Simple("QUEUED".into())
    );
    assert_eq!(
        ok(multi.cmd(&[b"EXEC"])),
        Value::Array(vec![Value::Int(1), Value::Int(2)])
    );
    assert_eq!(
        ok(selected.cmd(&[b"GET", b"in:db3"])),
        Value::Bulk(b"before".to_vec())
    );
    ok(selected.cmd(&[b"SET", b"in:db3", b"after"]));
    let map = ok(resp3.cmd(&[b"HGETALL", b"h3"]));
    assert_eq!(
        map,
        Value::Map(vec![(
            Value::Bulk(b"field".to_vec()),
            Value::Bulk(b"value".to_vec())
        )])
    );
    ok(picker.cmd(&[b"PUBLISH", b"news", b"hello"]));
    ok(picker.cmd(&[b"RPUSH", b"wakeup", b"now"]));
    assert_eq!(
        ok(blocked.read()),
        Value::Array(vec![
            Value::Bulk(b"wakeup".to_vec()),
            Value::Bulk(b"now".to_vec())
        ])
    );
    let bulk = |b: &[u8]| Value::Bulk(b.to_vec());
    assert_eq!(
        ok(subscriber.read()),
        Value::Array(vec![bulk(b"message"), bulk(b"news"), bulk(b"hello")])
    );

    // Node 2 comes back from its image and replays only what came after.
    let c2 = &mut c;
    let line = kill_and_restore(c2, 2);
    assert!(
        line.contains(&format!("applying from seq {} (restored server)", seq + 1)),
        "node 2 should resume right after seq {seq}: {line}"
    );
    load.wait_more(&c, 2000, LIMIT);
    // One more input on each connection: a backup compares the output
    // before it (the replies given while node 2 was down, which node 2
    // produced when it replayed them) with the leader's.
    for conn in [
        &mut selected,
        &mut multi,
        &mut resp3,
        &mut blocked,
        &mut picker,
    ] {
        ok(conn.cmd(&[b"PING"]));
    }
    ok(subscriber.cmd(&[b"PING"]));
    // Random picks after the restore: every node must pick the same.
    for _ in 0..300 {
        ok(picker.cmd(&[b"SPOP", b"big"]));
        ok(picker.cmd(&[b"SRANDMEMBER", b"big", b"3"]));
        ok(picker.cmd(&[b"RANDOMKEY"]));
    }
    let acked = load.stop();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    let counters = assert_acked_counters(&c, &acked);
    assert!(
        counters.iter().all(|v| v.as_slice() == acked),
        "{counters:?} != {acked:?}"
    );
    // Node 2's count started over with its restored server (the region is
    // new); the others' did not move.
    let after: Vec<u64> = (1..=3)
        .map(|id| c.status(id).unwrap().divergences)
        .collect();
    assert_eq!(
        after,
        [before[0], 0, before[2]],
        "divergences\n{}",
        c.logs()
    );
    let spop = |id: u64| {
        let mut r = Resp::connect(c.app(id)).unwrap();
        ok(r.cmd(&[b"SCARD", b"big"]))
    };
    assert_eq!(spop(2), spop(1));
}

/// Every node's `gets` of `keys`: flags, value and CAS id (None: absent).
type McView = Vec<Option<(u32, Vec<u8>, u64)>>;

fn mc_view(c: &TestCluster, id: u64, keys: &[String]) -> McView {
    let mut m = Memcache::connect(c.app(id)).expect("memcached answers");
    keys.iter().map(|k| m.gets(k).expect("gets")).collect()
}

#[test]
fn memcached_items_cas_ids_and_expiry_survive_a_restore() {
    let mut c = TestCluster::new(
        "snapmc",
        Options {
            server: Server::Memcached,
            ..Options::default()
        },
    );
    c.start_all();
    let mut m = Memcache::connect(c.app(1)).unwrap();
    let keys: Vec<String> = (0..300).map(|i| format!("k{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("v{i}");
        assert_eq!(
            m.store("set", k, i as u32, v.as_bytes(), None).unwrap(),
            "STORED"
        );
    }
    // Items that expire two seconds (of the log's time) from now.
    for i in 0..20 {
        let line = format!("set ttl{i} 0 2 1\r\nx\r\n");
        assert_eq!(m.request(line.as_bytes()).unwrap(), "STORED");
    }
    wait_applied_here(&c, 2);
    snapshot(&c, 2);
    c.kill_follower(2);
    c.kill_server(2);
    // CAS updates while node 2 is down: the CAS ids continue from the
    // image's counter on node 2.
    for k in keys.iter().take(100) {
        let (flags, _, cas) = m.gets(k).unwrap().expect("item");
        assert_eq!(
            m.store("cas", k, flags, b"swapped", Some(cas)).unwrap(),
            "STORED"
        );
    }
    let line = kill_and_restore(&mut c, 2);
    assert!(line.contains("(restored server)"), "{line}");
    for k in keys.iter().skip(100).take(100) {
        let (flags, _, cas) = m.gets(k).unwrap().expect("item");
        assert_eq!(
            m.store("cas", k, flags, b"after", Some(cas)).unwrap(),
            "STORED"
        );
    }
    let ttl: Vec<String> = (0..20).map(|i| format!("ttl{i}")).collect();
    // The expired items are gone everywhere once the log's time passed
    // their expiry (memcached's clock moves with the leader's timer turns).
    c.wait("the ttl items expire on the leader", LIMIT, |c| {
        mc_view(c, 1, &ttl).iter().all(Option::is_none)
    });
    assert_eq!(m.store("set", "last", 0, b"x", None).unwrap(), "STORED");
    c.wait_converged(LIMIT);
    let all: Vec<String> = keys.iter().chain(&ttl).cloned().collect();
    let leader = mc_view(&c, 1, &all);
    assert!(leader[..300].iter().all(Option::is_some));
    for id in [2, 3] {
        assert_eq!(mc_view(&c, id, &all), leader, "node {id}\n{}", c.logs());
    }
    c.assert_no_divergence();
}

/// Flips one byte in the middle of `file`.
fn corrupt(file: &std::path::Path) {
    let mut b = std::fs::read(file).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x55;
    std::fs::write(file, b).unwrap();
}

#[test]
fn a_corrupt_or_foreign_snapshot_is_refused_and_the_log_serves() {
    let mut c = TestCluster::new("snaprefuse", Options::default());
    c.start_all();
    cluster::redis_mixed_workload(c.app(1), 2, 200);
    wait_applied_here(&c, 2);
    let older = snapshot(&c, 2);
    cluster::redis_mixed_workload(c.app(1), 2, 200);
    wait_applied_here(&c, 2);
    let newer = snapshot(&c, 2);
    assert!(newer > older);
    c.kill_follower(2);
    c.kill_server(2);
    // The newer image has a damaged page file; the older one claims
    // another build of the preload.
    corrupt(&snapshot_dir(&c, 2, newer).join("pages-1.img"));
    let meta_path = snapshot_dir(&c, 2, older).join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
    meta["build_ids"][1][1] = "00ff".into();
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();

    assert_eq!(c.start_follower_restoring(2), None, "{}", c.logs());
    let log = follower_log(&c, 2);
    assert!(
        log.contains(&format!(
            "snapshot {newer}: file pages-1.img is corrupt or truncated"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("snapshot {older}: it was taken with")),
        "{log}"
    );
    // Full replay into a fresh server, as without snapshots.
    c.start_server(2);
    cluster::redis_mixed_workload(c.app(1), 2, 100);
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

#[test]
fn a_follower_killed_while_snapshotting_restores_a_complete_snapshot() {
    let mut c = TestCluster::new("snapkill", Options::default());
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 2);
    load.wait_more(&c, 2000, LIMIT);
    wait_applied_here(&c, 2);
    let first = snapshot(&c, 2);
    load.wait_more(&c, 2000, LIMIT);
    let config = c.config();
    let asking = std::thread::spawn(move || {
        lockstep_common::control::take_snapshot(&config, 2, Duration::from_secs(150))
    });
    // Kill node 2 as soon as its next snapshot's directory appears (its
    // image is being written then, or about to be).
    let snapshots = c.config().node_data_dir(2).join("snapshots");
    let begun = |c: &TestCluster| {
        let _ = c;
        std::fs::read_dir(&snapshots).is_ok_and(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
                .any(|s| s > first)
        })
    };
    c.wait("node 2 begins its second snapshot", LIMIT, begun);
    c.kill_follower(2);
    c.kill_server(2);
    assert!(asking.join().unwrap().is_err(), "the killed node answered");
    load.wait_more(&c, 2000, LIMIT);

    kill_and_restore(&mut c, 2);
    let log = follower_log(&c, 2);
    let restored = log
        .lines()
        .find_map(|l| l.split("restored the server from snapshot ").nth(1))
        .and_then(|rest| rest.split(';').next())
        .map(PathBuf::from)
        .expect("a restore line");
    assert!(
        restored.join("meta.json").exists(),
        "restored from {restored:?}"
    );
    load.wait_more(&c, 2000, LIMIT);
    let acked = load.stop();
    cluster::assert_converged_exactly(&c, &acked, LIMIT);
}

#[test]
fn a_restored_backup_leads_after_a_failover() {
    let mut c = TestCluster::new("snaplead", Options::default());
    let _zk = c.start_zookeeper(2000);
    c.start_nodes();
    let first = c.wait_leader_among(&[1, 2, 3], LIMIT);
    let backups: Vec<u64> = (1..=3).filter(|&i| i != first).collect();
    cluster::redis_mixed_workload(c.app(first), 2, 200);
    // Both backups come back from their images: whichever the election
    // picks next runs a restored server.
    for &b in &backups {
        wait_applied_from(&c, first, b);
        let seq = snapshot(&c, b);
        let line = kill_and_restore(&mut c, b);
        assert!(
            line.contains(&format!("applying from seq {}", seq + 1)),
            "{line}"
        );
    }
    cluster::redis_mixed_workload(c.app(first), 2, 200);
    c.wait_converged_on(&[first, backups[0], backups[1]], LIMIT);
    c.kill_server(first);
    c.kill_follower(first);
    let second = c.wait_leader_among(&backups, LIMIT);
    // The restored server's preload turns active and serves.
    cluster::redis_mixed_workload(c.app(second), 2, 200);
    c.start_follower(first);
    c.start_server(first);
    let other = backups.iter().copied().find(|&b| b != second).unwrap();
    c.wait_converged_on(&[second, other, first], LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// Bytes of node `id`'s log store: RocksDB's tables and write-ahead log,
/// beside the snapshots directory.
fn store_bytes(c: &TestCluster, id: u64) -> u64 {
    std::fs::read_dir(c.config().node_data_dir(id))
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.ends_with(".sst") || name.ends_with(".log")
                })
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A snapshot as node `id`'s follower log tells it: (seq, bytes, the
/// milliseconds it took, when it completed in ms of the log's clock).
fn snapshots_logged(c: &TestCluster, id: u64) -> Vec<(u64, u64, u64, u64)> {
    follower_log(c, id)
        .lines()
        .filter(|l| l.contains(&format!("node {id}: snapshot at seq ")) && l.contains(" bytes in "))
        .map(|l| {
            // `[2026-11-25T01:42:10.809Z INFO …] node 2: snapshot at seq 552: 3008220 bytes in 120 ms; …`
            let time = &l[1..l.find('Z').unwrap()];
            let hms = &time[11..];
            let mut parts = hms.split([':', '.']).map(|p| p.parse::<u64>().unwrap());
            let (h, m, s, ms) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            let done = ((h * 60 + m) * 60 + s) * 1000 + ms;
            let rest = &l[l.find("snapshot at seq ").unwrap() + 16..];
            let words: Vec<&str> = rest.split([' ', ':']).filter(|w| !w.is_empty()).collect();
            (
                words[0].parse().unwrap(),
                words[1].parse().unwrap(),
                words[4].parse().unwrap(),
                done,
            )
        })
        .collect()
}

/// The CRIU freeze times node `id`'s follower logged (ms).
fn freeze_times(c: &TestCluster, id: u64) -> Vec<f64> {
    follower_log(c, id)
        .lines()
        .filter_map(|l| {
            let at = l.find("frozen ")? + 7;
            l[at..].split(' ').next()?.parse().ok()
        })
        .collect()
}

/// Snapshots every this many entries in the tests of the rules.
const EVERY: u64 = 2000;

/// A three-node Redis cluster whose backups snapshot every [`EVERY`]
/// entries (the image rule off: the tests of the turns want many
/// snapshots of a small server).
fn often_snapshotting(test: &str) -> TestCluster {
    TestCluster::new(
        test,
        Options {
            extra: format!(
                "snapshot_every = {{ entries = {EVERY}, bytes = 0, image_percent = 0 }}\n"
            ),
            ..Options::default()
        },
    )
}

#[test]
fn backups_snapshot_by_themselves_in_turn_and_every_node_compacts_its_log() {
    let mut c = often_snapshotting("snappolicy");
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 2);
    // Under load until each backup snapshot twice by itself and each
    // backup's log start moved up twice (a majority's snapshots covered
    // it); the leader never snapshots (it deletes its log all the same: a
    // backup's image rebuilds it), and the two backups never image their
    // servers at once (checked below on the logged snapshots' spans).
    let peak_store = std::cell::RefCell::new([0u64; 4]);
    let firsts = std::cell::RefCell::new([0u64; 4]);
    c.wait(
        "both backups snapshot twice and every node compacts",
        LIMIT * 3,
        |c| {
            let st: Vec<_> = (1..=3).map(|id| c.status(id).expect("status")).collect();
            assert_eq!(st[0].role, "leader", "{}", c.logs());
            assert!(
                st[0].snapshot == 0 && !st[0].snapshotting,
                "the leader snapshot\n{}",
                c.logs()
            );
            let (mut peak, mut firsts) = (peak_store.borrow_mut(), firsts.borrow_mut());
            for s in &st {
                let i = s.node as usize;
                peak[i] = peak[i].max(store_bytes(c, s.node));
                if firsts[i] == 0 && s.oldest > 1 {
                    firsts[i] = s.oldest;
                }
            }
            let taken = |id: u64| snapshots_logged(c, id).len();
            taken(2) >= 2
                && taken(3) >= 2
                && st[1..]
                    .iter()
                    .all(|s| firsts[s.node as usize] > 1 && s.oldest > firsts[s.node as usize])
        },
    );
    load.wait_more(&c, 1000, LIMIT);
    load.stop();
    // Once the load stops, every node's log starts right after the
    // majority's snapshot (the leader has none: the older of the two
    // backups' newest), and no earlier.
    c.wait(
        "every log starts after the majority's snapshot",
        LIMIT,
        |c| {
            let st: Vec<_> = (1..=3).map(|id| c.status(id).expect("status")).collect();
            let majority = st[1].snapshot.min(st[2].snapshot);
            st.iter().all(|s| s.oldest == majority + 1)
        },
    );
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();

    let leader_log = follower_log(&c, 1);
    assert!(!leader_log.contains("snapshot at seq"), "{leader_log}");
    let (two, three) = (snapshots_logged(&c, 2), snapshots_logged(&c, 3));
    for &(seq2, _, took2, done2) in &two {
        for &(seq3, _, took3, done3) in &three {
            let apart = done2 < done3.saturating_sub(took3) || done3 < done2.saturating_sub(took2);
            assert!(
                apart,
                "node 2's snapshot at {seq2} and node 3's at {seq3} overlap\n{}",
                c.logs()
            );
        }
    }
    for id in 1..=3 {
        let s = c.status(id).unwrap();
        let kept = s.persisted + 1 - s.oldest;
        println!(
            "node {id}: log {}..={} ({kept} entries kept of {}), store {} bytes at its peak, {} now",
            s.oldest,
            s.persisted,
            s.persisted,
            peak_store.borrow()[id as usize],
            store_bytes(&c, id)
        );
        assert!(s.oldest > EVERY, "node {id}'s log starts at {}", s.oldest);
    }
    for id in [2, 3] {
        for (seq, bytes, took, _) in snapshots_logged(&c, id) {
            println!("node {id}: snapshot at seq {seq}: {bytes} bytes, {took} ms");
        }
        println!(
            "node {id}: CRIU freeze times (ms): {:?}",
            freeze_times(&c, id)
        );
    }
}

/// A backup asked for a snapshot while it works through a backlog takes
/// it where it is, not once it has caught up: while a snapshot is asked
/// for its server is fed one entry at a time and reaches a turn boundary
/// within a turn's entries. (Fed 256 at a time, its server was never seen
/// idle until the backlog was gone, and under steady load a backup that
/// stayed behind took none for minutes.)
#[test]
fn a_backup_behind_a_backlog_snapshots_where_it_is() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    const BEHIND: u64 = 100_000;
    let mut c = TestCluster::new("snapbehind", Options::default());
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 2);
    load.wait_more(&c, 500, LIMIT);
    let server = Pid::from_raw(c.status(3).expect("status").server_pid as i32);
    kill(server, Signal::SIGSTOP).expect("SIGSTOP node 3's server");
    c.wait("node 3 falls behind", LIMIT, |c| {
        let (Ok(l), Ok(s)) = (c.status(1), c.status(3)) else {
            return false;
        };
        l.committed > s.applied + BEHIND
    });
    let asked_at = c.status(1).unwrap().committed;
    kill(server, Signal::SIGCONT).expect("SIGCONT node 3's server");
    let seq = snapshot(&c, 3);
    assert!(
        seq < asked_at,
        "node 3's snapshot at {seq} waited until it caught up past {asked_at}, where the leader was when it was asked\n{}",
        follower_log(&c, 3)
    );
    load.wait_more(&c, 500, LIMIT);
    load.stop();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
    // Restarted, it restores that image and replays the rest.
    let line = kill_and_restore(&mut c, 3);
    assert!(line.contains("restored server"), "{line}");
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// The image rule (`snapshot_every.image_percent`, here 100): once a
/// backup has an image, its next snapshot waits until the log since has
/// grown to that image's size, however far past `snapshot_every.entries`
/// it is; then it is taken. The first snapshot has no image to weigh
/// (the entry measure decides).
#[test]
fn a_snapshot_waits_for_a_log_as_large_as_the_image_before_it() {
    let mut c = TestCluster::new(
        "snapimage",
        Options {
            extra: format!(
                "snapshot_every = {{ entries = {EVERY}, bytes = 0, image_percent = 100 }}\n"
            ),
            ..Options::default()
        },
    );
    c.start_all();
    let r = std::cell::RefCell::new(Resp::connect(c.app(1)).expect("connect"));
    // Small entries until both backups hold a first snapshot.
    // One SET at a time: each read is one entry.
    let set_small = |n: u64| {
        let mut r = r.borrow_mut();
        for i in 0..n {
            let key = format!("small{i}");
            assert_eq!(
                r.cmd(&[b"SET", key.as_bytes(), b"v"]).expect("SET"),
                Value::Simple("OK".into())
            );
        }
    };
    c.wait("both backups take a first snapshot", LIMIT, |c| {
        set_small(500);
        (2..=3).all(|id| c.status(id).is_ok_and(|s| s.snapshot > 0))
    });
    let firsts: Vec<_> = (2..=3).map(|id| c.status(id).unwrap()).collect();
    for s in &firsts {
        assert!(s.snapshot_bytes > 0, "node {}: {s:?}", s.node);
    }
    let image = firsts.iter().map(|s| s.snapshot_bytes).min().unwrap();
    // Three times `EVERY` small entries, far fewer bytes than the image:
    // no second snapshot. Waited for until both backups applied them and
    // the rules ran a few more rounds.
    set_small(3 * EVERY);
    let written = c.status(1).unwrap().persisted;
    c.wait("the backups apply the small entries", LIMIT, |c| {
        (2..=3).all(|id| c.status(id).is_ok_and(|s| s.applied >= written))
    });
    std::thread::sleep(Duration::from_secs(4));
    for (id, first) in (2..=3).zip(&firsts) {
        let s = c.status(id).unwrap();
        assert!(
            s.applied - first.snapshot > 3 * EVERY,
            "node {id} applied {} past its snapshot",
            s.applied - first.snapshot
        );
        assert!(
            s.bytes_since_snapshot < image,
            "node {id}: {} bytes of log since its snapshot, its image {image}",
            s.bytes_since_snapshot
        );
        assert_eq!(
            s.snapshot,
            first.snapshot,
            "node {id} took a snapshot before its log reached its image's size\n{}",
            c.logs()
        );
    }
    // Large values until the log since passes the image: a second one.
    let value = vec![b'x'; 64 << 10];
    let k = std::cell::Cell::new(0u64);
    c.wait(
        "a backup snapshots once its log outgrew its image",
        LIMIT * 2,
        |c| {
            for _ in 0..16 {
                let key = format!("big{}", k.get());
                k.set(k.get() + 1);
                assert_eq!(
                    r.borrow_mut()
                        .cmd(&[b"SET", key.as_bytes(), &value])
                        .expect("SET"),
                    Value::Simple("OK".into())
                );
            }
            (2..=3).any(|id| {
                c.status(id)
                    .is_ok_and(|s| s.snapshot > firsts[id as usize - 2].snapshot)
            })
        },
    );
    let (id, s) = (2..=3)
        .map(|id| (id, c.status(id).unwrap()))
        .find(|(id, s)| s.snapshot > firsts[*id as usize - 2].snapshot)
        .unwrap();
    // It came once the large values alone were most of the image.
    assert!(
        k.get() * (64 << 10) >= image / 2,
        "node {id}'s second snapshot (at {}) came after {} KiB of values, its image {image} bytes",
        s.snapshot,
        k.get() * 64
    );
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// Node `id`'s server log (its stderr: the preload's lines).
fn server_log(c: &TestCluster, id: u64) -> String {
    std::fs::read_to_string(c.dir.join(format!("server-{id}.log"))).unwrap_or_default()
}

/// Waits until every node's log (the leader's too) starts past
/// `EVERY`: a majority's snapshots covered it.
fn wait_every_log_compacted(c: &TestCluster) {
    c.wait("every node compacted its log", LIMIT * 3, |c| {
        (1..=3).all(|id| c.status(id).is_ok_and(|s| s.oldest > EVERY))
    });
}

#[test]
fn a_fresh_node_installs_a_backups_snapshot_taken_on_another_node() {
    let mut c = often_snapshotting("snapjoin");
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 2);
    // The leader deletes its log too: nobody can give node 3 the log
    // from seq 1.
    wait_every_log_compacted(&c);
    // Node 3 comes back with an empty data dir while the leader serves;
    // its fresh server attaches (and is replaced by the image).
    c.kill_follower(3);
    c.kill_server(3);
    std::fs::remove_dir_all(c.config().node_data_dir(3)).unwrap();
    c.start_follower(3);
    c.start_server(3);
    c.wait("node 3 installs node 2's snapshot", LIMIT, |c| {
        follower_log(c, 3).contains("installed node 2's snapshot")
    });
    c.wait("node 3 applies the restored server", LIMIT, |c| {
        follower_log(c, 3).contains("(restored server)")
    });
    let pid = c.adopt_restored(3);
    load.wait_more(&c, 2000, LIMIT);
    load.stop();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
    let log = follower_log(&c, 3);
    assert!(log.contains("node 2's image moved to node 3"), "{log}");
    // Node 2's server, imaged, now serves as node 3: it says so, and it
    // is node 3's (its region, its port: it answered above as node 3).
    assert!(
        server_log(&c, 3).contains("this server is node 3 now"),
        "{}",
        server_log(&c, 3)
    );
    assert_eq!(c.status(3).unwrap().server_pid as u32, pid);
    // Killed and restarted, node 3 restores the installed image (node 2's)
    // from its own catalog, moved to node 3 again.
    let line = kill_and_restore(&mut c, 3);
    assert!(line.contains("restored server"), "{line}");
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// A cluster whose every log is compacted, holding about 60 MB (an image
/// of some sixty 1 MiB chunks), and node 3 back with an empty data dir:
/// returns once node 3 stored at least 4 MiB of node 2's image (well
/// before the end), with that incoming directory.
fn node_3_midway_through_an_install(test: &str) -> (TestCluster, PathBuf) {
    let mut c = often_snapshotting(test);
    c.start_all();
    let mut r = Resp::connect(c.app(1)).expect("connect");
    assert_eq!(
        ok(r.cmd(&[b"DEBUG", b"POPULATE", b"250000", b"big", b"200"])),
        Value::Simple("OK".into())
    );
    let load = BackgroundLoad::start(c.app(1), 2);
    wait_every_log_compacted(&c);
    load.wait_more(&c, 500, LIMIT);
    load.stop();
    c.kill_follower(3);
    c.kill_server(3);
    std::fs::remove_dir_all(c.config().node_data_dir(3)).unwrap();
    let incoming = c
        .config()
        .node_data_dir(3)
        .join("snapshots")
        .join("incoming");
    c.start_follower(3);
    c.wait("node 3 stores part of node 2's image", LIMIT, |_| {
        tree_bytes(&incoming) >= 4 << 20
    });
    (c, incoming)
}

/// Waits until node 3 installed node 2's snapshot and its restored server
/// applies; then, under load, every replica agrees. Returns node 3's
/// follower log as it was once installed.
fn node_3_installs_and_agrees(c: &mut TestCluster) -> String {
    c.wait("node 3 installs node 2's snapshot", LIMIT, |c| {
        follower_log(c, 3).contains("installed node 2's snapshot")
    });
    c.wait("node 3 applies the restored server", LIMIT, |c| {
        follower_log(c, 3).contains("(restored server)")
    });
    c.adopt_restored(3);
    let log = follower_log(c, 3);
    let load = BackgroundLoad::start(c.app(1), 2);
    load.wait_more(c, 500, LIMIT);
    load.stop();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
    log
}

#[test]
fn an_install_killed_midway_resumes_from_the_chunks_it_stored() {
    let (mut c, incoming) = node_3_midway_through_an_install("snapresume");
    c.kill_follower(3);
    let partial = tree_bytes(&incoming);
    c.start_follower(3);
    let log = node_3_installs_and_agrees(&mut c);
    let fetched: u64 = log
        .lines()
        .find(|l| l.contains("installed node 2's snapshot"))
        .and_then(|l| l.split('(').nth(1))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no fetched bytes in {log}"));
    let seq = c.status(3).unwrap().snapshot;
    let image = tree_bytes(&snapshot_dir(&c, 3, seq));
    println!("image {image} bytes; {partial} stored before the kill; {fetched} fetched after it");
    assert!(partial < image, "the whole image arrived before the kill");
    // At least 4 MiB were stored: at least three whole 1 MiB chunks of
    // them are not fetched again.
    assert!(
        fetched <= image - (3 << 20),
        "the transfer started over: {fetched} of {image} bytes fetched after the kill\n{log}"
    );
}

#[test]
fn an_install_whose_source_dies_midway_resumes_once_it_is_back() {
    let (mut c, _) = node_3_midway_through_an_install("snapsrc");
    // Node 2, the only node with a snapshot, dies while it sends; it comes
    // back from that same snapshot, and node 3 goes on where it stopped.
    let line = kill_and_restore(&mut c, 2);
    assert!(line.contains("restored server"), "{line}");
    let log = node_3_installs_and_agrees(&mut c);
    assert!(
        log.contains("installing node 2's snapshot"),
        "the broken transfer was not reported\n{log}"
    );
}

#[test]
fn a_restarted_leader_that_deleted_its_log_rebuilds_from_a_backups_snapshot() {
    let mut c = often_snapshotting("snapleader");
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 2);
    wait_every_log_compacted(&c);
    load.wait_more(&c, 500, LIMIT);
    let acked = load.stop();
    // The leader (static: it leads again once rebuilt) loses its server and
    // comes back with a log that starts past seq 1 and no snapshot.
    let before = c.status(1).unwrap();
    assert_eq!(before.snapshot, 0, "the leader took a snapshot");
    c.kill_follower(1);
    c.kill_server(1);
    c.start_follower(1);
    c.wait_leader(1);
    c.adopt_restored(1);
    let log = follower_log(&c, 1);
    assert!(log.contains("rebuilt from a peer's snapshot"), "{log}");
    assert!(log.contains("'s image moved to node 1"), "{log}");
    // No acknowledged write lost, and every replica agrees.
    c.wait_converged(LIMIT);
    assert_acked_counters(&c, &acked);
    c.assert_same_digest();
    // It serves as before.
    let load = BackgroundLoad::start(c.app(1), 2);
    load.wait_more(&c, 1000, LIMIT);
    load.stop();
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

#[test]
fn with_snapshot_off_nothing_is_taken_or_deleted() {
    let mut c = TestCluster::new(
        "snapoff",
        Options {
            extra: format!("snapshot = \"off\"\nsnapshot_every = {{ entries = {EVERY} }}\n"),
            ..Options::default()
        },
    );
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 2);
    load.wait_more(&c, 3 * EVERY, LIMIT);
    load.stop();
    c.wait_converged(LIMIT);
    let asked = lockstep_common::control::take_snapshot(&c.config(), 2, LIMIT);
    let why = asked.expect_err("a snapshot with snapshot = \"off\"");
    assert!(why.to_string().contains("snapshot = \"off\""), "{why}");
    for id in 1..=3 {
        let s = c.status(id).unwrap();
        assert!(s.persisted > 3 * EVERY, "node {id}: {s:?}");
        assert_eq!((s.snapshot, s.oldest), (0, 1), "node {id}: {s:?}");
    }
    for id in 2..=3 {
        let dir = c.config().node_data_dir(id).join("snapshots");
        let taken = std::fs::read_dir(&dir).map(|rd| rd.count()).unwrap_or(0);
        assert_eq!(taken, 0, "node {id} wrote into {}", dir.display());
    }
    c.assert_same_digest();
}

/// A server started by hand (a plain child of whoever starts it: in its
/// starter's session, not leading one, and in the host's PID namespace,
/// as from a shell, a supervisor or systemd) is imaged like a launched
/// one: CRIU dumps it as a shell job (before, every dump failed: `The root
/// process … is not a session leader`), every node compacts its log, and
/// a killed backup restores its own image (its pids are free again) and
/// agrees with the leader.
#[test]
fn servers_started_by_hand_are_snapshotted_compacted_and_restored() {
    let mut c = often_snapshotting("snaphand");
    for id in 1..=3 {
        c.start_follower(id);
    }
    for id in 1..=3 {
        c.start_server_by_hand(id);
    }
    c.wait_leader(1);
    for id in 1..=3 {
        let pid = c.server_pid(id);
        assert_eq!(c.status(id).unwrap().server_pid, pid as u64);
        assert_ne!(
            lockstep_launcher::process::session_of(pid),
            Some(pid),
            "node {id}'s server leads its session: not started by hand"
        );
    }
    let load = BackgroundLoad::start(c.app(1), 2);
    wait_every_log_compacted(&c);
    load.wait_more(&c, 500, LIMIT);
    let acked = load.stop();
    for id in [2, 3] {
        let s = c.status(id).unwrap();
        assert!(
            s.snapshot > 0 && s.snapshot_failing.is_none(),
            "node {id}: {s:?}\n{}",
            c.logs()
        );
        let facts: serde_json::Value = serde_json::from_slice(
            &std::fs::read(snapshot_dir(&c, id, s.snapshot).join("process.json"))
                .expect("process.json beside the image"),
        )
        .unwrap();
        assert_eq!(facts["session_leader"], false, "{facts}");
        assert_eq!(facts["own_pid_namespace"], false, "{facts}");
    }
    c.wait_converged(LIMIT);
    let line = kill_and_restore(&mut c, 2);
    eprintln!("{line}");
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
    assert_acked_counters(&c, &acked);

    // A fresh node 3 must install a peer's image, but a by-hand server's
    // image restores with its pids, which node 2's server holds on this
    // host: refused before CRIU runs, naming the pid and the fix.
    c.kill_follower(3);
    c.kill_server(3);
    cluster::remove(&c.config().node_data_dir(3));
    c.start_follower(3);
    c.wait("node 3 refuses the image, naming the pid", LIMIT, |c| {
        follower_log(c, 3)
            .lines()
            .any(|l| l.contains("taken on this host now") && l.contains("lockstep run"))
    });
    let s = c.status(3).unwrap();
    assert_eq!(s.server_pid, 0, "no server restored: {s:?}");
    let f = s.snapshot_failing.expect("the refusal shows in the status");
    assert!(
        f.reason.contains("taken on this host now") && f.fix.contains("lockstep run"),
        "{f:?}"
    );
}

/// A backup whose snapshots fail says so once in its log, with the reason
/// and the fix; status (text and JSON), metrics and `/health` carry it;
/// the next backup takes its turns meanwhile; and once the log is past
/// `snapshot_degraded_after` the node is degraded: `/health` 503,
/// `lockstep status` not ok.
#[test]
fn a_failing_snapshot_is_said_once_and_shows_in_status_metrics_and_health() {
    let mut c = TestCluster::new(
        "snapfail",
        Options {
            extra: format!(
                "snapshot_every = {{ entries = {EVERY}, bytes = 0, image_percent = 0 }}\nsnapshot_degraded_after = 3\n"
            ),
            ..Options::default()
        },
    );
    let mut metrics = Vec::new();
    c.change_config(|mut s| {
        for n in s.nodes_mut() {
            let a = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
            n.metrics = Some(a);
            metrics.push(a);
        }
        s
    });
    // Node 2's CRIU passes `criu check` and fails every dump.
    let fake = c.dir.join("failing-criu");
    std::fs::write(
        &fake,
        "#!/bin/sh\n[ \"$1\" = check ] && exit 0\necho 'Error (criu/cr-dump.c:1): forced failure for the test' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    c.follower_env(2, "LOCKSTEP_CRIU", fake.to_str().unwrap());
    c.start_all();
    let load = BackgroundLoad::start(c.app(1), 2);
    // Node 2 is first in turn (no snapshot, lowest id) and fails: node 3
    // takes its turns all the same (it waited behind node 2 for good).
    c.wait("node 2 failing and node 3 snapshotting", LIMIT * 2, |c| {
        let failing = c
            .status(2)
            .is_ok_and(|s| s.snapshot_failing.is_some_and(|f| f.failures >= 1));
        failing && c.status(3).is_ok_and(|s| s.snapshot > 0)
    });
    // No majority holds a snapshot (the leader takes none): no log is
    // compacted, and node 2's grows past 3 x EVERY.
    c.wait("node 2 degraded", LIMIT * 3, |c| {
        c.status(2).is_ok_and(|s| s.degraded.is_some())
    });
    load.stop();
    let s = c.status(2).unwrap();
    let f = s.snapshot_failing.clone().unwrap();
    assert!(
        f.reason.contains("forced failure for the test") && f.fix.contains("CRIU log"),
        "{f:?}"
    );
    assert!(s.log_entries > 3 * EVERY && s.log_bytes > 0, "{s:?}");
    let log = follower_log(&c, 2);
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("snapshot failed") && !l.contains("DEBUG"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {said:#?}");
    assert!(said[0].contains("fix: "), "{}", said[0]);

    let (code, m) = http_get(metrics[1], "/metrics").expect("scrape node 2");
    assert_eq!(code, 200);
    for want in ["lockstep_snapshot_failing 1\n", "lockstep_degraded 1\n"] {
        assert!(m.contains(want), "{want}: {m}");
    }
    let (code, m3) = http_get(metrics[2], "/metrics").expect("scrape node 3");
    assert_eq!(code, 200);
    assert!(m3.contains("lockstep_snapshot_failing 0\n"), "{m3}");
    let (code, body) = http_get(metrics[1], "/health").expect("node 2 health");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("past snapshot_degraded_after") && body.contains("forced failure"),
        "{body}"
    );

    let json = cli_status(&c.config_path);
    assert_eq!(json["healthy"], false, "{json}");
    assert_eq!(json["leader"], 1, "still takes writes: {json}");
    assert!(
        json["degraded"]
            .as_array()
            .is_some_and(|d| d.contains(&serde_json::json!(2))),
        "{json}"
    );
    let node2 = &json["nodes"][1];
    assert!(
        node2["snapshot_failing"]
            .as_str()
            .is_some_and(|l| l.contains("forced failure") && l.contains("log ")),
        "{node2}"
    );
    let out = std::process::Command::new(bin_dir().join("lockstep"))
        .args(["status", "--config"])
        .arg(&c.config_path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("node 2: snapshots failing since ")
            && text.contains("node 2 is degraded: ")
            && text.contains("DEGRADED: node 1 leads"),
        "{text}"
    );
}
