//! Build ids of ELF files (the GNU build-id note), so that an image is
//! only installed under the very builds of the server and preload it was
//! taken with.

use std::path::{Path, PathBuf};

/// The build id of the file at `path`, hex: its GNU build-id note, or
/// the BLAKE3 of its contents where it has none (either way another
/// build has another id; None: unreadable).
pub fn of_file(path: &Path) -> Option<String> {
    let b = std::fs::read(path).ok()?;
    Some(gnu_note(&b).unwrap_or_else(|| blake3::hash(&b).to_hex().to_string()))
}

/// The GNU build-id note of a 64-bit little-endian ELF image, hex.
fn gnu_note(b: &[u8]) -> Option<String> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    if b.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = u64_at(0x20)? as usize;
    let phentsize = u16_at(0x36)? as usize;
    for i in 0..u16_at(0x38)? as usize {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(ph)? != 4 {
            continue; // not PT_NOTE
        }
        let (mut at, end) = (
            u64_at(ph + 8)? as usize,
            (u64_at(ph + 8)? + u64_at(ph + 32)?) as usize,
        );
        while at + 12 <= end.min(b.len()) {
            let (namesz, descsz, kind) = (
                u32_at(at)? as usize,
                u32_at(at + 4)? as usize,
                u32_at(at + 8)?,
            );
            let name = at + 12;
            let desc = name + namesz.div_ceil(4) * 4;
            if kind == 3 && b.get(name..name + namesz)? == b"GNU\0" {
                let id = b.get(desc..desc + descsz)?;
                return Some(id.iter().map(|x| format!("{x:02x}")).collect());
            }
            at = desc + descsz.div_ceil(4) * 4;
        }
    }
    None
}

/// `program` as the shell finds it: a path as given, a bare name on PATH.
pub fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// This node's builds: the server program of the config's `server`
/// command and `liblockstep.so` beside this executable, as (file name,
/// build id) — the names an image's `build_ids` are matched by.
pub fn local(server: Option<&[String]>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut add = |path: Option<PathBuf>| {
        if let Some(p) = path {
            if let (Some(name), Some(id)) = (p.file_name(), of_file(&p)) {
                out.push((name.to_string_lossy().into_owned(), id));
            }
        }
    };
    add(server.and_then(|s| s.first()).and_then(|p| find_program(p)));
    add(std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.join("liblockstep.so"))));
    out
}

/// This node's builds of what `image` (an image's `build_ids`) names:
/// each named file that exists here as it is now, then [`local`] (the
/// config's server program, the preload beside this executable) for names
/// that are paths on another machine.
pub fn for_image(image: &[(String, String)], server: Option<&[String]>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = image
        .iter()
        .filter_map(|(name, _)| Some((name.clone(), of_file(Path::new(name))?)))
        .collect();
    out.extend(local(server));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_id_of_a_real_binary_is_read() {
        // The test binary itself is linked with a build id by default.
        let me = std::env::current_exe().unwrap();
        let id = of_file(&me);
        let readelf = std::process::Command::new("readelf")
            .arg("-n")
            .arg(&me)
            .output();
        if let Ok(out) = readelf {
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(line) = text.lines().find(|l| l.contains("Build ID:")) {
                let want = line.split("Build ID:").nth(1).unwrap().trim();
                assert_eq!(id.as_deref(), Some(want));
                return;
            }
        }
        panic!(
            "readelf -n found no build id in {} (binutils missing?); ours: {id:?}",
            me.display()
        );
    }

    #[test]
    fn a_file_without_a_note_is_known_by_its_contents() {
        let p = std::env::temp_dir().join(format!("lockstep-notelf-{}", std::process::id()));
        std::fs::write(&p, b"#!/bin/sh\n").unwrap();
        let id = blake3::hash(b"#!/bin/sh\n").to_hex().to_string();
        assert_eq!(of_file(&p), Some(id));
        std::fs::write(&p, b"#!/bin/bash\n").unwrap();
        assert_ne!(
            of_file(&p),
            Some(blake3::hash(b"#!/bin/sh\n").to_hex().to_string())
        );
        std::fs::remove_file(&p).unwrap();
        assert_eq!(of_file(&p), None);
    }
}
