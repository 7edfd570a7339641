//! The clients of `lockstep verify`: each runs one operation at a time
//! against the node it believes leads, and records the invocation and the
//! completion of each (see `history` for what ok, fail and info mean).
//!
//! Workloads, each on keys of its own:
//! - **list-append**: a transaction of one to four micro-operations, each an
//!   append of a value unique in the run (`RPUSH`) or a read of a whole
//!   list (`LRANGE 0 -1`), in one `MULTI`/`EXEC`. A key takes at most
//!   [`APPENDS_PER_KEY`] appends and is then retired for a fresh one, so
//!   lists stay short and the checker's inferences precise (as Elle does).
//! - **register**: `GET`, `SET` and a compare-and-set through `EVAL` on a
//!   few keys holding small integers.
//! - **counter**: `INCR` on a few keys; after the run, one final read each.
//!
//! A request is sent only on a connection already open, so a connect that
//! fails records nothing. A reply that is an error (a backup refusing the
//! client, an aborted `EXEC`) is a `fail`: the server did not act. A
//! timeout or a broken connection after sending is `info`: it may have
//! happened; the client then continues as a new process.

use lockstep_launcher::rng::Rng;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockstep_common::resp::Value;
use lockstep_common::Config;
use lockstep_launcher::resp::Resp;

use super::history::{Event, Kind, Mop, Op};

/// Appends a list-append key takes before it is retired.
pub const APPENDS_PER_KEY: u32 = 32;
/// List-append keys in use at once.
pub const ACTIVE_LIST_KEYS: usize = 4;
/// Register keys in use at once, and the operations each takes before it
/// is retired for a fresh one (the linearizability search is exponential
/// in the concurrency of one key's history, so keys stay short, as
/// Jepsen's independent keys do).
pub const ACTIVE_REGISTER_KEYS: usize = 3;
pub const OPS_PER_REGISTER: u32 = 200;
/// Counter keys.
const COUNTER_KEYS: u64 = 2;
/// Values a register takes (small, so compare-and-sets often succeed).
const REGISTER_VALUES: i64 = 5;

/// The compare-and-set: sets KEYS[1] to ARGV[2] if it holds ARGV[1].
const CAS_SCRIPT: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('SET', KEYS[1], ARGV[2]) return 1 else return 0 end";

/// How a compare-and-set that found another value fails (the start of its
/// error): the leader served it.
pub const CAS_MISMATCH: &str = "the register did not hold";

/// A kind of operations a client runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    ListAppend,
    Register,
    Counter,
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Workload, String> {
        match s {
            "list-append" => Ok(Workload::ListAppend),
            "register" => Ok(Workload::Register),
            "counter" => Ok(Workload::Counter),
            other => Err(format!(
                "unknown workload {other:?} (list-append, register, counter)"
            )),
        }
    }
}

