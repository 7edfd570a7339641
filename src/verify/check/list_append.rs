//! The list-append workload (Elle's): transactions of `["append", k, v]` and
//! `["r", k, [..]]` over a few keys, checked for strict serializability.
//!
//! The analysis is the `adya` crate's (a native Rust implementation of
//! Elle, held by its authors to Elle's own expected results and to Elle run
//! live on random histories): it infers each key's version order from the
//! longest read, builds Adya's dependency graph (ww, wr, rw) plus real-time
//! order over committed and possibly-committed transactions, and searches it
//! for cycles; it also reports what needs no graph (aborted and intermediate
//! reads, lost updates, incompatible orders, duplicates). The tests below
//! are the evidence that it bites on each of those, on hand-made histories.
//!
//! This module only translates: our events into adya's history (`fail`
//! completions are aborted transactions; `info` ones and invocations that
//! never completed may or may not have committed, at any time after their
//! invocation), and adya's report into a [`Verdict`]. One check is ours:
//! adya drops its own "appended the same element twice" warning from the
//! report and calls such a history valid, so duplicate appends are caught
//! here first and give `Unknown`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use adya::history::{Interner, Mop as AMop, Op as AOp, OpType, ReadValue, Scalar};

use super::super::history::{Event, Kind, Mop, Op};
use super::{operations, Anomaly, Verdict};

/// The workload's name in verdicts.
pub const WORKLOAD: &str = "list-append";

/// At most this many anomalies of one kind are listed (one more entry says
/// how many were left out).
const MAX_PER_KIND: usize = 10;

/// Kinds adya reports when it cannot decide, rather than a violation.
const UNDECIDED: [&str; 2] = ["empty-transaction-graph", "cycle-search-timeout"];

/// Checks the history's list-append transactions for strict serializability.
pub fn check(events: &[Event]) -> Verdict {
    check_with_timeout(events, Duration::from_secs(5))
}

/// As [`check`], with adya's cycle-search budget per strongly connected
/// component (on running out it reports `cycle-search-timeout` and some
/// cycle it did find).
pub fn check_with_timeout(events: &[Event], timeout: Duration) -> Verdict {
    let is_txn = |op: &Op| matches!(op, Op::Txn(_));
    let ops = operations(events, is_txn);

    if let Some(dup) = duplicate_append(&ops) {
        return Verdict::new(WORKLOAD, &ops, vec![], vec![dup]);
    }

    // Our events in adya's form; an invocation the history never completed
    // gets an `info` completion at the end (adya would otherwise leave it
    // out of the graph entirely).
    let mut interner = Interner::default();
    let mut aops = Vec::new();
    for e in events.iter().filter(|e| is_txn(&e.op)) {
        aops.push(to_adya(e, e.kind, e.index, &mut interner));
    }
    let mut invoke_of: HashMap<u64, u64> = HashMap::new();
    for o in &ops {
        match o.done {
            Some(d) => {
                invoke_of.insert(d.index, o.invoke.index);
            }
            None => aops.push(to_adya(o.invoke, Kind::Info, o.invoke.index, &mut interner)),
        }
    }
    let history = adya::History::from_ops(aops, interner);
    let opts = adya::Opts {
        models: vec!["strict-serializable".into()],
        timeout,
        ..adya::Opts::default()
    };
    let report = adya::check(&history, adya::Workload::ListAppend, &opts);

    let mut definite = Vec::new();
    let mut unknown = Vec::new();
    for (kind, found) in &report.anomalies {
        let undecided = report.valid != adya::Valid::False || UNDECIDED.contains(&kind.as_str());
        let out = if undecided {
            &mut unknown
        } else {
            &mut definite
        };
        for a in found.iter().take(MAX_PER_KIND) {
            let mut events: Vec<u64> = Vec::new();
            for &i in &a.ops {
                events.extend(invoke_of.get(&i));
                events.push(i);
            }
            events.sort_unstable();
            events.dedup();
            let mut explanation = summary(kind);
            if !a.ops.is_empty() {
                explanation.push_str(" (Tn below is the transaction whose completion is event n.)");
            }
            explanation.push('\n');
            explanation.push_str(a.explanation.trim_end());
            out.push(Anomaly {
                kind: kind.clone(),
                explanation,
                events,
            });
        }
        if found.len() > MAX_PER_KIND {
            out.push(Anomaly {
                kind: kind.clone(),
                explanation: format!(
                    "{} more {kind} anomalies are not listed.",
                    found.len() - MAX_PER_KIND
                ),
                events: vec![],
            });
        }
    }
    // adya says unknown without naming why only if something is badly off.
    if report.valid == adya::Valid::Unknown && unknown.is_empty() {
        unknown.push(Anomaly {
            kind: "unknown".into(),
            explanation: "the list-append checker could not decide, and gave no reason".into(),
            events: vec![],
        });
    }
    Verdict::new(WORKLOAD, &ops, definite, unknown)
}

