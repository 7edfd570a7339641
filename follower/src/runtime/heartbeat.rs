//! The heartbeat thread: refreshes the heartbeat word for the preload,
//! ticks the replica with the region words others write (the leader's
//! commit point and commit records come out of that tick), and tells it
//! when the ZooKeeper session wavers or the server exited.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockstep_common::apply_lag::{self, Appliers};
use lockstep_common::region::Role;

use crate::io::zookeeper;
use crate::protocol::{Event, Millis, Session, Words};

use super::carried::Carried;
use super::poll::NOT_STALLED;
use super::Node;

/// Period of the heartbeat (and of the leader's commit writes when idle).
pub(super) const HEARTBEAT: Duration = Duration::from_millis(2);
/// How often the heartbeat thread checks that this node's server runs.
pub(super) const SERVER_CHECK: Duration = Duration::from_millis(100);

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Node {
    /// Every node: refreshes its heartbeat for the preload and ticks the
    /// replica.
    pub(super) fn heartbeat_loop(&self) {
        let mut server_checked = Instant::now();
        let mut server_gone = false;
        let mut appliers: Option<Appliers> = None;
        while !self.stopping() {
            self.region.set_heartbeat(now_ms());
            self.check_session();
            self.publish_appliers(&mut appliers);
            if server_checked.elapsed() >= SERVER_CHECK {
                self.check_server(&mut server_gone);
                self.learn_committed_origin();
                server_checked = Instant::now();
            }
            self.step(Event::Tick(self.words()), Carried::Nothing);
            // A timer, not the doorbell: under load the commit rides on
            // every entry's header, and waking on each entry would cost a
            // context switch here and, through the commit write, in every
            // backup's threads. Short, because when no entry follows, this
            // is how backups learn the commit and apply (bench follower's
            // apply latency: ~10 ms at a 10 ms period).
            std::thread::sleep(HEARTBEAT);
        }
    }

    /// A leader publishes, for its preload's `max_apply_lag`, which
    /// backups can apply (a server attached, reports coming); see
    /// `apply_lag`. `seen` lives while this node leads.
    fn publish_appliers(&self, seen: &mut Option<Appliers>) {
        if self.region.role() != Role::Leader {
            *seen = None;
            return;
        }
        let seen = seen.get_or_insert_with(Appliers::default);
        let now = self.started.elapsed().as_millis() as u64;
        let mask = self
            .config
            .ids()
            .filter(|&id| id != self.me)
            .filter(|&id| seen.observe(id, self.region.apply_report(id), now))
            .fold(0, |mask, id| mask | apply_lag::bit(id));
        self.region.set_appliers(mask);
    }

    /// The region words other processes write, for a tick.
    pub(super) fn words(&self) -> Words {
        let (seq, view) = self.region.commit_in_view();
        let stalled_at = self.stalled_at.load(Ordering::Relaxed);
        Words {
            acks: self
                .config
                .ids()
                .map(|id| (id, self.region.ack(id)))
                .collect(),
            served: self.region.served(),
            commit: (view, seq),
            commit_record: (view, seq),
            fenced_by: self.transport.fenced_by(),
            tail_ahead: stalled_at != NOT_STALLED && self.region.tail() > stalled_at,
        }
    }

    /// A leader whose ZooKeeper session wavers: the replica decides
    /// whether it stops serving (checked here, every heartbeat, because
    /// the election thread may be waiting on ZooKeeper meanwhile).
    fn check_session(&self) {
        if self.region.role() != Role::Leader {
            return;
        }
        let session = match self
            .session_watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(w) => protocol_session(w.session()),
            None => return,
        };
        if session != Session::Connected {
            // Not connected: nothing is known of the candidacy or the
            // announced leader, and the replica reads neither then.
            self.step(
                Event::Election {
                    session,
                    candidate: false,
                    announced: None,
                    followed_serving: false,
                },
                Carried::Nothing,
            );
        }
    }

    /// Tells the replica, once, that the server that attached in this
    /// follower's life (its pid word is set) exited (its lock is gone).
    fn check_server(&self, reported: &mut bool) {
        let pid = self.region.preload_pid();
        if *reported || pid == 0 || self.region.server_attached() {
            return;
        }
        if self.region.preload_pid() != pid {
            // Stopped on purpose (a snapshot's install clears the word
            // before its kill), or replaced meanwhile.
            return;
        }
        *reported = true;
        log::error!("node {}: its server (pid {pid}) exited", self.me);
        self.step(Event::ServerExited, Carried::Nothing);
    }
}

/// The election's session state as the protocol sees it.
pub(super) fn protocol_session(session: zookeeper::Session) -> Session {
    match session {
        zookeeper::Session::Connected => Session::Connected,
        zookeeper::Session::Disconnected(d) => Session::Disconnected(d.as_millis() as Millis),
        zookeeper::Session::Expired => Session::Expired,
    }
}
