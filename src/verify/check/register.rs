//! The register workload: `SET` (write), `GET` (read) and compare-and-set
//! on independent keys, checked per key for linearizability.
//!
//! Written here rather than taken from `todc-utils` (0.1.1, whose
//! `WGLChecker` implements the same Wing–Gong–Lowe search): its `History`
//! panics on an operation without a response, so it has no notion of an
//! operation that may or may not have taken effect (our `info`); its search
//! has no step budget, so a hard history hangs the run instead of giving
//! `Unknown`; and it answers only true or false, with nothing to say which
//! operation could not be placed. The search below is the same algorithm
//! (Lowe's memoized variant, as Horn and Kroening describe it) with those
//! three added: an `info` write or CAS has its completion at +infinity and
//! need not be linearized at all; every run stops after a budget of steps;
//! and a failure names the operation the search got stuck on.
//!
//! Operations: an `ok` read returned its value (`None`: nil); an `ok` write
//! or CAS took effect; a `fail` did not happen (a CAS whose `from` did not
//! match is recorded `fail` by the client); an `info` read tells nothing and
//! is dropped. The register starts nil.

use std::collections::{BTreeMap, HashSet};

use super::super::history::{Event, Kind, Op};
use super::{operations, Anomaly, Operation, Verdict};

/// The workload's name in verdicts.
pub const WORKLOAD: &str = "register";

/// Search steps allowed per key before the verdict is `Unknown`. A step is
/// one attempt to place or un-place an operation; histories of a few
/// thousand operations per key with modest concurrency need far fewer.
pub const DEFAULT_BUDGET: u64 = 5_000_000;

/// Checks each key's register operations for linearizability.
pub fn check(events: &[Event]) -> Verdict {
    check_with_budget(events, DEFAULT_BUDGET)
}

/// As [`check`], with the step budget per key.
pub fn check_with_budget(events: &[Event], budget: u64) -> Verdict {
    let ops = operations(events, |op| {
        matches!(op, Op::Read { .. } | Op::Write { .. } | Op::Cas { .. })
    });
    let mut by_key: BTreeMap<u64, Vec<Operation>> = BTreeMap::new();
    for o in &ops {
        by_key.entry(key_of(o.invoke)).or_default().push(*o);
    }
    let (mut definite, mut unknown) = (Vec::new(), Vec::new());
    for (key, kops) in by_key {
        let items = items(&kops);
        match search(&items, budget) {
            Outcome::Linearizable => {}
            Outcome::Stuck(s) => definite.push(explain(key, &items, &s)),
            Outcome::OutOfBudget => unknown.push(Anomaly {
                kind: "search-budget-exhausted".into(),
                explanation: format!(
                    "on key {key}, the linearizability search gave up after {budget} steps over {} operations \
                     without deciding; shorter runs per key (more keys) keep the search small",
                    items.len()
                ),
                events: vec![],
            }),
        }
    }
    Verdict::new(WORKLOAD, &ops, definite, unknown)
}

fn key_of(e: &Event) -> u64 {
    match e.op {
        Op::Read { key, .. } | Op::Write { key, .. } | Op::Cas { key, .. } => key,
        _ => unreachable!("only register operations are selected"),
    }
}

/// A register operation as the search sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ROp {
    Read(Option<i64>),
    Write(i64),
    Cas { from: i64, to: i64 },
}

impl ROp {
    /// The state after applying it to `state`, or None if it cannot happen
    /// there (a read of another value, a CAS whose `from` does not match).
    fn apply(self, state: Option<i64>) -> Option<Option<i64>> {
        match self {
            ROp::Read(v) => (v == state).then_some(state),
            ROp::Write(v) => Some(Some(v)),
            ROp::Cas { from, to } => (state == Some(from)).then_some(Some(to)),
        }
    }