fn to_adya(e: &Event, kind: Kind, index: u64, interner: &mut Interner) -> AOp {
    let Op::Txn(mops) = &e.op else {
        unreachable!("only transactions are converted")
    };
    let mut int = |x: i64| interner.intern(Scalar::Int(x));
    let value = mops
        .iter()
        .map(|m| match m {
            Mop::Append { key, value } => AMop::Append {
                key: int(*key as i64),
                value: int(*value),
            },
            Mop::Read { key, value } => AMop::Read {
                key: int(*key as i64),
                value: match value {
                    None => ReadValue::Nil,
                    Some(vs) => ReadValue::List(vs.iter().map(|v| int(*v)).collect()),
                },
            },
        })
        .collect();
    AOp {
        index,
        kind: match kind {
            Kind::Invoke => OpType::Invoke,
            Kind::Ok => OpType::Ok,
            Kind::Fail => OpType::Fail,
            Kind::Info => OpType::Info,
        },
        process: Some(e.process as i64),
        value,
        time: Some(e.time_ns as i64),
    }
}

/// The inference needs each appended value to be unique per key.
fn duplicate_append(ops: &[super::Operation]) -> Option<Anomaly> {
    let mut seen: HashMap<(u64, i64), &super::Operation> = HashMap::new();
    for o in ops {
        let Op::Txn(mops) = &o.invoke.op else {
            continue;
        };
        let mut mine = HashSet::new();
        for m in mops {
            let Mop::Append { key, value } = m else {
                continue;
            };
            if let Some(first) = seen
                .get(&(*key, *value))
                .filter(|_| !mine.contains(&(*key, *value)))
            {
                let mut events = first.events();
                events.extend(o.events());
                return Some(Anomaly {
                    kind: "duplicate-appends".into(),
                    explanation: format!(
                        "value {value} was appended to key {key} by two operations ({} and {}); the checker \
                         needs every appended value to be unique per key to tell versions apart, so this \
                         history cannot be checked",
                        first.describe(),
                        o.describe()
                    ),
                    events,
                });
            }
            mine.insert((*key, *value));
            seen.insert((*key, *value), o);
        }
    }
    None
}

