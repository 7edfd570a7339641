//! Fuzz loops on stable Rust for every decoder that reads bytes a peer (or a
//! user) controls: the entry decoder, the ring reader, the tcp transport's
//! frame decoder, the control channel's messages and the config parser.
//!
//! Each loop feeds seeded pseudo-random inputs (mutations of valid inputs
//! and plain noise) and checks that the decoder returns — no panic, no hang
//! — that what it accepts is consistent, and that no single allocation
//! passes a bound (a length field must never make a decoder allocate more
//! than its frame limit; a global allocator records the largest allocation
//! of the fuzzing thread).
//!
//! A short run is part of the test suite. The long run:
//!
//! ```sh
//! LOCKSTEP_FUZZ_ITERS=10000000 cargo test -p lockstep-common --release --test fuzz
//! ```
//!
//! `LOCKSTEP_FUZZ_ITERS` is the iteration count of every target,
//! `LOCKSTEP_FUZZ_SEED` changes the inputs. A failure names the target, the
//! seed and the iteration; the input is then rebuilt by running the same
//! target with that seed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_common::control::{
    self, FetchedEntry, NodeStatus, Promise, Request, Response, MAX_FRAME,
};
use lockstep_common::entry::{self, EntryHeader, Kind};
use lockstep_common::region::{Region, RegionSpec};
use lockstep_common::ring::{ReadOutcome, RingReader, RingWriter};
use lockstep_common::transport::tcp::{FrameHeader, RegionServer, HEADER_LEN, MAX_WRITE};
use lockstep_common::{words, Config};
use lockstep_launcher::rng::Rng;
use lockstep_testkit::config_fixture::ThreeNodeConfig;

// ---------------------------------------------------------------------
// The largest allocation of the current thread.

struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size)
        }
    });
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Runs `f` and returns its result and the largest single allocation it
/// made on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    let r = f();
    (r, LARGEST.with(|l| l.get()))
}

// ---------------------------------------------------------------------
// Inputs

