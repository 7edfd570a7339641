//! Majorities: the one definition every part of lockstep counts with.
//!
//! A seq is committed once a majority of the cluster's nodes (the leader
//! included) acknowledged it in the leader's view; any two majorities of
//! the same membership meet, which is what lets a view change find every
//! committed entry.

/// Smallest number of nodes that is a majority of `n` nodes.
pub fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// The highest seq that at least `need` of `acks` reach: the commit point
/// the ack array proves (0 when fewer than `need` slots are given).
///
/// `acks` holds one highest-acknowledged seq per member. Allocation-free
/// for clusters of up to 15 nodes (the region's limit), so the preload may
/// call it on its hot path.
pub fn acked_by(acks: &[u64], need: usize) -> u64 {
    if need == 0 || acks.len() < need {
        return 0;
    }
    let mut top = [0u64; 16];
    let n = acks.len().min(top.len());
    top[..n].copy_from_slice(&acks[..n]);
    let top = &mut top[..n];
    top.sort_unstable_by(|a, b| b.cmp(a));
    top[need - 1]
}

/// The highest value at least `need` of `ids` reach, reading each id's
/// value with `value` (an ack slot, an applied mark): `acked_by` over them,
/// without allocating (ids beyond the region's 15 nodes are ignored).
pub fn reached_by(
    ids: impl IntoIterator<Item = u64>,
    need: usize,
    value: impl Fn(u64) -> u64,
) -> u64 {
    let mut vals = [0u64; 16];
    let mut n = 0;
    for id in ids.into_iter().take(vals.len()) {
        vals[n] = value(id);
        n += 1;
    }
    acked_by(&vals[..n], need)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn majorities() {
        assert_eq!(majority(1), 1);
        assert_eq!(majority(2), 2);
        assert_eq!(majority(3), 2);
        assert_eq!(majority(4), 3);
        assert_eq!(majority(5), 3);
    }

    #[test]
    fn the_commit_point_is_the_majoritys_lowest_ack() {
        assert_eq!(acked_by(&[10, 7, 3], 2), 7);
        assert_eq!(acked_by(&[3, 7, 10], 2), 7);
        assert_eq!(acked_by(&[5, 0, 0], 2), 0);
        assert_eq!(acked_by(&[5], 1), 5);
        assert_eq!(acked_by(&[5, 6], 3), 0);
        assert_eq!(acked_by(&[], 0), 0);
        assert_eq!(reached_by([1, 2, 3], 2, |id| [0, 10, 7, 3][id as usize]), 7);
    }

    proptest! {
        #[test]
        fn a_majority_reaches_the_point_and_none_reaches_beyond(
            acks in proptest::collection::vec(0u64..50, 1..15)
        ) {
            let need = majority(acks.len());
            let c = acked_by(&acks, need);
            prop_assert!(acks.iter().filter(|&&a| a >= c).count() >= need);
            prop_assert!(acks.iter().filter(|&&a| a > c).count() < need);
        }
    }
}
