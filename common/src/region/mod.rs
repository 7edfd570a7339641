//! A node's region: a control block followed by the ring (and the local
//! apply ring), in a file under `/dev/shm` mapped `MAP_SHARED` by the
//! follower process and the preloaded server (and, with the shm transport,
//! by the other nodes' writers).
//!
//! - `layout`: where every word is, sizes and offsets, `RegionSpec`;
//! - `mapping`: the shared mapping as atomic words;
//! - `liveness`: the owner's and the server's liveness locks;
//! - `control_block`: typed accessors of the control block's words;
//! - `handover`: the hand-over word and its fence;
//! - `apply_stream`: the apply stream's words ([`ApplyStream`]);
//! - `doorbell`: the futex-backed [`Doorbell`];
//! - `ahead`: region files opened before a server drops its privileges;
//! - `publish`: a new region file appears whole or not at all.
//!
//! `mapping`, `liveness`, `doorbell` and `publish` (with `hooks` in the
//! preload and `verbs` in the rdma transport) are the only homes of
//! `unsafe`: the mapping itself, the lock probes, the futex calls and the
//! link of a finished file. Everything else
//! sees the region as a slice of `AtomicU64` words.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::words::{self, WordsError};

mod ahead;
mod apply_stream;
mod control_block;
mod doorbell;
mod handover;
mod layout;
mod liveness;
mod mapping;
mod publish;

pub use ahead::open_ahead;
pub use apply_stream::ApplyStream;
pub use control_block::{Role, PINNED_ORIGIN_US};
pub use doorbell::Doorbell;
pub use layout::{
    ack_offset, applied_by_offset, apply_ring_size, bell_offset, cluster_hash, commit_of_view,
    commit_offset, commit_record, commit_record_offset, region_path, ring_offset, tail_offset,
    view_offset, word_offset, RegionSpec, CONTROL_SIZE, LAYOUT_VERSION, MAGIC, MAX_NODES,
};
#[cfg(feature = "rdma")]
pub(crate) use mapping::map_shared;

use layout::*;
use mapping::SharedWords;

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
    /// The file is not (yet) a lockstep region: too short, or without the
    /// magic its creator writes last (it may be being created just now).
    #[error("region file {path}: {what}")]
    Unfinished {
        /// File path.
        path: PathBuf,
        /// What is missing.
        what: String,
    },
    /// The file is a lockstep region of another layout, node or cluster.
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
    map: SharedWords,
    ring_size: u64,
    path: PathBuf,
    /// The open file behind the mapping (None: anonymous); it carries
    /// this process's liveness lock (see `claim`, `attach_server`).
    file: Option<File>,
}

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
    /// Creates a new region file at `path`; fails if it exists. The file
    /// is sized and initialised before it has a name (see `publish`): one
    /// found at `path` is always whole, and a creator killed midway leaves
    /// nothing there.
    pub fn create(path: &Path, spec: &RegionSpec) -> Result<Region, RegionError> {
        let draft = publish::draft_beside(path).map_err(io_err(path, "create"))?;
        draft
            .file
            .set_len(spec.file_len())
            .map_err(io_err(path, "set length"))?;
        let file = draft.file.try_clone().map_err(io_err(path, "create"))?;
        let region = Self::map(Some(file), path, spec.file_len(), spec.ring_size)?;
        region.init_identity(spec);
        draft.publish(path).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                RegionError::Exists(path.to_path_buf())
            } else {
                io_err(path, "link")(e)
            }
        })?;
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

    /// Opens an existing region and checks it matches `spec`. A file
    /// [`open_ahead`] kept for `path` is used instead of opening
    /// the path again.
    pub fn open(path: &Path, spec: &RegionSpec) -> Result<Region, RegionError> {
        let file = ahead::kept(path)
            .map(Ok)
            .unwrap_or_else(|| OpenOptions::new().read(true).write(true).open(path))
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
        let unfinished = |what: String| RegionError::Unfinished {
            path: path.to_path_buf(),
            what,
        };
        if len < CONTROL_SIZE {
            return Err(unfinished(format!(
                "{len} bytes is too short to be a lockstep region"
            )));
        }
        let region = Self::map(Some(file), path, len.min(spec.file_len()), spec.ring_size)?;
        let w = region.words();
        if w[W_MAGIC].load(Ordering::Acquire) != MAGIC {
            return Err(unfinished("not a lockstep region (bad magic)".into()));
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
            // Never one this build created (they appear whole): a foreign
            // file, or one an older build left half made.
            Err(RegionError::Unfinished { path, what }) => Err(RegionError::Unfinished {
                what: format!(
                    "{what}; if it is not a region being created by another follower of this node right now, remove it and start again"
                ),
                path,
            }),
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
        let map = SharedWords::map(file.as_ref().map(|f| f.as_raw_fd()), len as usize)
            .map_err(io_err(path, "mmap"))?;
        Ok(Region {
            map,
            ring_size,
            path: path.to_path_buf(),
            file,
        })
    }

    /// Clears everything but the identity words: ring, view, role, acks,
    /// commit, tail, apply stream. Used by a follower that starts over with
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
        self.map.words()
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
        self.words().len() as u64 * 8
    }

    /// Bytes remote nodes may write (control block and ring).
    pub fn remote_len(&self) -> u64 {
        CONTROL_SIZE + self.ring_size
    }

    /// Always false: a region has at least a control block.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The node this region belongs to (its identity word).
    pub fn node(&self) -> u64 {
        self.words()[W_NODE].load(Ordering::Relaxed)
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
        self.write_unrung(offset, bytes)?;
        self.bell().ring();
        Ok(())
    }

    /// [`Region::write`] without the doorbell: for a writer that rings once
    /// after several writes (an entry, its wrap and the tail are one
    /// message to the poller; a ring each woke it up to three times).
    pub fn write_unrung(&self, offset: u64, bytes: &[u8]) -> Result<(), RegionError> {
        let remote = CONTROL_WORDS + (self.ring_size / 8) as usize;
        Ok(words::store(&self.words()[..remote], offset, bytes)?)
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        &self.words()[i]
    }
}

