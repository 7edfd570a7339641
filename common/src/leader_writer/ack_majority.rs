//! The majority a leader counts over its region's ack array.

use crate::quorum;
use crate::region::Region;

/// The members of a cluster and how many of them make a majority: what a
/// leader needs to read a commit point off its region's ack array (or any
/// per-node mark, such as how far each backup applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckMajority {
    ids: Vec<u64>,
    need: usize,
}

impl AckMajority {
    /// The majority of the nodes `ids`.
    pub fn new(ids: &[u64]) -> AckMajority {
        AckMajority {
            ids: ids.to_vec(),
            need: quorum::majority(ids.len()),
        }
    }

    /// The member ids.
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    /// How many members make a majority.
    pub fn need(&self) -> usize {
        self.need
    }

    /// The highest value a majority of the members reach, reading each
    /// member's value with `value`. Allocation-free.
    pub fn reached_by(&self, value: impl Fn(u64) -> u64) -> u64 {
        quorum::reached_by(self.ids.iter().copied(), self.need, value)
    }

    /// The highest seq a majority acknowledged in `region` (the leader's).
    pub fn acked(&self, region: &Region) -> u64 {
        self.reached_by(|id| region.ack(id))
    }

    /// Whether a majority acknowledged `seq` in `region` (the leader's).
    pub fn has_acked(&self, region: &Region, seq: u64) -> bool {
        self.acked(region) >= seq
    }
}
