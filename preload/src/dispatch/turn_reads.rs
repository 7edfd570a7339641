//! The clock and child reads a server thread makes inside its turn, by
//! role: the leader reads for real and logs what moved, a backup reads
//! what the log says (the records and their rules are `turn_time`'s; the
//! leader's logging is the engine's, the backup's lookup the applier's,
//! in `region_host`).

use crate::determinism::clock;
use crate::determinism::turn_time::{leader_value, Child, NO_FORK};

/// A counted clock read of a server thread inside its turn: the time it
/// reads, or None outside a turn (then `clock::now_us` answers). The
/// leader logs a record when the read moves the time; a backup reads the
/// log's records (and may wait for the log to say).
pub fn read(engine: &crate::leader::engine::Engine) -> Option<u64> {
    if clock::stopping() {
        return None;
    }
    if engine.region.role() == lockstep_common::region::Role::Leader {
        let mut moved = None;
        let us = clock::counted_read(|reads, now| {
            let (us, logs) = leader_value(crate::sys::realtime_us(), now);
            if logs {
                moved = Some(reads.count);
            }
            us
        })?;
        if let Some(k) = moved {
            if let Err(f) = engine.replicate_time(k, us) {
                log::debug!("clock record {k} at {us}: not logged: {f}");
            }
            clock::record_logged();
        }
        Some(us)
    } else {
        clock::counted_read(crate::backup::region_host::time_at)
    }
}

/// A poll for ended children (`waitpid(pid, …, options)` with `WNOHANG`)
/// of a server thread inside its turn, `real(pid, options)` being the
/// real call (its result and the status it stored): what the server gets,
/// or None outside a turn (then the real call answers).
///
/// The leader polls for real and, when a child was reaped, logs it as the
/// record of this read. A backup returns what the leader's poll of the
/// same read returned: the child its record names — reaping its own copy
/// of that child, waiting for it to end if it still runs, and reading the
/// leader's status — or no child (0) where the leader reaped none, even
/// when one of its own has ended already (it is reaped when the leader's
/// was).
pub fn poll_children(
    pid: libc::pid_t,
    options: i32,
    real: &mut dyn FnMut(libc::pid_t, i32) -> (libc::pid_t, i32),
) -> Option<(libc::pid_t, i32)> {
    let engine = crate::setup::engine()?;
    if clock::stopping() {
        return None;
    }
    if engine.region.role() == lockstep_common::region::Role::Leader {
        let (r, status) = real(pid, options);
        let mut k = 0;
        let us = clock::counted_read(|reads, now| {
            k = reads.count;
            now
        });
        if let Some(us) = us {
            if r > 0 {
                let child = Child {
                    fork: crate::determinism::forks::ordinal_of(r).unwrap_or(NO_FORK),
                    pid: r,
                    status,
                };
                if let Err(f) = engine.replicate_child(k, us, child) {
                    log::debug!("child {r} reaped at read {k}: not logged: {f}");
                }
                clock::record_logged();
            }
        }
        return Some((r, status));
    }
    let mut found = None;
    let read = clock::counted_read(|at, now| {
        let (us, child) = crate::backup::region_host::child_at(at, now);
        found = child;
        us
    });
    if read.is_none() {
        // Outside the log's turns (a timer the server ran before the log's
        // next turn reached this backup): on its event loop, nothing ended
        // — the log says where a child ends, and a real reap here would end
        // it at a read the leader's server did not make (its fork order
        // then no longer matches the leader's). Other threads: the real
        // call.
        return clock::is_loop_thread().then_some((0, 0));
    }
    Some(match found {
        Some(child) => {
            // Ours ends as the leader's did (same code, same input); wait
            // for it. A child this server does not have (gone already, or
            // never forked here) still reads as the leader's.
            let pid = child.here();
            let _ = real(pid, 0);
            (pid, child.status)
        }
        None => (0, 0),
    })
}