#[cfg(test)]
mod tests {
    use super::test_regions::{spec, tmp};
    use super::*;

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
    fn a_region_file_appears_whole_or_not_at_all() {
        // A preload polls the path while a follower creates the region:
        // it finds nothing, then a whole region; never a file too short or
        // without its magic (a creator killed there would leave that).
        let p = tmp("whole");
        for _ in 0..100 {
            let _ = std::fs::remove_file(&p);
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let opener = {
                let (p, stop) = (p.clone(), stop.clone());
                std::thread::spawn(move || loop {
                    // Read before the open: once set, the file is there.
                    let created = stop.load(Ordering::Acquire);
                    match Region::open(&p, &spec(1)) {
                        Err(RegionError::Missing(_)) if !created => {}
                        other => return other.map(|_| ()).map_err(|e| e.to_string()),
                    }
                })
            };
            let created = Region::create(&p, &spec(1)).unwrap();
            stop.store(true, Ordering::Release);
            assert_eq!(opener.join().unwrap(), Ok(()));
            drop(created);
        }
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_follower_finding_a_foreign_file_says_how_to_go_on() {
        let p = tmp("leftover");
        std::fs::write(&p, vec![0u8; CONTROL_SIZE as usize]).unwrap();
        let e = Region::open_or_create(&p, &spec(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad magic") && e.contains("remove it"), "{e}");
        std::fs::remove_file(&p).unwrap();
        // Nothing left of a creation that failed: the directory is gone.
        let gone = std::env::temp_dir().join("lockstep-no-such-dir").join("r");
        assert!(Region::create(&gone, &spec(1)).is_err());
        assert!(!gone.exists());
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
}

/// Regions for the unit tests of this module's parts.
#[cfg(test)]
pub(crate) mod test_regions {
    use std::path::PathBuf;

    use super::RegionSpec;

    pub(crate) fn spec(node: u64) -> RegionSpec {
        RegionSpec {
            cluster: "unit".into(),
            node,
            ring_size: 1 << 20,
        }
    }

    pub(crate) fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("lockstep-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }
}
