//! The snapshots on a node's disk (the reading side; the image side
//! writes them in the format of [`super`]).

use std::path::{Path, PathBuf};

use super::{dir_name, file_sum, seq_of, Meta, META_FILE};

/// The incoming transfers' directory inside the snapshots directory.
pub const INCOMING: &str = "incoming";

/// A complete snapshot on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Its directory.
    pub dir: PathBuf,
    /// Its `meta.json`.
    pub meta: Meta,
}

/// Why a snapshot on disk cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// Reading or deleting failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// `meta.json` does not parse or lists impossible files.
    #[error("{path}: {why}")]
    BadMeta {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A file's length or checksum is not what `meta.json` says.
    #[error("snapshot {seq}: file {name} is corrupt or truncated ({why})")]
    Corrupt {
        /// The snapshot's seq.
        seq: u64,
        /// The file.
        name: String,
        /// What differs.
        why: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CatalogError + '_ {
    move |source| CatalogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The snapshots directory of one node.
#[derive(Clone, Debug)]
pub struct Catalog {
    root: PathBuf,
}

impl Catalog {
    /// The catalog at `root` (see [`super::snapshots_dir`]); nothing is
    /// created until something is written.
    pub fn new(root: impl Into<PathBuf>) -> Catalog {
        Catalog { root: root.into() }
    }

    /// Its directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of the snapshot at `seq` (complete or not).
    pub fn dir_of(&self, seq: u64) -> PathBuf {
        self.root.join(dir_name(seq))
    }

    /// Where incoming transfers keep their partial files.
    pub fn incoming(&self) -> PathBuf {
        self.root.join(INCOMING)
    }

    /// Snapshot directories by seq, complete or not, oldest first.
    fn dirs(&self) -> Result<Vec<(u64, PathBuf)>, CatalogError> {
        let rd = match std::fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.root)(e)),
        };
        let mut out = Vec::new();
        for e in rd {
            let e = e.map_err(io(&self.root))?;
            if let Some(seq) = seq_of(&e.file_name().to_string_lossy()) {
                out.push((seq, e.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Reads the `meta.json` of the snapshot directory `dir` (None: it has
    /// none, so it is incomplete).
    pub fn read_meta(dir: &Path) -> Result<Option<Meta>, CatalogError> {
        let path = dir.join(META_FILE);
        let body = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path)(e)),
        };
        let meta: Meta = serde_json::from_slice(&body).map_err(|e| CatalogError::BadMeta {
            path: path.clone(),
            why: e.to_string(),
        })?;
        meta.check()
            .map_err(|why| CatalogError::BadMeta { path, why })?;
        Ok(Some(meta))
    }

    /// Complete snapshots, oldest first. One whose `meta.json` does not
    /// parse, or names another seq than its directory, is left out with a
    /// line in the log.
    pub fn list(&self) -> Result<Vec<Snapshot>, CatalogError> {
        let mut out = Vec::new();
        for (seq, dir) in self.dirs()? {
            match Self::read_meta(&dir) {
                Ok(Some(meta)) if meta.position.seq == seq => out.push(Snapshot { dir, meta }),
                Ok(Some(meta)) => log::warn!(
                    "{}: meta.json says seq {}, ignored",
                    dir.display(),
                    meta.position.seq
                ),
                Ok(None) => {}
                Err(e) => log::warn!("{e}; ignored"),
            }
        }
        Ok(out)
    }

    /// The newest complete snapshot.
    pub fn newest(&self) -> Result<Option<Snapshot>, CatalogError> {
        Ok(self.list()?.pop())
    }

    /// Checks every file of `snap` against its `meta.json` (length and
    /// BLAKE3), reading each in pieces.
    pub fn verify(snap: &Snapshot) -> Result<(), CatalogError> {
        let seq = snap.meta.position.seq;
        for f in &snap.meta.files {
            let path = snap.dir.join(&f.name);
            let (len, sum) = match file_sum(&path) {
                Ok(s) => s,
                Err(e) => {
                    return Err(CatalogError::Corrupt {
                        seq,
                        name: f.name.clone(),
                        why: e.to_string(),
                    })
                }
            };
            if len != f.len {
                return Err(CatalogError::Corrupt {
                    seq,
                    name: f.name.clone(),
                    why: format!("{len} bytes, meta.json says {}", f.len),
                });
            }
            if sum != f.blake3 {
                return Err(CatalogError::Corrupt {
                    seq,
                    name: f.name.clone(),
                    why: "its BLAKE3 checksum differs from meta.json's".into(),
                });
            }
        }
        Ok(())
    }

    /// Deletes incomplete snapshot directories (no `meta.json`: a taker
    /// died midway) below the newest complete one, and every complete one
    /// but the newest `keep`. Returns the seqs deleted.
    pub fn clean(&self, keep: usize) -> Result<Vec<u64>, CatalogError> {
        let dirs = self.dirs()?;
        let complete: Vec<u64> = self.list()?.iter().map(|s| s.meta.position.seq).collect();
        let newest = complete.last().copied();
        let kept: Vec<u64> = complete.iter().rev().take(keep.max(1)).copied().collect();
        let mut deleted = Vec::new();
        for (seq, dir) in dirs {
            let incomplete = !complete.contains(&seq);
            // An incomplete one above the newest may be a snapshot being
            // taken right now: left alone.
            let old_incomplete = incomplete && newest.is_some_and(|n| seq < n);
            let old_complete = !incomplete && !kept.contains(&seq);
            if old_incomplete || old_complete {
                std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
                deleted.push(seq);
            }
        }
        Ok(deleted)
    }

    /// Deletes the incomplete snapshot directory at `seq`, if it is one
    /// (a taker that failed cleans up after itself).
    pub fn drop_incomplete(&self, seq: u64) -> Result<(), CatalogError> {
        let dir = self.dir_of(seq);
        if dir.exists() && Self::read_meta(&dir)?.is_none() {
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::{sum_files, write_meta, Position};
    use super::*;

    pub(crate) fn tmp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("lockstep-snapshots-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A directory of arbitrary files standing in for an image (unit tests
    /// of the catalog only), made complete with its `meta.json`.
    pub(crate) fn fake_snapshot(c: &Catalog, seq: u64, files: &[(&str, Vec<u8>)]) -> Snapshot {
        let dir = c.dir_of(seq);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, body) in files {
            std::fs::write(dir.join(name), body).unwrap();
        }
        let meta = Meta {
            position: Position {
                seq,
                view: 2,
                time_us: 7,
            },
            build_ids: vec![("redis-server".into(), "ab12".into())],
            files: sum_files(&dir).unwrap(),
            lockstep_version: "test".into(),
            origin_us: 0,
        };
        write_meta(&dir, &meta).unwrap();
        Snapshot { dir, meta }
    }

    #[test]
    fn only_complete_snapshots_are_listed_newest_last() {
        let root = tmp("list");
        let c = Catalog::new(&root);
        assert!(c.newest().unwrap().is_none());
        fake_snapshot(&c, 100, &[("pages.img", vec![1; 5000])]);
        fake_snapshot(&c, 300, &[("pages.img", vec![2; 10])]);
        // A taker that died before meta.json, and foreign names.
        std::fs::create_dir_all(c.dir_of(400)).unwrap();
        std::fs::write(c.dir_of(400).join("pages.img"), b"half").unwrap();
        std::fs::create_dir_all(root.join("notes")).unwrap();
        std::fs::create_dir_all(c.incoming()).unwrap();
        let seqs: Vec<u64> = c
            .list()
            .unwrap()
            .iter()
            .map(|s| s.meta.position.seq)
            .collect();
        assert_eq!(seqs, vec![100, 300]);
        let newest = c.newest().unwrap().unwrap();
        assert_eq!(newest.meta.position.seq, 300);
        assert_eq!(newest.meta.bytes(), 10);
        Catalog::verify(&newest).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_corrupt_or_truncated_file_fails_verification_naming_it() {
        let root = tmp("verify");
        let c = Catalog::new(&root);
        let s = fake_snapshot(&c, 5, &[("a.img", vec![1; 100]), ("b.img", vec![2; 100])]);
        std::fs::write(s.dir.join("b.img"), vec![2; 99]).unwrap();
        let e = Catalog::verify(&s).unwrap_err().to_string();
        assert!(e.contains("file b.img") && e.contains("99 bytes"), "{e}");
        let mut flipped = vec![2; 100];
        flipped[50] = 3;
        std::fs::write(s.dir.join("b.img"), flipped).unwrap();
        let e = Catalog::verify(&s).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
        std::fs::remove_file(s.dir.join("a.img")).unwrap();
        let e = Catalog::verify(&s).unwrap_err().to_string();
        assert!(e.contains("file a.img"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_meta_json_naming_a_path_outside_is_refused() {
        let root = tmp("badmeta");
        let c = Catalog::new(&root);
        let mut s = fake_snapshot(&c, 9, &[("a.img", vec![1; 3])]);
        s.meta.files[0].name = "../../etc/passwd".into();
        write_meta(&s.dir, &s.meta).unwrap();
        assert!(c.list().unwrap().is_empty());
        let e = Catalog::read_meta(&s.dir).unwrap_err().to_string();
        assert!(e.contains("not a plain file name"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn clean_keeps_the_newest_and_a_snapshot_being_taken() {
        let root = tmp("clean");
        let c = Catalog::new(&root);
        for seq in [10, 20, 30] {
            fake_snapshot(&c, seq, &[("x", vec![0; 4])]);
        }
        std::fs::create_dir_all(c.dir_of(15)).unwrap();
        std::fs::create_dir_all(c.dir_of(40)).unwrap();
        let mut deleted = c.clean(2).unwrap();
        deleted.sort();
        assert_eq!(deleted, vec![10, 15]);
        let seqs: Vec<u64> = c
            .list()
            .unwrap()
            .iter()
            .map(|s| s.meta.position.seq)
            .collect();
        assert_eq!(seqs, vec![20, 30]);
        assert!(c.dir_of(40).exists(), "being taken: left alone");
        c.drop_incomplete(40).unwrap();
        assert!(!c.dir_of(40).exists());
        c.drop_incomplete(30).unwrap();
        assert!(c.dir_of(30).exists(), "complete: not dropped");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
