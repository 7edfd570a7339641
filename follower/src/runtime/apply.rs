//! The apply thread: hands committed entries to the local server's
//! passive preload in log order (see [`crate::feed`]), and turns a
//! restarted leader's rebuilt server active.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lockstep_common::region::Role;

use crate::feed::Feeder;
use crate::protocol::commit;

use super::Node;

/// A backup tells the leader how far it applied at least this often (and
/// whenever it moved): a new leader learns it within this.
pub(super) const APPLIED_REPORT: Duration = Duration::from_millis(50);

impl Node {
    /// Hands committed entries to the local server's passive preload, in
    /// log order, through the apply ring (backups, and a restarted leader
    /// before it serves again); see `feed` for why the preload applies.
    pub(super) fn apply_loop(&self) {
        let mut feeder: Option<Feeder> = None;
        let mut last_saved = Instant::now();
        let mut reported = (0u64, Instant::now());
        let mut rate = ApplyRate::default();
        while !self.stopping() {
            let role = self.region.role();
            if role == Role::Leader || self.stale.load(Ordering::Relaxed) {
                // The leader's server consumed its inputs itself; a demoted
                // one resumes after what it consumed (a new stream).
                feeder = None;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let f = feeder.get_or_insert_with(|| {
                let next = self.applied.load(Ordering::Acquire) + 1;
                log::info!("node {}: applying from seq {next}", self.me);
                Feeder::start(self.region.clone(), next, self.config.max_entry)
            });
            let applied = f.applied();
            if applied != reported.0 || reported.1.elapsed() >= APPLIED_REPORT {
                self.report_applied(applied);
                reported = (applied, Instant::now());
            }
            rate.observe(applied);
            self.apply_rate.store(rate.per_second(), Ordering::Relaxed);
            let before = self.applied.swap(applied, Ordering::AcqRel);
            self.metrics
                .applied_entries
                .fetch_add(applied.saturating_sub(before), Ordering::Relaxed);
            self.metrics
                .divergences
                .store(self.region.apply().diverged(), Ordering::Relaxed);
            let persisted = self.persisted.load(Ordering::Acquire);
            let target = commit::apply_target(
                self.committed.load(Ordering::Acquire),
                persisted,
                role == Role::Joining && self.is_leader_node(),
            );
            let mut full = false;
            if f.next() <= target {
                let want = ((target + 1 - f.next()) as usize).min(256);
                let entries = match self.store().range(f.next(), want) {
                    Ok(e) => e,
                    Err(e) => {
                        log::error!("cannot read the log: {e}; stopping");
                        self.stop.store(true, Ordering::Relaxed);
                        return;
                    }
                };
                for (seq, e) in entries {
                    if seq != f.next() {
                        log::error!("log gap at seq {} while applying; stopping", f.next());
                        self.stop.store(true, Ordering::Relaxed);
                        return;
                    }
                    match f.feed(&e.header(), e.payload()) {
                        Ok(true) => {}
                        Ok(false) => {
                            full = true;
                            break;
                        }
                        Err(err) => {
                            log::error!("cannot hand seq {seq} to the server: {err}; stopping");
                            self.stop.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                }
                f.publish();
                if !full && f.next() <= target {
                    continue;
                }
            }
            if commit::rebuilt(
                role == Role::Joining && self.is_leader_node(),
                self.log_view.load(Ordering::Acquire),
                self.region.view(),
                applied,
                target,
            ) && f.next() > target
            {
                log::info!(
                    "node {}: server rebuilt up to seq {applied}; serving as leader",
                    self.me
                );
                self.region.set_role(Role::Leader);
                continue;
            }
            if last_saved.elapsed() > Duration::from_secs(1) {
                let _ = self.store().set_applied(applied);
                let _ = self
                    .store()
                    .set_commit(self.committed.load(Ordering::Acquire));
                last_saved = Instant::now();
            }
            if full || applied + 1 < f.next() {
                // The server is working through what was fed: its progress
                // rings no bell here.
                std::thread::sleep(Duration::from_micros(500));
            } else {
                let bell = self.region.bell();
                let seen = bell.value();
                if self
                    .committed
                    .load(Ordering::Acquire)
                    .min(self.persisted.load(Ordering::Acquire))
                    < f.next()
                {
                    bell.wait(seen, Duration::from_millis(2));
                }
            }
        }
    }
}

/// The apply rate over the last second or so (for lag in seconds).
#[derive(Debug)]
struct ApplyRate {
    since: Instant,
    from: u64,
    per_second: u64,
}

impl Default for ApplyRate {
    fn default() -> Self {
        ApplyRate {
            since: Instant::now(),
            from: 0,
            per_second: 0,
        }
    }
}

impl ApplyRate {
    fn observe(&mut self, applied: u64) {
        let dt = self.since.elapsed();
        if dt >= Duration::from_secs(1) {
            let n = applied.saturating_sub(self.from);
            self.per_second = (n as f64 / dt.as_secs_f64()) as u64;
            self.since = Instant::now();
            self.from = applied;
        }
    }

    fn per_second(&self) -> u64 {
        self.per_second
    }
}
