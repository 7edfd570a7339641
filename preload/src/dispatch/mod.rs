//! What each hooked call does, in safe code: `hooks` calls in here before
//! and after the real call, and does what the returned value says.
//!
//! | fd class | role      | input call                                     |
//! |----------|-----------|------------------------------------------------|
//! | Client   | Leader    | real call, then DATA/CLOSE entries (input mode: |
//! |          |           | wait for the commit before returning)          |
//! | Client   | otherwise | fail the connection (accepted as leader)       |
//! | Replay   | any       | real call, tell the pump what was consumed     |
//! | Guest    | Leader    | fail the connection (was never replicated)     |
//! | Guest    | otherwise | pass through                                   |
//! | other    | any       | pass through (one table lookup)                |
//!
//! Output (write/send/close/shutdown) on a Client fd first waits until
//! every input appended so far is committed (output mode; see `engine`).
//! Output on a Replay fd is dropped without a syscall; the pump compares
//! its digest with the leader's (see `region_host`).
//!
//! A server thread's clock and child reads inside its turn go by role too
//! ([`turn_reads`]).

pub mod turn_reads;

use std::sync::atomic::{AtomicBool, Ordering};

use lockstep_common::config::BackupClients;
use lockstep_common::entry::{Kind, OutputDigest};
use lockstep_common::region::Role;

use crate::backup::region_host;
use crate::fdtable::{self, Class, Slot, CLOSED, FAILED, TABLE_SIZE};
use crate::leader::engine::{Engine, Fail};
use crate::leader::{held_output, turn_lock};
use crate::setup;
use crate::sys;
pub use turn_reads::poll_children;

/// What a hook returns: a value, and the errno to leave (None: the one the
/// real call left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ret {
    /// Return value.
    pub value: isize,
    /// errno to set.
    pub errno: Option<i32>,
}

impl Ret {
    /// The real call's own result.
    pub fn pass(value: isize) -> Ret {
        Ret { value, errno: None }
    }

    /// -1 with `errno`.
    pub fn err(errno: i32) -> Ret {
        Ret {
            value: -1,
            errno: Some(errno),
        }
    }
}

/// Decision before a recv-type call.
pub enum Before {
    /// Call the real function and return its result untouched.
    Pass,
    /// Do not call the real function; return this.
    Return(Ret),
    /// Call the real function, then `after_input`.
    Go(Ticket),
    /// A replay connection: serve the read from the log (`region_host::serve`)
    /// instead of the socket.
    Serve {
        /// Its conn id.
        conn: u64,
        /// MSG_PEEK: the bytes stay.
        peek: bool,
    },
}

/// What `before_input` learnt, for `after_input`.
pub struct Ticket {
    fd: i32,
    slot: &'static Slot,
    class: Class,
    want: usize,
}

/// Whether input/output hooks on `fd` need the slow path.
#[inline]
pub fn tracked(fd: i32) -> bool {
    fdtable::is_connection(fd) && !setup::inert()
}

/// Whether `close(fd)` needs to look at the table.
#[inline]
pub fn known(fd: i32) -> bool {
    fdtable::is_known(fd) && !setup::inert()
}

/// Whether the event-loop waits need a look: attached, not a forked child.
#[inline]
pub fn passive_hooked() -> bool {
    !setup::inert() && setup::engine().is_some()
}

