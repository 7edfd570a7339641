//! What a node reports of itself (read from its replica): `status`, the
//! metrics text and the apply lag in seconds.

use std::sync::atomic::Ordering;

use lockstep_common::apply_lag;
use lockstep_common::config::SnapshotMode;
use lockstep_common::control::NodeStatus;
use lockstep_common::region::Role;

use crate::protocol::snapshot;
use crate::serve::metrics;

use super::Node;

impl Node {
    /// This node's status.
    pub fn status(&self) -> NodeStatus {
        let (view, leader, role, stale_reason, committed, applied, commit_wait_ms) = {
            let r = self.replica();
            (
                r.promised(),
                r.leader(),
                r.role(),
                r.stale().map(str::to_string),
                r.committed(),
                r.applied(),
                r.commit_wait(),
            )
        };
        let (persisted, oldest, log_bytes) = {
            let store = self.store();
            (store.last().seq, store.oldest(), store.disk_bytes())
        };
        let snap = self.snapshot_state().clone();
        let log_entries = (persisted + 1).saturating_sub(oldest.max(1));
        let degraded = (self.config.snapshot == SnapshotMode::Process)
            .then(|| {
                let every = self.config.snapshot_every;
                snapshot::degraded(
                    log_entries,
                    log_bytes,
                    every,
                    snap.image_bytes.max(snap.members_image_bytes),
                    self.config.snapshot_degraded_after,
                )
            })
            .flatten();
        // The leader's server consumed what it was handed itself; shown
        // no further than the commit point, so that the counters read in
        // order (applied <= committed).
        let applied = if role == Role::Leader {
            persisted.min(committed)
        } else {
            applied.min(committed)
        };
        let lag = committed.saturating_sub(applied);
        let role_name = match role {
            _ if stale_reason.is_some() => "stale",
            Role::Leader => "leader",
            Role::Backup if !apply_lag::caught_up(lag, self.config.max_apply_lag) => "catching-up",
            Role::Backup => "backup",
            Role::Joining => "joining",
        };
        let failover_backlog = (role == Role::Leader)
            .then(|| {
                let members: Vec<u64> = self.config.ids().collect();
                apply_lag::backlog_warning(self.me, &members, self.region.appliers())
            })
            .flatten();
        let apply_rate = if role == Role::Leader {
            0
        } else {
            self.apply_rate.load(Ordering::Relaxed)
        };
        NodeStatus {
            node: self.me,
            view,
            leader,
            role: role_name.into(),
            stale_reason,
            persisted,
            committed,
            applied,
            divergences: self.metrics.divergences.load(Ordering::Relaxed),
            lag_ms: (self.lag_seconds(lag) * 1000.0) as u64,
            apply_rate,
            failover_backlog,
            server_pid: self.region.preload_pid(),
            follower_pid: std::process::id() as u64,
            zookeeper_down_ms: self
                .session_watch
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(|w| w.down_for())
                .map(|d| d.as_millis() as u64),
            commit_wait_ms,
            snapshot: snap.newest,
            snapshot_bytes: snap.image_bytes,
            oldest,
            snapshotting: snap.taking,
            bytes_since_snapshot: self
                .applied_bytes
                .load(Ordering::Relaxed)
                .saturating_sub(snap.bytes_at),
            snapshot_failing: snap.failing.as_ref().map(|f| f.report()),
            log_entries,
            log_bytes,
            degraded,
        }
    }

    pub(crate) fn render_metrics(&self) -> String {
        let s = self.status();
        let lag = s.committed.saturating_sub(s.applied);
        let mut text = self.metrics.render(&[
            ("lockstep_view", "Current view", s.view),
            ("lockstep_leader", "Leader of the current view", s.leader),
            ("lockstep_persisted_seq", "Highest seq stored", s.persisted),
            (
                "lockstep_committed_seq",
                "Highest seq known committed",
                s.committed,
            ),
            ("lockstep_applied_seq", "Highest seq applied", s.applied),
        ]);
        let zookeeper_connected = self
            .session_watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|w| w.session() == crate::io::zookeeper::Session::Connected);
        metrics::NodeGauges {
            role: &s.role,
            server_up: self.region.server_attached(),
            zookeeper_connected,
            apply_lag_entries: lag,
            apply_lag_seconds: self.lag_seconds(lag),
            apply_rate: s.apply_rate,
            failover_backlog_grows: s.failover_backlog.is_some(),
            snapshot_failing: s.snapshot_failing.is_some(),
            snapshot_failures: s.snapshot_failing.as_ref().map_or(0, |f| f.failures),
            newest_snapshot: s.snapshot,
            log_entries: s.log_entries,
            log_bytes: s.log_bytes,
            degraded: s.degraded.is_some(),
        }
        .render(&mut text);
        text
    }

    /// Seconds the server needs to apply `lag` entries at its recent rate
    /// (with no rate measured yet, a rate of 50k entries/s is assumed).
    pub(crate) fn lag_seconds(&self, lag: u64) -> f64 {
        let rate = self.apply_rate.load(Ordering::Relaxed).max(1);
        let rate = if rate <= 1 { 50_000 } else { rate };
        lag as f64 / rate as f64
    }
}
