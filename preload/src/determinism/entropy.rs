//! The cluster's entropy: every replica's server draws the same random
//! numbers.
//!
//! A server that seeds a generator from the kernel or the time and pid
//! (Redis: `srand`, its hash seed from `/dev/urandom`) makes commands such
//! as `SPOP` or `SRANDMEMBER` answer differently on each replica, and leave
//! different data. Here every replica of a cluster gets one stream derived
//! from the cluster's name: `getrandom`/`getentropy` draw from it in call
//! order, `srand`/`srandom` are seeded from it whatever seed the server
//! asks for, and `fopen("/dev/urandom")` reads a fixed block of it. A
//! restarted or rebuilt node starts from the same state again and replays
//! the same inputs, so it draws the same numbers.
//!
//! Generators a server seeds from its own clock and pid before it serves
//! are seeded again, once, when the server first waits in its event loop
//! (before any input): those whose seeding function the server exports
//! (see [`GENERATORS`]; Redis's 64-bit Mersenne Twister, `init_genrand64`,
//! which picks random keys and members of large hash tables).
//!
//! What it cannot reach: other generators a server seeds from the clock and
//! pid itself and does not export, entropy read with plain `open`/`read`,
//! or CPU instructions such as `rdrand`.

use std::sync::atomic::{AtomicU64, Ordering};

use once_cell::sync::OnceCell;

/// Seeding functions of server-internal generators, `fn(u64)`, looked up
/// among the server's exported symbols and called with
/// [`generator_seed`] at its first event-loop wait. Redis links with
/// `-rdynamic`, so its `init_genrand64` is visible.
pub const GENERATORS: &[&std::ffi::CStr] = &[c"init_genrand64"];

/// Where the generators' seed lies in the stream.
const GENERATOR_AT: u64 = BLOCK_AT + BLOCK as u64;

/// Bytes of the block a `/dev/urandom` stream reads.
pub const BLOCK: usize = 4096;
/// Where the block starts in the stream (apart from `getrandom`'s bytes).
const BLOCK_AT: u64 = 1 << 48;

static DRAWN: AtomicU64 = AtomicU64::new(0);
static BLOCK_BYTES: OnceCell<Option<Box<[u8]>>> = OnceCell::new();

/// The stream's key for cluster `name` (this process's is
/// [`crate::setup::entropy_seed`], from its config).
pub fn derive(name: &str) -> [u8; 32] {
    blake3::derive_key("lockstep cluster entropy v1", name.as_bytes())
}

/// The stream's bytes from `at` on, into `buf`.
pub fn stream(seed: &[u8; 32], at: u64, buf: &mut [u8]) {
    let mut xof = blake3::Hasher::new_keyed(seed).finalize_xof();
    xof.set_position(at);
    xof.fill(buf);
}

/// Draws the next `buf.len()` bytes (one stream per process, in call
/// order: every replica's server makes the same calls).
pub fn draw(seed: &[u8; 32], buf: &mut [u8]) {
    let at = DRAWN.fetch_add(buf.len() as u64, Ordering::AcqRel);
    stream(seed, at, buf);
}

/// The seed every `srand`/`srandom` of the server gets instead of its own.
pub fn small_seed(seed: &[u8; 32]) -> u32 {
    u32::from_le_bytes([seed[0], seed[1], seed[2], seed[3]])
}

/// The seed every exported generator of [`GENERATORS`] gets.
pub fn generator_seed(seed: &[u8; 32]) -> u64 {
    let mut b = [0u8; 8];
    stream(seed, GENERATOR_AT, &mut b);
    u64::from_le_bytes(b)
}

/// What a `/dev/urandom` stream of the server reads (the same block for
/// every open).
pub fn block(seed: &[u8; 32]) -> &'static [u8] {
    BLOCK_BYTES
        .get_or_init(|| {
            let mut b = vec![0u8; BLOCK].into_boxed_slice();
            stream(seed, BLOCK_AT, &mut b);
            Some(b)
        })
        .as_deref()
        .unwrap_or(&[])
}

/// Whether `path` names the kernel's random devices.
pub fn is_random_device(path: &[u8]) -> bool {
    path == b"/dev/urandom" || path == b"/dev/random"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cluster_one_stream() {
        let a = derive("demo");
        assert_eq!(a, derive("demo"));
        assert_ne!(a, derive("other"));
        let mut x = [0u8; 40];
        let mut y = [0u8; 40];
        stream(&a, 0, &mut x);
        stream(&a, 0, &mut y[..16]);
        stream(&a, 16, &mut y[16..]);
        assert_eq!(x, y, "the stream does not depend on how it is drawn");
        assert!(is_random_device(b"/dev/urandom") && !is_random_device(b"/etc/passwd"));
        assert_eq!(generator_seed(&a), generator_seed(&derive("demo")));
        assert_ne!(generator_seed(&a), generator_seed(&derive("other")));
    }
}
