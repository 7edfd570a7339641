//! Creating a region file so that it appears whole or not at all: the file
//! is made unnamed (`O_TMPFILE`) in its directory, sized and initialised,
//! and only then linked at its path. A follower killed while it creates
//! its region leaves nothing behind (an unnamed file dies with its last
//! descriptor), so neither the server's preload nor the next follower ever
//! finds a half-initialised region at the path.
//!
//! One of the region's homes of `unsafe`: the `linkat` call.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// A file being made for `path`: unnamed (`O_TMPFILE`), or where the
/// filesystem cannot make one, under a private name beside it (a creator
/// killed then leaves that name behind, never a file at `path`).
pub(super) struct Draft {
    pub file: File,
    private: Option<PathBuf>,
}

/// A draft, mode 0600, in the directory that will hold `path`.
pub(super) fn draft_beside(path: &Path) -> io::Result<Draft> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    // An unnamed file is named through /proc/self/fd: without /proc it
    // could not be named at all.
    let unnamed = if Path::new("/proc/self/fd").is_dir() {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(dir)
    } else {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    };
    match unnamed {
        Ok(file) => Ok(Draft {
            file,
            private: None,
        }),
        // No O_TMPFILE here (EOPNOTSUPP; older kernels say EISDIR or
        // EINVAL).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) =>
        {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let private = dir.join(format!(".{name}.creating.{}", std::process::id()));
            let _ = std::fs::remove_file(&private);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&private)?;
            Ok(Draft {
                file,
                private: Some(private),
            })
        }
        Err(e) => Err(e),
    }
}

impl Drop for Draft {
    /// A draft never published leaves no private name behind (an unnamed
    /// one goes with its last descriptor by itself).
    fn drop(&mut self) {
        if let Some(private) = &self.private {
            let _ = std::fs::remove_file(private);
        }
    }
}

impl Draft {
    /// Gives the finished draft the name `path`; fails with
    /// `AlreadyExists` if something is there (it is never replaced).
    pub fn publish(&self, path: &Path) -> io::Result<()> {
        match &self.private {
            None => link_at(&self.file, path),
            Some(private) => std::fs::hard_link(private, path),
        }
    }
}

/// Gives the unnamed `file` the name `path`.
fn link_at(file: &File, path: &Path) -> io::Result<()> {
    let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let to = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: both arguments are NUL-terminated strings that live across
    // the call; linkat only reads them. AT_SYMLINK_FOLLOW makes it link
    // the file behind the /proc magic link (allowed without privilege),
    // not the link itself.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
