//! The server's event loops, named alike on every replica, and the alarm
//! that wakes one.
//!
//! A `TICK` entry is a turn of one event loop of the leader's server (a
//! memcached listener's clock timer runs on another loop than its worker).
//! A loop is named by the order in which the server created its epoll
//! instance (1, 2, …): a server that starts up the same way creates them
//! in the same order everywhere, whatever fd numbers they get. Loop 0 is
//! any `poll`/`select` loop (such servers run one).
//!
//! A backup's server blocked in a loop's wait learns of a `TICK` by the
//! loop's alarm: an eventfd the preload adds to that epoll instance, whose
//! events the epoll hook takes out of what the server sees.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use crate::sys;

/// Loops with a name (a server creating more shares loop 0's fate: its
/// later loops are not told apart).
const LOOPS: usize = 16;

/// The epoll fd of each loop, by creation order (-1: none).
static EPFDS: [AtomicI32; LOOPS] = [const { AtomicI32::new(-1) }; LOOPS];
static CREATED: AtomicUsize = AtomicUsize::new(0);
/// Each loop's alarm eventfd (-1: not made yet).
static ALARMS: [AtomicI32; LOOPS] = [const { AtomicI32::new(-1) }; LOOPS];

/// The epoll key of an alarm's event ("lockstep" in ASCII): no server's
/// pointer or fd number.
pub const ALARM_KEY: u64 = 0x6c6f_636b_7374_6570;

/// The server created epoll instance `epfd`.
pub fn created(epfd: i32) {
    let i = CREATED.fetch_add(1, Ordering::AcqRel);
    if i < LOOPS {
        EPFDS[i].store(epfd, Ordering::Release);
    }
}

/// Whether the server created an epoll instance: then its event loops
/// are those, and a `poll`/`select` of one of its threads is a wait of
/// its own, not a loop (memcached's LRU crawler polls a client's socket
/// while it writes a dump to it).
pub fn any() -> bool {
    CREATED.load(Ordering::Acquire) > 0
}

/// Whether the server runs more than one loop besides its first (a
/// listener handing connections to several worker loops, memcached
/// `-t 2` and up). Such a server picks a connection's worker by how many
/// it accepted before (round robin): a client it accepts on a backup and
/// not on the leader would move every later replicated connection to
/// another worker than the leader's, so backups let none in.
pub fn several_workers() -> bool {
    CREATED.load(Ordering::Acquire) > 2
}

/// The loop that waits on `epfd` (0: not one of the named ones).
pub fn of_epfd(epfd: i32) -> u64 {
    EPFDS
        .iter()
        .position(|e| e.load(Ordering::Acquire) == epfd)
        .map_or(0, |i| i as u64 + 1)
}

/// The epoll fd of loop `id` (None for loop 0 or an unknown one).
pub fn epfd_of(id: u64) -> Option<i32> {
    let i = (id as usize).checked_sub(1)?;
    let fd = EPFDS.get(i)?.load(Ordering::Acquire);
    (fd >= 0).then_some(fd)
}

/// Wakes the server thread blocked in loop `id`'s wait: false when the
/// loop has no epoll instance or the alarm could not be set up.
pub fn ring(id: u64) -> bool {
    let Some(epfd) = epfd_of(id) else {
        return false;
    };
    let slot = &ALARMS[id as usize - 1];
    let mut fd = slot.load(Ordering::Acquire);
    if fd < 0 {
        let Some(new) = sys::eventfd() else {
            return false;
        };
        if !sys::epoll_add(epfd, new, ALARM_KEY) {
            sys::close(new);
            return false;
        }
        fd = match slot.compare_exchange(-1, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => new,
            Err(theirs) => {
                sys::close(new);
                theirs
            }
        };
    }
    sys::write_all(fd, &1u64.to_ne_bytes());
    true
}

/// The server's wait on `epfd` returned the alarm's event: it is spent.
pub fn silence(epfd: i32) {
    let id = of_epfd(epfd);
    if let Some(slot) = (id as usize).checked_sub(1).and_then(|i| ALARMS.get(i)) {
        let fd = slot.load(Ordering::Acquire);
        if fd >= 0 {
            let mut count = [0u8; 8];
            sys::read_nonblocking(fd, &mut count);
        }
    }
}

/// Takes the alarm's events out of what a wait returned (keeping the
/// order of the rest); returns how many are left.
pub fn without_alarm(events: &mut [libc::epoll_event]) -> usize {
    let mut kept = 0;
    for i in 0..events.len() {
        let e = events[i];
        if e.u64 != ALARM_KEY {
            events[kept] = e;
            kept += 1;
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_are_named_by_creation_order() {
        // Fd numbers no test process uses for epoll.
        created(9001);
        created(9002);
        assert_eq!(of_epfd(9001), 1);
        assert_eq!(of_epfd(9002), 2);
        assert_eq!(of_epfd(9003), 0);
        assert_eq!(epfd_of(2), Some(9002));
        assert_eq!(epfd_of(0), None);
        assert_eq!(epfd_of(99), None);
    }

    #[test]
    fn the_alarm_is_taken_out_of_a_waits_events() {
        let ev = |key: u64| libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: key,
        };
        let mut got = [ev(5), ev(ALARM_KEY), ev(6)];
        assert_eq!(without_alarm(&mut got), 2);
        assert_eq!((got[0].u64, got[1].u64), (5, 6));
        let mut none = [ev(7)];
        assert_eq!(without_alarm(&mut none), 1);
    }
}
