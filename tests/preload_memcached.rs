//! liblockstep.so inside a real `memcached -t 1` (an accept thread handing
//! connections to a worker thread), text protocol, with the test acker
//! standing in for the follower processes: every byte each client sent is
//! in the log, per connection and in order, on all three nodes.

use lockstep_testkit::preload_fixture as preload_support;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use preload_support::*;

/// A memcached text-protocol client that remembers what it sent.
struct Mc {
    r: BufReader<TcpStream>,
    sent: Vec<u8>,
}

impl Mc {
    fn connect(addr: SocketAddr) -> io::Result<Mc> {
        Ok(Mc {
            r: BufReader::new(connect(addr)?),
            sent: Vec::new(),
        })
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.r.get_mut().write_all(bytes)?;
        self.sent.extend_from_slice(bytes);
        Ok(())
    }

    fn line(&mut self) -> io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        Ok(l.trim_end().to_string())
    }

    fn set(&mut self, key: &str, value: &[u8]) -> String {
        let mut b = format!("set {key} 0 0 {}\r\n", value.len()).into_bytes();
        b.extend_from_slice(value);
        b.extend_from_slice(b"\r\n");
        self.send(&b).unwrap();
        self.line().unwrap()
    }

    fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.send(format!("get {key}\r\n").as_bytes()).unwrap();
        let l = self.line().unwrap();
        if l == "END" {
            return None;
        }
        let len: usize = l
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("bad VALUE line {l:?}"));
        let mut v = vec![0u8; len + 2];
        self.r.read_exact(&mut v).unwrap();
        v.truncate(len);
        assert_eq!(self.line().unwrap(), "END");
        Some(v)
    }

    fn incr(&mut self, key: &str, by: u64) -> String {
        self.send(format!("incr {key} {by}\r\n").as_bytes())
            .unwrap();
        self.line().unwrap()
    }

    fn stat(&mut self, name: &str) -> String {
        self.send(b"stats\r\n").unwrap();
        let mut found = None;
        loop {
            let l = self.line().unwrap();
            if l == "END" {
                break;
            }
            if let Some(v) = l.strip_prefix(&format!("STAT {name} ")) {
                found = Some(v.to_string());
            }
        }
        found.unwrap_or_else(|| panic!("no stat {name}"))
    }
}

