//! The checkers of `lockstep verify`: pure functions from a recorded history
//! (`super::history`) to a verdict per workload, each anomaly explained in
//! words that name the operations by their event index and what they
//! returned.
//!
//! * [`list_append`]: Elle-style list-append transactions, checked for
//!   strict serializability (through the `adya` crate);
//! * [`register`]: single registers (`SET`/`GET`/CAS), checked per key for
//!   linearizability (a Wing–Gong–Lowe search written here);
//! * [`counter`]: `INCR`s checked for exactly-once against a final read.
//!
//! Completions mean what `super::history` says: `ok` happened, `fail`
//! certainly did not, `info` may or may not have (and may have taken effect
//! at any time after its invocation). An invocation with no completion at
//! all (the run ended first) is treated as `info`.

pub mod counter;
pub mod list_append;
pub mod register;

use std::collections::HashMap;

use serde::Serialize;

use super::history::{Event, Kind, Op};

/// Whether a history satisfied a workload's consistency model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Validity {
    /// No anomaly: the history is consistent with the model.
    Valid,
    /// At least one anomaly the model forbids.
    Invalid,
    /// The checker could not decide (a search budget ran out, a final read
    /// is missing, nothing could be inferred).
    Unknown,
}

/// One anomaly (or, for `Unknown`, the reason no verdict was reached).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// A short name: `G-single-item-realtime`, `stale-read`, `lost-incr`…
    pub kind: String,
    /// What happened, in words, naming operations by event index.
    pub explanation: String,
    /// The indices of the events involved (invocations and completions).
    pub events: Vec<u64>,
}

/// One workload's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// `list-append`, `register` or `counter`.
    pub workload: &'static str,
    pub valid: Validity,
    pub anomalies: Vec<Anomaly>,
    /// How the workload's operations ended (an invocation never completed
    /// counts as `info`).
    pub ok: usize,
    pub fail: usize,
    pub info: usize,
}

impl Verdict {
    /// A verdict of one definite anomaly outside any workload's history
    /// (the cluster did not recover, the replicas diverged).
    pub fn single(workload: &'static str, anomaly: Anomaly) -> Verdict {
        Verdict {
            workload,
            valid: Validity::Invalid,
            anomalies: vec![anomaly],
            ok: 0,
            fail: 0,
            info: 0,
        }
    }

    /// A verdict from its anomalies: `Invalid` if any is `definite`,
    /// otherwise `Unknown` if there are any, otherwise `Valid`.
    fn new(
        workload: &'static str,
        ops: &[Operation],
        definite: Vec<Anomaly>,
        unknown: Vec<Anomaly>,
    ) -> Verdict {
        let valid = if !definite.is_empty() {
            Validity::Invalid
        } else if !unknown.is_empty() {
            Validity::Unknown
        } else {
            Validity::Valid
        };
        let count = |k: Kind| ops.iter().filter(|o| o.kind() == k).count();
        let mut anomalies = definite;
        anomalies.extend(unknown);
        Verdict {
            workload,
            valid,
            anomalies,
            ok: count(Kind::Ok),
            fail: count(Kind::Fail),
            info: count(Kind::Info),
        }
    }
}

/// Runs every checker whose operations appear in `events`, in the order
/// list-append, register, counter.
pub fn check(events: &[Event]) -> Vec<Verdict> {
    let has = |f: fn(&Op) -> bool| events.iter().any(|e| f(&e.op));
    let mut out = Vec::new();
    if has(|op| matches!(op, Op::Txn(_))) {
        out.push(list_append::check(events));
    }
    if has(|op| matches!(op, Op::Read { .. } | Op::Write { .. } | Op::Cas { .. })) {
        out.push(register::check(events));
    }
    if has(|op| matches!(op, Op::Incr { .. } | Op::CounterRead { .. })) {
        out.push(counter::check(events));
    }
    out
}

/// One operation: its invocation and, unless the history ended first, its
/// completion.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operation<'a> {
    pub invoke: &'a Event,
    pub done: Option<&'a Event>,
}

impl<'a> Operation<'a> {
    /// How it ended; no completion reads as `info` (unknown).
    pub fn kind(&self) -> Kind {
        self.done.map_or(Kind::Info, |d| d.kind)
    }

    /// What it returned (the completion's op), or what it asked for.
    pub fn op(&self) -> &'a Op {
        self.done.map_or(&self.invoke.op, |d| &d.op)
    }

    /// The event indices of its invocation and completion.
    pub fn events(&self) -> Vec<u64> {
        let mut v = vec![self.invoke.index];
        v.extend(self.done.map(|d| d.index));
        v
    }

    /// "operation 12 (process 3, events 12–15, ok): read of key 1 returned 5".
    pub fn describe(&self) -> String {
        let span = match self.done {
            Some(d) => format!("events {}–{}", self.invoke.index, d.index),
            None => format!("event {}, never completed", self.invoke.index),
        };
        let kind = match self.kind() {
            Kind::Ok => "ok",
            Kind::Fail => "failed",
            Kind::Info => "outcome unknown",
            Kind::Invoke => "invoke",
        };
        format!(
            "operation {} (process {}, {span}, {kind}): {}",
            self.invoke.index,
            self.invoke.process,
            describe_op(self.op(), self.kind() == Kind::Ok)
        )
    }
}

