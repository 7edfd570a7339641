//! A node's region: a control block followed by the ring, in a file under
//! `/dev/shm` mapped `MAP_SHARED` by the follower process and the preloaded
//! server (and, with the shm transport, by the other nodes' writers).
//!
//! This module and `hooks`/`verbs` are the only homes of `unsafe`: the
//! mapping itself and the futex calls. Everything else sees the region as a
//! slice of `AtomicU64` words.
//!
//! Control block (word indices; each field on its own cache line):
//! identity (magic, layout version, node, ring size, cluster hash), view,
//! leader, role, commit, tail, doorbell, follower heartbeat, writer hand-off
//! (next seq / next position), the ack array, and the replay slots through
//! which the passive preload reports what the server consumed.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::words::{self, WordsError};

/// "LOCKSTEP" in ASCII, little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"LOCKSTEP");
/// Bumped whenever the control block layout changes.
pub const LAYOUT_VERSION: u64 = 3;
/// Bytes of control block before the ring.
pub const CONTROL_SIZE: u64 = 32 * 1024;
/// Highest node id (ids are 1..=MAX_NODES).
pub const MAX_NODES: usize = 15;

const LINE: usize = 8; // words per cache line
const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_NODE: usize = 2;
const W_RING_SIZE: usize = 3;
const W_CLUSTER: usize = 4;
const W_VIEW: usize = LINE;
const W_LEADER: usize = 2 * LINE;
const W_ROLE: usize = 3 * LINE;
// The view whose leader last wrote the commit word, just before it: a
// leader sends both in one write, view first (see `commit_record`).
const W_COMMIT_VIEW: usize = 4 * LINE;
const W_COMMIT: usize = 4 * LINE + 1;
const W_TAIL: usize = 5 * LINE;
const W_BELL: usize = 6 * LINE;
const W_BELL_WAITERS: usize = 7 * LINE;
const W_HEARTBEAT: usize = 8 * LINE;
const W_NEXT_SEQ: usize = 9 * LINE;
const W_NEXT_POS: usize = 10 * LINE;
const W_PRELOAD: usize = 11 * LINE;
// Highest seq whose input the leader's preload handed to its server, with
// HANDOVER_FENCED set once the follower stopped the hand-overs.
const W_HANDOVER: usize = 12 * LINE;
const HANDOVER_FENCED: u64 = 1 << 63;
// The apply stream (see `ApplyStream`): the follower's words, then the
// passive preload's, then the doorbell the preload's applier parks on.
const W_APPLY_TAIL: usize = 13 * LINE;
const W_APPLY_EPOCH: usize = 13 * LINE + 1;
const W_APPLY_START_SEQ: usize = 13 * LINE + 2;
const W_APPLY_HEAD: usize = 14 * LINE;
const W_APPLIED: usize = 14 * LINE + 1;
const W_DIVERGED: usize = 14 * LINE + 2;
const W_APPLY_BELL: usize = 15 * LINE;
const W_APPLY_BELL_WAITERS: usize = 15 * LINE + 1;
const W_ACK: usize = 16 * LINE; // ack[id] at W_ACK + id * LINE
                                // applied[id] at W_APPLIED_BY + id * LINE: how far each backup's server
                                // applied, written by the backups into the leader's region.
const W_APPLIED_BY: usize = W_ACK + (MAX_NODES + 1) * LINE;
const CONTROL_WORDS: usize = (CONTROL_SIZE / 8) as usize;

const _: () = assert!(W_APPLIED_BY + (MAX_NODES + 1) * LINE <= CONTROL_WORDS);

/// Bytes of a node's apply ring for a replication ring of `ring_size`: a
/// quarter of it, between 1 and 16 MiB (a power of two, like the ring).
pub fn apply_ring_size(ring_size: u64) -> u64 {
    (ring_size / 4).clamp(1 << 20, 16 << 20)
}

/// Role of a node in its current view, as the preload sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Role {
    /// Not yet part of a view (follower starting, recovering): the preload
    /// serves only replay connections.
    Joining = 0,
    /// Backup: the preload is passive.
    Backup = 1,
    /// Leader: the preload is active and replicates inputs.
    Leader = 2,
}

impl Role {
    fn from_u64(v: u64) -> Role {
        match v {
            1 => Role::Backup,
            2 => Role::Leader,
            _ => Role::Joining,
        }
    }
}

