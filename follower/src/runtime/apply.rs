//! The apply thread: hands the entries the replica says are applicable
//! ([`crate::protocol::Action::ApplyUpTo`]) to the local server's passive
//! preload in log order (see [`crate::io::feed`]), and tells the replica how
//! far the server got ([`crate::protocol::Event::Applied`]: a restarted
//! leader's rebuilt server then serves).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lockstep_common::apply_lag::{self, REPORT_PERIOD};
use lockstep_common::region::{self, Role};

use crate::io::feed::Feeder;
use crate::protocol::Event;

use super::carried::Carried;
use super::Node;

impl Node {
    /// Hands committed entries to the local server's passive preload, in
    /// log order, through the apply ring (backups, and a restarted leader
    /// before it serves again); see `feed` for why the preload applies.
    pub(super) fn apply_loop(&self) {
        let mut feeder: Option<Feeder> = None;
        let mut last_saved = Instant::now();
        let mut reported = (0u64, Instant::now());
        let mut reports = 0u64;
        let mut stepped = 0u64;
        let mut rate = ApplyRate::default();
        let _ = self.applier.set(std::thread::current());
        while !self.stopping() {
            let (role, stale, from) = {
                let r = self.replica();
                (r.role(), r.stale().is_some(), r.applied())
            };
            if role == Role::Leader || stale {
                // The leader's server consumed its inputs itself; a demoted
                // one resumes after what it consumed (a new stream). A
                // stale server applies nothing more: the leader must not
                // wait for it.
                if stale && reported.1.elapsed() >= REPORT_PERIOD {
                    reports += 1;
                    self.report_applied(from, reports, false);
                    reported = (from, Instant::now());
                }
                feeder = None;
                self.refuse_snapshots("only a backup snapshots (this node leads or is stale)");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if self.snapshots.installing() {
                // An installed image replaces the server: its stream goes
                // with it, the restored one is resumed after.
                feeder = None;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let f = feeder.get_or_insert_with(|| {
                stepped = from;
                if self.snapshots.take_resume() {
                    // A server restored from an image reads on in its
                    // stream: a new one would end its replay connections.
                    let f = Feeder::resume(self.region.clone(), self.config.max_entry);
                    log::info!(
                        "node {}: applying from seq {} (restored server)",
                        self.me,
                        f.next()
                    );
                    return f;
                }
                log::info!("node {}: applying from seq {}", self.me, from + 1);
                Feeder::start(self.region.clone(), from + 1, self.config.max_entry)
            });
            if role == Role::Backup {
                self.snapshot_if_asked(f);
            }
            // A snapshot asked for needs the server idle at a turn
            // boundary: fed one entry at a time, it reaches one within a
            // turn's entries. Fed 256 at a time behind a backlog it was
            // never idle when looked at (no snapshot within two minutes
            // while a backup caught up under load).
            let narrow = role == Role::Backup && self.snapshots.has_pending();
            // Taken before what the server consumed is read: progress
            // after this wakes the wait below at once.
            let progress = self.region.apply().progress_bell().value();
            let applied = f.applied();
            // At least every period, also when nothing moved: the leader
            // counts only backups whose reports keep coming. Progress at
            // most every REPORT_GAP (see there).
            if apply_lag::report_due(applied, reported.0, reported.1.elapsed()) {
                reports += 1;
                self.report_applied(applied, reports, self.region.server_attached());
                reported = (applied, Instant::now());
            }
            rate.observe(applied);
            self.apply_rate.store(rate.per_second(), Ordering::Relaxed);
            if applied > stepped {
                self.metrics
                    .applied_entries
                    .fetch_add(applied - stepped, Ordering::Relaxed);
                stepped = applied;
                self.step(Event::Applied { seq: applied }, Carried::Nothing);
            }
            self.metrics
                .divergences
                .store(self.region.apply().diverged(), Ordering::Relaxed);
            // Never past the stored log (the replica's target is).
            let target = self
                .apply_target
                .load(Ordering::Acquire)
                .min(self.store().last().seq);
            let mut full = false;
            if f.next() <= target {
                let want = ((target + 1 - f.next()) as usize).min(if narrow { 1 } else { 256 });
                // Fed from the store in place (its recent runs, or
                // RocksDB's values), no copy per entry.
                let mut broken = None;
                let read = self.store().visit(f.next(), want, |e| {
                    if e.seq != f.next() {
                        broken = Some(format!("log gap at seq {} while applying", f.next()));
                        return false;
                    }
                    match f.feed(&e.header, e.payload) {
                        Ok(true) => {
                            self.applied_bytes
                                .fetch_add(e.bytes.len() as u64, Ordering::Relaxed);
                            true
                        }
                        Ok(false) => {
                            full = true;
                            false
                        }
                        Err(err) => {
                            broken =
                                Some(format!("cannot hand seq {} to the server: {err}", e.seq));
                            false
                        }
                    }
                });
                if let Err(e) = read {
                    self.fail(&format!("cannot read the log: {e}"));
                    return;
                }
                if let Some(why) = broken {
                    self.fail(&why);
                    return;
                }
                f.publish();
                if !full && !narrow && f.next() <= target {
                    continue;
                }
            }
            if last_saved.elapsed() > Duration::from_secs(1) {
                let committed = self.replica().committed();
                let store = self.store();
                let _ = store.set_applied(applied);
                let _ = store.set_commit(committed);
                last_saved = Instant::now();
            }
            if full || applied + 1 < f.next() {
                // The server is working through what was fed: its preload
                // rings the progress bell as each turn ends (a timer here
                // cost a third of this thread in wake-ups from 0.5 ms
                // sleeps). Space a turn in flight took is freed without a
                // ring: a ring filled by one turn is fed on at the timeout.
                self.region
                    .apply()
                    .progress_bell()
                    .wait(progress, Duration::from_millis(2));
            } else if self.apply_target.load(Ordering::Acquire) < f.next() {
                // Unparked when the replica moves the target.
                std::thread::park_timeout(Duration::from_millis(2));
            }
        }
    }

    /// Tells the leader how far this node's server applied, and (report
    /// number `count`) whether it can apply more (`can_apply`: a server
    /// is attached and not stale): the
    /// leader bounds the apply lag of the backups that can apply
    /// (`max_apply_lag`, see `apply_lag`).
    fn report_applied(&self, seq: u64, count: u64, can_apply: bool) {
        let leader = self.region.leader();
        if leader == 0 || leader == self.me {
            return;
        }
        let view = self.region.view();
        let mark = region::applied_by_offset(self.me);
        let word = apply_lag::report_word(count, can_apply);
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&seq.to_le_bytes());
        bytes[8..].copy_from_slice(&word.to_le_bytes());
        if let Err(e) = self.write_now(leader, view, mark, &bytes) {
            log::debug!("applied {seq} to node {leader}: {e}");
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
