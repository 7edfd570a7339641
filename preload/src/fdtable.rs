//! Per-fd state: a fixed table of atomics indexed by fd number, so that the
//! hot path of every hooked call on an fd that is not a client costs one
//! relaxed load, and nothing is ever allocated per connection.
//!
//! An entry is set when `accept` hands out a connection the preload cares
//! about (or when a listening socket is classified) and cleared when the fd
//! is closed through `close`/`dup2`/`dup3`. Fds at or above [`TABLE_SIZE`]
//! are never tracked: `accept` refuses such client connections rather than
//! serving them unreplicated.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use lockstep_common::entry::{OutputDigest, OutputHash};

/// Number of fds tracked.
pub const TABLE_SIZE: usize = 65536;

/// What an fd is, as far as the preload is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Class {
    /// Unknown or not interesting: every call passes through.
    Free = 0,
    /// A listening socket bound to this node's `app` address.
    ListenApp = 1,
    /// A listening socket bound elsewhere.
    ListenOther = 2,
    /// A client accepted while this node led (inputs are replicated).
    Client = 3,
    /// A replay connection the passive preload opened to apply the log.
    Replay = 4,
    /// A client a backup lets through (`backup_clients = "allow"`).
    Guest = 5,
}

impl Class {
    fn from_u8(b: u8) -> Class {
        match b {
            1 => Class::ListenApp,
            2 => Class::ListenOther,
            3 => Class::Client,
            4 => Class::Replay,
            5 => Class::Guest,
            _ => Class::Free,
        }
    }
}

/// The connection's CLOSE entry was logged (or it ended while passive).
pub const CLOSED: u64 = 1 << 8;
/// The connection was failed; every further input call returns ECONNRESET.
pub const FAILED: u64 = 1 << 9;
/// The server waits to write more to this replay connection (it asked
/// its event loop for writability): its reply so far is not complete.
pub const WANTS_WRITE: u64 = 1 << 10;
const CLASS_MASK: u64 = 0xff;

/// One fd's entry.
#[derive(Debug)]
pub struct Slot {
    state: AtomicU64,
    /// Conn id (client or replay connection).
    conn: AtomicU64,
    /// View the client was accepted in.
    view: AtomicU64,
    out_hash: AtomicU64,
    out_len: AtomicU64,
    /// The `epoll_event` data the server registered a replay connection
    /// with: how a backup finds it among the events a wait returns.
    wait_key: AtomicU64,
    /// The epoll fd it is registered in for reading (-1: none).
    wait_epfd: AtomicI32,
}

static TABLE: [Slot; TABLE_SIZE] = [const { Slot::new() }; TABLE_SIZE];

/// The entry of `fd`, if it is in range.
#[inline]
pub fn slot(fd: i32) -> Option<&'static Slot> {
    usize::try_from(fd).ok().and_then(|i| TABLE.get(i))
}

/// Whether `fd` is a connection whose inputs or outputs the preload looks
/// at (client, replay or guest). One relaxed load.
#[inline]
pub fn is_connection(fd: i32) -> bool {
    slot(fd).is_some_and(|s| s.state.load(Ordering::Relaxed) & CLASS_MASK >= Class::Client as u64)
}

