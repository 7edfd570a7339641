//! Output divergence detection for one replay connection.
//!
//! Each DATA entry carries the leader's output digest on that connection at
//! the moment the leader's server read the entry's bytes: a 32-bit hash of
//! its output so far and the output length mod 2^32. The backup's server
//! produces output for the same connection; when the backup has drained at
//! least that many bytes, the hash of exactly that prefix must match.

use std::collections::VecDeque;

use lockstep_common::entry::{OutputDigest, OutputHash};

/// Compares a connection's drained output against the leader's digests.
#[derive(Debug, Default)]
pub struct OutputChecker {
    digest: OutputDigest,
    /// (full output length, expected hash32), in increasing length.
    pending: VecDeque<(u64, u32)>,
}

/// The result of feeding output.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Prefixes that matched.
    pub matched: u64,
    /// Prefixes that did not.
    pub diverged: u64,
}

fn hash32(h: OutputHash) -> u32 {
    (h.0 ^ (h.0 >> 32)) as u32
}

impl OutputChecker {
    /// Registers the leader's packed digest (0: nothing to check). Returns
    /// a result at once when the prefix was already drained.
    pub fn expect(&mut self, packed: u64) -> Checked {
        if packed == 0 {
            return Checked::default();
        }
        let (hash, len32) = OutputDigest::unpack(packed);
        // Reconstruct the full length closest to what we drained.
        let d = self.digest.len;
        let base = d & !0xffff_ffff;
        let mut full = base | len32 as u64;
        if full + (1 << 31) < d {
            full += 1 << 32;
        } else if full > d + (1 << 31) && full >= 1 << 32 {
            full -= 1 << 32;
        }
        if full == d {
            return self.verdict(hash);
        }
        if full < d {
            // The prefix went by before the leader's digest arrived; it
            // can no longer be checked.
            return Checked::default();
        }
        if let Some(&(last, _)) = self.pending.back() {
            if full < last {
                return Checked::default();
            }
        }
        self.pending.push_back((full, hash));
        Checked::default()
    }

    fn verdict(&self, hash: u32) -> Checked {
        if hash32(self.digest.hash) == hash {
            Checked {
                matched: 1,
                diverged: 0,
            }
        } else {
            Checked {
                matched: 0,
                diverged: 1,
            }
        }
    }

    /// Feeds output read from the server.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Checked {
        let mut out = Checked::default();
        while let Some(&(target, hash)) = self.pending.front() {
            let need = target - self.digest.len;
            if need as usize > bytes.len() {
                break;
            }
            self.digest.update(&bytes[..need as usize]);
            bytes = &bytes[need as usize..];
            let v = self.verdict(hash);
            out.matched += v.matched;
            out.diverged += v.diverged;
            self.pending.pop_front();
        }
        self.digest.update(bytes);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader_digest(out: &[u8]) -> u64 {
        let mut d = OutputDigest::default();
        d.update(out);
        d.pack()
    }

    #[test]
    fn matching_prefixes_match_across_chunk_boundaries() {
        let mut c = OutputChecker::default();
        assert_eq!(c.expect(leader_digest(b"+OK\r\n")), Checked::default());
        assert_eq!(
            c.expect(leader_digest(b"+OK\r\n:1\r\n")),
            Checked::default()
        );
        let r1 = c.feed(b"+OK\r\n:");
        let r2 = c.feed(b"1\r\n");
        assert_eq!(r1.matched + r2.matched, 2);
        assert_eq!(r1.diverged + r2.diverged, 0);
    }

    #[test]
    fn different_output_diverges() {
        let mut c = OutputChecker::default();
        c.expect(leader_digest(b":5\r\n"));
        let r = c.feed(b":6\r\n");
        assert_eq!(r.diverged, 1);
    }

    #[test]
    fn already_drained_prefix_is_checked_at_once_when_exact() {
        let mut c = OutputChecker::default();
        c.feed(b"+PONG\r\n");
        assert_eq!(c.expect(leader_digest(b"+PONG\r\n")).matched, 1);
        assert_eq!(c.expect(leader_digest(b"+PONX\r\n")).diverged, 1);
        assert_eq!(c.expect(0), Checked::default());
    }
}
