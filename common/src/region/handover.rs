//! The hand-over word: how far the leader's preload handed inputs to its
//! server, and the fence with which the follower stops it exactly.

use std::sync::atomic::Ordering;

use super::layout::{HANDOVER_FENCED, W_HANDOVER};
use super::Region;

impl Region {
    /// server now. False once the follower fenced hand-overs: the input
    /// must then not reach the server.
    pub fn hand_over(&self, seq: u64) -> bool {
        self.word(W_HANDOVER)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur & HANDOVER_FENCED == 0).then_some(cur.max(seq))
            })
            .is_ok()
    }
    /// Highest seq whose input the leader's preload handed to its server
    /// (fenced or not).
    pub fn served(&self) -> u64 {
        self.word(W_HANDOVER).load(Ordering::Acquire) & !HANDOVER_FENCED
    }
    /// Whether hand-overs are fenced (this node is not serving a view).
    pub fn handover_fenced(&self) -> bool {
        self.word(W_HANDOVER).load(Ordering::Acquire) & HANDOVER_FENCED != 0
    }
    /// Follower, when this node stops leading (or the leader's preload,
    /// once its follower is gone): stops every further hand-over and
    /// returns the highest seq the server was given. Exact: a hand-over
    /// either landed before the fence or fails.
    pub fn fence_handover(&self) -> u64 {
        self.word(W_HANDOVER)
            .fetch_or(HANDOVER_FENCED, Ordering::AcqRel)
            & !HANDOVER_FENCED
    }
    /// Follower, when this node starts leading after serving up to `seq`
    /// (by replay): hand-overs allowed again.
    pub fn open_handover(&self, seq: u64) {
        self.word(W_HANDOVER).store(seq, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_regions::spec;
    use super::super::Region;

    #[test]
    fn handover_fence_is_exact() {
        let r = Region::anonymous(&spec(1)).unwrap();
        r.open_handover(10);
        assert!(r.hand_over(12));
        assert!(r.hand_over(11), "an older seq keeps the highest");
        assert_eq!(r.fence_handover(), 12);
        assert!(!r.hand_over(13), "fenced: nothing more reaches the server");
        assert_eq!(r.fence_handover(), 12, "fencing twice reads the same");
        r.open_handover(20);
        assert!(r.hand_over(21));
        assert_eq!(r.fence_handover(), 21);
    }
}