#[test]
fn memcached_text_protocol_through_the_leader_is_logged_per_connection() {
    let f = Fixture::new("memcached", Options::default());
    let acker = Acker::start(&f);
    let mut cmd = memcached_command(f.port());
    f.preload_env(&mut cmd);
    let mut server = Server::spawn(cmd, f.port(), &f.dir, "memcached");
    let mut sent: Vec<Vec<u8>> = Vec::new();

    // Ready when it answers "version".
    let start = Instant::now();
    loop {
        server.assert_running();
        if let Ok(mut c) = Mc::connect(f.app()) {
            c.send(b"version\r\n").unwrap();
            let ok = c.line().map(|l| l.starts_with("VERSION")).unwrap_or(false);
            sent.push(c.sent);
            if ok {
                break;
            }
        }
        assert!(
            start.elapsed() < LIMIT,
            "memcached did not answer\n{}",
            server.output()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    let mut c = Mc::connect(f.app()).unwrap();
    assert_eq!(c.set("greeting", b"hello"), "STORED");
    assert_eq!(c.get("greeting").as_deref(), Some(&b"hello"[..]));
    assert_eq!(c.set("n", b"40"), "STORED");
    assert_eq!(c.incr("n", 2), "42");
    // Far larger than max_entry (4 KiB): split into many entries.
    let big: Vec<u8> = (0..200_000u32).map(|i| b'A' + (i % 26) as u8).collect();
    assert_eq!(c.set("big", &big), "STORED");
    assert_eq!(c.get("big"), Some(big));
    assert_eq!(c.get("absent"), None);
    sent.push(std::mem::take(&mut c.sent));
    drop(c);

    // Concurrent clients.
    let addr = f.app();
    let workers: Vec<_> = (0..6)
        .map(|t| {
            std::thread::spawn(move || {
                let mut c = Mc::connect(addr).unwrap();
                assert_eq!(c.set(&format!("ctr-{t}"), b"0"), "STORED");
                for i in 0..150 {
                    let key = format!("key-{t}-{i}");
                    let value = format!("value-{t}-{i}-{}", "x".repeat(i % 40));
                    assert_eq!(c.set(&key, value.as_bytes()), "STORED");
                    assert_eq!(c.get(&key), Some(value.into_bytes()));
                    assert_eq!(c.incr(&format!("ctr-{t}"), 1), (i + 1).to_string());
                }
                c.sent
            })
        })
        .collect();
    for w in workers {
        sent.push(w.join().expect("client thread"));
    }

    let mut stats = Mc::connect(f.app()).unwrap();
    let bytes_read: usize = stats.stat("bytes_read").parse().unwrap();
    sent.push(std::mem::take(&mut stats.sent));
    drop(stats);

    acker.wait_all_closed(&f);
    server.assert_running();
    assert!(acker.errors().is_empty(), "acker: {:?}", acker.errors());
    let s = check_log(&acker.entries(), true);
    assert_eq!(
        s.data_bytes, bytes_read,
        "DATA bytes vs memcached's bytes_read"
    );
    assert_eq!(
        s.accepted.len(),
        sent.len(),
        "one ACCEPT per client connection"
    );
    assert_eq!(
        s.longest, f.config.max_entry as usize,
        "large reads are split at max_entry"
    );
    assert!(s.with_out_hash > 0);
    // Per connection, the log holds exactly what that client sent.
    let mut logged: Vec<Vec<u8>> = s
        .accepted
        .iter()
        .map(|c| s.data.get(c).cloned().unwrap_or_default())
        .collect();
    logged.sort();
    sent.sort();
    assert!(
        logged == sent,
        "per-connection bytes in the log differ from what the clients sent"
    );
}

#[test]
fn memcached_backup_refuses_clients_and_counts_replay_bytes() {
    let f = Fixture::new(
        "mcpassive",
        Options {
            role: lockstep_common::region::Role::Backup,
            ..Options::default()
        },
    );
    let acker = Acker::start(&f);
    let mut server = f.spawn_attached(memcached_command(f.port()), "memcached");
    for _ in 0..5 {
        let mut c = connect(f.app()).unwrap();
        let _ = c.write_all(b"set k 0 0 1\r\nx\r\n");
        assert!(
            is_closed_by_peer(&mut c, LIMIT),
            "a backup served a normal client"
        );
    }
    // The committed log, applied by the preload itself; every reply is
    // checked against the leader's.
    let mut feed = ApplyFeed::start(&f, 1);
    let diverged = feed.session(
        &mut server,
        &[
            (b"set k 0 0 8\r\nreplayed\r\n", b"STORED\r\n"),
            (b"get k\r\n", b"VALUE k 0 8\r\nreplayed\r\nEND\r\n"),
            (b"incr absent 1\r\n", b"NOT_FOUND\r\n"),
        ],
    );
    assert_eq!(
        diverged,
        0,
        "a replayed reply differed\n{}",
        f.preload_log()
    );
    server.assert_running();
    assert!(acker.entries().is_empty());
}

#[test]
fn a_refused_client_of_a_memcached_backup_reads_server_error_naming_the_leader() {
    let f = Fixture::new(
        "mcreadonly",
        Options {
            role: lockstep_common::region::Role::Backup,
            protocol: "memcached",
            ..Options::default()
        },
    );
    f.region(1).set_leader(3);
    let leader = f.config.node(3).unwrap().app;
    let acker = Acker::start(&f);
    let mut server = f.spawn_attached(memcached_command(f.port()), "memcached");
    let want = format!("SERVER_ERROR lockstep backup; the leader is at {leader}\r\n");
    let (got, eof) = refusal(f.app(), b"");
    assert_eq!(String::from_utf8_lossy(&got), want);
    assert!(eof, "no clean EOF after the SERVER_ERROR line");
    for _ in 0..3 {
        let (got, _) = refusal(f.app(), b"set k 0 0 1\r\nx\r\n");
        assert_eq!(String::from_utf8_lossy(&got), want);
    }
    server.assert_running();
    assert!(acker.entries().is_empty(), "a backup logged entries");
    assert_eq!(f.region(1).tail(), 0);
}