/// Whether `fd` has any entry (closing it must clear the entry).
#[inline]
pub fn is_known(fd: i32) -> bool {
    slot(fd).is_some_and(|s| s.state.load(Ordering::Relaxed) != 0)
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            state: AtomicU64::new(0),
            conn: AtomicU64::new(0),
            view: AtomicU64::new(0),
            out_hash: AtomicU64::new(0),
            out_len: AtomicU64::new(0),
            wait_key: AtomicU64::new(0),
            wait_epfd: AtomicI32::new(-1),
        }
    }

    /// The whole state word (class and flags).
    pub fn state(&self) -> u64 {
        self.state.load(Ordering::Acquire)
    }

    /// The class of the fd.
    pub fn class(&self) -> Class {
        Class::from_u8((self.state() & CLASS_MASK) as u8)
    }

    /// Conn id of a client or replay connection.
    pub fn conn(&self) -> u64 {
        self.conn.load(Ordering::Acquire)
    }

    /// View a client was accepted in.
    pub fn view(&self) -> u64 {
        self.view.load(Ordering::Acquire)
    }

    fn set(&self, class: Class, conn: u64, view: u64) {
        self.conn.store(conn, Ordering::Relaxed);
        self.view.store(view, Ordering::Relaxed);
        self.out_hash
            .store(OutputHash::default().0, Ordering::Relaxed);
        self.out_len.store(0, Ordering::Relaxed);
        self.wait_key.store(0, Ordering::Relaxed);
        self.wait_epfd.store(-1, Ordering::Relaxed);
        self.state.store(class as u64, Ordering::Release);
    }

    /// A client accepted as leader in `view` with conn id `conn`.
    pub fn set_client(&self, conn: u64, view: u64) {
        self.set(Class::Client, conn, view);
    }

    /// A replay connection applying the log's connection `conn`.
    pub fn set_replay(&self, conn: u64) {
        self.set(Class::Replay, conn, 0);
    }

    /// A client let through by a backup.
    pub fn set_guest(&self) {
        self.set(Class::Guest, 0, 0);
    }

    /// A classified listening socket.
    pub fn set_listener(&self, app: bool) {
        let class = if app {
            Class::ListenApp
        } else {
            Class::ListenOther
        };
        self.set(class, 0, 0);
    }

    /// Sets [`CLOSED`]; true when this call set it (exactly one caller
    /// logs the connection's CLOSE entry).
    pub fn mark_closed(&self) -> bool {
        self.state.fetch_or(CLOSED, Ordering::AcqRel) & CLOSED == 0
    }

    /// Sets or clears [`WANTS_WRITE`].
    pub fn set_wants_write(&self, wants: bool) {
        if wants {
            self.state.fetch_or(WANTS_WRITE, Ordering::AcqRel);
        } else {
            self.state.fetch_and(!WANTS_WRITE, Ordering::AcqRel);
        }
    }

    /// Whether [`WANTS_WRITE`] is set.
    pub fn wants_write(&self) -> bool {
        self.state() & WANTS_WRITE != 0
    }

    /// Records the `epoll_event` data the server registered the fd with,
    /// and the epoll fd that waits to read it (-1: none does).
    pub fn set_wait(&self, key: u64, epfd: i32) {
        self.wait_key.store(key, Ordering::Release);
        self.wait_epfd.store(epfd, Ordering::Release);
    }

    /// The epoll fd that waits to read the fd (-1: none).
    pub fn wait_epfd(&self) -> i32 {
        self.wait_epfd.load(Ordering::Acquire)
    }

    /// The `epoll_event` data the server registered the fd with.
    pub fn wait_key(&self) -> u64 {
        self.wait_key.load(Ordering::Acquire)
    }

    /// Sets [`FAILED`].
    pub fn mark_failed(&self) {
        self.state.fetch_or(FAILED, Ordering::AcqRel);
    }

    /// Forgets the fd (it was closed).
    pub fn clear(&self) {
        self.state.store(0, Ordering::Release);
    }

    /// The digest of the output since the last input, packed (see
    /// [`OutputDigest::pack`]), and a fresh start for the next one.
    pub fn take_digest(&self) -> u64 {
        let d = self.digest();
        self.out_hash
            .store(OutputHash::default().0, Ordering::Relaxed);
        self.out_len.store(0, Ordering::Relaxed);
        d.pack()
    }

    /// The digest of the output since the last input.
    pub fn digest(&self) -> OutputDigest {
        OutputDigest {
            hash: OutputHash(self.out_hash.load(Ordering::Relaxed)),
            len: self.out_len.load(Ordering::Relaxed),
        }
    }

    /// Folds bytes written to the client into its output digest. Only the
    /// thread that writes to the connection calls this.
    pub fn add_output(&self, segments: &[&[u8]]) {
        let mut d = self.digest();
        for s in segments {
            d.update(s);
        }
        self.out_hash.store(d.hash.0, Ordering::Relaxed);
        self.out_len.store(d.len, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_flags() {
        let s = slot(65000).unwrap();
        assert!(!is_known(65000));
        s.set_client(7, 3);
        assert!(is_connection(65000));
        assert_eq!(s.class(), Class::Client);
        assert_eq!((s.conn(), s.view()), (7, 3));
        assert!(s.mark_closed());
        assert!(!s.mark_closed());
        assert_eq!(s.class(), Class::Client);
        s.mark_failed();
        assert!(s.state() & FAILED != 0);
        s.clear();
        assert!(!is_known(65000));
        s.set_listener(true);
        assert!(is_known(65000) && !is_connection(65000));
        s.clear();
        assert!(slot(-1).is_none());
        assert!(slot(TABLE_SIZE as i32).is_none());
        assert!(!is_connection(1 << 20));
    }

    #[test]
    fn output_digest_matches_one_pass() {
        let s = slot(65001).unwrap();
        s.set_client(1, 1);
        s.add_output(&[b"+O", b"K\r"]);
        s.add_output(&[b"\n"]);
        let mut d = OutputDigest::default();
        d.update(b"+OK\r\n");
        assert_eq!(s.digest(), d);
        assert_eq!(s.take_digest(), d.pack());
        assert_eq!(s.digest(), OutputDigest::default());
        s.add_output(&[b"x"]);
        s.set_client(2, 1);
        assert_eq!(s.digest(), OutputDigest::default());
        s.clear();
    }
}