/// Byte offset in the region of a control word (for one-sided remote writes).
pub fn word_offset(word: usize) -> u64 {
    (word * 8) as u64
}

/// Region offset of node `id`'s ack slot.
pub fn ack_offset(id: u64) -> u64 {
    word_offset(W_ACK + id as usize * LINE)
}
/// Region offset of node `id`'s applied slot.
pub fn applied_by_offset(id: u64) -> u64 {
    word_offset(W_APPLIED_BY + id as usize * LINE)
}

/// Region offset of the commit word.
pub fn commit_offset() -> u64 {
    word_offset(W_COMMIT)
}
/// Region offset of a commit record (`commit_record`): the commit word's
/// view tag, followed by the commit word.
pub fn commit_record_offset() -> u64 {
    word_offset(W_COMMIT_VIEW)
}
/// What a leader of `view` writes at `commit_record_offset` to tell a peer
/// that `seq` is committed. Words are stored in order, the last with
/// release, so a reader that loads the commit word first (acquire) and
/// the tag second sees the tag of that write or of a later one.
pub fn commit_record(view: u64, seq: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&view.to_le_bytes());
    b[8..].copy_from_slice(&seq.to_le_bytes());
    b
}
/// Region offset of the tail word.
pub fn tail_offset() -> u64 {
    word_offset(W_TAIL)
}
/// Region offset of the view word.
pub fn view_offset() -> u64 {
    word_offset(W_VIEW)
}
/// Region offset of the doorbell word.
pub fn bell_offset() -> u64 {
    word_offset(W_BELL)
}
/// Region offset of ring byte `ring_offset`.
pub fn ring_offset(ring_offset: u64) -> u64 {
    CONTROL_SIZE + ring_offset
}

/// What a region must be: used to create one and to check one found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSpec {
    /// Cluster name (hashed into the control block).
    pub cluster: String,
    /// Node id owning the region.
    pub node: u64,
    /// Ring size in bytes (power of two).
    pub ring_size: u64,
}

impl RegionSpec {
    /// Total bytes of the region file: control block, ring, apply ring.
    pub fn file_len(&self) -> u64 {
        CONTROL_SIZE + self.ring_size + apply_ring_size(self.ring_size)
    }

    /// Bytes that remote nodes may write: the control block and the ring
    /// (the apply ring is the local follower's, for its own server only).
    pub fn remote_len(&self) -> u64 {
        CONTROL_SIZE + self.ring_size
    }

    /// `/dev/shm/lockstep-<cluster>-<node>`.
    pub fn default_path(&self) -> PathBuf {
        region_path(&self.cluster, self.node)
    }
}

/// Path of node `node`'s region file for `cluster`.
pub fn region_path(cluster: &str, node: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/lockstep-{cluster}-{node}"))
}

/// FNV-1a hash of a cluster name: stored in every region's control block
/// and sent in the tcp handshake.
pub fn cluster_hash(name: &str) -> u64 {
    let mut h = crate::entry::OutputHash::default();
    h.update(name.as_bytes());
    h.0
}

/// Liveness locks: open-file-description locks on single bytes of the
/// region file, which the kernel drops when the holder dies however it
/// dies. Byte 0: the follower that owns the region; byte 1: the attached
/// server. A probe (F_OFD_GETLK) takes nothing, and one process never
/// conflicts with its own lock, so the follower and its server can each
/// hold one byte and probe the other.
const LOCK_OWNER: i64 = 0;
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

