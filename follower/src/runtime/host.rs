//! [`StoreHost`]: what the replica reads synchronously — the stored log
//! (RocksDB) and the region's hand-over fence.

use crate::protocol::Host;

use super::Node;

/// The replica's view of this node's log and region.
pub(super) struct StoreHost<'a> {
    node: &'a Node,
}

impl<'a> StoreHost<'a> {
    pub(super) fn new(node: &'a Node) -> StoreHost<'a> {
        StoreHost { node }
    }
}

impl Host for StoreHost<'_> {
    fn last(&self) -> (u64, u64) {
        let last = self.node.store().last();
        (last.seq, last.view)
    }

    fn view_at(&self, seq: u64) -> Option<u64> {
        let store = self.node.store();
        // The entry a compacted log starts after is known by its view.
        if let Some(view) = store.base_view_at(seq) {
            return Some(view);
        }
        match store.get(seq) {
            Ok(e) => e.map(|e| e.header().view),
            Err(e) => {
                // Read as "no such entry": a sync then keeps less and
                // fetches more, never the other way round.
                log::error!("cannot read seq {seq} of the log: {e}");
                None
            }
        }
    }

    fn fence_handover(&mut self) -> u64 {
        self.node.region.fence_handover()
    }
}