/// The generator of `target`'s inputs (the test kit's xorshift64*): each
/// target its own stream of the seed (`LOCKSTEP_FUZZ_SEED`).
fn rng_for(target: &str) -> Rng {
    let seed: u64 = std::env::var("LOCKSTEP_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1e55_0c4a_b1e5);
    let mut h = seed ^ 0x9E37_79B9_7F4A_7C15;
    for b in target.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    Rng::from_state(h)
}

/// Fuzz inputs drawn from the generator.
trait Inputs {
    fn chance(&mut self, one_in: u64) -> bool;
    fn bytes(&mut self, n: usize) -> Vec<u8>;
    fn edgy(&mut self) -> u64;
    fn mutate(&mut self, v: &mut Vec<u8>);
}

impl Inputs for Rng {
    fn chance(&mut self, one_in: u64) -> bool {
        self.one_in(one_in)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// A number near an interesting edge more often than not.
    fn edgy(&mut self) -> u64 {
        match self.below(8) {
            0 => self.next(),
            1 => u64::MAX - self.below(16),
            2 => u32::MAX as u64 - self.below(16) + self.below(32),
            3 => (1u64 << self.below(64))
                .wrapping_add(self.below(3))
                .wrapping_sub(1),
            _ => self.below(300),
        }
    }
    /// Changes a few bytes of `v`: flips, overwrites with edge values,
    /// truncation, extension, duplication of a slice.
    fn mutate(&mut self, v: &mut Vec<u8>) {
        for _ in 0..=self.below(4) {
            match self.below(7) {
                0 | 1 if !v.is_empty() => {
                    let i = self.below(v.len() as u64) as usize;
                    v[i] ^= 1 << self.below(8);
                }
                2 if !v.is_empty() => {
                    let i = self.below(v.len() as u64) as usize;
                    v[i] = [0, 0xff, 0x7f, 0x80, b'"', b'[', b'{'][self.below(7) as usize];
                }
                3 if v.len() >= 4 => {
                    let i = self.below(v.len() as u64 - 3) as usize;
                    let x = (self.edgy() as u32).to_le_bytes();
                    v[i..i + 4].copy_from_slice(&x);
                }
                4 => {
                    let n = self.below(v.len() as u64 + 1) as usize;
                    v.truncate(n);
                }
                5 => {
                    let n = self.below(64) as usize;
                    let extra = self.bytes(n);
                    v.extend_from_slice(&extra);
                }
                _ if !v.is_empty() => {
                    let a = self.below(v.len() as u64) as usize;
                    let b = (a + self.below(32) as usize).min(v.len());
                    let s = v[a..b].to_vec();
                    let at = self.below(v.len() as u64 + 1) as usize;
                    v.splice(at..at, s);
                }
                _ => {}
            }
        }
    }
}

/// Iterations of every target: `LOCKSTEP_FUZZ_ITERS`, or `short`.
fn iterations(short: u64) -> u64 {
    std::env::var("LOCKSTEP_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(short)
}

/// An iteration that runs this long is a hang.
const HANG: Duration = Duration::from_secs(60);

/// Runs `one` for every iteration; a panic names the target, the rng state
/// and the iteration, and so does a hang (the process aborts: the hung
/// thread cannot be stopped).
fn fuzz(target: &str, short: u64, mut one: impl FnMut(&mut Rng)) {
    let n = iterations(short);
    let mut rng = rng_for(target);
    let start = Instant::now();
    // (iteration, rng state at its start), for the watchdog.
    let at = Mutex::new((0u64, rng.state(), Instant::now()));
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let (i, seed, since) = *at.lock().unwrap_or_else(|p| p.into_inner());
                if since.elapsed() > HANG && !done.load(Ordering::Relaxed) {
                    eprintln!("{target}: iteration {i} (rng state {seed:#x}) hangs");
                    std::process::abort();
                }
            }
        });
        for i in 0..n {
            let seed = rng.state();
            *at.lock().unwrap_or_else(|p| p.into_inner()) = (i, seed, Instant::now());
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| one(&mut rng)));
            if let Err(e) = r {
                done.store(true, Ordering::Relaxed);
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{target}: iteration {i} (rng state {seed:#x}) failed: {msg}");
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    eprintln!("{target}: {n} inputs in {:.1?}", start.elapsed());
}

fn arb_kind(rng: &mut Rng) -> Kind {
    [
        Kind::Accept,
        Kind::Data,
        Kind::Close,
        Kind::Noop,
        Kind::Wrap,
        Kind::View,
        Kind::Tick,
        Kind::Time,
    ][rng.below(8) as usize]
}

fn arb_entry(rng: &mut Rng, max_payload: u64) -> (EntryHeader, Vec<u8>) {
    let len = rng.below(max_payload + 1) as usize;
    let payload = rng.bytes(len);
    let mut h = EntryHeader::new(
        arb_kind(rng),
        rng.edgy(),
        rng.edgy(),
        rng.edgy(),
        len as u32,
    );
    h.last_committed = rng.edgy();
    h.out_hash = rng.next();
    (h, payload)
}

// ---------------------------------------------------------------------
// Targets

#[test]
fn fuzz_entry_decode() {
    let accepted = AtomicU64::new(0);
    fuzz("entry decode", 200_000, |rng| {
        let input = if rng.chance(4) {
            let n = rng.below(400) as usize;
            rng.bytes(n)
        } else {
            let (h, p) = arb_entry(rng, 300);
            let mut b = entry::encode(&h, &p);
            if !rng.chance(8) {
                rng.mutate(&mut b);
            }
            b
        };
        let max_len = match rng.below(4) {
            0 => u32::MAX,
            1 => rng.below(400) as u32,
            2 => rng.edgy() as u32,
            _ => 64 << 10,
        };
        let (r, largest) = largest_allocation(|| entry::decode(&input, max_len));
        assert_eq!(largest, 0, "decode allocated {largest} bytes");
        if let Ok((h, payload)) = r {
            accepted.fetch_add(1, Ordering::Relaxed);
            assert!(h.len <= max_len);
            assert_eq!(payload.len(), h.len as usize);
            assert!(entry::footprint(payload.len()) <= input.len());
            // What decodes re-encodes to the same bytes.
            let again = entry::encode(&h, payload);
            assert_eq!(&input[..again.len()], &again[..]);
        }
    });
    assert!(accepted.load(Ordering::Relaxed) > 0, "no input decoded");
}

#[test]
fn fuzz_ring_reader() {
    const SIZE: u64 = 8192;
    fuzz("ring reader", 20_000, |rng| {
        let ring = words::zeroed(SIZE as usize);
        let mut w = RingWriter::new(SIZE, rng.below(4) * SIZE);
        let mut scratch = vec![0u8; 4096];
        let first = 1 + rng.below(4);
        let mut tail = w.pos();
        // Some real entries, then noise and planted entries on top.
        for seq in first..first + rng.below(40) {
            let (mut h, p) = arb_entry(rng, 200);
            h.seq = seq;
            h.view = 1 + rng.below(3);
            if h.kind == Kind::Wrap && !rng.chance(3) {
                h.kind = Kind::Data;
            }
            match w.append(&ring, &h, &p, tail, &mut scratch) {
                Ok(pl) => tail = pl.end,
                Err(_) => break,
            }
        }
        for _ in 0..rng.below(6) {
            let at = rng.below(SIZE / 8) * 8;
            if rng.chance(2) {
                ring[(at / 8) as usize].store(rng.next(), std::sync::atomic::Ordering::Relaxed);
            } else {
                let (mut h, p) = arb_entry(rng, 100);
                h.seq = first + rng.below(8);
                h.view = 1 + rng.below(3);
                let b = entry::encode(&h, &p);
                let at = (at / 64 * 64).min(SIZE - b.len() as u64);
                let _ = words::store(&ring, at, &b);
            }
        }
        let max_len = [200, 64, u32::MAX, rng.edgy() as u32][rng.below(4) as usize];
        let mut r = RingReader::new(
            SIZE,
            [0, tail.saturating_sub(SIZE / 2), rng.below(SIZE * 4)][rng.below(3) as usize],
            first + rng.below(2),
            max_len,
        );
        r.set_min_view(rng.below(3));
        let hint = [0, tail, rng.edgy() % (SIZE * 8)][rng.below(3) as usize];
        let mut buf = Vec::new();
        let (_, largest) = largest_allocation(|| {
            for _ in 0..64 {
                match r.poll(&ring, hint, &mut buf) {
                    ReadOutcome::Entry { header, len, .. } => {
                        assert!(header.len <= max_len);
                        assert_eq!(len, entry::footprint(header.len as usize));
                    }
                    _ => break,
                }
            }
        });
        // The entry buffer grows by doubling: twice the largest entry.
        assert!(
            largest <= 2 * entry::footprint(max_len.min(SIZE as u32) as usize),
            "the reader allocated {largest} bytes"
        );
    });
}

#[test]
fn fuzz_tcp_frames() {
    let region = Arc::new(
        Region::anonymous(&RegionSpec {
            cluster: "fuzz".into(),
            node: 2,
            ring_size: 1 << 20,
        })
        .unwrap(),
    );
    region.set_view(5);
    let len = region.remote_len();
    let server = RegionServer::new(region);
    let applied = AtomicU64::new(0);
    fuzz("tcp frames", 20_000, |rng| {
        let mut stream = Vec::new();
        for _ in 0..rng.below(6) {
            // Frames near the size limit are rare: each costs a buffer of
            // that size (the decoder's bound, checked below).
            let body_len = match rng.below(5000) {
                0..=499 => rng.edgy() as u32,
                500 => (MAX_WRITE + 8 * rng.below(3) as usize) as u32 - 8,
                _ => (rng.below(64) * 8) as u32,
            };
            let h = FrameHeader {
                view: [5, 4, 6, rng.edgy()][rng.below(4) as usize],
                offset: match rng.below(4) {
                    0 => rng.edgy(),
                    _ => 64 + rng.below(len / 8) * 8,
                },
                len: body_len,
                flags: if rng.chance(10) { rng.next() as u32 } else { 0 },
            };
            let mut f = h.encode().to_vec();
            if rng.chance(20_000) {
                // A whole frame of the largest size.
                f.resize(f.len() + (body_len as usize).min(MAX_WRITE), 0);
            } else {
                let n = (body_len as usize).min(512);
                f.extend_from_slice(&rng.bytes(n));
            }
            if rng.chance(4) {
                rng.mutate(&mut f);
            }
            stream.extend_from_slice(&f);
        }
        if rng.chance(5) {
            let n = rng.below(HEADER_LEN as u64 * 3) as usize;
            stream.extend_from_slice(&rng.bytes(n));
        }
        let mut notices = Vec::new();
        let mut rd = std::io::BufReader::new(&stream[..]);
        let (r, largest) = largest_allocation(|| server.apply_frames(&mut rd, &mut notices));
        assert!(
            largest <= MAX_WRITE,
            "the decoder allocated {largest} bytes"
        );
        assert_eq!(notices.len() % 16, 0);
        if let Ok(stats) = r {
            applied.fetch_add(stats.applied, Ordering::Relaxed);
        }
    });
    assert!(applied.load(Ordering::Relaxed) > 0, "no frame applied");
}

fn arb_request(rng: &mut Rng) -> Request {
    match rng.below(7) {
        0 => Request::Status,
        6 => Request::Snapshot,
        4 => Request::SnapshotMeta,
        5 => Request::SnapshotChunk {
            seq: rng.edgy(),
            file: ["pages-1.img", "", "../x", "\u{0}"][rng.below(4) as usize].into(),
            offset: rng.edgy(),
            len: rng.edgy() as u32,
        },
        1 => Request::Fetch {
            from: rng.edgy(),
            to: rng.edgy(),
        },
        2 => Request::Prepare {
            view: rng.edgy(),
            candidate: rng.edgy(),
        },
        _ => Request::NewView {
            view: rng.edgy(),
            leader: rng.edgy(),
            last: rng.edgy(),
        },
    }
}

fn arb_response(rng: &mut Rng) -> Response {
    match rng.below(8) {
        7 => Response::Snapshot { seq: rng.edgy() },
        0 => Response::Status(NodeStatus {
            node: rng.edgy(),
            view: rng.edgy(),
            role: "backup".into(),
            stale_reason: rng.chance(2).then(|| "its server exited".into()),
            snapshot: rng.edgy(),
            oldest: rng.edgy(),
            snapshotting: rng.chance(2),
            ..NodeStatus::default()
        }),
        6 => Response::SnapshotMeta(rng.chance(2).then(|| (rng.edgy(), "{\"files\":[]}".into()))),
        1 => Response::Entries,
        2 => Response::Error("refused: candidate 9".into()),
        3 => Response::Promise(Promise {
            node: rng.edgy(),
            log_view: rng.edgy(),
            last_seq: rng.edgy(),
            committed: rng.edgy(),
            led: rng.chance(2).then(|| (rng.edgy(), rng.edgy())),
        }),
        4 => Response::Synced { last: rng.edgy() },
        _ => Response::Outdated {
            promised: rng.edgy(),
        },
    }
}

#[test]
fn fuzz_control_messages() {
    let decoded = AtomicU64::new(0);
    fuzz("control messages", 50_000, |rng| {
        let mut stream = Vec::new();
        for _ in 0..1 + rng.below(4) {
            let mut frame = Vec::new();
            match rng.below(5) {
                4 => {
                    let n = rng.below(3000) as usize;
                    control::send_snapshot_chunk(&mut frame, &rng.bytes(n)).unwrap()
                }
                0 => control::send_json(&mut frame, &arb_request(rng)).unwrap(),
                1 => control::send_json(&mut frame, &arb_response(rng)).unwrap(),
                2 => {
                    let es: Vec<FetchedEntry> = (0..rng.below(4))
                        .map(|_| {
                            let (h, p) = arb_entry(rng, 100);
                            FetchedEntry {
                                seq: h.seq,
                                pos: rng.edgy(),
                                bytes: entry::encode(&h, &p),
                            }
                        })
                        .collect();
                    control::send_entries(&mut frame, &es).unwrap()
                }
                _ => {
                    let n = rng.below(64) as usize;
                    frame = rng.bytes(n);
                }
            }
            if rng.chance(3) {
                rng.mutate(&mut frame);
            }
            if rng.chance(8) && frame.len() >= 4 {
                // A length field claiming up to the limit, or beyond.
                let claim = [MAX_FRAME as u32, MAX_FRAME as u32 + 1, u32::MAX, 0];
                frame[..4].copy_from_slice(&claim[rng.below(4) as usize].to_le_bytes());
            }
            stream.extend_from_slice(&frame);
        }
        let (_, largest) = largest_allocation(|| {
            let mut r = &stream[..];
            for _ in 0..8 {
                let ok = match rng.below(5) {
                    4 => control::recv_snapshot_chunk(&mut r)
                        .map(|d| assert!(d.len() <= control::SNAPSHOT_CHUNK as usize))
                        .is_ok(),
                    0 => control::recv_json::<Request>(&mut r).is_ok(),
                    1 => control::recv_json::<Response>(&mut r).is_ok(),
                    2 => control::recv_entries(&mut r)
                        .map(|es| {
                            for e in &es {
                                if let Ok(h) = e.check(64 << 10) {
                                    assert_eq!(h.seq, e.seq);
                                    assert_eq!(h.footprint(), e.bytes.len());
                                }
                            }
                        })
                        .is_ok(),
                    _ => control::read_frame(&mut r).is_ok(),
                };
                if ok {
                    decoded.fetch_add(1, Ordering::Relaxed);
                } else if r.is_empty() {
                    break;
                }
            }
        });
        // The body grows with the bytes that arrived: a length field
        // alone allocates nothing near the limit.
        assert!(
            largest <= (stream.len() * 4).max(128 << 10),
            "decoding {} bytes allocated {largest}",
            stream.len()
        );
    });
    assert!(decoded.load(Ordering::Relaxed) > 0, "no message decoded");
}

/// The config the mutator starts from: every option set, node 2 with a
/// metrics endpoint, node 3 on IPv6.
fn config_text() -> String {
    ThreeNodeConfig::new(
        r#"cluster = "demo"
transport = "shm"
ring_size = "64MiB"
max_entry = "64KiB"
data_dir = "/tmp/lockstep-fuzz-config"
durability = "memory-ack"
backup_clients = "deny"
commit = "output"
server = ["redis-server", "--port", "{port}"]
[election]
mode = "static"
leader = 1
session_timeout_ms = 2000
"#,
    )
    .metrics(2, "127.0.0.1:7202")
    .app(3, "[::1]:7003")
    .text()
}

/// Tokens the config mutator splices in.
const TOKENS: &[&str] = &[
    "=",
    "\n",
    "[",
    "]",
    "[[nodes]]\n",
    "[election]\n",
    "\"",
    "'",
    "{",
    "}",
    ",",
    "-",
    "0",
    "4294967296",
    "18446744073709551615",
    "9223372036854775807",
    "-1",
    "1.5",
    "true",
    "\"4GiB\"",
    "\"32GiB\"",
    "\"0\"",
    "\"1\"",
    "GiB",
    "KiB",
    "max_entry = ",
    "ring_size = ",
    "id = ",
    "app = ",
    "leader = ",
    "session_timeout_ms = ",
    "transport = \"tcp\"\n",
    "key = \"0123456789abcdef\"\n",
    "mode = \"zookeeper\"\n",
    "election = { mode = 7 }\n",
    "#",
    "\u{e9}",
    "\u{1F980}",
    "\\u0000",
    "\"\"\"",
];

#[test]
fn fuzz_config_parse() {
    let parsed = AtomicU64::new(0);
    fuzz("config parse", 5_000, |rng| {
        let mut text = config_text().into_bytes();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(text.len() as u64 + 1) as usize;
            match rng.below(4) {
                0 => {
                    let t = TOKENS[rng.below(TOKENS.len() as u64) as usize];
                    text.splice(at..at, t.bytes());
                }
                1 => {
                    let end = (at + rng.below(24) as usize).min(text.len());
                    text.drain(at..end);
                }
                _ => rng.mutate(&mut text),
            }
        }
        let text = String::from_utf8_lossy(&text);
        match Config::parse(&text) {
            Ok(c) => {
                parsed.fetch_add(1, Ordering::Relaxed);
                assert!(c.max_entry >= 1);
                assert!(entry::footprint(c.max_entry as usize) as u64 <= c.ring_size / 4);
                assert!(c.ring_size.is_power_of_two());
                assert!(!c.nodes.is_empty());
            }
            Err(e) => assert!(!e.0.contains('\n'), "a two-line error: {e}"),
        }
    });
    assert!(
        parsed.load(Ordering::Relaxed) > 0,
        "no mutated config parsed"
    );
}
