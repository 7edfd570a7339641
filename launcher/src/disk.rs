//! What a node keeps on disk, measured.

use std::path::Path;

/// Bytes of the regular files under `dir`, subdirectories included (0
/// when it is not there).
pub fn tree_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_below_are_counted_and_a_missing_dir_is_empty() {
        let d = std::env::temp_dir().join(format!("lockstep-tree-bytes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("x"), [0u8; 10]).unwrap();
        std::fs::write(d.join("a/b/y"), [0u8; 32]).unwrap();
        assert_eq!(tree_bytes(&d), 42);
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(tree_bytes(&d), 0);
    }
}