/// What an anomaly kind means, in words, before adya's step-by-step proof.
fn summary(kind: &str) -> String {
    let (base, variant) = if let Some(b) = kind.strip_suffix("-realtime") {
        (b, " Real-time order is part of it: a transaction missed the effect of one that had already completed before it began (a stale read, or an acknowledged append lost).")
    } else if let Some(b) = kind.strip_suffix("-process") {
        (b, " One client's own order of operations is part of it.")
    } else {
        (kind, "")
    };
    let what = match base {
        "G0" => "write cycle: transactions' appends interleave in an order no one-at-a-time execution produces.",
        "G1a" => "aborted read: a transaction read a value appended by a transaction that failed.",
        "G1b" => "intermediate read: a transaction read a state of a key that another transaction passed through but did not end in.",
        "G1c" => "circular information flow: transactions each saw the other's effects, which no one-at-a-time order allows.",
        "G-single-item" | "G-single" => "read skew: a transaction saw some of another transaction's effects but missed others (a non-atomic transaction, or a read of an older state), so the two cannot be ordered.",
        "G-nonadjacent-item" | "G-nonadjacent" | "G2-item" | "G2" => "anti-dependency cycle: transactions each missed the other's appends (write skew), which no one-at-a-time order allows.",
        "lost-update" => "lost update: transactions read the same state of a key and then appended to it, so one built on a stale read.",
        "incompatible-order" => "incompatible order: reads of a key disagree on the order of its elements, so no single order of appends explains them.",
        "dirty-update" => "dirty update: a committed append was applied on top of the effects of a failed transaction.",
        "duplicate-elements" => "duplicate elements: a read returned an element twice, though each was appended once.",
        "internal" => "internal inconsistency: a transaction's read disagrees with its own earlier reads and appends.",
        "future-read" => "future read: a transaction read an element before appending it itself.",
        "empty-transaction-graph" => "no dependencies between transactions could be inferred, so the history says nothing about their order (too few transactions, or none read what others wrote).",
        "cycle-search-timeout" => "the search for the exact shape of a dependency cycle ran out of time.",
        b if b.ends_with("-cycle-exists") => "a cycle of dependencies exists among these transactions, so the history is not strictly serializable; its exact shape was not searched for.",
        _ => "",
    };
    format!("{kind}: {what}{variant}")
}

#[cfg(test)]
mod tests {
    use super::super::testing::{kinds, H};
    use super::super::Validity;
    use super::*;

    fn app(key: u64, value: i64) -> Mop {
        Mop::Append { key, value }
    }
    fn r(key: u64) -> Mop {
        Mop::Read { key, value: None }
    }
    fn rv(key: u64, vs: &[i64]) -> Mop {
        Mop::Read {
            key,
            value: Some(vs.to_vec()),
        }
    }

    /// A transaction invoked and completed at once: `inv` the invocation's
    /// micro-ops, `done` the completion's.
    fn txn(h: &mut H, p: u64, kind: Kind, inv: Vec<Mop>, done: Vec<Mop>) {
        h.invoke(p, Op::Txn(inv));
        h.push(kind, p, Op::Txn(done));
    }

    fn assert_invalid(h: &H, want: &str) -> Verdict {
        let v = check(&h.events);
        assert_eq!(v.valid, Validity::Invalid, "{v:#?}");
        assert!(
            kinds(&v).iter().any(|k| k.starts_with(want)),
            "want {want}, got {:?}",
            kinds(&v)
        );
        v
    }

    #[test]
    fn valid_concurrent_history_with_failed_and_unknown_transactions_passes() {
        let mut h = H::default();
        // p0 and p1 overlap; p1's append commits inside p0's window.
        h.invoke(0, Op::Txn(vec![app(1, 1), r(2)]));
        h.invoke(1, Op::Txn(vec![app(2, 1)]));
        h.ok(1, Op::Txn(vec![app(2, 1)]));
        h.ok(0, Op::Txn(vec![app(1, 1), rv(2, &[])]));
        // A failed append, never seen.
        txn(&mut h, 2, Kind::Fail, vec![app(1, 9)], vec![app(1, 9)]);
        // Unknown outcome that did take effect (seen later)…
        txn(&mut h, 3, Kind::Info, vec![app(1, 2)], vec![app(1, 2)]);
        // …and one that did not (never seen), plus one never completed.
        txn(&mut h, 4, Kind::Info, vec![app(2, 7)], vec![app(2, 7)]);
        h.invoke(5, Op::Txn(vec![app(1, 8)]));
        txn(
            &mut h,
            6,
            Kind::Ok,
            vec![r(1), r(2), app(2, 2)],
            vec![rv(1, &[1, 2]), rv(2, &[1]), app(2, 2)],
        );
        txn(&mut h, 6, Kind::Ok, vec![r(2)], vec![rv(2, &[1, 2])]);
        let v = check(&h.events);
        assert_eq!(v.valid, Validity::Valid, "{v:#?}");
        assert_eq!((v.ok, v.fail, v.info), (4, 1, 3));
    }

