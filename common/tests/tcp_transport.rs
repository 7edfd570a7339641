//! The tcp transport over real sockets on 127.0.0.1: writes land byte-exact,
//! old views are fenced, wrong keys and garbage are refused, and a peer that
//! comes up late still gets later writes.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockstep_common::entry::{self, EntryHeader, Kind};
use lockstep_common::handshake::{self, Channel};
use lockstep_common::region::{self, Region, RegionSpec};
use lockstep_common::ring::RingWriter;
use lockstep_common::transport::tcp::{self, FrameHeader, TcpTransport, MAX_WRITE};
use lockstep_common::transport::{Transport, TransportError};
use lockstep_common::Config;

mod region_listener;

use region_listener::ListenerHandle;

const CLUSTER: &str = "tcptest";
const KEY: &str = "0123456789abcdef-test-key";
const RING: u64 = 1 << 20;
/// Upper bound on any wait (against hangs, not a performance threshold).
const WAIT: Duration = Duration::from_secs(30);

fn region(node: u64, ring: u64) -> Arc<Region> {
    Arc::new(
        Region::anonymous(&RegionSpec {
            cluster: CLUSTER.into(),
            node,
            ring_size: ring,
        })
        .unwrap(),
    )
}

fn config(control2: SocketAddr, key: &str, ring: u64) -> Config {
    Config::parse(&format!(
        r#"
cluster = "{CLUSTER}"
transport = "tcp"
key = "{key}"
ring_size = {ring}
data_dir = "/tmp/lockstep-tcp-transport-test"
[[nodes]]
id = 1
app = "127.0.0.1:11"
control = "127.0.0.1:12"
[[nodes]]
id = 2
app = "127.0.0.1:21"
control = "{control2}"
"#
    ))
    .unwrap()
}

/// Node 2's region behind a listener, and node 1's transport to it.
fn pair(ring: u64) -> (Arc<Region>, ListenerHandle, TcpTransport) {
    let r2 = region(2, ring);
    let l = region_listener::spawn_listener("127.0.0.1:0", r2.clone(), CLUSTER, KEY).unwrap();
    let t = TcpTransport::new(&config(l.local_addr(), KEY, ring), 1, region(1, ring)).unwrap();
    (r2, l, t)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn snapshot(r: &Region) -> Vec<u64> {
    r.words()
        .iter()
        .map(|w| w.load(Ordering::Acquire))
        .collect()
}

/// Both regions' rings hold the same bytes (`what` prefixes the failure).
fn assert_same_rings(a: &Region, b: &Region, what: &str) {
    let ring_start = (region::CONTROL_SIZE / 8) as usize;
    let (a, b) = (snapshot(a), snapshot(b));
    assert!(
        a[ring_start..] == b[ring_start..],
        "{what}rings differ at word {:?}",
        a[ring_start..]
            .iter()
            .zip(&b[ring_start..])
            .position(|(x, y)| x != y)
    );
}

fn read_region(r: &Region, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    lockstep_common::words::load(r.words(), offset, &mut out).unwrap();
    out
}

/// Deterministic pseudo-random bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn writes_land_byte_exact() {
    let (r2, _l, t) = pair(RING);
    let r1 = t.local();
    // Every write goes to node 1 (local, applied at once) and to node 2 in
    // the same order: in the end both rings must be identical.
    let both = |offset: u64, bytes: &[u8]| {
        t.write(1, 1, offset, bytes).unwrap();
        t.write(2, 1, offset, bytes).unwrap();
    };

    // Plain writes of many sizes, some overlapping.
    let mut off = 0u64;
    for (i, size) in [8usize, 16, 24, 64, 72, 1000 * 8, 4096, 65536, 8, 128]
        .iter()
        .enumerate()
    {
        both(region::ring_offset(off), &noise(i as u64 + 1, *size));
        off += (*size as u64 / 2) & !7;
    }

    // Encoded entries through a RingWriter, wrapping the ring twice.
    let mut w = RingWriter::new(RING, 0);
    let mut scratch = vec![0u8; entry::footprint(8192)];
    let mut seq = 1u64;
    while w.pos() < 2 * RING + RING / 2 {
        let payload = noise(seq, (seq as usize * 37) % 8000);
        let hdr = EntryHeader::new(Kind::Data, 1, seq, 7, payload.len() as u32);
        let safe = w.pos();
        let a = w
            .append(r1.ring(), &hdr, &payload, safe, &mut scratch)
            .unwrap();
        if let Some(wo) = a.wrap_offset {
            let wrap = w.wrap_bytes().to_vec();
            t.write(2, 1, region::ring_offset(wo), &wrap).unwrap();
        }
        t.write(2, 1, region::ring_offset(a.offset), &scratch[..a.len])
            .unwrap();
        // A whole entry encoded on its own must equal the ring bytes.
        if seq.is_multiple_of(100) {
            assert_eq!(entry::encode(&hdr, &payload), scratch[..a.len].to_vec());
        }
        seq += 1;
    }
    // Many small control-word writes.
    for v in 1..=5000u64 {
        both(region::ack_offset(3), &v.to_le_bytes());
    }
    t.flush();
    // The last write of a connection lands last (once flushed: a write
    // may wait for the next flush to leave).
    both(region::commit_offset(), &0xfeedu64.to_le_bytes());
    t.flush();
    wait_until("the last write", || r2.commit() == 0xfeed);

    assert_eq!(r2.ack(3), 5000);
    assert_same_rings(r1, &r2, "");
    // Spot-check a decoded entry on node 2.
    let first = read_region(&r2, region::ring_offset(0), 64);
    assert!(EntryHeader::parse(&first).is_ok());
    assert_eq!(t.fenced_by(), 0);
}

