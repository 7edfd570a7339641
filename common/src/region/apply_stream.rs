//! The apply stream's words in the control block (the apply ring itself is
//! [`Region::apply_ring`](super::Region::apply_ring)).

use std::sync::atomic::{AtomicU64, Ordering};

use super::layout::*;
use super::Doorbell;

/// The apply stream: how committed entries reach a backup's server.
///
/// The follower copies committed entries, in log order, into the region's
/// apply ring (from the replication ring or from RocksDB: live, after a
/// catch-up, on a restart alike) and publishes `tail`; the server's passive
/// preload reads them, presents them to its server through the server's own
/// event loop, and publishes how far the ring was read (`head`: the
/// follower's flow control) and the last seq the server consumed
/// (`applied`). `epoch` and `start_seq` tell the preload that the follower
/// started a new stream (a fresh follower, a demoted leader resuming).
#[derive(Clone, Copy, Debug)]
pub struct ApplyStream<'a> {
    pub(super) words: &'a [AtomicU64],
}

impl<'a> ApplyStream<'a> {
    fn w(&self, i: usize) -> &'a AtomicU64 {
        &self.words[i]
    }
    /// Follower: starts a new stream whose first entry is `seq`, at apply
    /// ring position 0 (nothing may be in the ring then).
    pub fn restart(&self, seq: u64) {
        self.w(W_APPLY_TAIL).store(0, Ordering::Release);
        self.w(W_APPLY_HEAD).store(0, Ordering::Release);
        self.w(W_APPLIED)
            .store(seq.saturating_sub(1), Ordering::Release);
        self.w(W_APPLY_START_SEQ).store(seq, Ordering::Release);
        self.w(W_APPLY_EPOCH).fetch_add(1, Ordering::AcqRel);
        self.bell().ring();
    }
    /// Follower: goes on with a stream a restored server's preload already
    /// reads (the image recorded it): stream `epoch` begun at `start_seq`,
    /// read and applied up to ring position `pos` and seq `applied`. The
    /// preload keeps its replay connections; the follower writes on at
    /// `pos`.
    pub fn resume(&self, epoch: u64, start_seq: u64, pos: u64, applied: u64, waiters: u64) {
        // The restored applier thread leaves the wait it was parked in
        // (and counted) when its image was taken.
        self.w(W_APPLY_BELL_WAITERS)
            .store(waiters, Ordering::SeqCst);
        self.w(W_APPLY_TAIL).store(pos, Ordering::Release);
        self.w(W_APPLY_HEAD).store(pos, Ordering::Release);
        self.w(W_APPLIED).store(applied, Ordering::Release);
        self.w(W_APPLY_START_SEQ)
            .store(start_seq, Ordering::Release);
        self.w(W_APPLY_EPOCH).store(epoch, Ordering::Release);
        self.bell().ring();
    }
    /// The current stream: (epoch, seq of its first entry).
    pub fn epoch(&self) -> (u64, u64) {
        let e = self.w(W_APPLY_EPOCH).load(Ordering::Acquire);
        (e, self.w(W_APPLY_START_SEQ).load(Ordering::Acquire))
    }
    /// End position of what the follower wrote.
    pub fn tail(&self) -> u64 {
        self.w(W_APPLY_TAIL).load(Ordering::Acquire)
    }
    /// Follower: publishes the end position of what it wrote.
    pub fn set_tail(&self, pos: u64) {
        self.w(W_APPLY_TAIL).store(pos, Ordering::Release);
        self.bell().ring();
    }
    /// Position up to which the preload read the ring (space before it
    /// may be reused).
    pub fn head(&self) -> u64 {
        self.w(W_APPLY_HEAD).load(Ordering::Acquire)
    }
    /// Preload: publishes how far it read (and rings
    /// [`Self::progress_bell`]).
    pub fn set_head(&self, pos: u64) {
        self.release(pos);
        self.progress_bell().ring();
    }
    /// Preload: publishes how far it read without ringing: the follower
    /// waits on the bell for the server's progress, which the turn's end
    /// rings; a ring here too woke it twice per turn. (A follower waiting
    /// for space in a full ring sees it at its wait's timeout.)
    pub fn release(&self, pos: u64) {
        self.w(W_APPLY_HEAD).store(pos, Ordering::Release);
    }
    /// Last seq the server consumed.
    pub fn applied(&self) -> u64 {
        self.w(W_APPLIED).load(Ordering::Acquire)
    }
    /// Preload: records that the server consumed up to `seq` (and rings
    /// [`Self::progress_bell`]).
    pub fn set_applied(&self, seq: u64) {
        self.w(W_APPLIED).store(seq, Ordering::Release);
        self.progress_bell().ring();
    }
    /// Entries whose output on this node differed from the leader's.
    pub fn diverged(&self) -> u64 {
        self.w(W_DIVERGED).load(Ordering::Acquire)
    }
    /// Preload: counts one divergent entry.
    pub fn add_diverged(&self) {
        self.w(W_DIVERGED).fetch_add(1, Ordering::AcqRel);
    }
    /// How many threads wait on [`Self::bell`] now (what an image of the
    /// server records, see `resume`).
    pub fn bell_waiters(&self) -> u64 {
        self.w(W_APPLY_BELL_WAITERS).load(Ordering::SeqCst)
    }
    /// The doorbell the follower's apply thread parks on while the server
    /// works through what it was fed (a full apply ring, entries fed and
    /// not yet consumed): the preload rings it as each turn of the server
    /// ends (not as a turn takes entries: see [`Self::release`]). A ring
    /// with nobody parked costs an atomic add and a load.
    pub fn progress_bell(&self) -> Doorbell<'a> {
        Doorbell::new(self.w(W_PROGRESS_BELL), self.w(W_PROGRESS_BELL_WAITERS))
    }
    /// How many threads wait on [`Self::progress_bell`] now.
    pub fn progress_bell_waiters(&self) -> u64 {
        self.w(W_PROGRESS_BELL_WAITERS).load(Ordering::SeqCst)
    }
    /// The doorbell the preload's applier parks on (rung on every new tail
    /// and restart).
    pub fn bell(&self) -> Doorbell<'a> {
        Doorbell::new(self.w(W_APPLY_BELL), self.w(W_APPLY_BELL_WAITERS))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_regions::spec;
    use super::super::{apply_ring_size, Region};

    #[test]
    fn the_servers_progress_rings_the_progress_bell_and_wakes_a_parked_follower() {
        let r = std::sync::Arc::new(Region::anonymous(&spec(1)).unwrap());
        let bell = r.apply().progress_bell();
        let seen = bell.value();
        r.apply().set_head(64);
        assert_ne!(bell.value(), seen, "reading on rings it");
        let seen = bell.value();
        r.apply().set_applied(5);
        assert_ne!(bell.value(), seen, "consuming rings it");
        let seen = bell.value();
        r.apply().release(128);
        assert_eq!(r.apply().head(), 128);
        assert_eq!(bell.value(), seen, "taking entries into a turn does not");
        // A follower parked on it (for far longer than the test) is woken
        // by the preload's next progress.
        let seen = bell.value();
        let r2 = r.clone();
        let parked = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            r2.apply()
                .progress_bell()
                .wait(seen, std::time::Duration::from_secs(60));
            start.elapsed()
        });
        while r.apply().progress_bell_waiters() == 0 {
            std::thread::yield_now();
        }
        r.apply().set_applied(6);
        assert!(parked.join().unwrap() < std::time::Duration::from_secs(60));
    }

    #[test]
    fn the_apply_ring_follows_the_ring_and_is_not_remotely_writable() {
        let r = Region::anonymous(&spec(1)).unwrap();
        assert_eq!(r.ring().len() * 8, 1 << 20);
        assert_eq!(r.apply_ring().len() * 8, 1 << 20);
        assert_eq!(r.len(), spec(1).file_len());
        let end_of_ring = spec(1).remote_len();
        assert!(r.write(end_of_ring - 8, &[1; 8]).is_ok());
        assert!(r.write(end_of_ring, &[1; 8]).is_err());
        let a = r.apply();
        a.restart(40);
        assert_eq!(a.epoch(), (1, 40));
        assert_eq!(a.applied(), 39);
        a.set_tail(128);
        a.set_head(64);
        a.restart(50);
        assert_eq!((a.epoch(), a.tail(), a.head()), ((2, 50), 0, 0));
        a.resume(7, 30, 4096, 99, 1);
        assert_eq!(a.bell_waiters(), 1);
        assert_eq!(
            (a.epoch(), a.tail(), a.head(), a.applied()),
            ((7, 30), 4096, 4096, 99)
        );
        assert_eq!(apply_ring_size(64 << 20), 16 << 20);
        assert_eq!(apply_ring_size(1 << 20), 1 << 20);
    }
}
