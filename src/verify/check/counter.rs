//! The counter workload: `INCR`s under client retries, checked for
//! exactly-once against a read of each counter after the run healed.
//!
//! Per key, with `n_ok` acknowledged INCRs, `n_info` whose outcome is
//! unknown (timed out, connection lost: each may have been applied once or
//! not at all), and the final read `F`:
//!
//! * `n_ok <= F`, or acknowledged increments were lost (`lost-incr`);
//! * `F <= n_ok + n_info`, or some INCR was applied more than once
//!   (`double-applied-incr`: a retried request executed twice, a log entry
//!   replayed);
//! * each acknowledged INCR's result lies in `1..=F` (a result above `F`:
//!   its increment is missing from the final count, `lost-incr`) and no two
//!   are equal (`duplicate-result`: a counter that only goes up cannot pass
//!   one value twice, so an increment was undone and redone, or a reply was
//!   replayed to another request);
//! * no final read means no verdict (`Unknown`).
//!
//! `fail` INCRs did not happen and count for nothing. Every `ok` counter
//! read is held to the same bounds, taken at its own time: at least the
//! INCRs acknowledged before it began, at most those invoked before it
//! ended; the last `ok` read of a key is its final read.

use std::collections::BTreeMap;

use super::super::history::{Event, Kind, Op};
use super::{operations, Anomaly, Operation, Verdict};

/// The workload's name in verdicts.
pub const WORKLOAD: &str = "counter";

/// At most this many anomalies of one kind per key are listed.
const MAX_PER_KIND: usize = 10;

/// Checks each counter for exactly-once increments.
pub fn check(events: &[Event]) -> Verdict {
    let ops = operations(events, |op| {
        matches!(op, Op::Incr { .. } | Op::CounterRead { .. })
    });
    let mut by_key: BTreeMap<u64, Vec<Operation>> = BTreeMap::new();
    for o in &ops {
        let (Op::Incr { key, .. } | Op::CounterRead { key, .. }) = o.invoke.op else {
            unreachable!()
        };
        by_key.entry(key).or_default().push(*o);
    }
    let (mut definite, mut unknown) = (Vec::new(), Vec::new());
    for (key, kops) in by_key {
        check_key(key, &kops, &mut definite, &mut unknown);
    }
    Verdict::new(WORKLOAD, &ops, definite, unknown)
}

