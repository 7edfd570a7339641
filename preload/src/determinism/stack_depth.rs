//! Where on its stack a server thread reads, against where it waited.
//!
//! Redis keeps one array of fired events. A busy script lets the event
//! loop run inside it (`processEventsWhileBlocked`): those nested waits
//! overwrite the array, and once the script ends the outer loop goes on
//! over the array up to its own wait's count — over entries a nested wait
//! left there. So Redis may read a client after the script ended, in the
//! turn of its last nested wait, with no wait in between: the leader's log
//! shows that input one wait after the nested wait, and a backup handed
//! it at its next nested wait would read it inside the script (`-BUSY`
//! where the leader answered). Wait counts cannot tell the two apart; the
//! stack can: such a read runs shallower than the thread's reads usually
//! run against their wait, by the depth of the frames that had called the
//! nested wait.
//!
//! The leader flags an input its server read so (`entry::RETURNED`); a
//! backup's server gets a flagged input only once it too reads from at
//! least as far out as the wait that started the turn — from the same
//! stale entry, or after a wait of its outer loop. Both sides measure the
//! same way at the same hooks, so a server's reads compare alike on every
//! replica.

use std::cell::Cell;

/// How much shallower than the thread's usual reads (against the wait that
/// preceded them) a read must run to count as one made after the function
/// that called the wait returned. Redis's nested loop inside a script is
/// about 1.7 KiB deeper than its outer loop; the reads of one server's
/// loop run at one depth against their wait, within a few hundred bytes.
pub const RETURNED_BY: i64 = 1024;

/// One thread's marks: where it last waited, and how far above its wait
/// its reads usually run (the least distance seen).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackMarks {
    wait: u64,
    usual: Option<i64>,
    read: u64,
}

impl StackMarks {
    /// No wait and no read seen.
    pub const NEW: StackMarks = StackMarks {
        wait: 0,
        usual: None,
        read: 0,
    };

    /// The thread enters a wait at stack address `sp`.
    pub fn waited(&mut self, sp: u64) {
        self.wait = sp;
    }

    /// Where the thread last waited (0: never).
    pub fn last_wait(&self) -> u64 {
        self.wait
    }

    /// The thread reads at stack address `sp`: whether that read runs
    /// further out than its usual reads against its last wait.
    pub fn read(&mut self, sp: u64) -> bool {
        self.read = sp;
        if self.wait == 0 {
            return false;
        }
        let rel = sp as i64 - self.wait as i64;
        let usual = *self.usual.get_or_insert(rel);
        self.usual = Some(usual.min(rel));
        rel > usual + RETURNED_BY
    }

    /// The thread's read is over: no read is current.
    pub fn read_done(&mut self) {
        self.read = 0;
    }

    /// Whether the thread's current read runs further out than its usual
    /// reads against the wait at `since` (a wait of this thread's, maybe
    /// not its last).
    pub fn read_returned_from(&self, since: u64) -> bool {
        match (self.usual, since) {
            (Some(usual), s) if s != 0 && self.read != 0 => {
                self.read as i64 - s as i64 > usual + RETURNED_BY
            }
            _ => false,
        }
    }
}

thread_local! {
    static MARKS: Cell<StackMarks> = const { Cell::new(StackMarks::NEW) };
}

/// Changes the calling thread's marks.
fn update(f: impl FnOnce(&mut StackMarks)) {
    let _ = MARKS.try_with(|c| {
        let mut m = c.get();
        f(&mut m);
        c.set(m);
    });
}

/// The calling thread enters a wait at stack address `sp`.
pub fn waited(sp: u64) {
    update(|m| m.waited(sp));
}

/// A read hook of the calling thread runs (see [`reading`]).
pub struct Reading(());

impl Drop for Reading {
    fn drop(&mut self) {
        update(StackMarks::read_done);
    }
}

/// The calling thread reads at stack address `sp` (see
/// [`StackMarks::read`]) until the returned guard goes (the read hook
/// ends).
pub fn reading(sp: u64) -> Reading {
    update(|m| {
        m.read(sp);
    });
    Reading(())
}

/// Whether the calling thread is in a read that runs further out than
/// usual against its last wait (the leader flags the input it logs).
pub fn read_returned() -> bool {
    MARKS
        .try_with(|c| {
            let m = c.get();
            m.read_returned_from(m.last_wait())
        })
        .unwrap_or(false)
}

/// Where the calling thread last waited.
pub fn last_wait() -> u64 {
    MARKS.try_with(|c| c.get().last_wait()).unwrap_or(0)
}

/// Whether the calling thread's current read runs further out than usual
/// against its wait at `since`.
pub fn read_returned_from(since: u64) -> bool {
    MARKS
        .try_with(|c| c.get().read_returned_from(since))
        .unwrap_or(false)
}

/// The caller's stack address (a local of this function, which the
/// compiler keeps out of line: its frame sits right below the caller's).
#[inline(never)]
pub fn here() -> u64 {
    let probe = 0u8;
    std::hint::black_box(&probe) as *const u8 as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_from_an_outer_frame_after_a_nested_wait_counts_as_returned() {
        let mut m = StackMarks::NEW;
        // The outer loop waits at 100_000 and reads 300 bytes above it.
        m.waited(100_000);
        assert!(!m.read(100_300));
        // A nested loop 1.7 KiB deeper reads as usual against its wait.
        m.waited(98_300);
        assert!(!m.read(98_600));
        assert!(!m.read_returned_from(98_300));
        // The outer loop goes on over the stale fired entry: its read runs
        // 1.7 KiB further out than reads usually run against that wait.
        assert!(m.read(100_300));
        assert!(m.read_returned_from(98_300));
        assert!(m.read_returned_from(m.last_wait()), "read's verdict, kept");
        m.read_done();
        assert!(!m.read_returned_from(98_300), "no read is current");
        // After the outer loop waited again, reads are usual against it,
        // and still further out than the nested wait.
        m.waited(100_000);
        assert!(!m.read(100_300));
        assert!(m.read_returned_from(98_300));
    }

    #[test]
    fn nothing_counts_before_a_wait_and_a_read() {
        let mut m = StackMarks::NEW;
        assert!(!m.read(5_000));
        assert!(!m.read_returned_from(1_000));
        m.waited(1_000);
        assert!(!m.read_returned_from(0));
    }
}