    #[test]
    fn lost_append_is_rejected() {
        // An acknowledged append missing from a read that began after it.
        let mut h = H::default();
        txn(&mut h, 0, Kind::Ok, vec![app(1, 1)], vec![app(1, 1)]);
        txn(&mut h, 1, Kind::Ok, vec![app(1, 2)], vec![app(1, 2)]);
        txn(&mut h, 0, Kind::Ok, vec![r(1)], vec![rv(1, &[2])]);
        let v = assert_invalid(&h, "G-single-item-realtime");
        let a = v
            .anomalies
            .iter()
            .find(|a| a.kind.ends_with("-realtime"))
            .unwrap();
        assert!(
            a.explanation.contains("Real-time order"),
            "{}",
            a.explanation
        );
        assert!(a.events.contains(&1) && a.events.contains(&5), "{a:?}");
    }

    #[test]
    fn stale_read_is_rejected() {
        // The read begins after the second append completed, yet sees only the first.
        let mut h = H::default();
        txn(&mut h, 0, Kind::Ok, vec![app(1, 1)], vec![app(1, 1)]);
        txn(&mut h, 0, Kind::Ok, vec![app(1, 2)], vec![app(1, 2)]);
        txn(&mut h, 1, Kind::Ok, vec![r(1)], vec![rv(1, &[1, 2])]);
        txn(&mut h, 2, Kind::Ok, vec![r(1)], vec![rv(1, &[1])]);
        assert_invalid(&h, "G-single-item-realtime");
    }

    #[test]
    fn non_atomic_transaction_is_rejected() {
        // p1 reads p0's append to key 1 but not its append to key 2.
        let mut h = H::default();
        h.invoke(0, Op::Txn(vec![app(1, 1), app(2, 1)]));
        h.invoke(1, Op::Txn(vec![r(1), r(2)]));
        h.ok(1, Op::Txn(vec![rv(1, &[1]), rv(2, &[])]));
        h.ok(0, Op::Txn(vec![app(1, 1), app(2, 1)]));
        let v = assert_invalid(&h, "G-single-item");
        assert!(
            v.anomalies[0].explanation.contains("read skew"),
            "{:?}",
            v.anomalies[0]
        );
    }

    #[test]
    fn aborted_read_is_rejected() {
        let mut h = H::default();
        txn(&mut h, 0, Kind::Fail, vec![app(1, 1)], vec![app(1, 1)]);
        txn(&mut h, 1, Kind::Ok, vec![r(1)], vec![rv(1, &[1])]);
        assert_invalid(&h, "G1a");
    }

    #[test]
    fn intermediate_read_is_rejected() {
        let mut h = H::default();
        h.invoke(0, Op::Txn(vec![app(1, 1), app(1, 2)]));
        txn(&mut h, 1, Kind::Ok, vec![r(1)], vec![rv(1, &[1])]);
        h.ok(0, Op::Txn(vec![app(1, 1), app(1, 2)]));
        assert_invalid(&h, "G1b");
    }

    #[test]
    fn circular_information_flow_is_rejected() {
        let mut h = H::default();
        h.invoke(0, Op::Txn(vec![app(1, 1), r(2)]));
        h.invoke(1, Op::Txn(vec![app(2, 1), r(1)]));
        h.ok(0, Op::Txn(vec![app(1, 1), rv(2, &[1])]));
        h.ok(1, Op::Txn(vec![app(2, 1), rv(1, &[1])]));
        assert_invalid(&h, "G1c");
    }

    #[test]
    fn write_skew_is_rejected() {
        let mut h = H::default();
        h.invoke(0, Op::Txn(vec![r(1), r(2), app(1, 1)]));
        h.invoke(1, Op::Txn(vec![r(1), r(2), app(2, 1)]));
        h.ok(0, Op::Txn(vec![rv(1, &[]), rv(2, &[]), app(1, 1)]));
        h.ok(1, Op::Txn(vec![rv(1, &[]), rv(2, &[]), app(2, 1)]));
        // Later reads pin the version order.
        txn(
            &mut h,
            2,
            Kind::Ok,
            vec![r(1), r(2)],
            vec![rv(1, &[1]), rv(2, &[1])],
        );
        assert_invalid(&h, "G2-item");
    }

