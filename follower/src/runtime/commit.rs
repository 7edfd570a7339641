//! Carries out the commit rules of [`crate::protocol::commit`]: a backup
//! learns the commit point from entry headers and commit records, a leader
//! raises its commit word from the ack array.

use std::sync::atomic::Ordering;

use crate::protocol::commit;

use super::Node;

impl Node {
    /// Takes `seq` as committed, unless a view change is under way: a
    /// commit point of another view's leader says nothing about a log that
    /// does not follow that leader yet.
    pub(crate) fn learn_commit(&self, seq: u64) {
        let (log_view, view) = (self.log_view.load(Ordering::Acquire), self.region.view());
        // From 0: what this view's commit point may become.
        self.committed
            .fetch_max(commit::learn(0, seq, log_view, view), Ordering::AcqRel);
    }

    /// Takes the commit point a leader wrote into this region, if that
    /// leader's view is the one this log follows: a newer leader's commit
    /// point arriving before this node joined its view would otherwise
    /// "commit" this log's uncommitted tail of the old view.
    pub(super) fn learn_remote_commit(&self) {
        let (seq, view) = self.region.commit_in_view();
        if let Some(seq) = commit::learn_record(
            view,
            seq,
            self.log_view.load(Ordering::Acquire),
            self.persisted.load(Ordering::Acquire),
        ) {
            self.learn_commit(seq);
        }
    }

    /// Leader: raises the commit word to what the ack array proves a
    /// majority stored, never past what the server was handed. The preload
    /// raises it when an output waits; this keeps it moving when none does
    /// (a client that only pipelines `noreply` commands), so backups apply.
    pub(super) fn raise_leader_commit(&self) -> u64 {
        let c = commit::leader_commit(
            self.config.ids(),
            self.config.majority(),
            |id| self.region.ack(id),
            self.region.served(),
        );
        self.region.raise_commit(c);
        self.region.commit()
    }
}