/// Maps `len` bytes of the file `fd` (None: fresh zeroed anonymous memory)
/// read-write and `MAP_SHARED`, so a `fork` never copies them. The caller
/// unmaps them.
pub(crate) fn map_shared(fd: Option<RawFd>, len: usize) -> io::Result<*mut libc::c_void> {
    let (flags, fd) = match fd {
        Some(fd) => (libc::MAP_SHARED, fd),
        None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: a new mapping chosen by the kernel (no address hint), of an
    // open fd or anonymous; MAP_FAILED is checked. It touches no existing
    // memory.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(ptr)
}

/// Why a region could not be created, opened or written.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The file exists already (create refuses to reuse it).
    #[error(
        "region file {0} already exists (another follower running, or a stale file: remove it)"
    )]
    Exists(PathBuf),
    /// The file does not exist.
    #[error("region file {0} does not exist (is the follower for this node running?)")]
    Missing(PathBuf),
    /// The file is not a lockstep region or has another layout.
    #[error("region file {path}: {what}")]
    Mismatch {
        /// File path.
        path: PathBuf,
        /// What does not match.
        what: String,
    },
    /// An OS call failed.
    #[error("region file {path}: {op}: {source}")]
    Io {
        /// File path.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Another live process (a follower of the same node) owns the file.
    #[error("region file {0} is in use by another running follower of this node")]
    Owned(PathBuf),
    /// Another live server is attached to the region.
    #[error("another server is already attached to region file {0} (one server per node)")]
    ServerAttached(PathBuf),
    /// A write fell outside the region or was misaligned.
    #[error(transparent)]
    Range(#[from] WordsError),
}

/// A mapped region. Dropping it unmaps (the file stays).
pub struct Region {
    ptr: *mut AtomicU64,
    words: usize,
    ring_size: u64,
    path: PathBuf,
    /// The open file behind the mapping (None: anonymous); it carries
    /// this process's liveness lock (see `claim`, `attach_server`).
    file: Option<File>,
}

// SAFETY: the mapping is only accessed through `AtomicU64`, which is Sync;
// the pointer stays valid until Drop, which needs `&mut self`.
unsafe impl Send for Region {}
// SAFETY: as above, all access is atomic.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("path", &self.path)
            .field("ring_size", &self.ring_size)
            .finish()
    }
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> RegionError + 'a {
    move |source| RegionError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

