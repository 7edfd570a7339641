//! Installing a peer's snapshot: its files come in checksummed chunks
//! ([`lockstep_common::control::SNAPSHOT_CHUNK`] bytes at most, each
//! checked on arrival) and are written straight to disk, so memory holds
//! one chunk, never the image. Partial files stay in
//! `snapshots/incoming/<seq>/`: a broken transfer resumes where its files
//! end (cut back to a chunk boundary, as a chunk is written only after its
//! checksum passed). The whole image is checked against the peer's
//! `meta.json` before it is moved into place and its `meta.json` written
//! (last, atomically): a corrupt or truncated image is refused with one
//! line, its bad files deleted so the next try fetches them again. An
//! image recorded under other build ids than this node's server and
//! preload is refused before anything is fetched.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use lockstep_common::control::SNAPSHOT_CHUNK;

use super::catalog::{Catalog, Snapshot};
use super::{dir_name, file_sum, write_meta, Meta};

/// Where an installer gets a snapshot from (a peer over the control
/// channel in the runtime; a local directory in tests).
pub trait ChunkSource {
    /// The source's newest complete snapshot (None: it has none).
    fn meta(&mut self) -> anyhow::Result<Option<Meta>>;
    /// Bytes `offset..offset + len` of `file` of the snapshot at `seq`
    /// (checked against the chunk's own checksum on the way).
    fn chunk(&mut self, seq: u64, file: &str, offset: u64, len: u32) -> anyhow::Result<Vec<u8>>;
}