fn check_key(key: u64, ops: &[Operation], definite: &mut Vec<Anomaly>, unknown: &mut Vec<Anomaly>) {
    let incrs: Vec<&Operation> = ops
        .iter()
        .filter(|o| matches!(o.invoke.op, Op::Incr { .. }))
        .collect();
    let ok: Vec<&Operation> = incrs
        .iter()
        .copied()
        .filter(|o| o.kind() == Kind::Ok)
        .collect();
    let n_info = incrs.iter().filter(|o| o.kind() == Kind::Info).count();
    let reads: Vec<(&Operation, i64)> = ops
        .iter()
        .filter(|o| o.kind() == Kind::Ok)
        .filter_map(|o| match o.op() {
            Op::CounterRead { value, .. } => Some((o, value.unwrap_or(0))),
            _ => None,
        })
        .collect();

    // Results of acknowledged INCRs: each value at most once.
    let mut by_result: BTreeMap<i64, Vec<&Operation>> = BTreeMap::new();
    for o in &ok {
        if let Op::Incr {
            result: Some(r), ..
        } = o.op()
        {
            by_result.entry(*r).or_default().push(o);
        }
    }
    for (r, same) in by_result
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .take(MAX_PER_KIND)
    {
        definite.push(Anomaly {
            kind: "duplicate-result".into(),
            explanation: format!(
                "duplicate-result: on counter {key}, {} acknowledged INCRs all returned {r}: {}. A counter that \
                 only goes up cannot reach {r} twice, so an increment was undone and applied again (a lost \
                 INCR), or one request's reply was replayed to another.",
                same.len(),
                same.iter().map(|o| o.describe()).collect::<Vec<_>>().join("; ")
            ),
            events: sorted(same.iter().flat_map(|o| o.events())),
        });
    }

    // Each counter read within what real time allows.
    for &(read, value) in &reads {
        let began = read.invoke.index;
        let ended = read.done.map_or(u64::MAX, |d| d.index);
        let before: Vec<&&Operation> = ok
            .iter()
            .filter(|o| o.done.is_some_and(|d| d.index < began))
            .collect();
        let could = incrs
            .iter()
            .filter(|o| o.kind() != Kind::Fail && o.invoke.index < ended)
            .count();
        let could_ok = ok.iter().filter(|o| o.invoke.index < ended).count();
        if (value as i128) < before.len() as i128 {
            definite.push(Anomaly {
                kind: "lost-incr".into(),
                explanation: format!(
                    "lost-incr: {} but {} INCRs of counter {key} had been acknowledged before that read began: \
                     {} acknowledged increment(s) are missing.",
                    read.describe(),
                    before.len(),
                    before.len() as i64 - value
                ),
                events: read.events(),
            });
        } else if value as i128 > could as i128 {
            definite.push(Anomaly {
                kind: "double-applied-incr".into(),
                explanation: format!(
                    "double-applied-incr: {} but at most {could} INCRs of counter {key} could have taken effect \
                     by then ({could_ok} acknowledged, {} with unknown outcome): {} increment(s) too many, so \
                     some INCR was applied more than once (a retried request executed twice, or a log entry \
                     replayed).",
                    read.describe(),
                    could - could_ok,
                    value as i128 - could as i128
                ),
                events: read.events(),
            });
        }
    }

    // Against the final read: every acknowledged result in 1..=F.
    let Some(&(last, f)) = reads.iter().max_by_key(|(o, _)| o.invoke.index) else {
        if !incrs.is_empty() {
            unknown.push(Anomaly {
                kind: "no-final-read".into(),
                explanation: format!(
                    "counter {key} had {} INCRs ({} acknowledged, {n_info} with unknown outcome) but no \
                     successful read after the run healed, so whether each was applied exactly once cannot \
                     be told.",
                    incrs.len(),
                    ok.len()
                ),
                events: vec![],
            });
        }
        return;
    };
    let out_of_range: Vec<(&&Operation, i64)> = ok
        .iter()
        .filter_map(|o| match o.op() {
            Op::Incr {
                result: Some(r), ..
            } if *r < 1 || *r > f => Some((o, *r)),
            _ => None,
        })
        .collect();
    for (o, r) in out_of_range.iter().take(MAX_PER_KIND) {
        let why = if *r < 1 {
            "no INCR of a counter that starts at 0 can return less than 1"
        } else {
            "its increment is missing from the final count"
        };
        definite.push(Anomaly {
            kind: if *r < 1 {
                "impossible-result"
            } else {
                "lost-incr"
            }
            .into(),
            explanation: format!(
                "{}: {} but the final {}: {why}.",
                if *r < 1 {
                    "impossible-result"
                } else {
                    "lost-incr"
                },
                o.describe(),
                last.describe()
            ),
            events: sorted(o.events().into_iter().chain(last.events())),
        });
    }
}

