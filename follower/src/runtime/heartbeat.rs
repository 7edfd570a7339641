//! The heartbeat thread: refreshes the heartbeat word for the preload,
//! checks the ZooKeeper session and the server, and (leader) raises and
//! sends the commit point.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lockstep_common::region::{self, Role};

use super::node::now_ms;
use super::Node;

/// Period of the heartbeat (and of the leader's commit writes when idle).
pub(super) const HEARTBEAT: Duration = Duration::from_millis(2);
/// How often the heartbeat thread checks that this node's server runs.
pub(super) const SERVER_CHECK: Duration = Duration::from_millis(100);

impl Node {
    /// Leader: keeps backups' commit words fresh, so idle backups apply.
    /// Every node: refreshes its heartbeat for the preload.
    pub(super) fn heartbeat_loop(&self) {
        let mut sent = 0u64;
        let mut last_send = Instant::now();
        let mut server_checked = Instant::now();
        while !self.stopping() {
            self.region.set_heartbeat(now_ms());
            self.check_session();
            if server_checked.elapsed() >= SERVER_CHECK {
                self.check_server();
                server_checked = Instant::now();
            }
            if self.region.role() == Role::Leader {
                let c = self.raise_leader_commit();
                self.learn_commit(c.min(self.persisted.load(Ordering::Acquire)));
                if c != sent || last_send.elapsed() > Duration::from_millis(100) {
                    let view = self.region.view();
                    for peer in self.config.ids().filter(|&i| i != self.me) {
                        if let Err(e) = self.transport.write(
                            peer,
                            view,
                            region::commit_record_offset(),
                            &region::commit_record(view, c),
                        ) {
                            self.note_refused_write(peer, &e);
                            log::debug!("commit heartbeat to node {peer}: {e}");
                        }
                    }
                    self.transport.flush();
                    sent = c;
                    last_send = Instant::now();
                }
            }
            // A timer, not the doorbell: under load the commit rides on
            // every entry's header, and waking on each entry would cost a
            // context switch here and, through the commit write, in every
            // backup's threads. Short, because when no entry follows, this
            // is how backups learn the commit and apply (bench follower's
            // apply latency: ~10 ms at a 10 ms period).
            std::thread::sleep(HEARTBEAT);
        }
    }

    /// A node whose server exited can neither serve clients nor apply the
    /// log: it steps down and goes stale (leaving the election, so that
    /// another node leads at once) until its server and follower are
    /// restarted and rebuild the server from the log.
    pub(super) fn check_server(&self) {
        // A server attached once in this follower's life (its pid word is
        // set), and its lock is gone.
        let pid = self.region.preload_pid();
        if !crate::protocol::stale::server_exited(
            pid,
            self.region.server_attached(),
            self.stale.load(Ordering::Relaxed),
        ) {
            return;
        }
        log::error!(
            "node {}: its server (pid {pid}) exited; this node serves nothing until its server and follower are restarted",
            self.me
        );
        // Stale first: once demoted, the election thread must not find a
        // non-stale candidate that no longer leads and start a view for it.
        self.go_stale(format!("its server (pid {pid}) exited"));
        self.demote_self("its server exited");
    }
}
