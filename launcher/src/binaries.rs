//! Where a cluster's programs are: `lockstep` (it launches servers), the
//! follower and the preload, built together into one directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The programs a local cluster runs.
#[derive(Clone, Debug)]
pub struct Binaries {
    /// `lockstep` itself: it launches the servers (`launch-server`).
    pub lockstep: PathBuf,
    /// `lockstep-follower`.
    pub follower: PathBuf,
    /// `liblockstep.so`.
    pub preload: PathBuf,
}

impl Binaries {
    /// The programs in `dir`, checked to exist.
    pub fn in_dir(dir: &Path) -> anyhow::Result<Binaries> {
        let b = Binaries {
            lockstep: dir.join("lockstep"),
            follower: dir.join("lockstep-follower"),
            preload: dir.join("liblockstep.so"),
        };
        for p in [&b.lockstep, &b.follower, &b.preload] {
            if !p.exists() {
                bail!(
                    "{} is missing: build the workspace first (cargo build --workspace; scripts/test does)",
                    p.display()
                );
            }
        }
        Ok(b)
    }

    /// Beside the running `lockstep` (`lockstep up`, the benchmarks).
    pub fn beside_current_exe() -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe().context("cannot find the lockstep executable")?;
        let dir = exe.parent().context("the executable has no directory")?;
        Ok(Binaries {
            lockstep: exe.clone(),
            ..Binaries::in_dir(dir)?
        })
    }

    /// Those of the build a test executable belongs to (it runs from
    /// `target/<profile>/deps`).
    pub fn of_test_build() -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe().context("cannot find the test executable")?;
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .context("a test executable runs from target/<profile>/deps")?;
        Binaries::in_dir(dir)
    }

    /// The directory they are in.
    pub fn dir(&self) -> &Path {
        self.follower.parent().unwrap_or(Path::new("."))
    }
}