impl Region {
    /// Creates a new region file at `path`; fails if it exists.
    pub fn create(path: &Path, spec: &RegionSpec) -> Result<Region, RegionError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    RegionError::Exists(path.to_path_buf())
                } else {
                    io_err(path, "create")(e)
                }
            })?;
        file.set_len(spec.file_len())
            .map_err(io_err(path, "set length"))?;
        let region = Self::map(Some(file), path, spec.file_len(), spec.ring_size)?;
        region.init_identity(spec);
        Ok(region)
    }

    /// Writes the identity words of a fresh region.
    fn init_identity(&self, spec: &RegionSpec) {
        let w = self.words();
        w[W_VERSION].store(LAYOUT_VERSION, Ordering::Relaxed);
        w[W_NODE].store(spec.node, Ordering::Relaxed);
        w[W_RING_SIZE].store(spec.ring_size, Ordering::Relaxed);
        w[W_CLUSTER].store(cluster_hash(&spec.cluster), Ordering::Relaxed);
        // Magic last: a half-initialised file is never taken for a region.
        w[W_MAGIC].store(MAGIC, Ordering::Release);
    }

    /// Opens an existing region and checks it matches `spec`.
    pub fn open(path: &Path, spec: &RegionSpec) -> Result<Region, RegionError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    RegionError::Missing(path.to_path_buf())
                } else {
                    io_err(path, "open")(e)
                }
            })?;
        let len = file.metadata().map_err(io_err(path, "stat"))?.len();
        let mismatch = |what: String| RegionError::Mismatch {
            path: path.to_path_buf(),
            what,
        };
        if len < CONTROL_SIZE {
            return Err(mismatch(format!(
                "{len} bytes is too short to be a lockstep region"
            )));
        }
        let region = Self::map(Some(file), path, len.min(spec.file_len()), spec.ring_size)?;
        let w = region.words();
        if w[W_MAGIC].load(Ordering::Acquire) != MAGIC {
            return Err(mismatch("not a lockstep region (bad magic)".into()));
        }
        let version = w[W_VERSION].load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(mismatch(format!(
                "layout version {version}, this build expects {LAYOUT_VERSION}"
            )));
        }
        let ring = w[W_RING_SIZE].load(Ordering::Relaxed);
        if ring != spec.ring_size || len != spec.file_len() {
            return Err(mismatch(format!(
                "ring size {ring} ({len} bytes), config says {} ({} bytes)",
                spec.ring_size,
                spec.file_len()
            )));
        }
        let node = w[W_NODE].load(Ordering::Relaxed);
        if node != spec.node {
            return Err(mismatch(format!(
                "belongs to node {node}, expected node {}",
                spec.node
            )));
        }
        if w[W_CLUSTER].load(Ordering::Relaxed) != cluster_hash(&spec.cluster) {
            return Err(mismatch(format!(
                "belongs to another cluster than {:?}",
                spec.cluster
            )));
        }
        Ok(region)
    }

    /// Opens the region if a matching one exists, otherwise creates it.
    /// Returns whether it was created. A file with another layout is an
    /// error, never silently replaced.
    pub fn open_or_create(path: &Path, spec: &RegionSpec) -> Result<(Region, bool), RegionError> {
        match Self::open(path, spec) {
            Ok(r) => Ok((r, false)),
            Err(RegionError::Missing(_)) => Ok((Self::create(path, spec)?, true)),
            Err(e) => Err(e),
        }
    }

    /// An anonymous shared region, for tests and benchmarks.
    pub fn anonymous(spec: &RegionSpec) -> Result<Region, RegionError> {
        let region = Self::map(
            None,
            Path::new("<anonymous>"),
            spec.file_len(),
            spec.ring_size,
        )?;
        region.init_identity(spec);
        Ok(region)
    }

    /// Maps `len` bytes of `file` (None: fresh zeroed anonymous memory)
    /// shared. The memory is page-aligned (so 8-aligned) and only ever
    /// accessed as atomics, for which every bit pattern is valid.
    fn map(
        file: Option<File>,
        path: &Path,
        len: u64,
        ring_size: u64,
    ) -> Result<Region, RegionError> {
        let ptr = map_shared(file.as_ref().map(|f| f.as_raw_fd()), len as usize)
            .map_err(io_err(path, "mmap"))?;
        Ok(Region {
            ptr: ptr as *mut AtomicU64,
            words: (len / 8) as usize,
            ring_size,
            path: path.to_path_buf(),
            file,
        })
    }

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

    /// Clears everything but the identity words: ring, view, role, acks,
    /// commit, tail, replay slots. Used by a follower that starts over with
    /// a region file left behind by an earlier run; writers that still map
    /// the file keep writing into the same memory.
    pub fn reset(&self) {
        for (i, w) in self.words().iter().enumerate().skip(LINE) {
            // Parked waiters keep their bookkeeping.
            if i != W_BELL && i != W_BELL_WAITERS && i != W_APPLY_BELL_WAITERS {
                w.store(0, Ordering::Relaxed);
            }
        }
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// The whole region as atomic words.
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is a live, page-aligned mapping of `words * 8` bytes
        // (see `map`); AtomicU64 has the size and alignment of u64 and every
        // bit pattern is valid. The slice borrows `self`, so it cannot
        // outlive the mapping.
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }

    /// The ring part of the region.
    pub fn ring(&self) -> &[AtomicU64] {
        &self.words()[CONTROL_WORDS..CONTROL_WORDS + (self.ring_size / 8) as usize]
    }

    /// The apply ring: committed entries in log order, written by the local
    /// follower, read by the server's passive preload.
    pub fn apply_ring(&self) -> &[AtomicU64] {
        &self.words()[CONTROL_WORDS + (self.ring_size / 8) as usize..]
    }

    /// The apply stream's words.
    pub fn apply(&self) -> ApplyStream<'_> {
        ApplyStream {
            words: self.words(),
        }
    }

    /// Ring size in bytes.
    pub fn ring_size(&self) -> u64 {
        self.ring_size
    }

    /// Total bytes of the region.
    pub fn len(&self) -> u64 {
        self.words as u64 * 8
    }

    /// Bytes remote nodes may write (control block and ring).
    pub fn remote_len(&self) -> u64 {
        CONTROL_SIZE + self.ring_size
    }

    /// Always false: a region has at least a control block.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Path of the backing file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One-sided write of `bytes` at region offset `offset` (bounds- and
    /// alignment-checked against the remotely writable part: control block
    /// and ring; the last 8 bytes land last, with release), then rings the
    /// doorbell.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), RegionError> {
        let remote = CONTROL_WORDS + (self.ring_size / 8) as usize;
        words::store(&self.words()[..remote], offset, bytes)?;
        self.bell().ring();
        Ok(())
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        &self.words()[i]
    }

    /// Current view of this node.
    pub fn view(&self) -> u64 {
        self.word(W_VIEW).load(Ordering::Acquire)
    }
    /// Sets the view (follower only).
    pub fn set_view(&self, v: u64) {
        self.word(W_VIEW).store(v, Ordering::Release)
    }
    /// Raises the view word to `v` (fencing: it never goes back).
    pub fn raise_view(&self, v: u64) {
        self.word(W_VIEW).fetch_max(v, Ordering::AcqRel);
    }
    /// Leader of the current view (0: none).
    pub fn leader(&self) -> u64 {
        self.word(W_LEADER).load(Ordering::Acquire)
    }
    /// Sets the leader id.
    pub fn set_leader(&self, id: u64) {
        self.word(W_LEADER).store(id, Ordering::Release)
    }
    /// This node's role, read by the preload.
    pub fn role(&self) -> Role {
        Role::from_u64(self.word(W_ROLE).load(Ordering::Acquire))
    }
    /// Sets the role (follower only).
    pub fn set_role(&self, r: Role) {
        self.word(W_ROLE).store(r as u64, Ordering::Release);
        self.bell().ring();
    }
    /// Highest committed seq.
    pub fn commit(&self) -> u64 {
        self.word(W_COMMIT).load(Ordering::Acquire)
    }
    /// Leader's preload: records that the input up to `seq` goes to the
    /// server now. False once the follower fenced hand-overs: the input
    /// must then not reach the server.
    pub fn hand_over(&self, seq: u64) -> bool {
        self.word(W_HANDOVER)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur & HANDOVER_FENCED == 0).then_some(cur.max(seq))
            })
            .is_ok()
    }
    /// Highest seq whose input the leader's preload handed to its server
    /// (fenced or not).
    pub fn served(&self) -> u64 {
        self.word(W_HANDOVER).load(Ordering::Acquire) & !HANDOVER_FENCED
    }
    /// Whether hand-overs are fenced (this node is not serving a view).
    pub fn handover_fenced(&self) -> bool {
        self.word(W_HANDOVER).load(Ordering::Acquire) & HANDOVER_FENCED != 0
    }
    /// Follower, when this node stops leading (or the leader's preload,
    /// once its follower is gone): stops every further hand-over and
    /// returns the highest seq the server was given. Exact: a hand-over
    /// either landed before the fence or fails.
    pub fn fence_handover(&self) -> u64 {
        self.word(W_HANDOVER)
            .fetch_or(HANDOVER_FENCED, Ordering::AcqRel)
            & !HANDOVER_FENCED
    }
    /// Follower, when this node starts leading after serving up to `seq`
    /// (by replay): hand-overs allowed again.
    pub fn open_handover(&self, seq: u64) {
        self.word(W_HANDOVER).store(seq, Ordering::Release);
    }

    /// The commit word and the view of the leader that wrote it (a view
    /// at least that new: see `commit_record`). A commit point is only
    /// meaningful for a log that follows that view.
    pub fn commit_in_view(&self) -> (u64, u64) {
        let seq = self.word(W_COMMIT).load(Ordering::Acquire);
        (seq, self.word(W_COMMIT_VIEW).load(Ordering::Acquire))
    }
    /// Raises the commit word to at least `seq`.
    pub fn raise_commit(&self, seq: u64) {
        self.word(W_COMMIT).fetch_max(seq, Ordering::AcqRel);
    }
    /// Sets the commit word (view change only).
    pub fn set_commit(&self, seq: u64) {
        self.word(W_COMMIT).store(seq, Ordering::Release);
    }
    /// Writer's last published end position.
    pub fn tail(&self) -> u64 {
        self.word(W_TAIL).load(Ordering::Acquire)
    }
    /// Publishes the writer's end position.
    pub fn set_tail(&self, pos: u64) {
        self.word(W_TAIL).store(pos, Ordering::Release)
    }
    /// `ack[id]`: highest seq node `id` stored in the current view.
    pub fn ack(&self, id: u64) -> u64 {
        self.word(W_ACK + id as usize * LINE)
            .load(Ordering::Acquire)
    }
    /// Sets `ack[id]` locally.
    pub fn set_ack(&self, id: u64, seq: u64) {
        self.word(W_ACK + id as usize * LINE)
            .store(seq, Ordering::Release);
        self.bell().ring();
    }
    /// How far node `id`'s server applied the log, as it last told this
    /// (leading) node.
    pub fn applied_by(&self, id: u64) -> u64 {
        self.word(W_APPLIED_BY + id as usize * LINE)
            .load(Ordering::Acquire)
    }
    /// Resets every ack slot (new view).
    pub fn clear_acks(&self) {
        for id in 0..=MAX_NODES as u64 {
            self.word(W_ACK + id as usize * LINE)
                .store(0, Ordering::Release);
        }
    }
    /// Follower heartbeat (milliseconds since the epoch; 0: never).
    pub fn heartbeat(&self) -> u64 {
        self.word(W_HEARTBEAT).load(Ordering::Acquire)
    }
    /// Updates the follower heartbeat.
    pub fn set_heartbeat(&self, ms: u64) {
        self.word(W_HEARTBEAT).store(ms, Ordering::Release)
    }
    /// Writer hand-off: (next seq, next ring position) for a new leader's
    /// preload, set by the follower before it flips the role to leader.
    pub fn writer_start(&self) -> (u64, u64) {
        (
            self.word(W_NEXT_SEQ).load(Ordering::Acquire),
            self.word(W_NEXT_POS).load(Ordering::Acquire),
        )
    }
    /// Sets the writer hand-off.
    pub fn set_writer_start(&self, seq: u64, pos: u64) {
        self.word(W_NEXT_SEQ).store(seq, Ordering::Release);
        self.word(W_NEXT_POS).store(pos, Ordering::Release);
    }
    /// Pid of the preloaded server attached to this region (0: none).
    pub fn preload_pid(&self) -> u64 {
        self.word(W_PRELOAD).load(Ordering::Acquire)
    }
    /// Records the attached server's pid.
    pub fn set_preload_pid(&self, pid: u64) {
        self.word(W_PRELOAD).store(pid, Ordering::Release)
    }
    /// The doorbell pollers of this region park on.
    pub fn bell(&self) -> Doorbell<'_> {
        Doorbell {
            seq: self.word(W_BELL),
            waiters: self.word(W_BELL_WAITERS),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`words` describe the mapping made in `map` or
        // `anonymous`; no borrow of it survives `&mut self`.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.words * 8);
        }
    }
}

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
    words: &'a [AtomicU64],
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
    /// Preload: publishes how far it read.
    pub fn set_head(&self, pos: u64) {
        self.w(W_APPLY_HEAD).store(pos, Ordering::Release);
    }
    /// Last seq the server consumed.
    pub fn applied(&self) -> u64 {
        self.w(W_APPLIED).load(Ordering::Acquire)
    }
    /// Preload: records that the server consumed up to `seq`.
    pub fn set_applied(&self, seq: u64) {
        self.w(W_APPLIED).store(seq, Ordering::Release);
    }
    /// Entries whose output on this node differed from the leader's.
    pub fn diverged(&self) -> u64 {
        self.w(W_DIVERGED).load(Ordering::Acquire)
    }
    /// Preload: counts one divergent entry.
    pub fn add_diverged(&self) {
        self.w(W_DIVERGED).fetch_add(1, Ordering::AcqRel);
    }
    /// The doorbell the preload's applier parks on (rung on every new tail
    /// and restart).
    pub fn bell(&self) -> Doorbell<'a> {
        Doorbell {
            seq: self.w(W_APPLY_BELL),
            waiters: self.w(W_APPLY_BELL_WAITERS),
        }
    }
}

