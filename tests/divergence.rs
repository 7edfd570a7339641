//! The divergence count means divergence: output one connection's input
//! causes on another (pub/sub deliveries) is compared where the leader's
//! turns put it, not where a backup that took the leader's turn in parts
//! happened to write it. Real followers, real redis-server, both commit
//! modes (the suite's).

use lockstep_testkit::cluster;

use std::time::Duration;

use cluster::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Subscribers that also send commands of their own (a `PING` each time
/// they read a message, as clients acknowledging deliveries do) while
/// another connection publishes: every replica writes the same bytes to
/// each subscriber, so nothing is counted — though a delivery lands on a
/// subscriber's connection in the same turn as that subscriber's `PING`.
#[test]
fn pubsub_subscribers_that_send_commands_count_no_divergence() {
    let mut c = TestCluster::new("div-pubsub", Options::default());
    c.start_all();
    const SUBSCRIBERS: usize = 40;
    const MESSAGES: usize = 200;
    let app = c.app(1);
    let subs: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = Resp::connect(app).unwrap();
                s.set_read_timeout(LIMIT).unwrap();
                s.cmd(&[b"SUBSCRIBE", b"news"]).unwrap();
                let (mut messages, mut pongs) = (0, 0);
                while messages < MESSAGES {
                    match s.read().unwrap() {
                        Value::Array(m) if m.first() == Some(&Value::Bulk(b"message".to_vec())) => {
                            messages += 1;
                            s.send(&[b"PING"]).unwrap();
                        }
                        Value::Array(m) if m.first() == Some(&Value::Bulk(b"pong".to_vec())) => {
                            pongs += 1;
                        }
                        other => panic!("a subscriber read {other:?}"),
                    }
                }
                // Every reply read before hanging up: a client that leaves
                // mid-reply makes the leader's writes fail (and its output
                // differ from a backup's), which is not this test's case.
                s.send(&[b"UNSUBSCRIBE"]).unwrap();
                loop {
                    match s.read().unwrap() {
                        Value::Array(m)
                            if m.first() == Some(&Value::Bulk(b"unsubscribe".to_vec())) =>
                        {
                            break
                        }
                        Value::Array(m) if m.first() == Some(&Value::Bulk(b"pong".to_vec())) => {
                            pongs += 1
                        }
                        Value::Array(m) if m.first() == Some(&Value::Bulk(b"message".to_vec())) => {
                        }
                        other => panic!("a subscriber read {other:?}"),
                    }
                }
                assert_eq!(s.cmd(&[b"PING"]).unwrap(), Value::Simple("PONG".into()));
                (messages, pongs)
            })
        })
        .collect();
    // Every subscriber is subscribed before the first message.
    let mut p = Resp::connect(app).unwrap();
    let all = Value::Array(vec![
        Value::Bulk(b"news".to_vec()),
        Value::Int(SUBSCRIBERS as i64),
    ]);
    let start = std::time::Instant::now();
    while p.cmd(&[b"PUBSUB", b"NUMSUB", b"news"]).unwrap() != all {
        assert!(start.elapsed() < LIMIT, "the subscribers never subscribed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Published in pipelined bursts: a turn of the leader's reads a burst
    // and subscribers' PINGs together.
    for burst in 0..MESSAGES / 20 {
        for i in 0..20 {
            let m = format!("m{}", burst * 20 + i);
            p.send(&[b"PUBLISH", b"news", m.as_bytes()]).unwrap();
        }
        for _ in 0..20 {
            assert_eq!(p.read().unwrap(), Value::Int(SUBSCRIBERS as i64));
        }
    }
    for s in subs {
        let (messages, _) = s.join().unwrap();
        assert_eq!(messages, MESSAGES);
    }
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// A command that keeps a backup's server busy inside its turn — `DEBUG
/// RELOAD` runs its event loop while it loads (the pump takes the next
/// turn at those waits), `DEBUG SLEEP` holds it past the pump's patience —
/// answers after the pump took the next input: each reply is still compared
/// with the leader's at the input that followed it on the leader, so
/// nothing is counted (both were counted on every backup, one input late).
#[test]
fn replies_of_long_commands_are_compared_where_the_leader_wrote_them() {
    let mut c = TestCluster::new("div-long", Options::default());
    c.start_all();
    {
        let mut r = Resp::connect(c.app(1)).unwrap();
        r.set_read_timeout(LIMIT).unwrap();
        // Enough data (about 8 MB of RDB) that loading it runs the event
        // loop (every 2 MB: `loading-process-events-interval-bytes`).
        fill_keys(&mut r, 100_000, &[b'v'; 64]);
        for round in 0..2 {
            assert_eq!(
                r.cmd(&[b"DEBUG", b"RELOAD"]).unwrap(),
                Value::Simple("OK".into()),
                "DEBUG RELOAD, round {round}"
            );
            assert_eq!(r.cmd(&[b"TTL", b"k1"]).unwrap(), Value::Int(-1));
            assert_eq!(
                r.cmd(&[b"DEBUG", b"SLEEP", b"0.7"]).unwrap(),
                Value::Simple("OK".into())
            );
            assert_eq!(r.cmd(&[b"PING"]).unwrap(), Value::Simple("PONG".into()));
        }
    }
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
}

/// A client that sends many requests with large replies and hangs up
/// without reading them: the leader's Redis writes part of the replies,
/// then its writes fail (the peer reset the connection), while a backup's
/// writes are dropped and never fail. The leader's digests then cover a
/// prefix of what a backup's server wrote, which is no divergence.
#[test]
fn a_client_that_hangs_up_before_reading_its_replies_counts_no_divergence() {
    let mut c = TestCluster::new("div-hangup", Options::default());
    c.start_all();
    let mut setup = Resp::connect(c.app(1)).unwrap();
    let big = vec![b'B'; 100_000];
    assert_eq!(
        setup.cmd(&[b"SET", b"big", &big]).unwrap(),
        Value::Simple("OK".into())
    );
    for round in 0..5 {
        let mut gone = Resp::connect(c.app(1)).unwrap();
        for _ in 0..40 {
            gone.send(&[b"GET", b"big"]).unwrap();
        }
        gone.send(&[b"INCR", b"rounds"]).unwrap();
        // Let the leader read them and start answering, then hang up with
        // the replies unread (the kernel resets the connection).
        std::thread::sleep(Duration::from_millis(50));
        drop(gone);
        assert_eq!(
            setup.cmd(&[b"INCR", b"after"]).unwrap(),
            Value::Int(round + 1)
        );
    }
    c.wait_converged(LIMIT);
    c.assert_same_digest();
    c.assert_no_divergence();
}

/// memcached's `stats` (text, with and without a group, and the binary
/// protocol's `STAT`) names the node: its pid, uptime, rusage, each
/// connection's address, its own port. Those replies are known by the
/// request that asked and not counted; the data requests around them are
/// compared as ever.
#[test]
fn memcached_stats_in_text_and_binary_count_no_divergence() {
    let mut c = TestCluster::new(
        "div-mc-stats",
        Options {
            server: Server::Memcached,
            extra: "protocol = \"memcached\"\n".into(),
            ..Options::default()
        },
    );
    c.use_memcached("root", "1");
    c.start_all();
    {
        let mut text = std::net::TcpStream::connect(c.app(1)).unwrap();
        text.set_read_timeout(Some(LIMIT)).unwrap();
        let mut reader = std::io::BufReader::new(text.try_clone().unwrap());
        for (cmd, last) in [
            ("set k 0 0 5\r\nvalue\r\n", "STORED"),
            ("stats\r\n", "END"),
            ("stats settings\r\n", "END"),
            ("stats conns\r\n", "END"),
            ("get k\r\n", "END"),
        ] {
            std::io::Write::write_all(&mut text, cmd.as_bytes()).unwrap();
            let mut lines = 0;
            loop {
                let mut line = String::new();
                std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
                assert!(!line.is_empty(), "{cmd:?}: the connection closed");
                lines += 1;
                // Started when the log began (not 2000-01-01): an uptime
                // of minutes, not 27 years.
                if let Some(up) = line.strip_prefix("STAT uptime ") {
                    let up: u64 = up.trim().parse().unwrap();
                    assert!(up < 600, "memcached's uptime is {up} s");
                }
                if line.trim_end() == last {
                    break;
                }
            }
            if cmd.starts_with("stats") {
                assert!(lines > 2, "{cmd:?} answered {lines} lines");
            }
        }
    }
    {
        let mut bin = std::net::TcpStream::connect(c.app(1)).unwrap();
        bin.set_read_timeout(Some(LIMIT)).unwrap();
        // STAT: one response per statistic, then one with an empty key.
        std::io::Write::write_all(&mut bin, &memcached_binary_request(0x10, b"")).unwrap();
        let mut stats = 0;
        while read_memcached_binary_response(&mut bin) > 0 {
            stats += 1;
        }
        assert!(stats > 10, "the binary STAT answered {stats} statistics");
        // GET k: its value, compared as any data.
        std::io::Write::write_all(&mut bin, &memcached_binary_request(0x00, b"k")).unwrap();
        read_memcached_binary_response(&mut bin);
    }
    c.wait_converged(LIMIT);
    c.assert_no_divergence();
}

/// A memcached binary request with opcode `op` and `key`, no extras or value.
fn memcached_binary_request(op: u8, key: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80, op];
    out.extend((key.len() as u16).to_be_bytes());
    out.extend([0u8; 4]); // extras length, data type, vbucket
    out.extend((key.len() as u32).to_be_bytes());
    out.extend([0u8; 12]); // opaque, cas
    out.extend(key);
    out
}

/// Reads one binary response; returns its key's length.
fn read_memcached_binary_response(s: &mut std::net::TcpStream) -> usize {
    let mut header = [0u8; 24];
    std::io::Read::read_exact(s, &mut header).unwrap();
    assert_eq!(header[0], 0x81, "a binary response's magic");
    let key_len = u16::from_be_bytes([header[2], header[3]]) as usize;
    let body = u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize;
    let mut rest = vec![0u8; body];
    std::io::Read::read_exact(s, &mut rest).unwrap();
    key_len
}