/// An operation in words; `returned`: whether the values it carries are
/// what the server returned (an `ok` completion).
pub(crate) fn describe_op(op: &Op, returned: bool) -> String {
    use super::history::Mop;
    let opt = |v: &Option<i64>| v.map_or_else(|| "nil".to_string(), |v| v.to_string());
    match op {
        Op::Txn(mops) => {
            let parts: Vec<String> = mops
                .iter()
                .map(|m| match m {
                    Mop::Append { key, value } => format!("append {value} to key {key}"),
                    Mop::Read {
                        key,
                        value: Some(v),
                    } if returned => format!("read key {key} = {v:?}"),
                    Mop::Read { key, .. } => format!("read key {key}"),
                })
                .collect();
            format!("transaction [{}]", parts.join(", "))
        }
        Op::Read { key, value } if returned => format!("read of key {key} returned {}", opt(value)),
        Op::Read { key, .. } => format!("read of key {key}"),
        Op::Write { key, value } => format!("write of {value} to key {key}"),
        Op::Cas { key, from, to } => format!("compare-and-set of key {key} from {from} to {to}"),
        Op::Incr {
            key,
            result: Some(r),
        } if returned => format!("INCR of counter {key} returned {r}"),
        Op::Incr { key, .. } => format!("INCR of counter {key}"),
        Op::CounterRead { key, value } if returned => {
            format!("read of counter {key} returned {}", opt(value))
        }
        Op::CounterRead { key, .. } => format!("read of counter {key}"),
    }
}

/// Pairs each invocation with the next completion of the same process, in
/// history order, keeping only events `keep` selects. Completions with no
/// open invocation are ignored.
pub(crate) fn operations<'a>(
    events: &'a [Event],
    keep: impl Fn(&Op) -> bool,
) -> Vec<Operation<'a>> {
    let mut ops: Vec<Operation<'a>> = Vec::new();
    let mut open: HashMap<u64, usize> = HashMap::new();
    for e in events.iter().filter(|e| keep(&e.op)) {
        if e.kind == Kind::Invoke {
            open.insert(e.process, ops.len());
            ops.push(Operation {
                invoke: e,
                done: None,
            });
        } else if let Some(i) = open.remove(&e.process) {
            ops[i].done = Some(e);
        }
    }
    ops
}

#[cfg(test)]
pub(crate) mod testing {
    //! Building histories by hand in the checkers' tests.
    use super::super::history::{Event, Kind, Op};

    /// A history under construction: `invoke` and `complete` append events
    /// with consecutive indices and times.
    #[derive(Default)]
    pub struct H {
        pub events: Vec<Event>,
    }

    impl H {
        pub fn push(&mut self, kind: Kind, process: u64, op: Op) -> u64 {
            let index = self.events.len() as u64;
            self.events.push(Event {
                index,
                kind,
                process,
                time_ns: index * 1000,
                op,
                node: None,
                error: None,
            });
            index
        }
        pub fn invoke(&mut self, process: u64, op: Op) -> u64 {
            self.push(Kind::Invoke, process, op)
        }
        pub fn ok(&mut self, process: u64, op: Op) -> u64 {
            self.push(Kind::Ok, process, op)
        }
        pub fn fail(&mut self, process: u64, op: Op) -> u64 {
            self.push(Kind::Fail, process, op)
        }
        pub fn info(&mut self, process: u64, op: Op) -> u64 {
            self.push(Kind::Info, process, op)
        }
    }

    /// Kinds of a verdict's anomalies, for assertions.
    pub fn kinds(v: &super::Verdict) -> Vec<&str> {
        v.anomalies.iter().map(|a| a.kind.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::history::{Mop, Op};
    use super::testing::H;
    use super::*;

    #[test]
    fn check_runs_each_workload_present_and_serializes() {
        let mut h = H::default();
        h.invoke(0, Op::Write { key: 1, value: 5 });
        h.ok(0, Op::Write { key: 1, value: 5 });
        h.invoke(
            1,
            Op::Incr {
                key: 0,
                result: None,
            },
        );
        h.ok(
            1,
            Op::Incr {
                key: 0,
                result: Some(1),
            },
        );
        h.invoke(
            1,
            Op::CounterRead {
                key: 0,
                value: None,
            },
        );
        h.ok(
            1,
            Op::CounterRead {
                key: 0,
                value: Some(1),
            },
        );
        let v = check(&h.events);
        let names: Vec<_> = v.iter().map(|v| v.workload).collect();
        assert_eq!(names, ["register", "counter"]);
        assert!(v.iter().all(|v| v.valid == Validity::Valid), "{v:#?}");
        let json = serde_json::to_string(&v[0]).unwrap();
        assert!(
            json.contains(r#""valid":"valid""#) && json.contains(r#""ok":1"#),
            "{json}"
        );

        let mut h = H::default();
        h.invoke(0, Op::Txn(vec![Mop::Append { key: 1, value: 1 }]));
        assert_eq!(check(&h.events)[0].workload, "list-append");
        assert_eq!(
            check(&h.events)[0].info,
            1,
            "a never-completed invocation counts as info"
        );
    }
}
