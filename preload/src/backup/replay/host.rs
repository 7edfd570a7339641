//! What the replay machine asks of the world around it.
//!
//! The machine ([`super::Replay`]) decides; a [`Host`] reads the log, knows
//! the server's threads and carries out the machine's effects. The preload's
//! host (`region_host`) does that over the region, the turn counters and real
//! sockets; the simulation (`replay::sim`, tests) over an in-memory ring and
//! model servers whose threads it schedules itself.
//!
//! Why calls rather than events in and actions out: the machine pulls the
//! log lazily — a clock read inside a turn takes the next clock record only
//! when the read needs it, and an entry of the next turn is held back — so
//! it must ask for entries in the middle of a decision. Every other effect
//! is a call that returns nothing the machine depends on, except
//! [`Host::connect`] (whether a replay connection could be opened).

use std::time::Duration;

use lockstep_common::entry::EntryHeader;

/// The world the replay machine runs in. "The calling thread" is the server
/// thread (or the applier) whose hook entered the machine.
pub trait Host {
    /// The apply stream to read: `(epoch, first seq)`; `None` while nothing
    /// is to be applied (this node leads, or took over an image whose
    /// identity it cannot take).
    fn stream(&mut self) -> Option<(u64, u64)>;
    /// A new stream starts: read it from its beginning, whose first entry
    /// has seq `start`.
    fn read_from(&mut self, start: u64);
    /// The next entry of the stream: its header and the position just past
    /// it; its bytes (header included) are in `buf`.
    fn next_entry(&mut self, buf: &mut Vec<u8>) -> Option<(EntryHeader, u64)>;
    /// The stream up to `pos` was handled: the follower may reuse it.
    fn set_head(&mut self, pos: u64);
    /// The stream up to `pos` was taken into the turn in flight: the
    /// follower may reuse it (not woken for it: the turn's end wakes it).
    fn release(&mut self, pos: u64);
    /// Every entry up to `seq` was applied.
    fn set_applied(&mut self, seq: u64);
    /// One more divergence was counted.
    fn diverged(&mut self);

    /// The calling thread's slot (see `turns`).
    fn slot(&self) -> usize;
    /// How many waits thread `slot` entered so far.
    fn waits(&self, slot: usize) -> u64;
    /// Whether thread `slot` runs between a wait's return and its next.
    fn running(&self, slot: usize) -> bool;
    /// Whether the calling thread entered `waits` waits since the last turn
    /// of `view` it was handed (see `turns::due`).
    fn due(&self, view: u64, waits: u32) -> bool;
    /// The calling thread starts a turn of `view` it was handed.
    fn handed(&mut self, view: u64);
    /// How many connections one turn may hand over.
    fn batch_width(&self) -> usize;
    /// Whether the server waits to write more to `fd` (a reply sent over
    /// several turns).
    fn wants_write(&self, fd: i32) -> bool;
    /// The event loop that waits for `fd` (diagnostics only).
    fn loop_of(&self, fd: i32) -> Option<u64>;
    /// Where on its stack the calling thread last waited (see
    /// `stack_depth`; 0: not known).
    fn wait_mark(&self) -> u64;
    /// Whether the calling thread's current read runs further out on its
    /// stack than its reads usually run against its wait at `since`: the
    /// function that called that wait returned (see `stack_depth`).
    fn read_returned_from(&self, since: u64) -> bool;

    /// The log reached an entry of time `us` (see `clock::enter_input`).
    fn enter_input(&mut self, us: u64);
    /// The calling thread starts the turn beginning at seq `turn`, of time
    /// `us` (see `clock::enter_turn`).
    fn enter_turn(&mut self, turn: u64, us: u64);
    /// The calling thread consumed the input whose last entry is `anchor`
    /// (see `clock::enter_window`).
    fn enter_window(&mut self, turn: u64, anchor: u64, us: u64);

    /// Opens replay connection `conn` to the server (it accepts it in its
    /// event loop): false when it cannot.
    fn connect(&mut self, conn: u64) -> bool;
    /// The log ended `conn`: the server reads EOF once it read the rest.
    fn shut_write(&mut self, conn: u64);
    /// `conn` is gone (a view change or a new stream).
    fn disconnect(&mut self, conn: u64);
    /// Wakes a server blocked in its wait through `conn` (its fd
    /// `server_fd`) when no bell is outstanding.
    fn ring_bell(&mut self, conn: u64, server_fd: i32);
    /// The server closed `server_fd`: a bell rung into it is gone.
    fn bell_gone(&mut self, server_fd: i32);
    /// Wakes event loop `id` from its wait (its alarm).
    fn wake_loop(&mut self, id: u64);

    /// A monotonic clock (patience and warnings only, never the server's
    /// time).
    fn now(&self) -> Duration;
}
