//! Snapshots on disk: where they are, `meta.json` (written last, by
//! rename: a directory without it is incomplete), the checks a snapshot
//! passes before it is restored (every file's length and BLAKE3, the build
//! ids of the server binary and the preload it was taken with), and build
//! ids themselves.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Position;

/// The file that makes a snapshot directory complete.
pub const META_FILE: &str = "meta.json";

/// One file of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSum {
    /// Its name in the snapshot directory.
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
    /// BLAKE3 of its contents, hex.
    pub blake3: String,
}

/// `meta.json`: what a complete snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Where in the log it was taken.
    pub position: Position,
    /// (name, hex) of the server binary and the preload it was taken with.
    pub build_ids: Vec<(String, String)>,
    /// Every other file of the directory.
    pub files: Vec<FileSum>,
    /// The lockstep version that wrote it.
    pub lockstep_version: String,
}

/// Why a snapshot is not used (one line each).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    /// No `meta.json`: taking it did not finish.
    #[error("snapshot {0} is incomplete (no meta.json)")]
    Incomplete(PathBuf),
    /// `meta.json` does not parse.
    #[error("snapshot {0}: meta.json is unreadable: {1}")]
    BadMeta(PathBuf, String),
    /// A file is missing, has another length or another checksum.
    #[error("snapshot {0}: file {1} {2}")]
    BadFile(PathBuf, String, String),
    /// Taken with another server binary or preload.
    #[error("snapshot {0} was taken with another {1} (build id {2}, now {3})")]
    OtherBuild(PathBuf, String, String, String),
}

/// The snapshots directory of a node's data directory.
pub fn snapshots_dir(node_data_dir: &Path) -> PathBuf {
    node_data_dir.join("snapshots")
}

/// The directory of the snapshot at `seq`.
pub fn snapshot_dir(node_data_dir: &Path, seq: u64) -> PathBuf {
    snapshots_dir(node_data_dir).join(format!("{seq:020}"))
}

/// The snapshot directories of a node, newest (highest seq) first,
/// complete or not.
pub fn list(node_data_dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(snapshots_dir(node_data_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, PathBuf)> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let name = name.to_str()?;
            (name.len() == 20)
                .then(|| name.parse().ok())
                .flatten()
                .map(|seq| (seq, e.path()))
        })
        .collect();
    out.sort_by_key(|(seq, _)| std::cmp::Reverse(*seq));
    out
}

/// BLAKE3 (hex) and length of a file, read in pieces.
fn sum_file(path: &Path) -> io::Result<(u64, String)> {
    let mut f = File::open(path)?;
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        len += n as u64;
    }
    Ok((len, h.finalize().to_hex().to_string()))
}

/// Completes the snapshot in `dir`: sums every file in it and writes
/// `meta.json` last (a temporary file, synced, renamed).
pub fn complete(
    dir: &Path,
    position: Position,
    build_ids: Vec<(String, String)>,
) -> io::Result<Meta> {
    let mut files = Vec::new();
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n != META_FILE)
        .collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let (len, blake3) = sum_file(&path)?;
        // The image reaches the disk before the meta that vouches for it.
        File::open(&path)?.sync_all()?;
        files.push(FileSum { name, len, blake3 });
    }
    let meta = Meta {
        position,
        build_ids,
        files,
        lockstep_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    let tmp = dir.join("meta.json.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(&meta).map_err(io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(META_FILE))?;
    File::open(dir)?.sync_all()?;
    Ok(meta)
}

/// Reads the meta of the snapshot in `dir` and checks every file it names
/// (length, BLAKE3) and its build ids against `current` (the build id of
/// each named file now; None: unknown, not checked).
pub fn verify(dir: &Path, current: &dyn Fn(&str) -> Option<String>) -> Result<Meta, Refusal> {
    let at = dir.to_path_buf();
    let text = match std::fs::read(dir.join(META_FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Refusal::Incomplete(at)),
        Err(e) => return Err(Refusal::BadMeta(at, e.to_string())),
    };
    let meta: Meta =
        serde_json::from_slice(&text).map_err(|e| Refusal::BadMeta(at.clone(), e.to_string()))?;
    for (name, id) in &meta.build_ids {
        if let Some(now) = current(name) {
            if &now != id {
                return Err(Refusal::OtherBuild(at, name.clone(), id.clone(), now));
            }
        }
    }
    for f in &meta.files {
        let bad = |why: String| Refusal::BadFile(at.clone(), f.name.clone(), why);
        if f.name.contains('/') {
            return Err(bad("is not a plain name".into()));
        }
        let (len, sum) = sum_file(&dir.join(&f.name)).map_err(|e| bad(e.to_string()))?;
        if len != f.len {
            return Err(bad(format!("has {len} bytes, not {}", f.len)));
        }
        if sum != f.blake3 {
            return Err(bad("fails its checksum".into()));
        }
    }
    Ok(meta)
}

/// The build id of an ELF file: its GNU build-id note when it has one,
/// else the BLAKE3 of its contents (either way: another build, another
/// id).
pub fn build_id(path: &Path) -> io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(match gnu_build_id(&bytes) {
        Some(id) => id.iter().map(|b| format!("{b:02x}")).collect(),
        None => blake3::hash(&bytes).to_hex().to_string(),
    })
}

