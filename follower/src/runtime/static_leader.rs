//! The static election's thread: a backup tells the replica the configured
//! leader's view and whether it serves
//! ([`crate::protocol::Event::LeaderStatus`]); the replica follows it when
//! it missed its view change, and catches up once at start. (The
//! configured leader starts its views on the replica's ticks.)

use std::time::Duration;

use lockstep_common::control;

use crate::protocol::Event;

use super::carried::Carried;
use super::Node;

impl Node {
    /// Asks the configured leader for its status until `stop`.
    pub(crate) fn static_loop(&self) {
        let leader = self.config.election.leader;
        if leader == self.me {
            return;
        }
        while !self.stopping() {
            if let Ok(s) = control::query_status(&self.config, leader, Duration::from_secs(1)) {
                self.step(
                    Event::LeaderStatus {
                        view: s.view,
                        serving: s.role == "leader",
                    },
                    Carried::Nothing,
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}