    #[test]
    fn lost_update_is_rejected() {
        let mut h = H::default();
        h.invoke(0, Op::Txn(vec![r(1), app(1, 1)]));
        h.invoke(1, Op::Txn(vec![r(1), app(1, 2)]));
        h.ok(0, Op::Txn(vec![rv(1, &[]), app(1, 1)]));
        h.ok(1, Op::Txn(vec![rv(1, &[]), app(1, 2)]));
        txn(&mut h, 2, Kind::Ok, vec![r(1)], vec![rv(1, &[1, 2])]);
        assert_invalid(&h, "lost-update");
    }

    #[test]
    fn incompatible_orders_are_rejected() {
        let mut h = H::default();
        h.invoke(0, Op::Txn(vec![app(1, 1)]));
        h.invoke(1, Op::Txn(vec![app(1, 2)]));
        h.ok(0, Op::Txn(vec![app(1, 1)]));
        h.ok(1, Op::Txn(vec![app(1, 2)]));
        txn(&mut h, 2, Kind::Ok, vec![r(1)], vec![rv(1, &[1, 2])]);
        txn(&mut h, 3, Kind::Ok, vec![r(1)], vec![rv(1, &[2, 1])]);
        assert_invalid(&h, "incompatible-order");
    }

    #[test]
    fn unknown_append_seen_out_of_real_time_order_is_rejected() {
        // An info append may take effect late, but not before its invocation:
        // a read that completed before it was invoked cannot see it.
        let mut h = H::default();
        txn(&mut h, 0, Kind::Ok, vec![app(1, 1)], vec![app(1, 1)]);
        txn(&mut h, 1, Kind::Ok, vec![r(1)], vec![rv(1, &[1, 2])]);
        txn(&mut h, 2, Kind::Info, vec![app(1, 2)], vec![app(1, 2)]);
        let v = check(&h.events);
        assert_eq!(v.valid, Validity::Invalid, "{v:#?}");
    }

    #[test]
    fn duplicate_appends_are_unknown_not_valid() {
        let mut h = H::default();
        txn(&mut h, 0, Kind::Ok, vec![app(1, 1)], vec![app(1, 1)]);
        txn(&mut h, 1, Kind::Ok, vec![app(1, 1)], vec![app(1, 1)]);
        let v = check(&h.events);
        assert_eq!(v.valid, Validity::Unknown, "{v:#?}");
        assert_eq!(kinds(&v), ["duplicate-appends"]);
        assert_eq!(v.anomalies[0].events, [0, 1, 2, 3]);
    }

    #[test]
    fn adya_alone_calls_duplicate_appends_valid() {
        // Why `duplicate_append` exists: adya flags the history as
        // unanalyzable internally, then filters that out of its report.
        let h = adya::History::from_json(
            r#"{"index":0,"type":"invoke","process":0,"value":[["append",1,1]]}
{"index":1,"type":"ok","process":0,"value":[["append",1,1]]}
{"index":2,"type":"invoke","process":1,"value":[["append",1,1]]}
{"index":3,"type":"ok","process":1,"value":[["append",1,1]]}"#,
        )
        .unwrap();
        let r = adya::check(&h, adya::Workload::ListAppend, &adya::Opts::default());
        assert_eq!(
            r.valid,
            adya::Valid::True,
            "if this fails, adya fixed it: {r:?}"
        );
    }