/// A futex-backed doorbell: writers bump it after posting an entry or an
/// ack; pollers that ran out of spinning park on it instead of sleeping a
/// timer's worth.
#[derive(Clone, Copy, Debug)]
pub struct Doorbell<'a> {
    seq: &'a AtomicU64,
    waiters: &'a AtomicU64,
}

impl<'a> Doorbell<'a> {
    fn futex_word(&self) -> &AtomicU32 {
        // SAFETY: the low half of an 8-aligned AtomicU64 on little-endian
        // x86_64/aarch64 is a 4-aligned u32 inside the same live mapping;
        // the futex syscall and this view only touch it atomically.
        unsafe { &*(self.seq as *const AtomicU64 as *const AtomicU32) }
    }

    /// Current doorbell value (pass to [`Doorbell::wait`]).
    pub fn value(&self) -> u32 {
        self.futex_word().load(Ordering::Acquire)
    }

    /// Bumps the doorbell and wakes parked waiters, if any.
    pub fn ring(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        if self.waiters.load(Ordering::SeqCst) != 0 {
            // SAFETY: FUTEX_WAKE on a valid shared-memory u32; no pointer
            // arguments besides the word itself.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.futex_word().as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                );
            }
        }
    }

    /// Parks until the doorbell moves past `seen` or `timeout` passes.
    pub fn wait(&self, seen: u32, timeout: Duration) {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        if self.value() == seen {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: FUTEX_WAIT on a valid shared u32 with a stack timespec
            // that outlives the call; spurious wake-ups are fine for callers.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.futex_word().as_ptr(),
                    libc::FUTEX_WAIT,
                    seen,
                    &ts as *const libc::timespec,
                );
            }
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(node: u64) -> RegionSpec {
        RegionSpec {
            cluster: "unit".into(),
            node,
            ring_size: 1 << 20,
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("lockstep-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

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
    fn create_twice_fails_and_open_checks_layout() {
        let p = tmp("twice");
        let r = Region::create(&p, &spec(1)).unwrap();
        r.set_view(3);
        assert!(matches!(
            Region::create(&p, &spec(1)),
            Err(RegionError::Exists(_))
        ));
        let r2 = Region::open(&p, &spec(1)).unwrap();
        assert_eq!(r2.view(), 3);
        let e = Region::open(&p, &spec(2)).unwrap_err().to_string();
        assert!(e.contains("belongs to node 1"), "{e}");
        let mut other = spec(1);
        other.ring_size = 1 << 21;
        let e = Region::open(&p, &other).unwrap_err().to_string();
        assert!(e.contains("ring size"), "{e}");
        let mut other = spec(1);
        other.cluster = "else".into();
        let e = Region::open(&p, &other).unwrap_err().to_string();
        assert!(e.contains("another cluster"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn open_rejects_foreign_files() {
        let p = tmp("foreign");
        std::fs::write(&p, vec![0u8; (CONTROL_SIZE + (1 << 20)) as usize]).unwrap();
        let e = Region::open(&p, &spec(1)).unwrap_err().to_string();
        assert!(e.contains("bad magic"), "{e}");
        std::fs::write(&p, b"short").unwrap();
        let e = Region::open(&p, &spec(1)).unwrap_err().to_string();
        assert!(e.contains("too short"), "{e}");
        std::fs::remove_file(&p).unwrap();
        let e = Region::open(&p, &spec(1)).unwrap_err();
        assert!(matches!(e, RegionError::Missing(_)));
    }

    #[test]
    fn writes_are_bounds_checked() {
        let r = Region::anonymous(&spec(1)).unwrap();
        let remote = spec(1).remote_len();
        assert!(r.write(remote - 8, &[1; 8]).is_ok());
        assert!(r.write(remote, &[1; 8]).is_err());
        assert!(r.write(4, &[1; 8]).is_err());
        r.write(ack_offset(2), &7u64.to_le_bytes()).unwrap();
        assert_eq!(r.ack(2), 7);
    }

    #[test]
    fn handover_fence_is_exact() {
        let r = Region::anonymous(&spec(1)).unwrap();
        r.open_handover(10);
        assert!(r.hand_over(12));
        assert!(r.hand_over(11), "an older seq keeps the highest");
        assert_eq!(r.fence_handover(), 12);
        assert!(!r.hand_over(13), "fenced: nothing more reaches the server");
        assert_eq!(r.fence_handover(), 12, "fencing twice reads the same");
        r.open_handover(20);
        assert!(r.hand_over(21));
        assert_eq!(r.fence_handover(), 21);
    }

    #[test]
    fn commit_records_carry_their_view() {
        let r = Region::anonymous(&spec(1)).unwrap();
        r.write(commit_record_offset(), &commit_record(4, 220))
            .unwrap();
        assert_eq!(r.commit_in_view(), (220, 4));
        assert_eq!(r.commit(), 220);
        // The leader's own raise leaves the tag alone.
        r.raise_commit(230);
        assert_eq!(r.commit_in_view(), (230, 4));
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
        assert_eq!(apply_ring_size(64 << 20), 16 << 20);
        assert_eq!(apply_ring_size(1 << 20), 1 << 20);
    }

    #[test]
    fn doorbell_wakes_a_parked_waiter() {
        let r = std::sync::Arc::new(Region::anonymous(&spec(1)).unwrap());
        let seen = r.bell().value();
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            r2.bell().wait(seen, Duration::from_secs(30));
            r2.bell().value()
        });
        std::thread::sleep(Duration::from_millis(20));
        r.bell().ring();
        assert_ne!(t.join().unwrap(), seen);
    }
}
