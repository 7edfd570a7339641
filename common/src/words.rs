//! Byte copies into and out of shared memory viewed as 64-bit atomic words.
//!
//! Regions are shared between processes (and written by remote peers), so
//! every access goes through `AtomicU64`: no data race in Rust's model, and a
//! relaxed load or store compiles to a plain move. Writes store the last word
//! with release ordering so that a reader that acquires it sees the rest —
//! this is how the canary of an entry becomes visible last.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a word copy could not be done.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WordsError {
    /// Offset or length is not a multiple of 8, or the length is zero.
    #[error("write at {offset} of {len} bytes is not 8-byte aligned")]
    Unaligned {
        /// Byte offset.
        offset: u64,
        /// Byte length.
        len: usize,
    },
    /// The copy would run past the end of the memory.
    #[error("write at {offset} of {len} bytes is outside the {size}-byte area")]
    OutOfBounds {
        /// Byte offset.
        offset: u64,
        /// Byte length.
        len: usize,
        /// Size of the area in bytes.
        size: u64,
    },
}

/// Checks that `[offset, offset+len)` is a non-empty, 8-aligned range inside
/// `words`, and returns its first word index.
pub fn check_range(words: &[AtomicU64], offset: u64, len: usize) -> Result<usize, WordsError> {
    if !offset.is_multiple_of(8) || !len.is_multiple_of(8) || len == 0 {
        return Err(WordsError::Unaligned { offset, len });
    }
    let size = words.len() as u64 * 8;
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok((offset / 8) as usize),
        _ => Err(WordsError::OutOfBounds { offset, len, size }),
    }
}

/// Stores `bytes` at byte `offset`; the last 8 bytes are stored last, with
/// release ordering.
pub fn store(words: &[AtomicU64], offset: u64, bytes: &[u8]) -> Result<(), WordsError> {
    let first = check_range(words, offset, bytes.len())?;
    let n = bytes.len() / 8;
    let target = &words[first..first + n];
    for (w, chunk) in target[..n - 1].iter().zip(bytes.chunks_exact(8)) {
        w.store(
            u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
            Ordering::Relaxed,
        );
    }
    let last = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().expect("8 bytes"));
    target[n - 1].store(last, Ordering::Release);
    Ok(())
}

/// Loads `out.len()` bytes from byte `offset` (relaxed loads; callers order
/// them with an acquire load of a guard word first).
pub fn load(words: &[AtomicU64], offset: u64, out: &mut [u8]) -> Result<(), WordsError> {
    let first = check_range(words, offset, out.len())?;
    for (w, chunk) in words[first..].iter().zip(out.chunks_exact_mut(8)) {
        chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    Ok(())
}

/// A heap area of zeroed words, for tests and for rings that live in-process.
pub fn zeroed(bytes: usize) -> Vec<AtomicU64> {
    (0..bytes / 8).map(|_| AtomicU64::new(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_then_load_round_trips() {
        let w = zeroed(64);
        let data: Vec<u8> = (0..24u8).collect();
        store(&w, 16, &data).unwrap();
        let mut out = vec![0u8; 24];
        load(&w, 16, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn bad_ranges_are_refused() {
        let w = zeroed(64);
        assert!(matches!(
            store(&w, 3, &[0; 8]),
            Err(WordsError::Unaligned { .. })
        ));
        assert!(matches!(
            store(&w, 0, &[0; 5]),
            Err(WordsError::Unaligned { .. })
        ));
        assert!(matches!(
            store(&w, 0, &[]),
            Err(WordsError::Unaligned { .. })
        ));
        assert!(matches!(
            store(&w, 64, &[0; 8]),
            Err(WordsError::OutOfBounds { .. })
        ));
        assert!(matches!(
            store(&w, u64::MAX - 7, &[0; 8]),
            Err(WordsError::OutOfBounds { .. })
        ));
    }
}