    /// A valid history of `n` events: concurrent clients whose transactions
    /// take effect atomically at some moment between invocation and
    /// completion; some fail (no effect), some end unknown (effect or not).
    /// Keys retire after 40 appends, as Elle's generator does, so reads stay
    /// short.
    fn generated(n: usize, seed: u64) -> Vec<Event> {
        #[derive(Clone)]
        enum St {
            Idle,
            Open(Vec<Mop>),
            Applied(Vec<Mop>, Vec<Mop>),
        }
        let mut rng = lockstep_launcher::rng::Rng::from_state(seed);
        let mut h = H::default();
        let mut lists: HashMap<u64, Vec<i64>> = HashMap::new();
        let (mut next_key, mut next_value) = (0u64, 0i64);
        let mut active: Vec<u64> = (0..4).collect();
        next_key += 4;
        let mut procs: Vec<(u64, St)> = (0..8).map(|p| (p, St::Idle)).collect();
        let mut next_proc = 8;
        while h.events.len() < n {
            let slot = rng.below(procs.len() as u64) as usize;
            let (p, st) = procs[slot].clone();
            match st {
                St::Idle => {
                    let mops: Vec<Mop> = (0..1 + rng.below(4))
                        .map(|_| {
                            let key = active[rng.below(active.len() as u64) as usize];
                            if rng.below(2) == 0 {
                                next_value += 1;
                                app(key, next_value)
                            } else {
                                r(key)
                            }
                        })
                        .collect();
                    h.invoke(p, Op::Txn(mops.clone()));
                    procs[slot].1 = St::Open(mops);
                }
                St::Open(mops) => match rng.below(10) {
                    0 => {
                        h.fail(p, Op::Txn(mops));
                        procs[slot].1 = St::Idle;
                    }
                    1 => {
                        h.info(p, Op::Txn(mops));
                        procs[slot] = (next_proc, St::Idle);
                        next_proc += 1;
                    }
                    _ => {
                        let done = mops
                            .iter()
                            .map(|m| match m {
                                Mop::Append { key, value } => {
                                    let l = lists.entry(*key).or_default();
                                    l.push(*value);
                                    if l.len() >= 40 {
                                        active.retain(|k| k != key);
                                        active.push(next_key);
                                        next_key += 1;
                                    }
                                    m.clone()
                                }
                                Mop::Read { key, .. } => {
                                    rv(*key, lists.get(key).map_or(&[][..], |l| l))
                                }
                            })
                            .collect();
                        procs[slot].1 = St::Applied(mops, done);
                    }
                },
                St::Applied(inv, done) => {
                    if rng.below(20) == 0 {
                        // Took effect, but the client never heard back.
                        h.info(p, Op::Txn(inv));
                        procs[slot] = (next_proc, St::Idle);
                        next_proc += 1;
                    } else {
                        h.ok(p, Op::Txn(done));
                        procs[slot].1 = St::Idle;
                    }
                }
            }
        }
        h.events
    }

    #[test]
    fn twenty_thousand_generated_events_check_valid() {
        let events = generated(20_000, 41);
        let v = check(&events);
        assert_eq!(
            v.valid,
            Validity::Valid,
            "{:#?}",
            &v.anomalies[..v.anomalies.len().min(3)]
        );
        assert!(v.ok > 5_000 && v.fail > 0 && v.info > 0, "{v:?}");
    }

    #[test]
    fn generated_history_with_one_dropped_append_is_rejected() {
        // The same kind of history, with an acknowledged append erased from
        // every later read: the checker must notice in a large history too.
        let mut events = generated(4_000, 7);
        let victim = events
            .iter()
            .filter(|e| e.kind == Kind::Ok)
            .find_map(|e| match &e.op {
                Op::Txn(m) => m.iter().find_map(|m| match m {
                    Mop::Append { key, value } => Some((e.index, *key, *value)),
                    _ => None,
                }),
                _ => None,
            })
            .unwrap();
        let mut erased = 0;
        for e in events
            .iter_mut()
            .filter(|e| e.index > victim.0 + 50 && e.kind == Kind::Ok)
        {
            if let Op::Txn(mops) = &mut e.op {
                for m in mops {
                    if let Mop::Read {
                        key,
                        value: Some(vs),
                    } = m
                    {
                        if *key == victim.1 && vs.contains(&victim.2) {
                            vs.retain(|v| *v != victim.2);
                            erased += 1;
                        }
                    }
                }
            }
        }
        assert!(erased > 0);
        let v = check(&events);
        assert_eq!(v.valid, Validity::Invalid, "{v:#?}");
    }
}