/// The descriptor of the `NT_GNU_BUILD_ID` note of a 64-bit little-endian
/// ELF image, if any (found through its program headers).
fn gnu_build_id(elf: &[u8]) -> Option<&[u8]> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(elf.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    // ELF magic, 64-bit, little endian.
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = u64_at(0x20)? as usize;
    let phentsize = u16_at(0x36)? as usize;
    let phnum = u16_at(0x38)? as usize;
    const PT_NOTE: u32 = 4;
    const NT_GNU_BUILD_ID: u32 = 3;
    let align4 = |n: usize| (n + 3) & !3;
    for i in 0..phnum {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(ph)? != PT_NOTE {
            continue;
        }
        let off = u64_at(ph + 8)? as usize;
        let size = u64_at(ph + 32)? as usize;
        let mut at = off;
        let end = off.checked_add(size)?.min(elf.len());
        while at + 12 <= end {
            let namesz = u32_at(at)? as usize;
            let descsz = u32_at(at + 4)? as usize;
            let kind = u32_at(at + 8)?;
            let name_at = at + 12;
            let desc_at = name_at.checked_add(align4(namesz))?;
            let next = desc_at.checked_add(align4(descsz))?;
            if kind == NT_GNU_BUILD_ID && elf.get(name_at..name_at + namesz)? == b"GNU\0" {
                return elf.get(desc_at..desc_at + descsz);
            }
            at = next;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("lockstep-snapfiles-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn at(seq: u64) -> Position {
        Position {
            seq,
            view: 2,
            time_us: 5,
        }
    }

    #[test]
    fn a_completed_snapshot_verifies_and_any_change_is_refused() {
        let node = tmp("verify");
        let dir = snapshot_dir(&node, 42);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pages-1.img"), vec![7u8; 3000]).unwrap();
        std::fs::write(dir.join("core-1.img"), b"core").unwrap();
        let none = |_: &str| None;
        assert_eq!(verify(&dir, &none), Err(Refusal::Incomplete(dir.clone())));
        let ids = vec![("/usr/bin/redis-server".to_string(), "ab".to_string())];
        let meta = complete(&dir, at(42), ids).unwrap();
        assert_eq!(meta.files.len(), 2);
        assert_eq!(verify(&dir, &none).unwrap(), meta);
        assert_eq!(list(&node), vec![(42, dir.clone())]);

        let same = |_: &str| Some("ab".to_string());
        assert!(verify(&dir, &same).is_ok());
        let other = |_: &str| Some("cd".to_string());
        assert!(matches!(
            verify(&dir, &other),
            Err(Refusal::OtherBuild(_, name, _, _)) if name == "/usr/bin/redis-server"
        ));

        let mut pages = std::fs::read(dir.join("pages-1.img")).unwrap();
        pages[1000] ^= 1;
        std::fs::write(dir.join("pages-1.img"), &pages).unwrap();
        let e = verify(&dir, &none).unwrap_err();
        assert!(
            e.to_string().contains("pages-1.img fails its checksum"),
            "{e}"
        );
        pages.truncate(10);
        std::fs::write(dir.join("pages-1.img"), &pages).unwrap();
        let e = verify(&dir, &none).unwrap_err();
        assert!(e.to_string().contains("has 10 bytes, not 3000"), "{e}");
        std::fs::remove_dir_all(&node).unwrap();
    }

    #[test]
    fn snapshots_list_newest_first_and_ignore_other_names() {
        let node = tmp("list");
        for seq in [7u64, 300, 12] {
            std::fs::create_dir_all(snapshot_dir(&node, seq)).unwrap();
        }
        std::fs::create_dir_all(snapshots_dir(&node).join("tmp-1")).unwrap();
        let seqs: Vec<u64> = list(&node).into_iter().map(|(s, _)| s).collect();
        assert_eq!(seqs, [300, 12, 7]);
        std::fs::remove_dir_all(&node).unwrap();
    }

    #[test]
    fn the_build_id_of_this_test_binary_is_stable_and_of_other_bytes_differs() {
        let me = std::env::current_exe().unwrap();
        let a = build_id(&me).unwrap();
        assert_eq!(a, build_id(&me).unwrap());
        let elf = std::fs::read(&me).unwrap();
        if let Some(id) = gnu_build_id(&elf) {
            assert!(id.len() >= 8, "a GNU build id has at least 8 bytes");
        }
        let d = tmp("buildid");
        std::fs::write(d.join("x"), b"not an elf").unwrap();
        assert_ne!(build_id(&d.join("x")).unwrap(), a);
        assert!(gnu_build_id(b"not an elf").is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