/// A flush sends inline what the socket takes and leaves the rest to the
/// sender thread: batches far larger than the kernel's socket buffers,
/// each flushed at once while the last one is still on its way, land
/// whole and in order.
#[test]
fn batches_larger_than_the_socket_takes_land_in_order() {
    const BIG: u64 = 16 << 20;
    let (r2, _l, t) = pair(BIG);
    let r1 = t.local();
    let chunk = 1usize << 20;
    // Connected, and the sender idle: the next flush sends inline.
    t.write(2, 1, region::commit_offset(), &1u64.to_le_bytes())
        .unwrap();
    t.flush();
    wait_until("the connection", || r2.commit() == 1);
    for round in 0..4u64 {
        for i in 0..BIG / chunk as u64 {
            let bytes = noise(round * 1000 + i + 1, chunk);
            let offset = region::ring_offset(i * chunk as u64);
            t.write(1, 1, offset, &bytes).unwrap();
            t.write(2, 1, offset, &bytes).unwrap();
            // Half of the rounds flush the whole ring at once.
            if round % 2 == 1 {
                t.flush();
            }
        }
        t.flush();
        // Small writes between the big ones take the same road.
        for v in 1..=100u64 {
            let ack = (round * 100 + v).to_le_bytes();
            t.write(1, 1, region::ack_offset(2), &ack).unwrap();
            t.write(2, 1, region::ack_offset(2), &ack).unwrap();
            t.flush();
        }
        // Every round lands whole before the next one overwrites it.
        let mark = 0xbeef + round;
        t.write(2, 1, region::commit_offset(), &mark.to_le_bytes())
            .unwrap();
        t.flush();
        wait_until("the round's last write", || r2.commit() == mark);
        assert_eq!(r2.ack(2), round * 100 + 100);
        assert_same_rings(r1, &r2, &format!("round {round}: "));
    }
}

#[test]
fn old_view_writes_are_refused() {
    let (r2, _l, t) = pair(RING);
    r2.set_view(5);
    let before = snapshot(&r2);
    let off = region::ring_offset(4096);
    t.write(2, 4, off, &[0xAA; 64]).unwrap();
    t.flush();
    wait_until("the fence notice", || t.fenced_by() == 5);
    assert_eq!(
        snapshot(&r2),
        before,
        "an old-view write changed the region"
    );
    // Now known: refused at once.
    match t.write(2, 4, off, &[0xAA; 64]) {
        Err(TransportError::Fenced { node, ours, theirs }) => {
            assert_eq!((node, ours, theirs), (2, 4, 5))
        }
        other => panic!("expected a fenced error, got {other:?}"),
    }
    // Current and newer views still land on the same connection.
    t.write(2, 5, off + 64, &[0xBB; 64]).unwrap();
    t.flush();
    t.write(2, 6, off + 128, &[0xCC; 64]).unwrap();
    t.flush();
    wait_until("the view-6 write", || {
        read_region(&r2, off + 128, 64) == vec![0xCC; 64]
    });
    assert_eq!(read_region(&r2, off + 64, 64), vec![0xBB; 64]);
    assert_eq!(read_region(&r2, off, 64), vec![0; 64]);
    // Writes to the local node are fenced by its own view.
    t.local().set_view(3);
    assert!(matches!(
        t.write(1, 2, off, &[1; 8]),
        Err(TransportError::Fenced { theirs: 3, .. })
    ));
}