/// Before the server waits in its event loop `loop_id` (see `loops`): its
/// turn ends (both roles count), and a backup's pump may move on.
pub fn before_wait(wait: crate::determinism::turns::Wait, max: i32, loop_id: u64) {
    let engine = setup::engine();
    // The turn's held replies leave after one commit wait for all: here,
    // or, when another loop waits for the turn lock, once this turn has
    // ended and let the lock go (the loops' commit waits overlap).
    let overlap =
        engine.is_some() && turn_lock::held() && turn_lock::others_wait() && held_output::any();
    let mut deferred = false;
    if let (Some(engine), false) = (engine, overlap) {
        if wait == crate::determinism::turns::Wait::Epoll
            && crate::determinism::clock::is_loop_thread()
        {
            // What is committed leaves now; the rest waits no longer than
            // the loop's next turn: it leaves as that turn reads inputs or
            // ends (see `release_deferred`), or, should the loop have
            // nothing to do, before it blocks (`closing_probe`). Under
            // load the next turn's work so overlaps this turn's commit
            // round instead of the loop waiting it out.
            deferred = release_deferred(engine);
        } else {
            held_output::release_all(&mut || engine.wait_output(), &mut fail_held);
        }
    }
    held_output::seal();
    let _ = DEFERRED.try_with(|d| d.set(deferred));
    let _ = DEFERRED_HELD.try_with(|d| d.set(deferred));
    // The turn's TICK is the turn's last entry: logged before the wait
    // counts (it is the turn's, and may continue its clock records).
    if let Some(engine) = engine {
        log_turn_time(engine);
    }
    crate::determinism::turns::enter_wait(wait, max);
    crate::determinism::clock::leave_turn();
    let mut closing = false;
    if let Some(engine) = engine {
        if engine.region.role() == Role::Leader && turn_lock::held() && engine.turn_open() {
            // The log must say where the turn ends before the loop blocks
            // (see `turn_time`). An epoll wait looks first (`closing_probe`):
            // under load the next turn's entries say it for free. Not when
            // another loop waits for its turn: a loop that always finds
            // input would keep the lock for good (memcached `-t 4` held one
            // worker's clients for seconds).
            match wait {
                crate::determinism::turns::Wait::Epoll if !turn_lock::others_wait() => {
                    closing = true
                }
                _ => {
                    engine.close_turn();
                }
            }
        }
    }
    let _ = CLOSING.try_with(|c| c.set(closing));
    let mark = engine.map(|e| e.appended_mark());
    if !closing {
        turn_lock::end();
    }
    if let Some(engine) = engine {
        // The turn's entries move now, with one wake-up per follower (the
        // writer defers them: see `Engine::post`); its replies waited for
        // them already if it had any.
        engine.post();
        if let (true, Some(mark)) = (overlap, mark) {
            // Everything this turn's replies may depend on was appended
            // by the time it ended.
            held_output::release_all(&mut || engine.wait_output_upto(mark), &mut fail_held);
        }
    }
    region_host::on_loop(loop_id);
}