fn sorted(it: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let mut v: Vec<u64> = it.into_iter().collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::super::testing::{kinds, H};
    use super::super::Validity;
    use super::*;

    fn incr(h: &mut H, p: u64, key: u64, kind: Kind, result: Option<i64>) {
        h.invoke(p, Op::Incr { key, result: None });
        h.push(kind, p, Op::Incr { key, result });
    }
    fn final_read(h: &mut H, key: u64, value: i64) {
        h.invoke(99, Op::CounterRead { key, value: None });
        h.ok(
            99,
            Op::CounterRead {
                key,
                value: Some(value),
            },
        );
    }

    #[test]
    fn exactly_once_with_failed_and_unknown_incrs_passes() {
        for applied in [0, 1, 2] {
            let mut h = H::default();
            // Concurrent INCRs.
            h.invoke(
                0,
                Op::Incr {
                    key: 1,
                    result: None,
                },
            );
            h.invoke(
                1,
                Op::Incr {
                    key: 1,
                    result: None,
                },
            );
            h.ok(
                1,
                Op::Incr {
                    key: 1,
                    result: Some(1),
                },
            );
            h.ok(
                0,
                Op::Incr {
                    key: 1,
                    result: Some(2),
                },
            );
            incr(&mut h, 2, 1, Kind::Fail, None);
            // Two unknown outcomes: `applied` of them took effect.
            incr(&mut h, 3, 1, Kind::Info, None);
            h.invoke(
                4,
                Op::Incr {
                    key: 1,
                    result: None,
                },
            );
            incr(&mut h, 5, 1, Kind::Ok, Some(3 + applied));
            final_read(&mut h, 1, 3 + applied);
            let v = check(&h.events);
            assert_eq!(v.valid, Validity::Valid, "applied {applied}: {v:#?}");
            assert_eq!((v.ok, v.fail, v.info), (4, 1, 2));
        }
    }

    #[test]
    fn double_applied_incr_is_rejected() {
        // A retried INCR executed twice: the count exceeds every INCR there was.
        let mut h = H::default();
        incr(&mut h, 0, 1, Kind::Ok, Some(1));
        incr(&mut h, 0, 1, Kind::Ok, Some(3));
        incr(&mut h, 1, 1, Kind::Fail, None);
        final_read(&mut h, 1, 3);
        let v = check(&h.events);
        assert_eq!(v.valid, Validity::Invalid, "{v:#?}");
        assert_eq!(kinds(&v), ["double-applied-incr"]);
        let e = &v.anomalies[0].explanation;
        assert!(
            e.contains("returned 3") && e.contains("at most 2 INCRs"),
            "{e}"
        );
    }

    #[test]
    fn lost_incr_is_rejected() {
        let mut h = H::default();
        incr(&mut h, 0, 1, Kind::Ok, Some(1));
        incr(&mut h, 0, 1, Kind::Ok, Some(2));
        incr(&mut h, 0, 1, Kind::Ok, Some(3));
        final_read(&mut h, 1, 2);
        let v = check(&h.events);
        assert_eq!(v.valid, Validity::Invalid, "{v:#?}");
        assert_eq!(kinds(&v), ["lost-incr", "lost-incr"]);
        assert!(
            v.anomalies[0]
                .explanation
                .contains("1 acknowledged increment(s) are missing"),
            "{v:#?}"
        );
        assert!(v.anomalies[1].explanation.contains("operation 4"), "{v:#?}");
    }

    #[test]
    fn repeated_result_is_rejected() {
        // Both returned 1: one increment was undone (e.g. lost in a failover)
        // and redone; the final count happens to be plausible.
        let mut h = H::default();
        incr(&mut h, 0, 1, Kind::Ok, Some(1));
        incr(&mut h, 1, 1, Kind::Ok, Some(1));
        incr(&mut h, 2, 1, Kind::Info, None);
        final_read(&mut h, 1, 2);
        let v = check(&h.events);
        assert_eq!(kinds(&v), ["duplicate-result"]);
        assert_eq!(v.anomalies[0].events, [0, 1, 2, 3]);
    }

    #[test]
    fn no_final_read_is_unknown() {
        let mut h = H::default();
        incr(&mut h, 0, 1, Kind::Ok, Some(1));
        incr(&mut h, 0, 2, Kind::Ok, Some(1));
        final_read(&mut h, 2, 1);
        let v = check(&h.events);
        assert_eq!(v.valid, Validity::Unknown, "{v:#?}");
        assert_eq!(kinds(&v), ["no-final-read"]);
        assert!(v.anomalies[0].explanation.contains("counter 1"));
    }

    #[test]
    fn a_read_during_the_run_is_held_to_real_time_bounds() {
        let mut h = H::default();
        incr(&mut h, 0, 1, Kind::Ok, Some(1));
        incr(&mut h, 0, 1, Kind::Ok, Some(2));
        // A read that began after both were acknowledged, returning 1.
        h.invoke(
            5,
            Op::CounterRead {
                key: 1,
                value: None,
            },
        );
        h.ok(
            5,
            Op::CounterRead {
                key: 1,
                value: Some(1),
            },
        );
        final_read(&mut h, 1, 2);
        assert_eq!(kinds(&check(&h.events)), ["lost-incr"]);
    }
}