#[test]
fn wrong_key_is_refused() {
    let r2 = region(2, RING);
    let l = region_listener::spawn_listener("127.0.0.1:0", r2.clone(), CLUSTER, KEY).unwrap();
    let addr = l.local_addr();
    let before = snapshot(&r2);

    let bad_key = "another-key-0123456789";
    let t = TcpTransport::new(&config(addr, bad_key, RING), 1, region(1, RING)).unwrap();
    for i in 0..10u64 {
        t.write(2, 1, region::ring_offset(i * 64), &[0x55; 64])
            .unwrap();
    }
    let e = handshake::connect(addr, CLUSTER, bad_key, 1, Channel::Region, WAIT)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("refused") && e.contains("wrong cluster key"),
        "{e}"
    );
    // Give the transport's sender time for a few attempts.
    std::thread::sleep(Duration::from_millis(500));
    t.flush();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(snapshot(&r2), before, "a write with the wrong key landed");

    // The right key works against the same listener.
    let good = TcpTransport::new(&config(addr, KEY, RING), 1, region(1, RING)).unwrap();
    good.write(2, 1, region::ring_offset(0), &[0x66; 64])
        .unwrap();
    wait_until("the good write", || {
        read_region(&r2, region::ring_offset(0), 64) == vec![0x66; 64]
    });
    drop(t);
}

#[test]
fn control_channel_and_wrong_cluster_are_refused_by_the_region_listener() {
    let r2 = region(2, RING);
    let l = region_listener::spawn_listener("127.0.0.1:0", r2, CLUSTER, KEY).unwrap();
    let e = handshake::connect(l.local_addr(), CLUSTER, KEY, 1, Channel::Control, WAIT)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("refused") && e.contains("control channel"),
        "{e}"
    );
    let e = handshake::connect(l.local_addr(), "other", KEY, 1, Channel::Region, WAIT)
        .unwrap_err()
        .to_string();
    assert!(e.contains("refused") && e.contains("wrong cluster"), "{e}");
}

/// Sends `bytes` on an authenticated region connection (then closes our
/// sending side if `eof`), and checks that the server closes it.
fn send_garbage(addr: SocketAddr, bytes: &[u8], eof: bool) {
    let mut s = handshake::connect(addr, CLUSTER, KEY, 1, Channel::Region, WAIT).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    // The server may close (and reset) before it read everything.
    let _ = s.write_all(bytes);
    if eof {
        let _ = s.shutdown(Shutdown::Write);
    }
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("server answered {n} bytes to garbage"),
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "server kept a garbage connection open"
        ),
    }
}

fn frame(view: u64, offset: u64, len: u32, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut f = FrameHeader {
        view,
        offset,
        len,
        flags,
    }
    .encode()
    .to_vec();
    f.extend_from_slice(body);
    f
}

#[test]
fn garbage_does_not_corrupt_the_region() {
    let (r2, l, t) = pair(RING);
    let addr = l.local_addr();
    // Some content first, so that "unchanged" means something.
    t.write(2, 1, region::ring_offset(0), &noise(9, 4096))
        .unwrap();
    t.flush();
    wait_until("the first write", || {
        read_region(&r2, region::ring_offset(0), 4096) == noise(9, 4096)
    });
    let before = snapshot(&r2);
    let len = r2.len();
    let ring0 = region::ring_offset(0);

    let random = noise(42, 4096);
    let mut h = [0u8; tcp::HEADER_LEN];
    h.copy_from_slice(&random[..tcp::HEADER_LEN]);
    assert!(FrameHeader::decode(&h).check(len).is_err());
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("random bytes", random, false),
        (
            "truncated header",
            frame(1, ring0, 64, 0, &[])[..10].to_vec(),
            true,
        ),
        ("truncated frame", frame(1, ring0, 64, 0, &[0x77; 32]), true),
        (
            "out of bounds",
            frame(1, len - 8, 16, 0, &[0x77; 16]),
            false,
        ),
        ("past the end", frame(1, len, 8, 0, &[0x77; 8]), false),
        (
            "offset overflow",
            frame(1, u64::MAX - 7, 16, 0, &[0x77; 16]),
            false,
        ),
        (
            "misaligned offset",
            frame(1, ring0 + 4, 8, 0, &[0x77; 8]),
            false,
        ),
        (
            "misaligned length",
            frame(1, ring0, 12, 0, &[0x77; 16]),
            false,
        ),
        ("empty write", frame(1, ring0, 0, 0, &[0x77; 8]), false),
        (
            "too long",
            frame(1, ring0, (MAX_WRITE + 8) as u32, 0, &[0x77; 64]),
            false,
        ),
        ("unknown flags", frame(1, ring0, 8, 2, &[0x77; 8]), false),
        ("identity words", frame(1, 0, 8, 0, &[0x77; 8]), false),
    ];
    for (what, bytes, eof) in &cases {
        send_garbage(addr, bytes, *eof);
        assert!(snapshot(&r2) == before, "{what} changed the region");
    }
    // A bad frame after good ones: the good ones land, the bad one does not.
    let mut mixed = frame(1, ring0 + 8192, 8, 0, &[0x11; 8]);
    mixed.extend(frame(1, ring0 + 8200, 8, 0, &[0x22; 8]));
    mixed.extend(frame(1, ring0 + 8208, 16, 0, &[0x33; 8]));
    send_garbage(addr, &mixed, true);
    assert_eq!(read_region(&r2, ring0 + 8192, 24), {
        let mut v = vec![0x11; 8];
        v.extend([0x22; 8]);
        v.extend([0; 8]);
        v
    });

    // The transport's own connection is unaffected; a new one works too.
    t.write(2, 1, ring0 + 16384, &[0x44; 64]).unwrap();
    t.flush();
    let t2 = TcpTransport::new(&config(addr, KEY, RING), 1, region(1, RING)).unwrap();
    t2.write(2, 1, ring0 + 16448, &[0x45; 64]).unwrap();
    // A write may wait for the next flush to leave: without this one it
    // left only when the new sender happened to look after it was queued.
    t2.flush();
    wait_until("good writes after garbage", || {
        read_region(&r2, ring0 + 16384, 64) == vec![0x44; 64]
            && read_region(&r2, ring0 + 16448, 64) == vec![0x45; 64]
    });
}

