//! The static election's thread: the configured leader opens a view of
//! its own; a backup follows the leader's view when it missed it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use lockstep_common::control;

use crate::protocol::viewchange;

use super::Node;

impl Node {
    /// Static election: the configured leader opens every run with a view
    /// change of its own (it alone starts views, so no ZooKeeper is needed):
    /// a restarted leader thereby adopts entries the backups stored and
    /// acked that its own log lacks, instead of reusing their seqs. A backup
    /// that missed such a view change follows the leader's view when it
    /// sees it.
    pub(crate) fn static_loop(&self) {
        let leader = self.config.election.leader;
        while !self.stopping() {
            if leader == self.me {
                self.step_down_if_superseded();
                if !self.leading() && !self.stale.load(Ordering::Relaxed) {
                    match self.start_view(self.view_floor() + 1) {
                        Ok(v) => log::info!("node {}: leading view {v} (static election)", self.me),
                        Err(e) => log::warn!("node {}: {e:#}; retrying", self.me),
                    }
                }
            } else if let Ok(s) =
                control::query_status(&self.config, leader, Duration::from_secs(1))
            {
                if viewchange::follows_static(self.views(), s.view, s.role == "leader") {
                    if let Err(e) = self.follow(s.view, leader, None) {
                        log::warn!(
                            "node {}: following node {leader} in view {}: {e:#}",
                            self.me,
                            s.view
                        );
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}