    /// The value it leaves in the register, if it writes.
    fn writes(self) -> Option<i64> {
        match self {
            ROp::Read(_) => None,
            ROp::Write(v) | ROp::Cas { to: v, .. } => Some(v),
        }
    }
}

struct Item<'a> {
    op: ROp,
    /// `info` (or never completed): may have taken effect at any time after
    /// its invocation, or never.
    pending: bool,
    o: Operation<'a>,
}

impl Item<'_> {
    fn invoked(&self) -> u64 {
        self.o.invoke.index
    }
    /// When it completed; +infinity for a pending one.
    fn completed(&self) -> u64 {
        if self.pending {
            u64::MAX
        } else {
            self.o.done.map_or(u64::MAX, |d| d.index)
        }
    }
}

/// The operations of one key the search must account for.
fn items<'a>(kops: &[Operation<'a>]) -> Vec<Item<'a>> {
    let mut out = Vec::new();
    for o in kops {
        let pending = match o.kind() {
            Kind::Ok => false,
            Kind::Info => true,
            Kind::Fail | Kind::Invoke => continue,
        };
        let op = match *o.op() {
            Op::Read { value, .. } if !pending => ROp::Read(value),
            Op::Read { .. } => continue,
            Op::Write { value, .. } => ROp::Write(value),
            Op::Cas { from, to, .. } => ROp::Cas { from, to },
            _ => continue,
        };
        out.push(Item { op, pending, o: *o });
    }
    out
}

/// Where the search got furthest before failing.
struct Stuck {
    /// The operation whose completion came with no way to place it.
    blocked: usize,
    /// The register's value at that point, and the operation that wrote it.
    state: Option<i64>,
    writer: Option<usize>,
    /// How many operations were placed before it.
    placed: usize,
}

enum Outcome {
    Linearizable,
    Stuck(Stuck),
    OutOfBudget,
}

const NIL: usize = usize::MAX;
const HEAD: usize = 0;

/// The Wing–Gong–Lowe search. Entries (calls and returns, in history
/// order; pending returns last) form a doubly linked list; placing an
/// operation unlinks its call and return, backtracking relinks them.
/// `(placed set, state)` pairs already explored are never explored again.
fn search(items: &[Item], budget: u64) -> Outcome {
    let n = items.len();
    if n == 0 {
        return Outcome::Linearizable;
    }
    // Entry 0 is the head; entry 1 + 2i is item i's call, 2 + 2i its return.
    let mut order: Vec<(u64, usize)> = Vec::with_capacity(2 * n);
    for (i, it) in items.iter().enumerate() {
        order.push((it.invoked(), 1 + 2 * i));
        order.push((it.completed(), 2 + 2 * i));
    }
    order.sort_unstable();
    let mut next = vec![NIL; 2 * n + 1];
    let mut prev = vec![NIL; 2 * n + 1];
    let mut last = HEAD;
    for &(_, e) in &order {
        next[last] = e;
        prev[e] = last;
        last = e;
    }
    let is_call = |e: usize| e % 2 == 1;
    let item_of = |e: usize| (e - 1) / 2;
    let unlink = |e: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        next[prev[e]] = next[e];
        if next[e] != NIL {
            prev[next[e]] = prev[e];
        }
    };
    let relink = |e: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        next[prev[e]] = e;
        if next[e] != NIL {
            prev[next[e]] = e;
        }
    };

    let must_place = items.iter().filter(|it| !it.pending).count();
    let mut placed_done = 0;
    let mut placed = vec![0u64; n.div_ceil(64)];
    let mut seen: HashSet<(Vec<u64>, Option<i64>)> = HashSet::new();
    // (call entry, state before it)
    let mut stack: Vec<(usize, Option<i64>)> = Vec::new();
    let mut state: Option<i64> = None;
    let mut entry = next[HEAD];
    let mut best: Option<Stuck> = None;
    let mut steps = 0u64;
    loop {
        if placed_done == must_place {
            return Outcome::Linearizable;
        }
        steps += 1;
        if steps > budget {
            return Outcome::OutOfBudget;
        }
        if entry != NIL && is_call(entry) {
            let i = item_of(entry);
            if let Some(after) = items[i].op.apply(state) {
                placed[i / 64] |= 1 << (i % 64);
                if seen.insert((placed.clone(), after)) {
                    stack.push((entry, state));
                    state = after;
                    placed_done += usize::from(!items[i].pending);
                    unlink(entry, &mut next, &mut prev);
                    unlink(entry + 1, &mut next, &mut prev);
                    entry = next[HEAD];
                    continue;
                }
                placed[i / 64] &= !(1 << (i % 64));
            }
            entry = next[entry];
            continue;
        }
        // A return (or the end): its operation was not placed before it
        // completed. Remember the deepest such point, then backtrack.
        if entry != NIL && best.as_ref().is_none_or(|b| stack.len() > b.placed) {
            let writer = stack
                .iter()
                .rev()
                .map(|&(e, _)| item_of(e))
                .find(|&j| items[j].op.writes().is_some());
            best = Some(Stuck {
                blocked: item_of(entry),
                state,
                writer,
                placed: stack.len(),
            });
        }
        let Some((e, before)) = stack.pop() else {
            // Every failing search meets a return first (the list ends with
            // returns), so `best` is set; were it not, say so rather than panic.
            return best.map_or(Outcome::OutOfBudget, Outcome::Stuck);
        };
        let i = item_of(e);
        state = before;
        placed[i / 64] &= !(1 << (i % 64));
        placed_done -= usize::from(!items[i].pending);
        relink(e + 1, &mut next, &mut prev);
        relink(e, &mut next, &mut prev);
        entry = next[e];
    }
}

