//! The load of `lockstep bench redis` and `lockstep bench memcached`: N
//! connections, one thread each, every thread sending one request (a Redis
//! `SET`, optionally followed by `WAIT n 0`; a memcached `set` or `get`)
//! and waiting for the reply before the next, with every request's latency
//! recorded in an HDR histogram.
//!
//! It exists beside `redis-benchmark` because `redis-benchmark` cannot send
//! `WAIT` after each write: with one client of our own, the `WAIT` row is
//! compared with the other systems under exactly the same load. Debian
//! ships no memcached load tool that measures latency per request.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use lockstep_common::resp::{encode_command, read_value, Value};

use crate::resp::connect_stream;

/// How long one reply may take before the run is declared hung.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest latency the histogram holds (larger ones saturate): 60 s in ns.
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// What one load run does.
#[derive(Clone, Debug)]
pub struct LoadSpec {
    /// The server to load.
    pub addr: SocketAddr,
    /// Connections, one thread each.
    pub clients: usize,
    /// Requests in all (split evenly over the connections); ignored when
    /// `duration` is set.
    pub requests: u64,
    /// Run for this long instead of a request count.
    pub duration: Option<Duration>,
    /// What each request is.
    pub request: Request,
    /// Requests each connection sends in one write before it reads their
    /// replies (1: one at a time).
    pub pipeline: usize,
    /// Bytes of each stored value (`redis-benchmark -d`, default 3).
    pub value_size: usize,
}

/// One request of the load. Keys cycle over 1000 per connection: the same
/// small working set for every system, and no single hot key shared by all
/// clients (a `get` run after a `set` run finds every key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Redis `SET`; with `wait_replicas`, followed by `WAIT n 0` in the
    /// same write, the pair counted as one request.
    RedisSet {
        /// The `n` of `WAIT n 0`.
        wait_replicas: Option<u32>,
    },
    /// memcached `set`.
    MemcachedSet,
    /// memcached `get`.
    MemcachedGet,
    /// memcached `incr key 1` (the set load stores digits, so a key it
    /// set holds a number; a key it never reached answers `NOT_FOUND`).
    MemcachedIncr,
}

/// What one load run measured.
pub struct LoadResult {
    /// Requests completed.
    pub requests: u64,
    /// From the moment all connections were open and started until the
    /// last one finished.
    pub elapsed: Duration,
    /// Per-request latency in nanoseconds, all connections together.
    pub latency_ns: Histogram<u64>,
}

impl LoadResult {
    /// Completed requests per second.
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The latency at quantile `q` (0..=1), in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        self.latency_ns.value_at_quantile(q) as f64 / 1e6
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("valid histogram bounds")
}

/// One connection's work until its quota is done or the run is stopped.
struct Client {
    stream: TcpStream,
    id: usize,
    quota: u64,
}

/// Connection `id`'s share of `requests` spread over `clients`.
fn quota(requests: u64, clients: u64, id: u64) -> u64 {
    requests / clients + u64::from(id < requests % clients)
}

/// Runs the load; `stop` (Ctrl-C) ends it early with an error.
pub fn run(spec: &LoadSpec, stop: &AtomicBool) -> anyhow::Result<LoadResult> {
    if spec.clients == 0 {
        bail!("the load needs at least one client");
    }
    // Open every connection before the clock starts: connection setup is
    // not what is measured (and through lockstep each accept is a log entry).
    let clients = spec.clients as u64;
    let mut conns = Vec::with_capacity(spec.clients);
    for id in 0..spec.clients {
        let stream = connect_stream(spec.addr, Duration::from_secs(5), REPLY_TIMEOUT)
            .with_context(|| format!("load client {id}: cannot connect to {}", spec.addr))?;
        let quota = quota(spec.requests, clients, id as u64);
        conns.push(Client { stream, id, quota });
    }
    let start_line = Barrier::new(spec.clients + 1);
    // Raised by the first client that fails, so the others stop early.
    let abort = AtomicBool::new(false);
    // Digits: memcached's `incr` can then count on what a set stored.
    let filler = match spec.request {
        Request::MemcachedSet => b'0',
        _ => b'x',
    };
    let value = vec![filler; spec.value_size];
    std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .into_iter()
            .map(|c| {
                let (start_line, abort, value) = (&start_line, &abort, &value);
                s.spawn(move || {
                    start_line.wait();
                    let r = client(c, spec, value, stop, abort);
                    if r.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        start_line.wait();
        let t0 = Instant::now();
        let mut total = LoadResult {
            requests: 0,
            elapsed: Duration::ZERO,
            latency_ns: new_histogram(),
        };
        let mut first_err = None;
        for h in handles {
            match h.join() {
                Ok(Ok((n, hist, end))) => {
                    total.requests += n;
                    total.latency_ns.add(&hist).expect("same histogram bounds");
                    total.elapsed = total.elapsed.max(end.saturating_duration_since(t0));
                }
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow::anyhow!("a load client thread panicked"));
                }
            }
        }
        if stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    })
}