thread_local! {
    /// The leader's loop thread is about to wait with its turn's end not
    /// logged, holding the turn lock (see `closing_probe`).
    static CLOSING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The leader's loop thread is about to wait holding output whose
    /// commit it did not wait for (see `before_wait`).
    static DEFERRED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// This loop thread holds output of an ended turn that was not
    /// committed when the turn ended (see `release_deferred_on_input`).
    static DEFERRED_HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The turn's clock when `release_deferred_at` last looked.
    static LOOKED_AT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Sends the output this loop thread holds that is committed by now,
/// without waiting; true when some stays held waiting for its commit. Asks
/// the engine at most twice: a mark at or below one found committed is,
/// and one at or past one found pending is pending (marks of one view).
fn release_deferred(engine: &Engine) -> bool {
    let mut committed_upto = (0, 0);
    let mut pending_from = (u64::MAX, 0);
    held_output::release_committed(
        &mut |(seq, view)| {
            if view == committed_upto.1 && seq <= committed_upto.0 {
                return Some(Ok(()));
            }
            if view == pending_from.1 && seq >= pending_from.0 {
                return None;
            }
            let decided = engine.try_output_upto((seq, view));
            match decided {
                Some(Ok(())) => committed_upto = (seq, view),
                None => pending_from = (seq, view),
                Some(Err(_)) => {}
            }
            decided
        },
        &mut fail_held,
    )
}

/// Whether this loop thread holds an ended turn's output not committed
/// when last looked at.
fn deferred_held() -> bool {
    DEFERRED_HELD.try_with(|d| d.get()).unwrap_or(false)
}

/// Looks again at the deferred output: what is committed by now leaves.
fn look_at_deferred(engine: &Engine) {
    let stays = release_deferred(engine);
    let _ = DEFERRED_HELD.try_with(|d| d.set(stays));
}

/// A leader's loop thread reads input while holding an earlier turn's
/// output (see `before_wait`): what is committed by now leaves.
fn release_deferred_on_input(engine: &Engine) {
    if deferred_held() {
        look_at_deferred(engine);
    }
}

/// The leader's loop thread is about to wait `timeout` ms with its last
/// turn's end not logged, or holding output whose commit it did not wait
/// for (see `before_wait`): `probe()` waits without blocking first.
/// Events (or an error): that is the wait's result (the next turn starts
/// at once, under the turn lock if it was held, and its entries end the
/// last one; the held output stays for it). None: the held output left
/// once committed, the turn's end is logged, the lock let go, and the
/// caller waits for real — or, for a zero timeout with the turn's end to
/// log, Some(0). None at once when nothing was pending.
pub fn closing_probe(timeout: i32, probe: impl FnOnce() -> i32) -> Option<i32> {
    let closing = CLOSING.try_with(|c| c.replace(false)).unwrap_or(false);
    let deferred = DEFERRED.try_with(|c| c.replace(false)).unwrap_or(false);
    if !closing && (!deferred || timeout == 0) {
        // A wait that does not block leaves deferred output to the next
        // turn's end.
        return None;
    }
    let n = probe();
    if n != 0 {
        return Some(n);
    }
    let engine = setup::engine();
    if let (true, Some(engine)) = (deferred, engine) {
        // The loop would block: its deferred output leaves first.
        held_output::release_all(&mut || engine.wait_output(), &mut fail_held);
        let _ = DEFERRED_HELD.try_with(|d| d.set(false));
    }
    if !closing {
        return None;
    }
    if let Some(engine) = engine {
        engine.close_turn();
        engine.post();
    }
    turn_lock::end();
    (timeout == 0).then_some(0)
}

/// The server's wait in loop `loop_id` returned: on the leader its turn
/// reads the log's time moved to now (see `clock`); on a backup it may be
/// the turn a `TICK` of that loop is handed over in, or (`delivers`) the
/// one that reports the log's DATA.
pub fn after_wait(loop_id: u64, delivers: bool) {
    crate::determinism::turns::wait_returned();
    let Some(engine) = setup::engine() else {
        return;
    };
    if engine.region.role() == Role::Leader {
        // Only an event loop's turns are the log's (and run one at a time).
        // A wait that returned without a `closing_probe` (an odd path of a
        // hook) lets no turn lock linger.
        if CLOSING.try_with(|c| c.replace(false)).unwrap_or(false) {
            turn_lock::end();
        }
        if crate::determinism::clock::is_loop_thread() {
            turn_lock::begin();
            crate::determinism::clock::turn_starts(sys::realtime_us(), loop_id);
        }
    } else {
        region_host::turn_returned(loop_id, delivers);
    }
}

/// A leader's turn that moved the log's time and logged no entry (yet)
/// logs a `TICK` before it ends or sends anything: backups run the turn's
/// timers at the same point of the log, and its output (a timeout's
/// reply) waits for the tick's commit like any other.
fn log_turn_time(engine: &Engine) {
    let Some((time_us, loop_id)) = crate::determinism::clock::take_unlogged() else {
        return;
    };
    if engine.region.role() != Role::Leader {
        return;
    }
    if let Err(f) = engine.replicate_tick(time_us, loop_id) {
        log::debug!("turn of loop {loop_id} at {time_us}: not logged: {f}");
    }
}

/// A counted clock read of a server loop thread inside its turn (see
/// `turn_time`): None outside one, for the preload's own reads, or when
/// not attached.
pub fn turn_clock_read() -> Option<u64> {
    let _reentry = crate::reentry::Reentry::enter()?;
    let engine = setup::engine()?;
    let us = turn_reads::read(engine)?;
    release_deferred_at(engine, us);
    Some(us)
}

/// A leader's loop thread read the clock (`us`) inside a turn while
/// holding an earlier turn's output: what is committed by now leaves, a
/// look each time the turn's clock moves (a grain): a turn that reads no
/// input for long (a busy script) holds no earlier reply for longer.
fn release_deferred_at(engine: &Engine, us: u64) {
    if deferred_held() && LOOKED_AT.try_with(|l| l.replace(us) != us).unwrap_or(false) {
        look_at_deferred(engine);
    }
}

/// Whether accept/listen need the slow path.
#[inline]
pub fn accept_hooked() -> bool {
    setup::active()
}

/// Fails a client connection: every further input call on it returns
/// ECONNRESET, and its peer sees the connection end now.
pub fn fail_connection(fd: i32) -> Ret {
    if let Some(slot) = fdtable::slot(fd) {
        slot.mark_failed();
    }
    sys::shutdown_both(fd);
    Ret::err(libc::ECONNRESET)
}

/// A hook body panicked on `fd` (the panic hook printed why): the input
/// may be lost or unreplicated, so the connection fails.
pub fn internal_error(fd: i32) -> Ret {
    log::error!("internal error in a hook on fd {fd}; failing the connection");
    fail_connection(fd)
}

fn fail_with(fd: i32, conn: u64, f: &Fail) -> Ret {
    match f {
        Fail::Lost(_) => log::info!("failing connection {conn} (fd {fd}): {f}"),
        Fail::Internal(_) => log::error!("failing connection {conn} (fd {fd}): {f}"),
    }
    fail_connection(fd)
}

/// Whether `slot` is a client this node may replicate for now.
fn leading(engine: &Engine, slot: &Slot) -> bool {
    engine.region.role() == Role::Leader && engine.region.view() == slot.view()
}

/// Before a recv-type call on a tracked fd.
pub fn before_input(fd: i32, want: usize, flags: i32) -> Before {
    let Some(slot) = fdtable::slot(fd) else {
        return Before::Pass;
    };
    let Some(engine) = setup::engine() else {
        return Before::Pass;
    };
    let state = slot.state();
    match slot.class() {
        // The log's bytes, not the socket's (see `region_host`).
        Class::Replay => Before::Serve {
            conn: slot.conn(),
            peek: flags & libc::MSG_PEEK != 0,
        },
        Class::Guest => {
            if engine.region.role() == Role::Leader {
                log::info!(
                    "closing fd {fd}: a backup's unreplicated client, and this node now leads"
                );
                Before::Return(fail_connection(fd))
            } else {
                Before::Pass
            }
        }
        Class::Client => {
            if state & FAILED != 0 {
                return Before::Return(Ret::err(libc::ECONNRESET));
            }
            if state & CLOSED != 0 {
                // Its input ended in the log: nothing more is read.
                return Before::Return(Ret::pass(0));
            }
            if !leading(engine, slot) {
                log::info!(
                    "failing connection {} (fd {fd}): accepted in view {}, this node is now {:?} in view {}",
                    slot.conn(),
                    slot.view(),
                    engine.region.role(),
                    engine.region.view()
                );
                return Before::Return(fail_connection(fd));
            }
            if flags & libc::MSG_PEEK != 0 {
                // The bytes stay in the socket; the read that takes them
                // is logged.
                return Before::Pass;
            }
            if flags & libc::MSG_TRUNC != 0 {
                // TCP discards the bytes: they could not be replicated.
                log::error!("recv with MSG_TRUNC on client fd {fd} cannot be replicated");
                return Before::Return(fail_connection(fd));
            }
            release_deferred_on_input(engine);
            Before::Go(Ticket {
                fd,
                slot,
                class: Class::Client,
                want,
            })
        }
        _ => Before::Pass,
    }
}

/// After a recv-type call that returned `n` (`errno` when negative), with
/// the bytes read in `segments`.
pub fn after_input(t: Ticket, n: isize, errno: i32, segments: &[&[u8]]) -> Ret {
    let Some(engine) = setup::engine() else {
        return Ret::pass(n);
    };
    match t.class {
        Class::Client => {
            let conn = t.slot.conn();
            if n > 0 {
                let out = withheld_or(t.slot);
                match engine.replicate(Kind::Data, conn, out, segments, n as usize) {
                    Ok(_) => Ret::pass(n),
                    Err(f) => fail_with(t.fd, conn, &f),
                }
            } else if n == 0 && t.want > 0 {
                match log_close(engine, t.slot) {
                    Ok(()) => Ret::pass(0),
                    Err(f) => fail_with(t.fd, conn, &f),
                }
            } else if n < 0 && errno == libc::ECONNRESET {
                if let Err(f) = log_close(engine, t.slot) {
                    log::info!("connection {conn}: reset; its CLOSE was not replicated: {f}");
                }
                Ret::err(libc::ECONNRESET)
            } else {
                // EAGAIN, EINTR, zero-length reads, other errors.
                Ret::pass(n)
            }
        }
        _ => Ret::pass(n),
    }
}

/// Logs a client's CLOSE entry unless it was logged already (or the
/// connection is no longer this leader's to log).
fn log_close(engine: &Engine, slot: &Slot) -> Result<(), Fail> {
    if slot.class() != Class::Client || !slot.mark_closed() {
        return Ok(());
    }
    if !leading(engine, slot) {
        return Ok(());
    }
    let out = withheld_or(slot);
    engine
        .replicate(Kind::Close, slot.conn(), out, &[], 0)
        .map(|_| ())
}

/// The `out_hash` a client's next entry carries: its output's digest, or
/// [`OutputDigest::WITHHELD`] once this leader refused some of it (a
/// connection it failed: the server's replies never left, so the digest
/// is not the server's output and backups must not count the difference).
fn withheld_or(slot: &Slot) -> u64 {
    let digest = slot.take_digest();
    if slot.state() & FAILED != 0 {
        OutputDigest::WITHHELD
    } else {
        digest
    }
}

/// Before output of `segments` to a tracked fd: a client's output waits
/// until every input appended so far is committed (output mode). Written
/// before the commit on a loop thread of a leader, it is held until the
/// turn ends instead (see `held_output`). Some: what the call returns —
/// the segments' length when held; an error when refused (this node
/// stopped leading: never released, the connection is reset) or when
/// the client's socket still holds earlier output (`EAGAIN`). None: the
/// real call sends them now.
pub fn before_output(fd: i32, segments: &[&[u8]]) -> Option<Ret> {
    let slot = fdtable::slot(fd)?;
    if slot.class() != Class::Client {
        return None;
    }
    let engine = setup::engine()?;
    let holds = slot.state() & FAILED == 0
        && engine.region.role() == Role::Leader
        && crate::determinism::clock::is_loop_thread();
    if holds {
        if let Some(r) = try_hold(engine, fd, slot, segments) {
            return Some(r);
        }
    }
    log_turn_time(engine);
    hold_for_commit(engine, fd, slot)
}

/// Holds a client's output, close or shutdown until its inputs (and every
/// earlier one) are committed: the client must not see a reply, or the
/// connection end, on an input the cluster may still lose. When that can no
/// longer happen, the connection is reset instead (Some: what the call
/// returns). A failed client's socket is shut down already: its call
/// fails by itself.
fn hold_for_commit(engine: &Engine, fd: i32, slot: &Slot) -> Option<Ret> {
    if slot.state() & FAILED != 0 {
        return None;
    }
    engine
        .wait_output()
        .err()
        .map(|f| fail_with(fd, slot.conn(), &f))
}

/// `before_output`'s held path: Some when decided (held, or refused);
/// None when the output waits for the commit and goes out itself (it is
/// committed already, or too large to hold).
fn try_hold(engine: &Engine, fd: i32, slot: &Slot, segments: &[&[u8]]) -> Option<Ret> {
    let conn = slot.conn();
    let holds = held_output::holds(fd, conn);
    if !holds && engine.output_free() {
        return None;
    }
    // The turn's time goes into the log before any of its output (what
    // the connection holds may be an earlier turn's).
    log_turn_time(engine);
    if !held_output::hold(fd, conn, segments, engine.appended_mark()) {
        if !holds {
            return None;
        }
        // Over the bound: what it holds goes first.
        return match held_output::release(engine, fd, conn, &mut fail_held) {
            held_output::Released::Sent => None,
            held_output::Released::Stuck => Some(Ret::err(libc::EAGAIN)),
            held_output::Released::Failed => Some(Ret::err(libc::ECONNRESET)),
        };
    }
    slot.add_output(segments);
    let total: usize = segments.iter().map(|s| s.len()).sum();
    Some(Ret::pass(total as isize))
}

/// A held output's commit failed: its connection is reset (see
/// `hold_for_commit`).
fn fail_held(fd: i32, conn: u64, f: &Fail) {
    fail_with(fd, conn, f);
}

/// Sends what a client connection holds (see `held_output`) before its
/// close or shutdown.
fn release_held(engine: &Engine, fd: i32, slot: &Slot) {
    if held_output::holds(fd, slot.conn())
        && held_output::release(engine, fd, slot.conn(), &mut fail_held)
            == held_output::Released::Stuck
    {
        log::info!(
            "connection {} (fd {fd}): the client did not take all of its replies before the server closed it",
            slot.conn()
        );
    }
}

/// Output to a replay connection: the pump takes its digest and the bytes
/// go nowhere. Some(bytes "written") when `fd` is one.
pub fn replay_output(fd: i32, segments: &[&[u8]]) -> Option<usize> {
    let slot = fdtable::slot(fd)?;
    if slot.class() != Class::Replay {
        return None;
    }
    region_host::on_output(slot.conn(), segments);
    Some(segments.iter().map(|s| s.len()).sum())
}

/// The server does (or no longer does) wait to write more to `fd`: on a
/// replay connection, a reply it sends over several turns (the pump waits
/// for it).
pub fn write_interest(fd: i32, wants: bool) {
    if let Some(slot) = fdtable::slot(fd).filter(|s| s.class() == Class::Replay) {
        slot.set_wants_write(wants);
    }
}

/// The server registered `fd`, a replay connection, in `epfd` under `key`
/// (`reads`: for reading; `epfd` -1: it removed it).
pub fn wait_key(fd: i32, epfd: i32, key: u64, reads: bool) {
    if let Some(slot) = fdtable::slot(fd) {
        slot.set_wait(key, if reads { epfd } else { -1 });
    }
}

/// Whether `fd` is a replay connection (its output is dropped).
pub fn is_replay(fd: i32) -> bool {
    fdtable::slot(fd).is_some_and(|s| s.class() == Class::Replay)
}

/// Output written to a tracked fd: `segments` what the socket took.
pub fn after_output(fd: i32, segments: &[&[u8]]) {
    if let Some(slot) = fdtable::slot(fd) {
        if slot.class() == Class::Client {
            slot.add_output(segments);
        }
    }
}

/// Before `close(fd)` (or `dup2` over it) of a known fd.
pub fn before_close(fd: i32) {
    let Some(slot) = fdtable::slot(fd) else {
        return;
    };
    if slot.class() == Class::Replay {
        region_host::on_close(slot.conn());
    }
    if slot.class() == Class::Client {
        if let Some(engine) = setup::engine() {
            release_held(engine, fd, slot);
            if let Err(f) = log_close(engine, slot) {
                log::info!(
                    "connection {}: closed; its CLOSE was not replicated: {f}",
                    slot.conn()
                );
            }
            hold_for_commit(engine, fd, slot);
        }
    }
    slot.clear();
}

/// Forgets `fd` without logging anything (after a failure in `before_close`).
pub fn forget(fd: i32) {
    if let Some(slot) = fdtable::slot(fd) {
        slot.clear();
    }
}

/// Before `shutdown(fd, how)`: the end of a client's input is its CLOSE.
/// SHUT_WR alone is not: the server still reads from the client.
/// Any shutdown is visible to the client, so it waits for the commit like
/// output does (output mode).
pub fn before_shutdown(fd: i32, how: i32) {
    let (Some(slot), Some(engine)) = (fdtable::slot(fd), setup::engine()) else {
        return;
    };
    if slot.class() != Class::Client {
        return;
    }
    release_held(engine, fd, slot);
    if how != libc::SHUT_WR {
        if let Err(f) = log_close(engine, slot) {
            log::info!(
                "connection {}: shut down; its CLOSE was not replicated: {f}",
                slot.conn()
            );
        }
    }
    hold_for_commit(engine, fd, slot);
}

/// Whether listener `fd` is this node's app listener (cached per fd).
fn is_app_listener(fd: i32, app: std::net::SocketAddr) -> bool {
    let slot = fdtable::slot(fd);
    match slot.map(|s| s.class()) {
        Some(Class::ListenApp) => return true,
        Some(Class::ListenOther) => return false,
        _ => {}
    }
    let local = sys::local_addr(fd);
    let app_listener = local.is_some_and(|a| setup::is_app_addr(a, app));
    if !app_listener {
        if let Some(local) = local {
            log::warn!(
                "listener {local} is not this node's app address {app}: its clients are NOT replicated"
            );
        }
    }
    if let Some(s) = slot {
        s.set_listener(app_listener);
    }
    app_listener
}

/// After a successful `listen(fd)`: a listener in the wrong place, or an
/// unusable config, stops the server now (see `listeners`); the app
/// listener attaches early, so that the follower sees the server.
pub fn after_listen(fd: i32) {
    crate::listeners::after_listen(sys::local_addr(fd));
    let Some(Ok(s)) = setup::settings() else {
        return;
    };
    if !is_app_listener(fd, s.app) {
        return;
    }
    match setup::attach() {
        Ok(_) => {}
        Err(setup::Unattached::NotYet(why)) => setup::attach_when_ready(&why),
        Err(setup::Unattached::Failed(e)) => {
            log::info!("not attached yet ({e}); trying again at the first accept");
        }
    }
}

/// `accept`/`accept4` on listener `lfd`; `real` performs the real call
/// and returns (fd or -1, errno).
pub fn accept(lfd: i32, real: &mut dyn FnMut() -> (i32, i32)) -> Ret {
    let pass = |real: &mut dyn FnMut() -> (i32, i32)| {
        let (fd, e) = real();
        if fd < 0 {
            Ret::err(e)
        } else {
            Ret::pass(fd as isize)
        }
    };
    let settings = match setup::settings() {
        None => return pass(real),
        Some(Err(reason)) => {
            // Which port is the app's is unknown: any accept is the first.
            setup::cannot_replicate(reason);
            return pass(real);
        }
        Some(Ok(s)) => s,
    };
    if !is_app_listener(lfd, settings.app) {
        return pass(real);
    }
    let engine = match setup::attach() {
        Ok(e) => e,
        Err(setup::Unattached::NotYet(_))
            if setup::waiting_for_region() && !setup::unreplicated_allowed() =>
        {
            return refuse_unattached(lfd, settings, real);
        }
        Err(why) => {
            setup::cannot_replicate(why.reason());
            return pass(real);
        }
    };
    loop {
        let (fd, e) = real();
        if fd < 0 {
            return Ret::err(e);
        }
        let Some(slot) = fdtable::slot(fd).filter(|_| (fd as usize) < TABLE_SIZE) else {
            log::warn!("refusing a client on fd {fd}: fds from {TABLE_SIZE} on are not tracked");
            sys::close(fd);
            continue;
        };
        // Whatever the table held for this fd number is stale now.
        slot.clear();
        match engine.region.role() {
            Role::Leader => {
                // The conn id is the ACCEPT's seq, known only once logged.
                match engine.replicate(Kind::Accept, 0, 0, &[], 0) {
                    Ok(l) => {
                        slot.set_client(l.first, l.view);
                        log::debug!("fd {fd}: connection {} accepted", l.first);
                        return Ret::pass(fd as isize);
                    }
                    Err(f) => {
                        log::info!("refusing a client: its ACCEPT was not replicated: {f}");
                        sys::close(fd);
                        let again = if sys::is_nonblocking(lfd) {
                            libc::EAGAIN
                        } else {
                            libc::ECONNABORTED
                        };
                        return Ret::err(again);
                    }
                }
            }
            role => {
                if passive_accept(engine, role, fd, slot) {
                    return Ret::pass(fd as isize);
                }
                // Refused: closed; take the next pending connection (or
                // return EAGAIN / block, as the real accept does).
                sys::close(fd);
            }
        }
    }
}

/// A client came before the region (the server started before its
/// follower): nothing can replicate it yet, so it is told so and closed,
/// as a backup refuses clients; the server runs on and attaches later.
fn refuse_unattached(
    lfd: i32,
    settings: &setup::Settings,
    real: &mut dyn FnMut() -> (i32, i32),
) -> Ret {
    let (fd, e) = real();
    if fd < 0 {
        return Ret::err(e);
    }
    log::debug!("refusing a client on fd {fd}: not attached to the region yet");
    if let Some(line) = settings.config.protocol.refusal(None) {
        sys::send_nonblocking(fd, &line);
        sys::discard_input(fd);
    }
    sys::close(fd);
    Ret::err(if sys::is_nonblocking(lfd) {
        libc::EAGAIN
    } else {
        libc::ECONNABORTED
    })
}

/// A backup or joining node accepted `fd`: keep it when it is one of the
/// pump's replay connections (or, on a backup, when other clients
/// are allowed).
fn passive_accept(engine: &Engine, role: Role, fd: i32, slot: &Slot) -> bool {
    let peer = sys::peer_addr(fd);
    if peer.is_some_and(|p| region_host::on_accept(fd, p)) {
        return true;
    }
    if role == Role::Backup && engine.config.backup_clients == BackupClients::Allow {
        if !crate::determinism::loops::several_workers() {
            slot.set_guest();
            log::debug!("fd {fd}: unreplicated client allowed on a backup");
            return true;
        }
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            log::warn!(
                "refusing clients on this backup although backup_clients = \"allow\": the server hands connections to several worker loops in turn, and one it took here but not on the leader would move every later replicated connection to another worker"
            );
        }
    }
    slot.clear();
    log::debug!(
        "refusing client {} on a {role:?} node (backup_clients = \"deny\")",
        peer.map(|p| p.to_string()).unwrap_or_else(|| "?".into())
    );
    // One reply in the server's own protocol naming the leader, when the
    // config says which protocol that is: a single non-blocking send on
    // the fresh socket (its buffer is empty), never a wait.
    // Never this node itself: a leader whose server is being rebuilt
    // refuses clients too, and sending them back here would loop.
    let leader = engine.region.leader();
    let leader_app = (leader != 0 && leader != engine.me)
        .then(|| engine.config.node(leader).ok().map(|n| n.app))
        .flatten();
    if let Some(line) = engine.config.protocol.refusal(leader_app) {
        sys::send_nonblocking(fd, &line);
        sys::discard_input(fd);
    }
    false
}

/// A backup's epoll timeout: none when a tick is due (this wait is its
/// turn); unbounded while the log has no time (the server's clock stands
/// at the origin, so no timer of its can come due: the first entry's bell
/// or alarm wakes it, a signal too); else the server's.
pub fn wait_timeout(tick: bool, timeout: i32) -> i32 {
    if tick {
        0
    } else if crate::determinism::clock::stilled()
        && setup::engine().is_some_and(|e| e.region.role() != Role::Leader)
    {
        -1
    } else {
        timeout
    }
}
