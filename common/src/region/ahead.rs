//! Region files opened ahead of a privilege drop: a server that gives up
//! its user id after starting (memcached `-u nobody`, as root) can no
//! longer open the region files, which belong to the followers' user with
//! mode 0600. Its preload opens them just before the drop
//! ([`open_ahead`]); [`Region::open`](super::Region::open) then maps a
//! duplicate of the kept file instead of opening the path again, for as
//! long as the path still names that file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The kept files, by path (a handful: one per node).
static KEPT: Mutex<Vec<(PathBuf, File)>> = Mutex::new(Vec::new());

/// Opens the region file at `path` now, while this process may, and keeps
/// it for later opens of `path` (replacing one kept before).
pub fn open_ahead(path: &Path) -> io::Result<()> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    kept.retain(|(p, _)| p != path);
    kept.push((path.to_path_buf(), file));
    Ok(())
}

/// A duplicate of the file kept for `path`, while `path` still names it
/// (a region file removed and created anew is opened by path again).
pub(super) fn kept(path: &Path) -> Option<File> {
    let kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let (_, file) = kept.iter().find(|(p, _)| p == path)?;
    let (now, then) = (std::fs::metadata(path).ok()?, file.metadata().ok()?);
    if (now.dev(), now.ino()) != (then.dev(), then.ino()) {
        return None;
    }
    file.try_clone().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_file_serves_its_path_until_the_path_names_another() {
        let dir = std::env::temp_dir().join(format!("lockstep-ahead-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("region");
        assert!(kept(&path).is_none());
        assert!(open_ahead(&path).is_err(), "a missing file is not kept");
        std::fs::write(&path, b"first").unwrap();
        open_ahead(&path).unwrap();
        let mut text = String::new();
        io::Read::read_to_string(&mut kept(&path).unwrap(), &mut text).unwrap();
        assert_eq!(text, "first");
        // Replaced: the old file no longer answers for the path.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"second").unwrap();
        assert!(kept(&path).is_none());
        assert!(kept(&dir.join("other")).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
