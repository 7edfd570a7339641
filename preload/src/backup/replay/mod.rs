//! A backup's replay: its server re-executes the committed log, in log
//! order, through its own event loop.
//!
//! The follower copies committed entries into the region's apply ring (see
//! the follower's `feed` module for why). Here the replay turns them into
//! what the server sees from real clients:
//!
//! - `ACCEPT`: the replay opens a TCP connection to the server's own app
//!   listener; the server accepts it like any client, and the accept hook
//!   recognises it by its source port (a *replay connection*).
//! - `DATA`: the server reads the entry's bytes from the log: the read
//!   hook copies them out of the log (`Replay::serve`), and the wait hooks report
//!   the connection readable while the log holds bytes for it. No byte
//!   goes through the socket: a loopback write, its TCP processing and the
//!   server's read syscall cost about four times what the server's own
//!   work on a small command does (measured with `perf`: apply went from
//!   58k to 230k entries/s on 2 cores).
//! - `CLOSE`: the wait hooks report the connection readable in log order
//!   and its read gets the end; the replay shuts its end down after that.
//! - `VIEW`: every replay connection ends (the new view's clients connect
//!   to its leader).
//! - `TICK`: a turn of the leader's server that read no input but moved
//!   its clock (see `clock`): the named loop's thread (see `loops`) runs
//!   one turn at the tick's time — its wait returns without blocking (its
//!   alarm wakes it) — and the tick is done when it waits again.
//!
//! Only one *turn* is in flight: the entries the leader's server read in
//! one event-loop turn (the leader flags them, `entry::SAME_TURN`), for at
//! most `turns::batch_width` connections (see `machine::joins`): the
//! connections it accepted in one go, before or after its inputs, and the
//! inputs and EOFs it read, a connection again when the server read it
//! again in that turn (a server that reads until EAGAIN got more while it
//! worked; Redis's loop going on after a script let it run) but nothing of
//! it after its EOF. The next turn starts once the
//! server read the last and went back to its event loop (the
//! `epoll_wait`/`poll`/`select` hooks tell: by then it wrote whatever it
//! answers). That keeps the leader's exact cross-connection order, and each
//! reply lands in the same per-input interval as on the leader, without any
//! round trip to another process. Within a turn the server takes the
//! connections in log order: an epoll wait returns them first, in that
//! order, the listener before them when the leader accepted first
//! (`region_host::merge_events`); a server that scans (`poll`, `select`) is
//! handed one connection per turn (it handles a wait's result in an order
//! of its own). A read stops where the leader's read stopped, and a read
//! of a connection whose next entry comes after entries of others still
//! unread gets nothing yet (EAGAIN), so the server's reads and its clock
//! reads follow the leader's. Entries of different leader turns never
//! share one: a server that changes a connection's interest between turns
//! (beanstalkd sends a reply in the turn after the request) sees them as
//! its leader did.
//!
//! Each input's output check runs when the server reads it (its bytes or
//! its EOF): the leader's digest covers what its server wrote between its
//! reads of the connection's previous input and this one (see
//! `output_check`).
//!
//! Splitting a leader's turn is not harmless: whatever a server does once
//! per loop iteration (checking its timers) then runs between inputs the
//! leader's server read in one iteration, and a due timer runs earlier on
//! the backup. The simulation (`sim`) found that for accept loops, a
//! connection read again after a busy command, EOFs and a script letting
//! the loop run; an epoll server's turn is split now only past its
//! `maxevents`. A scanning server's still is (one connection per turn).
//!
//! The replay advances from the hooks themselves (the server thread that
//! re-enters its event loop takes the next turn, which its wait then
//! reports at once) and, when the server is idle, from a small applier
//! thread parked on the apply doorbell. The log's bytes make no fd ready,
//! so that thread wakes a server blocked in its wait with one byte into
//! the turn's first connection (the *bell*), which the wait hook takes out
//! again. A server that never waits in one of those calls is still served:
//! a consumed turn is taken as handled after `TURN_PATIENCE`. Replay
//! connections must be non-blocking (a read with nothing in the log gets
//! EAGAIN), as in every event-loop server.
//!
//! The server's replies on replay connections are dropped in the write hook
//! without a syscall. Their digest is compared, entry by entry, with the
//! digest the leader logged with the connection's next input: a divergence
//! names the connection, the seq whose output differed and the first bytes
//! this server wrote.
//!
//! # Layout
//!
//! - [`machine`]: the decisions ([`Replay`]), free of I/O: which turn the
//!   server runs, when and on which loop, what a clock read inside it
//!   reads, when it is over, what the output check says.
//! - [`host`]: what the machine asks of the world ([`Host`]): the log's
//!   entries, the server threads' wait counts, sockets, the clock. The
//!   preload's host is `region_host` (region, turn counters, real sockets); the
//!   tests' is a simulation with model event-loop servers (`sim`).

pub mod host;
pub mod machine;
#[cfg(test)]
mod sim;

pub use host::Host;
pub use machine::{Replay, Served};
