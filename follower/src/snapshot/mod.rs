//! Snapshots: images of this node's server taken at a log position, so
//! that the log below them can be deleted and a node restarts (or joins)
//! from an image plus the entries after it.
//!
//! How an image is made is [`ServerImage`]'s business (the CRIU
//! implementation is [`criu::Criu`]); everything else here works on
//! directories of files with a [`Meta`] beside them and never looks inside
//! them:
//!
//! - [`build_id`]: the build ids an image is taken and restored under.
//! - [`catalog`]: the snapshots on disk: list, newest complete, verify,
//!   delete old ones and incomplete leftovers.
//! - [`transfer`]: installing a peer's snapshot in checksummed chunks,
//!   resumable after a broken transfer, never the whole image in memory.
//!
//! On disk: `<node dir>/snapshots/<seq as 20 digits>/` ([`snapshots_dir`])
//! holds the image's files and, written last (atomically, by rename),
//! `meta.json` ([`META_FILE`]). A directory without it is incomplete:
//! ignored, and deleted by [`catalog::Catalog::clean`].

pub mod build_id;
pub mod catalog;
pub mod criu;
pub mod protobuf;
pub mod relocate;
pub mod transfer;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A log position a snapshot was taken at: the server had applied every entry up to `seq` (inclusive)
/// and nothing after, at a turn boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Position {
    /// The last entry the server applied.
    pub seq: u64,
    /// That entry's view.
    pub view: u64,
    /// The log's time at that entry (µs).
    pub time_us: u64,
}

/// Takes and restores images of this node's server (the CRIU implementation is `criu::Criu`).
pub trait ServerImage: Send + Sync {
    /// Quiesce the server after it applied exactly `upto` (the runtime stops feeding the apply ring
    /// there and calls this once the server reported it applied `upto`), write the image's files into
    /// the empty directory `dir`, let the server run on. Returns the build ids recorded in the image
    /// (server binary, liblockstep.so) as (name, hex) pairs.
    fn take(&self, dir: &std::path::Path, upto: Position) -> anyhow::Result<Vec<(String, String)>>;
    /// Replace this node's (stopped) server by the one in `dir`; returns once it runs.
    fn restore(&self, dir: &std::path::Path, at: Position) -> anyhow::Result<()>;
    /// Stops this node's running server for good (before an installed
    /// image replaces it).
    fn stop_server(&self) -> anyhow::Result<()>;
}

/// Where the preload's apply stream stood when an image was taken: a
/// restored server's preload reads on from there, so the follower resumes
/// the stream (same epoch, same ring position) instead of starting a new
/// one (which would end every replay connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    /// The stream's epoch.
    pub epoch: u64,
    /// The seq the stream started at.
    pub start_seq: u64,
    /// The apply ring position just past the last entry applied.
    pub pos: u64,
    /// The last seq applied.
    pub applied: u64,
    /// Threads of the server parked on the apply doorbell (its applier,
    /// when idle): the restored ones leave that wait and uncount
    /// themselves.
    #[serde(default)]
    pub waiters: u64,
}

/// The file in an image directory that holds its [`StreamState`].
pub const STREAM_FILE: &str = "stream.json";

/// The file a complete snapshot directory holds, written last.
pub const META_FILE: &str = "meta.json";

/// One file of an image, as [`Meta`] lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    /// Its name inside the snapshot directory (no directories).
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
    /// BLAKE3 of its content, hex.
    pub blake3: String,
}

/// `meta.json`: what a snapshot is and what it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Where in the log it was taken.
    pub position: Position,
    /// Build ids of the server binary and the preload library it ran
    /// (`(name, hex)`): an image only restores under the same builds.
    pub build_ids: Vec<(String, String)>,
    /// Every file of the image but `meta.json`, by name.
    pub files: Vec<FileSum>,
    /// The lockstep version that wrote it.
    pub lockstep_version: String,
    /// When the cluster's log began (µs since the epoch; 0: not known, or
    /// written before it was recorded): a node whose log starts past seq 1
    /// learns it here.
    #[serde(default)]
    pub origin_us: u64,
}

impl Meta {
    /// The whole image's checksum: BLAKE3 over each file's name, length
    /// and checksum in order, so that two images with equal files agree
    /// whatever their directory.
    pub fn digest(&self) -> String {
        let mut h = blake3::Hasher::new();
        for f in &self.files {
            h.update(f.name.as_bytes());
            h.update(&[0]);
            h.update(&f.len.to_le_bytes());
            h.update(f.blake3.as_bytes());
        }
        h.finalize().to_hex().to_string()
    }

    /// Total bytes of the image's files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.len).sum()
    }

    /// Checks what a peer or a disk may have mangled: file names that stay
    /// inside the directory, once each, never `meta.json`; one line why not.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for f in &self.files {
            if !safe_name(&f.name) {
                return Err(format!(
                    "snapshot file name {:?} is not a plain file name",
                    f.name
                ));
            }
            if f.name == META_FILE || !seen.insert(f.name.as_str()) {
                return Err(format!("snapshot file {:?} is listed twice", f.name));
            }
            if f.blake3.len() != 64 || !f.blake3.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("snapshot file {:?} has no BLAKE3 checksum", f.name));
            }
        }
        Ok(())
    }
}

/// A name for a file inside one directory: no separators, not `.`/`..`,
/// printable, not too long.
pub fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.chars().any(|c| c.is_control())
}

/// Where node `me`'s snapshots live: `<data_dir>/node-<me>/snapshots`.
pub fn snapshots_dir(config: &lockstep_common::Config, me: u64) -> PathBuf {
    config.node_data_dir(me).join("snapshots")
}

/// A snapshot directory's name: its seq as 20 digits (they sort as the
/// seqs do).
pub fn dir_name(seq: u64) -> String {
    format!("{seq:020}")
}

/// The seq a snapshot directory's name stands for (None: not one).
pub fn seq_of(name: &str) -> Option<u64> {
    (name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()))
        .then(|| name.parse().ok())
        .flatten()
}

/// Checksums `path`: (length, BLAKE3 hex), reading it in pieces.
pub fn file_sum(path: &Path) -> std::io::Result<(u64, String)> {
    let mut h = blake3::Hasher::new();
    let mut f = std::fs::File::open(path)?;
    let len = std::io::copy(&mut f, &mut h)?;
    Ok((len, h.finalize().to_hex().to_string()))
}

/// Writes `meta` into `dir` atomically (a temp file renamed over
/// `meta.json`, both fsynced): the step that makes a snapshot complete.
/// For whoever writes a snapshot (the image side, a transfer).
pub fn write_meta(dir: &Path, meta: &Meta) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{META_FILE}.tmp"));
    let body = serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?;
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(META_FILE))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Lists `dir`'s image files (every plain file but `meta.json` and its
/// temp file) with their checksums, sorted by name: the `files` of the
/// [`Meta`] a snapshot taker writes.
pub fn sum_files(dir: &Path) -> std::io::Result<Vec<FileSum>> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !e.file_type()?.is_file() || name.starts_with(META_FILE) {
            continue;
        }
        let (len, blake3) = file_sum(&e.path())?;
        files.push(FileSum { name, len, blake3 });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}