#[test]
fn bad_writes_are_refused_before_queueing() {
    let (_r2, _l, t) = pair(RING);
    let len = t.local().len();
    assert!(matches!(
        t.write(2, 1, 4, &[0; 8]),
        Err(TransportError::Range(_))
    ));
    assert!(matches!(
        t.write(2, 1, 64, &[0; 12]),
        Err(TransportError::Range(_))
    ));
    assert!(matches!(
        t.write(2, 1, 64, &[]),
        Err(TransportError::Range(_))
    ));
    assert!(matches!(
        t.write(2, 1, len - 8, &[0; 16]),
        Err(TransportError::Range(_))
    ));
    assert!(matches!(
        t.write(2, 1, 0, &[0; 8]),
        Err(TransportError::Range(_))
    ));
    assert!(matches!(
        t.write(9, 1, 64, &[0; 8]),
        Err(TransportError::UnknownNode(9))
    ));
}

#[test]
fn peer_down_at_start_gets_later_writes() {
    // A free port nobody listens on yet.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let r2 = region(2, RING);
    let t = TcpTransport::new(&config(addr, KEY, RING), 1, region(1, RING)).unwrap();
    for i in 0..100u64 {
        t.write(2, 1, region::ring_offset(i * 8), &i.to_le_bytes())
            .unwrap();
    }
    t.flush();
    std::thread::sleep(Duration::from_millis(100));

    let mut l = region_listener::spawn_listener(addr, r2.clone(), CLUSTER, KEY).unwrap();
    let off = region::ring_offset(65536);
    t.write(2, 1, off, &[0x5A; 128]).unwrap();
    t.flush();
    wait_until("a write posted once the peer is up", || {
        read_region(&r2, off, 128) == vec![0x5A; 128]
    });

    // The peer goes down and comes back: writes posted after it is back land.
    l.shutdown();
    drop(l);
    t.write(2, 1, off, &[0x01; 128]).unwrap();
    t.flush();
    std::thread::sleep(Duration::from_millis(50));
    let _l = region_listener::spawn_listener(addr, r2.clone(), CLUSTER, KEY).unwrap();
    wait_until("a write after the peer came back", || {
        t.write(2, 1, off + 128, &[0x6B; 64]).unwrap();
        t.flush();
        std::thread::sleep(Duration::from_millis(20));
        read_region(&r2, off + 128, 64) == vec![0x6B; 64]
    });
}

#[test]
fn writes_longer_than_a_frame_are_split() {
    let ring = 32 << 20;
    let (r2, _l, t) = pair(ring);
    let big = noise(77, MAX_WRITE + 4096);
    let off = region::ring_offset(8);
    t.write(2, 1, off, &big).unwrap();
    t.flush();
    wait_until("the big write", || {
        read_region(&r2, off + big.len() as u64 - 8, 8) == big[big.len() - 8..]
    });
    assert!(read_region(&r2, off, big.len()) == big);
}