/// The history being recorded, shared by every client.
pub struct Recorder {
    start: Instant,
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        })
    }

    /// Nanoseconds since the run began.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Appends one event, stamped now.
    pub fn record(&self, kind: Kind, process: u64, op: Op, node: u64, error: Option<String>) {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let index = events.len() as u64;
        events.push(Event {
            index,
            kind,
            process,
            time_ns: self.now_ns(),
            op,
            node: Some(node),
            error,
        });
    }

    /// How many events were recorded so far.
    pub fn count(&self) -> usize {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The history so far.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Where clients send requests: the node that leads, as far as known.
pub struct Target {
    config: Arc<Config>,
    ids: Vec<u64>,
    leader: AtomicU64,
}

impl Target {
    pub fn new(config: Arc<Config>) -> Arc<Target> {
        let ids: Vec<u64> = config.ids().collect();
        let first = ids[0];
        Arc::new(Target {
            config,
            ids,
            leader: AtomicU64::new(first),
        })
    }

    /// The node believed to lead.
    pub fn node(&self) -> u64 {
        self.leader.load(Ordering::Relaxed)
    }

    /// Node `id`'s client address.
    pub fn app(&self, id: u64) -> Option<SocketAddr> {
        self.config.node(id).ok().map(|n| n.app)
    }

    /// Asks the nodes who leads now (a node that does not answer within
    /// `timeout` is skipped); keeps the old belief when none is found.
    pub fn refresh(&self, timeout: Duration) -> Option<u64> {
        let (_, leader) = lockstep_launcher::leader::find_leader(&self.config, &self.ids, timeout)?;
        self.leader.store(leader, Ordering::Relaxed);
        Some(leader)
    }
}

/// Keys of a workload: a few active at once, each retired for a fresh
/// one after `budget` uses; and values unique in the run.
pub struct Keys {
    active: Vec<(u64, u32)>,
    budget: u32,
    next_key: u64,
    next_value: i64,
}

impl Keys {
    pub fn new(active: usize, budget: u32) -> Arc<Mutex<Keys>> {
        let mut k = Keys {
            active: Vec::new(),
            budget,
            next_key: 0,
            next_value: 0,
        };
        for _ in 0..active {
            k.active.push((k.next_key, 0));
            k.next_key += 1;
        }
        Arc::new(Mutex::new(k))
    }

    /// An active key, without using it up.
    fn read_key(&self, rng: &mut Rng) -> u64 {
        self.active[rng.below(self.active.len() as u64) as usize].0
    }

    /// An active key, using it once.
    fn use_key(&mut self, rng: &mut Rng) -> u64 {
        let slot = rng.below(self.active.len() as u64) as usize;
        let (key, n) = self.active[slot];
        self.active[slot] = if n + 1 >= self.budget {
            self.next_key += 1;
            (self.next_key - 1, 0)
        } else {
            (key, n + 1)
        };
        key
    }

    /// A key and a fresh value to append.
    fn append(&mut self, rng: &mut Rng) -> (u64, i64) {
        let key = self.use_key(rng);
        self.next_value += 1;
        (key, self.next_value)
    }

    /// Every key used so far (for the final reads).
    pub fn used(&self) -> Vec<u64> {
        (0..self.next_key).collect()
    }
}

/// What every client shares.
pub struct Shared {
    pub recorder: Arc<Recorder>,
    pub target: Arc<Target>,
    pub list_keys: Arc<Mutex<Keys>>,
    pub register_keys: Arc<Mutex<Keys>>,
    pub workloads: Vec<Workload>,
    /// How long a request may wait for its reply before it is `info`.
    pub request_timeout: Duration,
    /// Each client's pause between the starts of two operations (None:
    /// as fast as the replies come).
    pub interval: Option<Duration>,
    pub stop: Arc<AtomicBool>,
}

/// How a request ended.
enum Outcome {
    /// It happened; the operation with what it returned.
    Ok(Op),
    /// It did not happen.
    Fail(String),
    /// Unknown.
    Info(String),
}

/// One client: runs operations until `stop`, as process `first_process`,
/// then `first_process + stride`, … after each unknown outcome.
pub fn run(shared: &Shared, first_process: u64, stride: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut process = first_process;
    let mut conn: Option<(u64, Resp)> = None;
    let mut next = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        if let Some(interval) = shared.interval {
            // Paced from the schedule, not from the last reply: a slow
            // spell is not made up for by a burst afterwards.
            let now = Instant::now();
            next = now.checked_sub(interval).map_or(next, |t| next.max(t)) + interval;
            std::thread::sleep(next.saturating_duration_since(now));
        }
        let node = shared.target.node();
        if conn.as_ref().map(|(n, _)| *n) != Some(node) {
            conn = connect(shared, node);
            if conn.is_none() {
                shared.target.refresh(Duration::from_millis(500));
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let Some((node, resp)) = conn.as_mut() else {
            continue;
        };
        let node = *node;
        let workload = shared.workloads[rng.below(shared.workloads.len() as u64) as usize];
        let op = next_op(workload, shared, &mut rng);
        shared
            .recorder
            .record(Kind::Invoke, process, op.clone(), node, None);
        match execute(resp, &op) {
            Outcome::Ok(done) => shared.recorder.record(Kind::Ok, process, done, node, None),
            Outcome::Fail(why) => {
                shared
                    .recorder
                    .record(Kind::Fail, process, op, node, Some(why.clone()));
                if why.contains("READONLY") || why.contains("LOADING") {
                    // Not (or no longer) the leader: ask who is.
                    conn = None;
                    shared.target.refresh(Duration::from_millis(500));
                }
            }
            Outcome::Info(why) => {
                shared
                    .recorder
                    .record(Kind::Info, process, op, node, Some(why));
                process += stride;
                conn = None;
                shared.target.refresh(Duration::from_millis(500));
            }
        }
    }
}

/// Opens a connection to node `node`, whose replies may take up to the
/// request timeout.
fn connect(shared: &Shared, node: u64) -> Option<(u64, Resp)> {
    let addr = shared.target.app(node)?;
    let resp = Resp::connect_with(addr, Duration::from_secs(1), shared.request_timeout).ok()?;
    Some((node, resp))
}

/// The next operation of `workload` (as invoked: reads carry no value).
fn next_op(workload: Workload, shared: &Shared, rng: &mut Rng) -> Op {
    match workload {
        Workload::ListAppend => {
            let mut keys = shared.list_keys.lock().unwrap_or_else(|e| e.into_inner());
            let n = 1 + rng.below(4);
            Op::Txn(
                (0..n)
                    .map(|_| {
                        if rng.below(2) == 0 {
                            let (key, value) = keys.append(rng);
                            Mop::Append { key, value }
                        } else {
                            Mop::Read {
                                key: keys.read_key(rng),
                                value: None,
                            }
                        }
                    })
                    .collect(),
            )
        }
        Workload::Register => {
            let key = shared
                .register_keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .use_key(rng);
            match rng.below(3) {
                0 => Op::Read { key, value: None },
                1 => Op::Write {
                    key,
                    value: rng.below(REGISTER_VALUES as u64) as i64,
                },
                _ => Op::Cas {
                    key,
                    from: rng.below(REGISTER_VALUES as u64) as i64,
                    to: rng.below(REGISTER_VALUES as u64) as i64,
                },
            }
        }
        Workload::Counter => Op::Incr {
            key: rng.below(COUNTER_KEYS),
            result: None,
        },
    }
}

/// Redis key names of each workload.
pub fn list_key(key: u64) -> String {
    format!("la:{key}")
}
fn register_key(key: u64) -> String {
    format!("reg:{key}")
}
pub fn counter_key(key: u64) -> String {
    format!("ctr:{key}")
}

/// A reply's error, or an I/O error, as an outcome: an error reply is a
/// refusal (nothing happened), an I/O error leaves it unknown.
fn io_outcome(e: std::io::Error) -> Outcome {
    Outcome::Info(format!("no reply: {e}"))
}

/// Sends `op` on `resp` and reads what became of it.
fn execute(resp: &mut Resp, op: &Op) -> Outcome {
    match op {
        Op::Txn(mops) => execute_txn(resp, mops),
        Op::Read { key, .. } | Op::CounterRead { key, .. } => {
            let name = match op {
                Op::Read { .. } => register_key(*key),
                _ => counter_key(*key),
            };
            match resp.cmd(&[b"GET", name.as_bytes()]) {
                Err(e) => io_outcome(e),
                Ok(Value::Error(e)) => Outcome::Fail(e),
                Ok(reply) => match int_of(&reply) {
                    Ok(value) => Outcome::Ok(match op {
                        Op::Read { .. } => Op::Read { key: *key, value },
                        _ => Op::CounterRead { key: *key, value },
                    }),
                    Err(e) => Outcome::Info(e),
                },
            }
        }
        Op::Write { key, value } => {
            let v = value.to_string();
            match resp.cmd(&[b"SET", register_key(*key).as_bytes(), v.as_bytes()]) {
                Err(e) => io_outcome(e),
                Ok(Value::Simple(s)) if s == "OK" => Outcome::Ok(op.clone()),
                Ok(Value::Error(e)) => Outcome::Fail(e),
                Ok(other) => Outcome::Info(format!("unexpected reply {other:?}")),
            }
        }
        Op::Cas { key, from, to } => {
            let (f, t, k) = (from.to_string(), to.to_string(), register_key(*key));
            let args: [&[u8]; 6] = [
                b"EVAL",
                CAS_SCRIPT.as_bytes(),
                b"1",
                k.as_bytes(),
                f.as_bytes(),
                t.as_bytes(),
            ];
            match resp.cmd(&args) {
                Err(e) => io_outcome(e),
                Ok(Value::Int(1)) => Outcome::Ok(op.clone()),
                Ok(Value::Int(0)) => Outcome::Fail(format!("{CAS_MISMATCH} {from}")),
                Ok(Value::Error(e)) => Outcome::Fail(e),
                Ok(other) => Outcome::Info(format!("unexpected reply {other:?}")),
            }
        }
        Op::Incr { key, .. } => match resp.cmd(&[b"INCR", counter_key(*key).as_bytes()]) {
            Err(e) => io_outcome(e),
            Ok(Value::Int(n)) => Outcome::Ok(Op::Incr {
                key: *key,
                result: Some(n),
            }),
            Ok(Value::Error(e)) => Outcome::Fail(e),
            Ok(other) => Outcome::Info(format!("unexpected reply {other:?}")),
        },
    }
}

/// A `MULTI`, one command per micro-operation, `EXEC`; the transaction's
/// reads filled in from `EXEC`'s replies.
fn execute_txn(resp: &mut Resp, mops: &[Mop]) -> Outcome {
    let names: Vec<(String, String)> = mops
        .iter()
        .map(|m| match m {
            Mop::Append { key, value } => (list_key(*key), value.to_string()),
            Mop::Read { key, .. } => (list_key(*key), String::new()),
        })
        .collect();
    // Pipelined: the server runs the whole transaction in one turn.
    let mut sent = resp.send(&[b"MULTI"]);
    for (m, (k, v)) in mops.iter().zip(&names) {
        if sent.is_err() {
            break;
        }
        sent = match m {
            Mop::Append { .. } => resp.send(&[b"RPUSH", k.as_bytes(), v.as_bytes()]),
            Mop::Read { .. } => resp.send(&[b"LRANGE", k.as_bytes(), b"0", b"-1"]),
        };
    }
    if let Err(e) = sent.and_then(|_| resp.send(&[b"EXEC"])) {
        return io_outcome(e);
    }
    // MULTI's +OK and each command's +QUEUED (or an error: then EXEC
    // aborts the whole transaction).
    let mut refused = None;
    for _ in 0..=mops.len() {
        match resp.read() {
            Err(e) => return io_outcome(e),
            Ok(Value::Error(e)) => refused = refused.or(Some(e)),
            Ok(_) => {}
        }
    }
    let replies = match resp.read() {
        Err(e) => return io_outcome(e),
        Ok(Value::Array(r)) if r.len() == mops.len() => r,
        Ok(Value::Error(e)) => return Outcome::Fail(refused.unwrap_or(e)),
        Ok(Value::NullArray) => return Outcome::Fail("EXEC aborted".into()),
        Ok(other) => return Outcome::Info(format!("unexpected EXEC reply {other:?}")),
    };
    let mut done = Vec::with_capacity(mops.len());
    for (m, r) in mops.iter().zip(replies) {
        done.push(match (m, r) {
            (Mop::Append { .. }, Value::Int(_)) => m.clone(),
            (Mop::Read { key, .. }, Value::Array(items)) => {
                let mut values = Vec::with_capacity(items.len());
                for item in items {
                    match int_of(&item) {
                        Ok(Some(v)) => values.push(v),
                        _ => return Outcome::Info(format!("a list held {item:?}")),
                    }
                }
                Mop::Read {
                    key: *key,
                    value: Some(values),
                }
            }
            (_, other) => return Outcome::Info(format!("unexpected reply in EXEC: {other:?}")),
        });
    }
    Outcome::Ok(Op::Txn(done))
}

/// An integer from a bulk reply (None: nil).
fn int_of(reply: &Value) -> Result<Option<i64>, String> {
    match reply {
        Value::Null => Ok(None),
        Value::Bulk(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| format!("not an integer: {:?}", String::from_utf8_lossy(b))),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// After the run healed: reads every counter, list-append key and
/// register once through the leader, as process `process`, retrying a refused or
/// unanswered read (as a new process) until `deadline`.
pub fn final_reads(shared: &Shared, mut process: u64, stride: u64, deadline: Instant) {
    let mut ops = Vec::new();
    if shared.workloads.contains(&Workload::Counter) {
        ops.extend((0..COUNTER_KEYS).map(|key| Op::CounterRead { key, value: None }));
    }
    if shared.workloads.contains(&Workload::ListAppend) {
        let used = shared
            .list_keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .used();
        for chunk in used.chunks(16) {
            ops.push(Op::Txn(
                chunk
                    .iter()
                    .map(|&key| Mop::Read { key, value: None })
                    .collect(),
            ));
        }
    }
    if shared.workloads.contains(&Workload::Register) {
        let used = shared
            .register_keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .used();
        ops.extend(used.into_iter().map(|key| Op::Read { key, value: None }));
    }
    for op in ops {
        loop {
            if Instant::now() > deadline {
                return;
            }
            let node = shared
                .target
                .refresh(Duration::from_secs(1))
                .unwrap_or_else(|| shared.target.node());
            let Some((node, mut resp)) = connect(shared, node) else {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            };
            shared
                .recorder
                .record(Kind::Invoke, process, op.clone(), node, None);
            match execute(&mut resp, &op) {
                Outcome::Ok(done) => {
                    shared.recorder.record(Kind::Ok, process, done, node, None);
                    break;
                }
                Outcome::Fail(why) => {
                    shared
                        .recorder
                        .record(Kind::Fail, process, op.clone(), node, Some(why));
                }
                Outcome::Info(why) => {
                    shared
                        .recorder
                        .record(Kind::Info, process, op.clone(), node, Some(why));
                    process += stride;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_keys_retire_after_their_appends_and_values_are_unique() {
        let keys = Keys::new(ACTIVE_LIST_KEYS, APPENDS_PER_KEY);
        let mut k = keys.lock().unwrap();
        let mut rng = Rng::new(7);
        let mut per_key = std::collections::HashMap::new();
        let mut values = std::collections::HashSet::new();
        for _ in 0..1000 {
            let (key, value) = k.append(&mut rng);
            *per_key.entry(key).or_insert(0u32) += 1;
            assert!(values.insert(value), "value {value} twice");
        }
        assert!(
            per_key.values().all(|&n| n <= APPENDS_PER_KEY),
            "{per_key:?}"
        );
        assert!(k.used().len() > 1000 / APPENDS_PER_KEY as usize);
        assert_eq!(k.active.len(), ACTIVE_LIST_KEYS);
    }

    #[test]
    fn workloads_parse_by_name() {
        assert_eq!("list-append".parse(), Ok(Workload::ListAppend));
        assert_eq!("counter".parse(), Ok(Workload::Counter));
        assert!("bank".parse::<Workload>().unwrap_err().contains("register"));
    }
}
