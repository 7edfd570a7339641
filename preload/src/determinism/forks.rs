//! The server's children by the order it forked them.
//!
//! A child's pid is not the same on every replica: the preload's own
//! threads (a backup's applier) take pids in the server's PID namespace
//! too. The order in which the server forks is the same everywhere (the
//! same code runs the same log), so a child is named in the log by its
//! fork's ordinal ([`super::turn_time::Child`]), and each replica finds its
//! own copy of that child here.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Forks remembered (the oldest are forgotten; a server has a child or
/// two at a time).
const KEPT: usize = 64;

/// Forks so far.
static FORKS: AtomicU32 = AtomicU32::new(0);
/// Fork `n`'s child at `n % KEPT`: (n << 32) | pid, or 0.
static CHILDREN: [AtomicU64; KEPT] = [const { AtomicU64::new(0) }; KEPT];

/// The server forked child `pid` (in the parent, after `fork` returned).
pub fn forked(pid: i32) {
    let n = FORKS.fetch_add(1, Ordering::AcqRel);
    CHILDREN[n as usize % KEPT].store(pack(n, pid), Ordering::Release);
}

/// The ordinal of the fork that made child `pid` (None: not one of the
/// remembered forks).
pub fn ordinal_of(pid: i32) -> Option<u32> {
    CHILDREN
        .iter()
        .map(|c| c.load(Ordering::Acquire))
        .filter(|&v| v != 0)
        .map(unpack)
        .find(|&(_, p)| p == pid)
        .map(|(n, _)| n)
}

/// The pid of fork `n`'s child here (None: not remembered).
pub fn pid_of(n: u32) -> Option<i32> {
    let v = CHILDREN[n as usize % KEPT].load(Ordering::Acquire);
    let (m, pid) = unpack(v);
    (v != 0 && m == n).then_some(pid)
}

fn pack(n: u32, pid: i32) -> u64 {
    // Fork 0 of pid 0 never happens (fork returns a positive pid), so 0
    // stays "none".
    (u64::from(n) << 32) | u64::from(pid as u32)
}

fn unpack(v: u64) -> (u32, i32) {
    ((v >> 32) as u32, v as u32 as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_found_by_its_fork_and_back() {
        let base = FORKS.load(Ordering::Acquire);
        forked(4242);
        forked(4343);
        assert_eq!(ordinal_of(4242), Some(base));
        assert_eq!(ordinal_of(4343), Some(base + 1));
        assert_eq!(pid_of(base + 1), Some(4343));
        assert_eq!(ordinal_of(1), None);
        assert_eq!(pid_of(base + 2), None);
        assert_eq!(unpack(pack(7, -1)), (7, -1));
    }
}