fn show(v: Option<i64>) -> String {
    v.map_or_else(|| "nil".into(), |v| v.to_string())
}

/// An anomaly from where the search got stuck, named as precisely as the
/// history allows: a `stale-read` (the value read had certainly been
/// overwritten before the read began), an `impossible-read` (no operation
/// wrote that value), or else `not-linearizable`.
fn explain(key: u64, items: &[Item], s: &Stuck) -> Anomaly {
    let b = &items[s.blocked];
    let mut events = b.o.events();
    let add = |it: &Item, events: &mut Vec<u64>| events.extend(it.o.events());
    let writer_text = match s.writer {
        Some(w) => format!(" (last written by {})", items[w].o.describe()),
        None => " (its initial value)".into(),
    };
    let furthest = format!(
        "The search for an order got furthest by placing {} operation(s) first, leaving the register at {}{}, \
         and then found no way to place {} before it completed.",
        s.placed,
        show(s.state),
        writer_text,
        b.o.describe()
    );
    if let Some(w) = s.writer {
        add(&items[w], &mut events);
    }
    let mut kind = "not-linearizable";
    let mut lead = format!(
        "on key {key}, no single order of the operations agrees both with real time (an operation that \
         completed before another began comes first) and with what each returned."
    );
    if let ROp::Read(v) = b.op {
        let writes_v: Vec<&Item> = items
            .iter()
            .filter(|it| it.op.writes().is_some() && it.op.writes() == v)
            .collect();
        let newer = items
            .iter()
            .filter(|w| w.op.writes().is_some_and(|x| Some(x) != v) && !w.pending)
            .find(|w| {
                w.completed() < b.invoked()
                    && writes_v.iter().all(|wv| wv.completed() < w.invoked())
            });
        if v.is_some() && writes_v.is_empty() {
            kind = "impossible-read";
            lead = format!(
                "on key {key}, {}: {} is a value no operation wrote (neither an acknowledged one nor one \
                 whose outcome is unknown).",
                b.o.describe(),
                show(v)
            );
        } else if let Some(w) = newer {
            kind = "stale-read";
            add(w, &mut events);
            let source = match writes_v.iter().max_by_key(|wv| wv.completed()) {
                Some(wv) => {
                    add(wv, &mut events);
                    format!("it was written by {}, which", wv.o.describe())
                }
                None => "that was the initial value, which".into(),
            };
            lead = format!(
                "on key {key}, {}: {} is an overwritten value: {source} was superseded by {}, completed \
                 before the read began.",
                b.o.describe(),
                show(v),
                w.o.describe()
            );
        }
    }
    events.sort_unstable();
    events.dedup();
    Anomaly {
        kind: kind.into(),
        explanation: format!("{kind}: {lead} {furthest}"),
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{kinds, H};
    use super::super::Validity;
    use super::*;

    fn read(key: u64, value: Option<i64>) -> Op {
        Op::Read { key, value }
    }
    fn write(key: u64, value: i64) -> Op {
        Op::Write { key, value }
    }
    fn cas(key: u64, from: i64, to: i64) -> Op {
        Op::Cas { key, from, to }
    }

    /// Invokes and completes at once.
    fn op(h: &mut H, p: u64, kind: Kind, invoke: Op, done: Op) {
        h.invoke(p, invoke);
        h.push(kind, p, done);
    }

    fn verdict(h: &H) -> Verdict {
        check(&h.events)
    }

    #[test]
    fn sequential_and_concurrent_valid_histories_pass() {
        let mut h = H::default();
        op(&mut h, 0, Kind::Ok, read(1, None), read(1, None));
        op(&mut h, 0, Kind::Ok, write(1, 1), write(1, 1));
        // Two concurrent writes, reads during them see either order.
        h.invoke(0, write(1, 2));
        h.invoke(1, write(1, 3));
        op(&mut h, 2, Kind::Ok, read(1, None), read(1, Some(3)));
        op(&mut h, 2, Kind::Ok, read(1, None), read(1, Some(2)));
        h.ok(0, write(1, 2));
        h.ok(1, write(1, 3));
        op(&mut h, 2, Kind::Ok, read(1, None), read(1, Some(2)));
        op(&mut h, 3, Kind::Ok, cas(1, 2, 4), cas(1, 2, 4));
        // A CAS whose `from` did not match failed: no effect.
        op(&mut h, 3, Kind::Fail, cas(1, 9, 5), cas(1, 9, 5));
        op(&mut h, 2, Kind::Ok, read(1, None), read(1, Some(4)));
        let v = verdict(&h);
        assert_eq!(v.valid, Validity::Valid, "{v:#?}");
        assert_eq!((v.ok, v.fail, v.info), (9, 1, 0));
    }

    #[test]
    fn unknown_writes_may_or_may_not_take_effect() {
        let mut h = H::default();
        op(&mut h, 0, Kind::Ok, write(1, 1), write(1, 1));
        // Took effect: seen later, long after the client gave up.
        op(&mut h, 1, Kind::Info, write(1, 2), write(1, 2));
        op(&mut h, 0, Kind::Ok, read(1, None), read(1, Some(1)));
        op(&mut h, 0, Kind::Ok, read(1, None), read(1, Some(2)));
        // Never took effect.
        op(&mut h, 2, Kind::Info, write(1, 3), write(1, 3));
        op(&mut h, 3, Kind::Info, cas(1, 7, 8), cas(1, 7, 8));
        h.invoke(4, write(1, 9));
        op(&mut h, 0, Kind::Ok, read(1, None), read(1, Some(2)));
        // An unknown read tells nothing.
        op(&mut h, 5, Kind::Info, read(1, None), read(1, None));
        // An unknown CAS that did take effect.
        op(&mut h, 6, Kind::Info, cas(1, 2, 10), cas(1, 2, 10));
        op(&mut h, 0, Kind::Ok, read(1, None), read(1, Some(10)));
        let v = verdict(&h);
        assert_eq!(v.valid, Validity::Valid, "{v:#?}");
        assert_eq!((v.ok, v.fail, v.info), (5, 0, 6));
    }

    #[test]
    fn stale_read_is_rejected() {
        let mut h = H::default();
        op(&mut h, 0, Kind::Ok, write(1, 1), write(1, 1));
        op(&mut h, 0, Kind::Ok, write(1, 2), write(1, 2));
        op(&mut h, 1, Kind::Ok, read(1, None), read(1, Some(1)));
        let v = verdict(&h);
        assert_eq!(v.valid, Validity::Invalid, "{v:#?}");
        assert_eq!(kinds(&v), ["stale-read"]);
        let a = &v.anomalies[0];
        assert!(
            a.explanation.contains("operation 4") && a.explanation.contains("returned 1"),
            "{}",
            a.explanation
        );
        assert!(
            a.explanation
                .contains("operation 2 (process 0, events 2–3, ok): write of 2"),
            "{}",
            a.explanation
        );
        assert_eq!(a.events, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn read_of_initial_value_after_a_write_is_stale() {
        let mut h = H::default();
        op(&mut h, 0, Kind::Ok, write(1, 1), write(1, 1));
        op(&mut h, 1, Kind::Ok, read(1, None), read(1, None));
        assert_eq!(kinds(&verdict(&h)), ["stale-read"]);
    }

    #[test]
    fn sequentially_consistent_but_not_linearizable_is_rejected() {
        // A write overlaps two reads; the first read sees it, the later one
        // (begun after the first completed) does not: the write cannot be
        // both before and after.
        let mut h = H::default();
        h.invoke(0, write(1, 1));
        op(&mut h, 1, Kind::Ok, read(1, None), read(1, Some(1)));
        op(&mut h, 2, Kind::Ok, read(1, None), read(1, None));
        h.ok(0, write(1, 1));
        let v = verdict(&h);
        assert_eq!(v.valid, Validity::Invalid, "{v:#?}");
        assert_eq!(kinds(&v), ["not-linearizable"]);
    }

    #[test]
    fn read_of_a_failed_write_is_rejected() {
        let mut h = H::default();
        op(&mut h, 0, Kind::Fail, write(1, 1), write(1, 1));
        op(&mut h, 1, Kind::Ok, read(1, None), read(1, Some(1)));
        assert_eq!(kinds(&verdict(&h)), ["impossible-read"]);
        // A CAS that failed did not happen either.
        let mut h = H::default();
        op(&mut h, 0, Kind::Ok, write(1, 1), write(1, 1));
        op(&mut h, 0, Kind::Fail, cas(1, 1, 2), cas(1, 1, 2));
        op(&mut h, 1, Kind::Ok, read(1, None), read(1, Some(2)));
        assert_eq!(kinds(&verdict(&h)), ["impossible-read"]);
    }

    #[test]
    fn acknowledged_cas_from_a_value_never_held_is_rejected() {
        let mut h = H::default();
        op(&mut h, 0, Kind::Ok, write(1, 1), write(1, 1));
        op(&mut h, 0, Kind::Ok, cas(1, 5, 6), cas(1, 5, 6));
        assert_eq!(kinds(&verdict(&h)), ["not-linearizable"]);
    }

    #[test]
    fn keys_are_independent() {
        let mut h = H::default();
        op(&mut h, 0, Kind::Ok, write(1, 1), write(1, 1));
        op(&mut h, 0, Kind::Ok, write(2, 1), write(2, 1));
        op(&mut h, 0, Kind::Ok, write(2, 2), write(2, 2));
        op(&mut h, 1, Kind::Ok, read(1, None), read(1, Some(1)));
        op(&mut h, 1, Kind::Ok, read(2, None), read(2, Some(1)));
        let v = verdict(&h);
        assert_eq!(kinds(&v), ["stale-read"]);
        assert!(
            v.anomalies[0].explanation.contains("on key 2"),
            "{}",
            v.anomalies[0].explanation
        );
    }

    #[test]
    fn a_search_over_budget_is_unknown_not_valid() {
        let mut h = H::default();
        for p in 0..6 {
            h.invoke(p, write(1, p as i64));
        }
        for p in 0..6 {
            h.ok(p, write(1, p as i64));
        }
        op(&mut h, 9, Kind::Ok, read(1, None), read(1, Some(3)));
        assert_eq!(verdict(&h).valid, Validity::Valid);
        let v = check_with_budget(&h.events, 3);
        assert_eq!(v.valid, Validity::Unknown, "{v:#?}");
        assert_eq!(kinds(&v), ["search-budget-exhausted"]);
    }

    /// 8 clients over 3 keys, each read/write/CAS taking effect at a random
    /// moment inside its window (some then end unknown): `n` events.
    fn generated(n: usize) -> Vec<Event> {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut h = H::default();
        let mut regs: BTreeMap<u64, Option<i64>> = BTreeMap::new();
        // Per client slot: its process id, and its open operation with the
        // completion decided when it took effect.
        let mut procs: Vec<u64> = (0..8).collect();
        type Open = Option<(Op, Option<(Kind, Op)>)>;
        let mut open: Vec<Open> = vec![None; 8];
        let mut value = 0;
        while h.events.len() < n {
            let slot = rnd(8) as usize;
            let p = procs[slot];
            match open[slot].take() {
                None => {
                    let key = rnd(3);
                    value += 1;
                    let held = regs.get(&key).copied().flatten().unwrap_or(0);
                    let inv = match rnd(3) {
                        0 => read(key, None),
                        1 => write(key, value),
                        _ => cas(key, if rnd(2) == 0 { held } else { held - 1 }, value),
                    };
                    h.invoke(p, inv.clone());
                    open[slot] = Some((inv, None));
                }
                Some((inv, None)) => {
                    let done = match inv {
                        Op::Read { key, .. } => {
                            (Kind::Ok, read(key, regs.get(&key).copied().flatten()))
                        }
                        Op::Write { key, value } => {
                            regs.insert(key, Some(value));
                            (Kind::Ok, inv.clone())
                        }
                        Op::Cas { key, from, to } => {
                            let r = regs.entry(key).or_default();
                            if *r == Some(from) {
                                *r = Some(to);
                                (Kind::Ok, inv.clone())
                            } else {
                                (Kind::Fail, inv.clone())
                            }
                        }
                        _ => unreachable!(),
                    };
                    open[slot] = Some((inv, Some(done)));
                }
                Some((inv, Some((kind, done)))) => {
                    if kind == Kind::Ok && rnd(30) == 0 {
                        h.info(p, inv);
                        procs[slot] += 8;
                    } else {
                        h.push(kind, p, done);
                    }
                }
            }
        }
        h.events
    }

    #[test]
    fn long_concurrent_history_checks_quickly() {
        let v = check(&generated(12_000));
        assert_eq!(v.valid, Validity::Valid, "{v:#?}");
        assert!(v.ok > 3_000 && v.fail > 100 && v.info > 10, "{v:?}");
    }

    #[test]
    fn one_stale_read_in_a_long_history_is_found() {
        let mut events = generated(6_000);
        let first = events
            .iter()
            .find_map(|e| match e.op {
                Op::Write { key: 0, value } if e.kind == Kind::Ok => Some(value),
                _ => None,
            })
            .unwrap();
        let late = events
            .iter_mut()
            .rev()
            .find(|e| e.kind == Kind::Ok && matches!(e.op, Op::Read { key: 0, .. }))
            .unwrap();
        late.op = read(0, Some(first));
        let at = late.index;
        let v = check(&events);
        assert_eq!(kinds(&v), ["stale-read"], "{v:#?}");
        assert!(v.anomalies[0].events.contains(&at));
    }
}
