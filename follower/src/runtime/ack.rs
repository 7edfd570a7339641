//! What a backup posts into its leader's region: its ack and how far its
//! server applied.

use std::sync::atomic::Ordering;

use lockstep_common::region;

use super::Node;

impl Node {
    /// Posts `ack[me] = seq` into the leader's region.
    pub(crate) fn ack(&self, seq: u64) {
        let leader = self.region.leader();
        let view = self.region.view();
        if let Err(e) = self.transport.write(
            leader,
            view,
            region::ack_offset(self.me),
            &seq.to_le_bytes(),
        ) {
            log::warn!("ack {seq} to node {leader} failed: {e}");
        }
        self.transport.flush();
        self.metrics.acks.fetch_add(1, Ordering::Relaxed);
    }

    /// Tells the leader how far this node's server applied (the leader
    /// bounds the backups' apply lag with it: `max_apply_lag`).
    pub(super) fn report_applied(&self, seq: u64) {
        let leader = self.region.leader();
        if leader == 0 || leader == self.me {
            return;
        }
        let view = self.region.view();
        if let Err(e) = self.transport.write(
            leader,
            view,
            region::applied_by_offset(self.me),
            &seq.to_le_bytes(),
        ) {
            log::debug!("applied {seq} to node {leader}: {e}");
        }
        self.transport.flush();
    }
}
