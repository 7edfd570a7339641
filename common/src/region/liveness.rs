//! Liveness locks: open-file-description locks on single bytes of the
//! region file, which the kernel drops when the holder dies however it
//! dies. Byte 0: the follower that owns the region; byte 1: the attached
//! server. A probe (F_OFD_GETLK) takes nothing, and one process never
//! conflicts with its own lock, so the follower and its server can each
//! hold one byte and probe the other.
//!
//! One of the region's homes of `unsafe`: the two `fcntl` calls.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::layout::{MAGIC, W_MAGIC};
use super::{io_err, Region, RegionError};

/// The byte the region's owner (its follower) locks.
const LOCK_OWNER: i64 = 0;
/// The byte the attached server locks.
const LOCK_SERVER: i64 = 1;

/// An exclusive lock request for one byte.
fn lock_request(byte: i64) -> libc::flock {
    libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: byte as libc::off_t,
        l_len: 1,
        // Must be 0 for open-file-description locks.
        l_pid: 0,
    }
}

impl Region {
    /// Makes this process the region's owner (its node's follower) for as
    /// long as this `Region` lives. Fails when another live process owns
    /// it (a second follower of the same node).
    pub fn claim(&self) -> Result<(), RegionError> {
        self.take_lock(LOCK_OWNER, RegionError::Owned)
    }

    /// Whether the region's owner (see `claim`) is alive. A server's
    /// preload asks when the acks it waits for do not come: without its
    /// follower the node can neither ack nor learn of view changes.
    pub fn owner_alive(&self) -> bool {
        self.lock_held(LOCK_OWNER)
    }

    /// Marks this process as the server attached to the region (its
    /// preload, at attach) for as long as this `Region` lives. Fails when
    /// another live server is attached.
    pub fn attach_server(&self) -> Result<(), RegionError> {
        self.take_lock(LOCK_SERVER, RegionError::ServerAttached)
    }

    /// Whether a server is attached (see `attach_server`): the follower
    /// asks to notice its server's exit. Works across pid namespaces, and
    /// a zombie holds nothing.
    pub fn server_attached(&self) -> bool {
        self.lock_held(LOCK_SERVER)
    }

    /// Removes the region file on a clean stop of its owner, unless a
    /// server is attached (`Ok(false)`: the file stays, and the next
    /// follower refuses to start until that server stops, as after a
    /// crash). The server's byte is taken first and kept for as long as
    /// this `Region` lives, so no server attaches to the file once it is
    /// gone from its path. Mappings of the file (this process's, peers'
    /// on shm) stay valid; the file is marked retired after the unlink so
    /// that peers' writers map the path again ([`Region::retired`]).
    /// Nothing of the node's log is lost: the caller stored it all.
    pub fn remove_unattached(&self) -> Result<bool, RegionError> {
        let Some(file) = &self.file else {
            return Ok(false);
        };
        match self.take_lock(LOCK_SERVER, RegionError::ServerAttached) {
            Ok(()) => {}
            Err(RegionError::ServerAttached(_)) => return Ok(false),
            Err(e) => return Err(e),
        }
        // Only the file this process owns: never a newer one at the path.
        let ours = file.metadata().map_err(io_err(&self.path, "stat"))?;
        match std::fs::metadata(&self.path) {
            Ok(now) if (now.dev(), now.ino()) == (ours.dev(), ours.ino()) => {}
            _ => return Ok(false),
        }
        std::fs::remove_file(&self.path).map_err(io_err(&self.path, "remove"))?;
        // After the unlink: a file still at its path is never marked.
        self.words()[W_MAGIC].store(0, Ordering::Release);
        Ok(true)
    }

    /// Whether the region's owner removed its file on a clean stop (see
    /// [`Region::remove_unattached`]): a writer holding a mapping of it
    /// maps the path again, where a restarted owner creates a new file.
    pub fn retired(&self) -> bool {
        self.words()[W_MAGIC].load(Ordering::Acquire) != MAGIC
    }

    fn take_lock(&self, byte: i64, taken: fn(PathBuf) -> RegionError) -> Result<(), RegionError> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let mut fl = lock_request(byte);
        // SAFETY: F_OFD_SETLK on an fd this Region owns, with a fully
        // initialised `flock` that outlives the call.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => Err(taken(self.path.clone())),
            _ => Err(io_err(&self.path, "lock")(e)),
        }
    }

    fn lock_held(&self, byte: i64) -> bool {
        let Some(file) = &self.file else {
            // Anonymous regions have no other process to lose.
            return true;
        };
        let mut fl = lock_request(byte);
        // SAFETY: F_OFD_GETLK only fills in `fl`, a fully initialised
        // `flock` on our stack; the fd is owned by this Region.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
        // Cannot tell: do not give up on a live process.
        r != 0 || fl.l_type != libc::F_UNLCK as libc::c_short
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_regions::{spec, tmp};
    use super::super::Region;

    #[test]
    fn one_owner_and_one_server_at_a_time_and_their_deaths_are_seen() {
        let p = tmp("owner");
        let owner = Region::create(&p, &spec(1)).unwrap();
        let server = Region::open(&p, &spec(1)).unwrap();
        assert!(!server.owner_alive(), "nobody claimed it yet");
        owner.claim().unwrap();
        assert!(server.owner_alive());
        // Probing leaves the lock as it was.
        assert!(server.owner_alive());
        let second = Region::open(&p, &spec(1)).unwrap();
        let e = second.claim().unwrap_err().to_string();
        assert!(e.contains("in use by another running follower"), "{e}");
        drop(owner);
        assert!(!server.owner_alive(), "the owner's lock dies with it");
        second.claim().unwrap();
        assert!(server.owner_alive());
        // The server's byte is independent of the owner's.
        assert!(!second.server_attached());
        server.attach_server().unwrap();
        assert!(second.server_attached() && server.owner_alive());
        let e = Region::open(&p, &spec(1))
            .unwrap()
            .attach_server()
            .unwrap_err()
            .to_string();
        assert!(e.contains("another server is already attached"), "{e}");
        drop(server);
        assert!(!second.server_attached());
        let anon = Region::anonymous(&spec(1)).unwrap();
        assert!(anon.owner_alive() && anon.server_attached());
        anon.claim().unwrap();
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn a_clean_stop_removes_the_file_unless_a_server_is_attached() {
        let p = tmp("remove");
        let owner = Region::create(&p, &spec(1)).unwrap();
        owner.claim().unwrap();
        let server = Region::open(&p, &spec(1)).unwrap();
        server.attach_server().unwrap();
        assert!(!owner.remove_unattached().unwrap(), "a server is attached");
        assert!(p.exists() && !owner.retired());
        drop(server);
        let peer = Region::open(&p, &spec(1)).unwrap();
        assert!(owner.remove_unattached().unwrap());
        assert!(!p.exists());
        assert!(owner.retired() && peer.retired(), "every mapping sees it");
        // Nothing attaches to the removed file any more.
        let e = peer.attach_server().unwrap_err().to_string();
        assert!(e.contains("another server is already attached"), "{e}");
        // A newer file at the path is not the old owner's to remove.
        let newer = Region::create(&p, &spec(1)).unwrap();
        assert!(!owner.remove_unattached().unwrap());
        assert!(p.exists() && !newer.retired());
        assert!(!Region::anonymous(&spec(1))
            .unwrap()
            .remove_unattached()
            .unwrap());
        let _ = std::fs::remove_file(&p);
    }
}