/// Why an install failed (each one line).
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The source has no snapshot past what this node holds.
    #[error("the peer has no snapshot past seq {have}")]
    Nothing {
        /// The seq this node needs a snapshot above.
        have: u64,
    },
    /// The image was taken under other builds of the server or preload.
    #[error("snapshot {seq} refused: {why}")]
    OtherBuild {
        /// Its seq.
        seq: u64,
        /// Which build differs.
        why: String,
    },
    /// A file arrived corrupt or truncated (deleted: fetched again next).
    #[error("snapshot {seq} refused: file {name} is corrupt or truncated ({why}); it will be fetched again")]
    Corrupt {
        /// Its seq.
        seq: u64,
        /// The file.
        name: String,
        /// What differs.
        why: String,
    },
    /// The peer's `meta.json` is unusable.
    #[error("snapshot refused: {0}")]
    BadMeta(String),
    /// The source failed midway (what arrived is kept for a resume).
    #[error("snapshot {seq}: transfer broken after {bytes} bytes: {source:#}")]
    Broken {
        /// Its seq.
        seq: u64,
        /// Bytes stored so far by this try.
        bytes: u64,
        /// Why.
        source: anyhow::Error,
    },
    /// The local disk failed.
    #[error("snapshot {seq}: {path}: {source}")]
    Io {
        /// Its seq.
        seq: u64,
        /// The file.
        path: std::path::PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// What an install did.
#[derive(Debug)]
pub struct Installed {
    /// The snapshot, complete in the catalog.
    pub snapshot: Snapshot,
    /// Bytes fetched by this try (less than the image after a resume).
    pub fetched: u64,
}

/// The file that records which snapshot an incoming directory holds.
const EXPECTED: &str = "expected.json";

/// Checks the image's build ids against this node's (`local`, as
/// `(name, hex)`): every build the image names must be here, equal. A
/// name matches by its file name (`/usr/bin/redis-server` and
/// `redis-server` are one build).
pub fn check_build_ids(
    image: &[(String, String)],
    local: &[(String, String)],
) -> Result<(), String> {
    let base = |n: &str| {
        Path::new(n)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
    };
    for (name, hex) in image {
        match local.iter().find(|(l, _)| base(l) == base(name)) {
            None => {
                return Err(format!(
                    "it was taken with {name} (build {hex}), which this node does not run"
                ))
            }
            Some((_, mine)) if !mine.eq_ignore_ascii_case(hex) => {
                return Err(format!(
                    "it was taken with {name} build {hex}, this node runs build {mine}"
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Installs `src`'s newest snapshot into `catalog` when it is past seq
/// `have` (what this node's log or own snapshot already reach), resuming
/// a partial transfer of the same snapshot; `local` are this node's build
/// ids.
pub fn install(
    catalog: &Catalog,
    src: &mut impl ChunkSource,
    have: u64,
    local: &[(String, String)],
) -> Result<Installed, InstallError> {
    let meta = src
        .meta()
        .map_err(|e| InstallError::BadMeta(format!("{e:#}")))?
        .ok_or(InstallError::Nothing { have })?;
    meta.check().map_err(InstallError::BadMeta)?;
    let seq = meta.position.seq;
    if seq <= have {
        return Err(InstallError::Nothing { have });
    }
    check_build_ids(&meta.build_ids, local).map_err(|why| InstallError::OtherBuild { seq, why })?;
    // Fetched whole by an earlier try whose restore then failed: not
    // fetched again (the image is checked as any other before a restore).
    if let Ok(snaps) = catalog.list() {
        if let Some(snapshot) = snaps
            .into_iter()
            .find(|s| s.meta.position.seq == seq && s.meta.digest() == meta.digest())
            .filter(|s| Catalog::verify(s).is_ok())
        {
            return Ok(Installed {
                snapshot,
                fetched: 0,
            });
        }
    }
    let dir = catalog.incoming().join(dir_name(seq));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| InstallError::Io { seq, path, source }
    };
    prepare_incoming(catalog, &dir, &meta).map_err(io(&dir))?;
    let mut fetched = 0;
    for f in &meta.files {
        let path = dir.join(&f.name);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        let on_disk = file.metadata().map_err(io(&path))?.len();
        // Only whole chunks were written after their checksum passed (a
        // whole file is checked below with the rest); a file longer than
        // the image's is not this image's.
        let mut at = if on_disk == f.len {
            f.len
        } else if on_disk > f.len {
            0
        } else {
            on_disk - on_disk % SNAPSHOT_CHUNK as u64
        };
        file.set_len(at).map_err(io(&path))?;
        file.seek(SeekFrom::Start(at)).map_err(io(&path))?;
        while at < f.len {
            let want = (f.len - at).min(SNAPSHOT_CHUNK as u64) as u32;
            let bytes =
                src.chunk(seq, &f.name, at, want)
                    .map_err(|source| InstallError::Broken {
                        seq,
                        bytes: fetched,
                        source,
                    })?;
            if bytes.len() != want as usize {
                let why = format!("{} bytes at offset {at}, {want} expected", bytes.len());
                return Err(InstallError::Broken {
                    seq,
                    bytes: fetched,
                    source: anyhow::anyhow!(why),
                });
            }
            file.write_all(&bytes).map_err(io(&path))?;
            at += want as u64;
            fetched += want as u64;
        }
        file.sync_all().map_err(io(&path))?;
    }
    for f in &meta.files {
        let path = dir.join(&f.name);
        let (len, sum) = file_sum(&path).map_err(io(&path))?;
        if len != f.len || sum != f.blake3 {
            let _ = std::fs::remove_file(&path);
            let why = if len != f.len {
                format!("{len} bytes, meta.json says {}", f.len)
            } else {
                "its BLAKE3 checksum differs from meta.json's".into()
            };
            return Err(InstallError::Corrupt {
                seq,
                name: f.name.clone(),
                why,
            });
        }
    }
    // Into place, then meta.json last: only now is it complete.
    let target = catalog.dir_of(seq);
    if target.exists() {
        std::fs::remove_dir_all(&target).map_err(io(&target))?;
    }
    std::fs::remove_file(dir.join(EXPECTED)).map_err(io(&dir))?;
    std::fs::rename(&dir, &target).map_err(io(&target))?;
    write_meta(&target, &meta).map_err(io(&target))?;
    Ok(Installed {
        snapshot: Snapshot { dir: target, meta },
        fetched,
    })
}

/// Makes `dir` the incoming directory of `meta`'s snapshot: kept when it
/// holds a partial transfer of the same image (same files and sums),
/// emptied otherwise; other incoming transfers are dropped.
fn prepare_incoming(catalog: &Catalog, dir: &Path, meta: &Meta) -> std::io::Result<()> {
    let incoming = catalog.incoming();
    std::fs::create_dir_all(&incoming)?;
    for e in std::fs::read_dir(&incoming)? {
        let e = e?;
        if e.path() != dir {
            std::fs::remove_dir_all(e.path())?;
        }
    }
    let expected = dir.join(EXPECTED);
    let same = std::fs::read(&expected)
        .ok()
        .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
        .is_some_and(|m| m.digest() == meta.digest());
    if !same {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
        let body = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
        std::fs::write(&expected, body)?;
    }
    Ok(())
}

/// A snapshot in a local catalog as a [`ChunkSource`] (what a peer
/// serves: `runtime::control_server` reads chunks the same way).
pub struct LocalSource<'a> {
    /// The catalog served.
    pub catalog: &'a Catalog,
}

/// Reads bytes `offset..offset + len` (at most a chunk) of `file` of the
/// complete snapshot `seq` in `catalog`, if `file` is one of its files.
pub fn read_chunk(
    catalog: &Catalog,
    seq: u64,
    file: &str,
    offset: u64,
    len: u32,
) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let dir = catalog.dir_of(seq);
    let meta = Catalog::read_meta(&dir)?
        .ok_or_else(|| anyhow::anyhow!("no complete snapshot {seq} here"))?;
    let f = meta
        .files
        .iter()
        .find(|f| f.name == file)
        .ok_or_else(|| anyhow::anyhow!("snapshot {seq} has no file {file:?}"))?;
    let len = (len.min(SNAPSHOT_CHUNK) as u64).min(f.len.saturating_sub(offset));
    let mut fh = std::fs::File::open(dir.join(&f.name))?;
    fh.seek(SeekFrom::Start(offset))?;
    let mut out = Vec::with_capacity(len as usize);
    fh.take(len).read_to_end(&mut out)?;
    Ok(out)
}

impl ChunkSource for LocalSource<'_> {
    fn meta(&mut self) -> anyhow::Result<Option<Meta>> {
        Ok(self.catalog.newest()?.map(|s| s.meta))
    }
    fn chunk(&mut self, seq: u64, file: &str, offset: u64, len: u32) -> anyhow::Result<Vec<u8>> {
        read_chunk(self.catalog, seq, file, offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::super::catalog::tests::{fake_snapshot, tmp};
    use super::*;

    const IDS: &[(&str, &str)] = &[("redis-server", "ab12")];

    fn ids() -> Vec<(String, String)> {
        IDS.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    /// A peer: a local catalog, with faults.
    struct Peer<'a> {
        local: LocalSource<'a>,
        /// Chunks served before the connection breaks (None: never).
        break_after: Option<usize>,
        /// Flip a byte of the chunk at this offset of this file.
        flip: Option<(&'static str, u64)>,
        chunks: usize,
        bytes: u64,
    }

    impl<'a> Peer<'a> {
        fn new(catalog: &'a Catalog) -> Peer<'a> {
            Peer {
                local: LocalSource { catalog },
                break_after: None,
                flip: None,
                chunks: 0,
                bytes: 0,
            }
        }
    }

    impl ChunkSource for Peer<'_> {
        fn meta(&mut self) -> anyhow::Result<Option<Meta>> {
            self.local.meta()
        }
        fn chunk(
            &mut self,
            seq: u64,
            file: &str,
            offset: u64,
            len: u32,
        ) -> anyhow::Result<Vec<u8>> {
            if self.break_after == Some(self.chunks) {
                anyhow::bail!("connection reset");
            }
            self.chunks += 1;
            let mut b = self.local.chunk(seq, file, offset, len)?;
            if self.flip == Some((file_static(file), offset)) {
                b[0] ^= 0xff;
            }
            self.bytes += b.len() as u64;
            Ok(b)
        }
    }

    fn file_static(name: &str) -> &'static str {
        ["pages.img", "core.img"]
            .into_iter()
            .find(|n| *n == name)
            .unwrap_or("")
    }

    /// A directory of arbitrary files standing in for an image: 2.5 chunks
    /// and a small one.
    fn source(name: &str) -> (std::path::PathBuf, Catalog) {
        let root = tmp(name);
        let c = Catalog::new(root.join("peer"));
        let pages: Vec<u8> = (0..(SNAPSHOT_CHUNK as usize * 5 / 2))
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut s = fake_snapshot(
            &c,
            4000,
            &[("pages.img", pages), ("core.img", b"core".to_vec())],
        );
        s.meta.build_ids = ids();
        write_meta(&s.dir, &s.meta).unwrap();
        (root, c)
    }

    #[test]
    fn an_image_arrives_in_chunks_and_is_complete_only_at_the_end() {
        let (root, peer) = source("whole");
        let mine = Catalog::new(root.join("mine"));
        let mut p = Peer::new(&peer);
        let got = install(&mine, &mut p, 100, &ids()).unwrap();
        assert_eq!(p.chunks, 4, "3 chunks of pages.img, 1 of core.img");
        assert_eq!(got.fetched, got.snapshot.meta.bytes());
        let newest = mine.newest().unwrap().unwrap();
        assert_eq!(newest.meta, peer.newest().unwrap().unwrap().meta);
        Catalog::verify(&newest).unwrap();
        assert!(std::fs::read_dir(mine.incoming()).unwrap().next().is_none());
        // Nothing newer than what this node has: nothing to do.
        let e = install(&mine, &mut Peer::new(&peer), 4000, &ids()).unwrap_err();
        assert!(matches!(e, InstallError::Nothing { have: 4000 }));
        // Asked again for the same image (its restore failed, say): it is
        // here whole, so nothing is fetched again ...
        let mut again = Peer::new(&peer);
        let got = install(&mine, &mut again, 100, &ids()).unwrap();
        assert_eq!((again.chunks, got.fetched), (0, 0));
        assert_eq!(got.snapshot.meta, newest.meta);
        // ... unless it no longer checks out: then it is fetched anew.
        let pages = got.snapshot.dir.join("pages.img");
        let mut b = std::fs::read(&pages).unwrap();
        b[0] ^= 1;
        std::fs::write(&pages, b).unwrap();
        let mut anew = Peer::new(&peer);
        let got = install(&mine, &mut anew, 100, &ids()).unwrap();
        assert_eq!(anew.chunks, 4);
        Catalog::verify(&got.snapshot).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_broken_transfer_resumes_where_its_files_end() {
        let (root, peer) = source("resume");
        let mine = Catalog::new(root.join("mine"));
        let mut p = Peer::new(&peer);
        // core.img, then two of pages.img's three chunks.
        p.break_after = Some(3);
        let e = install(&mine, &mut p, 0, &ids()).unwrap_err().to_string();
        assert!(
            e.contains("transfer broken after 2097156 bytes") && e.contains("connection reset"),
            "{e}"
        );
        assert!(
            mine.newest().unwrap().is_none(),
            "incomplete: not in the catalog"
        );
        // A half-written chunk (the process died mid-write) is cut off.
        let partial = mine.incoming().join(dir_name(4000)).join("pages.img");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&partial)
            .unwrap()
            .write_all(b"junk")
            .unwrap();
        let mut p = Peer::new(&peer);
        let got = install(&mine, &mut p, 0, &ids()).unwrap();
        assert_eq!(p.chunks, 1, "the rest of pages.img only");
        assert_eq!(
            got.fetched,
            got.snapshot.meta.bytes() - 4 - 2 * SNAPSHOT_CHUNK as u64
        );
        Catalog::verify(&mine.newest().unwrap().unwrap()).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_corrupt_image_is_refused_with_one_line_and_fetched_again() {
        let (root, peer) = source("corrupt");
        let mine = Catalog::new(root.join("mine"));
        let mut p = Peer::new(&peer);
        p.flip = Some(("pages.img", SNAPSHOT_CHUNK as u64));
        let e = install(&mine, &mut p, 0, &ids()).unwrap_err().to_string();
        assert!(
            e.contains("file pages.img is corrupt") && e.contains("fetched again"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        assert!(mine.newest().unwrap().is_none());
        let mut p = Peer::new(&peer);
        install(&mine, &mut p, 0, &ids()).unwrap();
        assert_eq!(
            p.bytes,
            SNAPSHOT_CHUNK as u64 * 5 / 2,
            "the corrupt file again, whole"
        );
        Catalog::verify(&mine.newest().unwrap().unwrap()).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_image_of_another_build_is_refused_before_any_transfer() {
        let (root, peer) = source("build");
        let mine = Catalog::new(root.join("mine"));
        let mut p = Peer::new(&peer);
        let other = vec![("/usr/bin/redis-server".to_string(), "cd34".to_string())];
        let e = install(&mine, &mut p, 0, &other).unwrap_err().to_string();
        assert!(
            e.contains("taken with redis-server build ab12, this node runs build cd34"),
            "{e}"
        );
        assert_eq!(p.chunks, 0);
        let e = install(&mine, &mut p, 0, &[]).unwrap_err().to_string();
        assert!(e.contains("which this node does not run"), "{e}");
        let same_path = vec![("/usr/bin/redis-server".to_string(), "AB12".to_string())];
        install(&mine, &mut p, 0, &same_path).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }
}
