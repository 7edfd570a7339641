//! How the leader tags the entries it appends, free of I/O: whether an
//! entry was read in the same event-loop turn as the one before
//! (`SAME_TURN`), how many waits its thread entered since its last logged
//! turn, which loop's turn it is, and which entry of a read carries the
//! output digest. `Engine` tags its appends with it; so does the replay
//! simulation's leader, so the backups there replay what the real leader
//! logs.

use lockstep_common::entry::{EntryHeader, Kind, RETURNED, SAME_TURN};

/// A server thread's turn as the leader counts it (`turns::current`): its
/// slot and the waits it entered; None for a thread that never waited.
pub type ThreadTurn = Option<(usize, u64)>;

/// The tags of one append: its first entry's, then those of the later
/// chunks of the same read.
pub struct AppendTags {
    fields: EntryHeader,
    flags: u8,
    out_hash: u64,
    waits: u32,
}

impl AppendTags {
    /// An append of `kind` for `conn` in `view`, of time `time_us`, by a
    /// thread in turn `here`, the writer's previous entry having been
    /// appended in turn `*last` (now `here`). `log_turn` gives the waits
    /// since the thread's last logged turn (`turns::log_turn`) and is asked
    /// only for a turn's first entry; `thread_loop` is the loop of the
    /// thread's turn (a `TICK` names its own: its `conn`). `out_hash`: the
    /// connection's output digest since its last input.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: Kind,
        view: u64,
        conn: u64,
        out_hash: u64,
        time_us: u64,
        here: ThreadTurn,
        last: &mut ThreadTurn,
        thread_loop: Option<u64>,
        log_turn: impl FnOnce() -> u32,
    ) -> AppendTags {
        let flags = if here.is_some() && *last == here {
            SAME_TURN
        } else {
            0
        };
        *last = here;
        let mut fields = EntryHeader::new(kind, view, 0, conn, 0);
        fields.time_us = time_us;
        let waits = if flags == 0 && here.is_some() {
            log_turn()
        } else {
            0
        };
        fields.turn_loop = match kind {
            Kind::Tick => Some(conn),
            _ => thread_loop,
        }
        .and_then(|l| u16::try_from(l).ok());
        AppendTags {
            fields,
            flags,
            out_hash,
            waits,
        }
    }

    /// Flags the append's input as read after the function that called its
    /// turn's wait returned (`RETURNED`, on its first entry; see
    /// `stack_depth`).
    pub fn returned(mut self, yes: bool) -> AppendTags {
        if yes {
            self.flags |= RETURNED;
        }
        self
    }

    /// The next entry's fields: the first carries the digest, the append's
    /// flags and the turn's waits; a later chunk of the same read is
    /// `SAME_TURN` with neither (a backup checks the digest where the input
    /// begins, and counts a turn's waits once).
    pub fn entry(&mut self) -> &EntryHeader {
        self.fields.out_hash = std::mem::take(&mut self.out_hash);
        self.fields.flags = std::mem::replace(&mut self.flags, SAME_TURN);
        self.fields.waits = std::mem::take(&mut self.waits);
        &self.fields
    }
}

/// The entry that ends a logged turn (`Engine::close_turn`): a `TIME` with
/// read index 0, in the same turn, at the thread's time `time_us`, of its
/// loop `thread_loop`.
pub fn turn_end(view: u64, time_us: u64, thread_loop: Option<u64>) -> EntryHeader {
    let mut fields = EntryHeader::new(Kind::Time, view, 0, 0, 0);
    fields.flags = SAME_TURN;
    fields.time_us = time_us;
    fields.turn_loop = thread_loop.and_then(|l| u16::try_from(l).ok());
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_first_entry_counts_its_waits_and_the_rest_join_it() {
        let mut last = None;
        let here = Some((0, 7));
        let mut asked = 0;
        let mut first = AppendTags::new(
            Kind::Data,
            1,
            5,
            99,
            1_000,
            here,
            &mut last,
            Some(2),
            || {
                asked += 1;
                3
            },
        );
        let a = *first.entry();
        assert_eq!(
            (a.flags, a.waits, a.out_hash, a.turn_loop),
            (0, 3, 99, Some(2))
        );
        let b = *first.entry();
        assert_eq!(
            (b.flags, b.waits, b.out_hash),
            (SAME_TURN, 0, 0),
            "a later chunk of the same read"
        );
        let mut second = AppendTags::new(
            Kind::Data,
            1,
            6,
            42,
            1_000,
            here,
            &mut last,
            Some(2),
            || {
                asked += 1;
                9
            },
        );
        let c = *second.entry();
        assert_eq!(
            (c.flags, c.waits, c.out_hash),
            (SAME_TURN, 0, 42),
            "another input of the same turn: its own digest"
        );
        assert_eq!(asked, 1, "the waits are asked once per turn");
        let mut tick = AppendTags::new(
            Kind::Tick,
            1,
            4,
            0,
            2_000,
            Some((0, 8)),
            &mut last,
            Some(2),
            || 1,
        );
        let t = *tick.entry();
        assert_eq!(
            (t.flags, t.waits, t.turn_loop),
            (0, 1, Some(4)),
            "a TICK names its loop"
        );
        let mut outside =
            AppendTags::new(Kind::Accept, 1, 0, 0, 2_000, None, &mut last, None, || 5);
        assert_eq!(outside.entry().flags, 0, "a thread that never waited");
        assert_eq!(turn_end(1, 3_000, Some(2)).flags, SAME_TURN);
    }
}