/// One connection's loop: send `pipeline` requests in one write, read
/// their replies, record the round's latency for each of them.
fn client(
    c: Client,
    spec: &LoadSpec,
    value: &[u8],
    stop: &AtomicBool,
    abort: &AtomicBool,
) -> anyhow::Result<(u64, Histogram<u64>, Instant)> {
    let mut hist = new_histogram();
    let mut reader = BufReader::new(c.stream.try_clone()?);
    let mut w = c.stream;
    let deadline = spec.duration.map(|d| Instant::now() + d);
    let depth = spec.pipeline.max(1) as u64;
    let mut buf = Vec::with_capacity(128 * depth as usize);
    let mut line = String::new();
    let mut done = 0u64;
    loop {
        let more = match deadline {
            Some(d) => Instant::now() < d,
            None => done < c.quota,
        };
        if !more || stop.load(Ordering::Relaxed) || abort.load(Ordering::Relaxed) {
            break;
        }
        let round = match deadline {
            Some(_) => depth,
            None => depth.min(c.quota - done),
        };
        buf.clear();
        for i in 0..round {
            let key = format!("lockstep:lg:{}:{}", c.id, (done + i) % 1000);
            encode_request(spec.request, &key, value, &mut buf);
        }
        let t = Instant::now();
        w.write_all(&buf)
            .with_context(|| format!("load client {}: cannot send", c.id))?;
        for _ in 0..round {
            read_response(spec.request, &mut reader, &mut line, c.id)?;
        }
        let took = t.elapsed().as_nanos() as u64;
        for _ in 0..round {
            hist.saturating_record(took);
        }
        done += round;
    }
    Ok((done, hist, Instant::now()))
}

/// Appends `request` on `key` to `buf`.
fn encode_request(request: Request, key: &str, value: &[u8], buf: &mut Vec<u8>) {
    match request {
        Request::RedisSet { wait_replicas } => {
            encode_command(&[b"SET", key.as_bytes(), value], buf);
            if let Some(n) = wait_replicas {
                // WAIT goes out in the same write as its SET: the pair
                // costs one round trip, the cheapest way a client gets "a
                // replica has it" from Redis, so the WAIT row is Redis's
                // best case.
                encode_command(&[b"WAIT", n.to_string().as_bytes(), b"0"], buf);
            }
        }
        Request::MemcachedSet => {
            buf.extend_from_slice(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
            buf.extend_from_slice(value);
            buf.extend_from_slice(b"\r\n");
        }
        Request::MemcachedGet => buf.extend_from_slice(format!("get {key}\r\n").as_bytes()),
        Request::MemcachedIncr => buf.extend_from_slice(format!("incr {key} 1\r\n").as_bytes()),
    }
}

/// Reads the whole response to one `request` (an error names client `id`).
fn read_response(
    request: Request,
    reader: &mut BufReader<TcpStream>,
    line: &mut String,
    id: usize,
) -> anyhow::Result<()> {
    match request {
        Request::RedisSet { wait_replicas } => {
            match read_value(reader) {
                Ok(Value::Simple(s)) if s == "OK" => {}
                Ok(r) => bail!("load client {id}: SET answered {r:?}"),
                Err(e) => bail!("load client {id}: no reply to SET: {e}"),
            }
            if let Some(n) = wait_replicas {
                match read_value(reader) {
                    Ok(Value::Int(k)) if k >= i64::from(n) => {}
                    Ok(r) => bail!("load client {id}: WAIT {n} 0 answered {r:?}"),
                    Err(e) => bail!("load client {id}: no reply to WAIT: {e}"),
                }
            }
        }
        Request::MemcachedSet => {
            read_line(reader, line, id)?;
            if line != "STORED\r\n" {
                bail!("load client {id}: set answered {line:?}");
            }
        }
        Request::MemcachedIncr => {
            read_line(reader, line, id)?;
            let number = line.trim_end();
            if number != "NOT_FOUND"
                && (number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()))
            {
                bail!("load client {id}: incr answered {line:?}");
            }
        }
        Request::MemcachedGet => loop {
            // VALUE lines with their data, then END.
            read_line(reader, line, id)?;
            if line == "END\r\n" {
                break;
            }
            if !line.starts_with("VALUE ") {
                bail!("load client {id}: get answered {line:?}");
            }
            read_line(reader, line, id)?;
        },
    }
    Ok(())
}

/// Reads one reply line into `line` (a closed connection is an error).
fn read_line(reader: &mut impl BufRead, line: &mut String, id: usize) -> anyhow::Result<()> {
    line.clear();
    match reader.read_line(line) {
        Ok(0) => bail!("load client {id}: the server closed the connection"),
        Ok(_) => Ok(()),
        Err(e) => bail!("load client {id}: no reply: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_add_up() {
        for (req, clients) in [(1003u64, 10u64), (5, 50), (50, 50)] {
            let q: Vec<u64> = (0..clients).map(|id| quota(req, clients, id)).collect();
            assert_eq!(q.iter().sum::<u64>(), req);
            assert!(q.iter().max().unwrap() - q.iter().min().unwrap() <= 1);
        }
    }
}
