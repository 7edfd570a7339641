//! Log entry codec: a 64-byte header, the payload, and a trailing canary.
//!
//! ```text
//! 0  len u32 | kind u8 | flags u8 | turn loop u16 (0: none, else loop + 1)
//! 8  view u64
//! 16 seq u64
//! 24 conn u64
//! 32 last_committed u64
//! 40 out_hash u64
//! 48 crc32c u32 (header with this field zeroed, then payload) | waits u32
//! 56 time_us u64 (the leader's wall clock when its server read the input)
//! 64 payload (len bytes), zero padding
//! .. canary u64 = canary(seq, view), the last 8 bytes of the footprint
//! ```
//!
//! The footprint of an entry is a multiple of 64 bytes so that every entry
//! starts on a cache line, and the canary is always its last word: a writer
//! stores it last (release), a reader checks it first (acquire).

use thiserror::Error;

/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 64;
/// Size of the trailing canary in bytes.
pub const CANARY_LEN: usize = 8;
/// Entries start and end on this boundary.
pub const ENTRY_ALIGN: usize = 64;

const CRC_OFFSET: usize = 48;

/// Flag: the leader's server read this entry's input in the same
/// event-loop turn, on the same thread, as the previous entry's. A backup
/// may hand a run of such entries to its server in one turn; without the
/// flag it never joins an entry to the one before.
pub const SAME_TURN: u8 = 1;

/// Flag: the leader's server read this input after the function that
/// called its turn's wait had returned (Redis's outer loop going on over
/// an event a nested wait left in its fired list, once a busy script
/// ended). A backup's server gets it only once it reads from as far out
/// (see the preload's `stack_depth`).
pub const RETURNED: u8 = 2;

/// What an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A new client connection; its conn id is this entry's seq.
    Accept = 1,
    /// Bytes a `recv`-type call returned on connection `conn`.
    Data = 2,
    /// Connection `conn` ended (EOF, reset or close).
    Close = 3,
    /// Carries a commit index or starts a view; applies nothing.
    Noop = 4,
    /// Ring wrap marker: the entry with this seq starts at ring offset 0.
    Wrap = 5,
    /// A view starts here: every replay connection is closed at this point.
    View = 6,
    /// An event-loop turn of the leader's server in which it read no input
    /// but its clock moved (its timers may have run): a backup's server
    /// runs one turn of the same event loop at this entry's time. `conn`
    /// names the loop (see the preload's `loops`).
    Tick = 7,
    /// A clock read inside a turn of the leader's server: its `conn`-th
    /// read since the turn's last input (or since the turn began, before
    /// its first input) read `time_us`, and so must every backup's. Time
    /// moves inside a turn only through these (a busy script sees its
    /// clock run), identically everywhere. `conn` 0 ends the leader's last
    /// logged turn: no more records of it follow (a backup's server that
    /// reads the clock after the turn's last record need not wait for the
    /// next turn's entries to know that). A poll for ended children counts
    /// as such a read; where the leader's reaped one, its record carries
    /// the child (12 bytes: fork ordinal, pid, wait status, little-endian)
    /// and every backup reaps its own copy of that child there.
    Time = 8,
}

impl Kind {
    /// Decodes a kind byte.
    pub fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Accept,
            2 => Kind::Data,
            3 => Kind::Close,
            4 => Kind::Noop,
            5 => Kind::Wrap,
            6 => Kind::View,
            7 => Kind::Tick,
            8 => Kind::Time,
            _ => return None,
        })
    }
}

/// The decoded fixed part of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryHeader {
    /// Payload length in bytes.
    pub len: u32,
    /// What the entry records.
    pub kind: Kind,
    /// Flag bits: [`SAME_TURN`], [`RETURNED`]; the others are reserved (zero).
    pub flags: u8,
    /// The event loop of the leader's server whose turn read the input
    /// (loops are named alike on every replica): a backup's server moves
    /// that loop's clock to the entry's time, no other. None for entries
    /// no loop read (the follower's `VIEW`) and in logs written before
    /// the field existed.
    pub turn_loop: Option<u16>,
    /// View in which the entry was proposed.
    pub view: u64,
    /// Global, gap-free sequence number (starts at 1).
    pub seq: u64,
    /// Connection id (seq of the connection's ACCEPT); 0 when not applicable.
    pub conn: u64,
    /// Highest seq known committed when this entry was written.
    pub last_committed: u64,
    /// Hash of the output the leader sent on `conn` so far (0: none).
    pub out_hash: u64,
    /// The leader's wall clock (µs since the epoch) when its server read
    /// the input: the time every replica's server sees while it handles
    /// the input (0: not recorded).
    pub time_us: u64,
    /// On the first entry of a leader's turn: how many times the turn's
    /// thread entered its event loop's wait since its previous logged turn
    /// began (0: not known). The waits between are turns the log does not
    /// hold (nothing read, the clock did not move); a backup's server runs
    /// as many before it is handed this turn, so a loop that polls without
    /// blocking (Redis serving other clients during a busy script) reads
    /// each input in the same wait as the leader's.
    pub waits: u32,
}

/// Why bytes are not a valid entry.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header, or than the header's `len` requires.
    #[error("entry truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// Unknown kind byte.
    #[error("unknown entry kind {0}")]
    BadKind(u8),
    /// Payload longer than allowed.
    #[error("entry length {len} exceeds the maximum {max}")]
    TooLong {
        /// Length found.
        len: u32,
        /// Maximum allowed.
        max: u32,
    },
    /// Canary does not match (seq, view): the entry is torn or stale.
    #[error("canary mismatch")]
    Canary,
    /// CRC over header and payload does not match.
    #[error("crc mismatch")]
    Crc,
    /// Non-zero bytes in a padding field.
    #[error("non-zero padding")]
    Padding,
}

/// Bytes an entry with a payload of `len` bytes occupies (header, payload,
/// padding and canary), rounded up to [`ENTRY_ALIGN`].
pub const fn footprint(len: usize) -> usize {
    let raw = HEADER_LEN + len + CANARY_LEN;
    raw.div_ceil(ENTRY_ALIGN) * ENTRY_ALIGN
}

/// The canary of the entry `(seq, view)`: a mixing function, so that a stale
/// entry from an older lap or view never carries the canary a reader expects.
pub fn canary(seq: u64, view: u64) -> u64 {
    // splitmix64 finaliser over both words; never zero for valid entries
    // because zeroed memory must not look like a written canary.
    let mut z = seq
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(view.rotate_left(32) ^ 0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    if z == 0 {
        1
    } else {
        z
    }
}

impl EntryHeader {
    /// A header with the given identity and zero commit/hash fields.
    pub fn new(kind: Kind, view: u64, seq: u64, conn: u64, len: u32) -> Self {
        EntryHeader {
            len,
            kind,
            flags: 0,
            turn_loop: None,
            view,
            seq,
            conn,
            last_committed: 0,
            out_hash: 0,
            time_us: 0,
            waits: 0,
        }
    }

    /// Bytes the whole entry occupies.
    pub fn footprint(&self) -> usize {
        footprint(self.len as usize)
    }

    fn write_fields(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.len.to_le_bytes());
        out[4] = self.kind as u8;
        out[5] = self.flags;
        let turn_loop = self.turn_loop.map_or(0, |l| l.saturating_add(1));
        out[6..8].copy_from_slice(&turn_loop.to_le_bytes());
        out[8..16].copy_from_slice(&self.view.to_le_bytes());
        out[16..24].copy_from_slice(&self.seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.conn.to_le_bytes());
        out[32..40].copy_from_slice(&self.last_committed.to_le_bytes());
        out[40..48].copy_from_slice(&self.out_hash.to_le_bytes());
        out[48..52].fill(0);
        out[52..56].copy_from_slice(&self.waits.to_le_bytes());
        out[56..64].copy_from_slice(&self.time_us.to_le_bytes());
    }

    /// Parses the header fields without checking CRC or canary.
    pub fn parse(bytes: &[u8]) -> Result<EntryHeader, DecodeError> {
        if bytes.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                need: HEADER_LEN,
                have: bytes.len(),
            });
        }
        let kind = Kind::from_u8(bytes[4]).ok_or(DecodeError::BadKind(bytes[4]))?;
        let turn_loop = u16::from_le_bytes([bytes[6], bytes[7]]).checked_sub(1);
        Ok(EntryHeader {
            len: u32_at(bytes, 0),
            kind,
            flags: bytes[5],
            turn_loop,
            view: u64_at(bytes, 8),
            seq: u64_at(bytes, 16),
            conn: u64_at(bytes, 24),
            last_committed: u64_at(bytes, 32),
            out_hash: u64_at(bytes, 40),
            time_us: u64_at(bytes, 56),
            waits: u32_at(bytes, 52),
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn crc_of(header_with_zero_crc: &[u8], payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(header_with_zero_crc);
    crc32c::crc32c_append(c, payload)
}

/// Encodes header and payload into `out[..footprint]`, including padding and
/// the canary. `out` must hold at least `footprint(payload.len())` bytes;
/// `hdr.len` is taken from the payload. Returns the footprint.
///
/// Writers into shared memory store everything but the last 8 bytes first
/// and the canary last; see `Region::write`.
pub fn encode_into(hdr: &EntryHeader, payload: &[u8], out: &mut [u8]) -> usize {
    let mut hdr = *hdr;
    hdr.len = payload.len() as u32;
    let fp = hdr.footprint();
    let out = &mut out[..fp];
    hdr.write_fields(&mut out[..HEADER_LEN]);
    out[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
    out[HEADER_LEN + payload.len()..fp - CANARY_LEN].fill(0);
    let crc = crc_of(&out[..HEADER_LEN], payload);
    out[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    out[fp - CANARY_LEN..].copy_from_slice(&canary(hdr.seq, hdr.view).to_le_bytes());
    fp
}

/// Encodes an entry into a new vector (for storage and tests).
pub fn encode(hdr: &EntryHeader, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; footprint(payload.len())];
    encode_into(hdr, payload, &mut out);
    out
}

/// Decodes a complete entry (header, payload, canary) and checks the
/// canary, the CRC and that the payload is at most `max_len` bytes.
/// Returns the header and the payload slice.
pub fn decode(bytes: &[u8], max_len: u32) -> Result<(EntryHeader, &[u8]), DecodeError> {
    let hdr = EntryHeader::parse(bytes)?;
    if hdr.len > max_len {
        return Err(DecodeError::TooLong {
            len: hdr.len,
            max: max_len,
        });
    }
    let fp = hdr.footprint();
    if bytes.len() < fp {
        return Err(DecodeError::Truncated {
            need: fp,
            have: bytes.len(),
        });
    }
    if u64_at(bytes, fp - CANARY_LEN) != canary(hdr.seq, hdr.view) {
        return Err(DecodeError::Canary);
    }
    let payload = &bytes[HEADER_LEN..HEADER_LEN + hdr.len as usize];
    if bytes[HEADER_LEN + hdr.len as usize..fp - CANARY_LEN]
        .iter()
        .any(|b| *b != 0)
    {
        return Err(DecodeError::Padding);
    }
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(&bytes[..HEADER_LEN]);
    let stored = u32_at(&h, CRC_OFFSET);
    h[CRC_OFFSET..CRC_OFFSET + 4].fill(0);
    if crc_of(&h, payload) != stored {
        return Err(DecodeError::Crc);
    }
    Ok((hdr, payload))
}

/// A 64-bit FNV-1a style running hash, used for the per-connection output
/// hash that backups compare to detect divergence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputHash(pub u64);

impl Default for OutputHash {
    fn default() -> Self {
        OutputHash(0xcbf2_9ce4_8422_2325)
    }
}

impl OutputHash {
    /// Folds `bytes` into the hash.
    pub fn update(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// Digest of the output a server sent on one connection since that
/// connection's previous input: a 32-bit hash of the bytes and their
/// count. The leader packs it into the connection's next input entry
/// (`out_hash`), so a backup compares, entry by entry, what its server
/// answered to the same input; one differing reply marks one entry, not
/// every later one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutputDigest {
    /// Hash of all output so far.
    pub hash: OutputHash,
    /// Bytes of output so far.
    pub len: u64,
}

impl OutputDigest {
    /// The `out_hash` of an input after which the leader withheld its
    /// server's output (it could not commit, or stopped leading, and reset
    /// the connection instead): what its server produced then is unknown,
    /// so backups compare nothing for it. A real digest never packs to it
    /// (its length would be 4 GiB - 1 with a hash of all ones).
    pub const WITHHELD: u64 = u64::MAX;

    /// Folds more output in.
    pub fn update(&mut self, bytes: &[u8]) {
        self.hash.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// A bit of a packed digest that leaders used to set when their
    /// client's socket refused output; backups take every leader's bytes
    /// as a possible prefix now (see the preload's `output_check`), so
    /// nothing sets it, and comparisons ignore it for logs written before.
    pub const BACKLOGGED: u64 = 1 << 32;

    /// A 31-bit hash of the bytes, [`OutputDigest::BACKLOGGED`] clear, and
    /// their count mod 2^32 (never 0: even no output is checked; an
    /// `out_hash` of 0 means the entry carries no digest).
    pub fn pack(&self) -> u64 {
        let h = (self.hash.0 ^ (self.hash.0 >> 32)) as u32;
        ((h as u64 & !1) << 32) | (self.len as u32 as u64)
    }

    /// Whether two packed digests name the same bytes (the flag aside).
    pub fn same(a: u64, b: u64) -> bool {
        a & !Self::BACKLOGGED == b & !Self::BACKLOGGED
    }

    /// Splits a packed digest into (hash bits, len mod 2^32).
    pub fn unpack(packed: u64) -> (u32, u32) {
        ((packed >> 32) as u32 & !1, packed as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            Just(Kind::Accept),
            Just(Kind::Data),
            Just(Kind::Close),
            Just(Kind::Noop),
            Just(Kind::Wrap),
            Just(Kind::View),
            Just(Kind::Tick),
            Just(Kind::Time),
        ]
    }

    prop_compose! {
        fn arb_entry()(kind in arb_kind(), view in any::<u64>(), seq in any::<u64>(),
                       conn in any::<u64>(), lc in any::<u64>(), oh in any::<u64>(),
                       flags in any::<u8>(), t in any::<u64>(), waits in any::<u32>(),
                       turn_loop in proptest::option::of(0..u16::MAX),
                       payload in proptest::collection::vec(any::<u8>(), 0..300))
            -> (EntryHeader, Vec<u8>) {
            let mut h = EntryHeader::new(kind, view, seq, conn, payload.len() as u32);
            h.last_committed = lc;
            h.out_hash = oh;
            h.time_us = t;
            h.waits = waits;
            h.flags = flags;
            h.turn_loop = turn_loop;
            (h, payload)
        }
    }

    #[test]
    fn footprint_is_aligned_and_holds_everything() {
        assert_eq!(footprint(0), 128);
        assert_eq!(footprint(56), 128);
        assert_eq!(footprint(57), 192);
        for len in 0..1000 {
            let fp = footprint(len);
            assert_eq!(fp % ENTRY_ALIGN, 0);
            assert!(fp >= HEADER_LEN + len + CANARY_LEN);
            assert!(fp < HEADER_LEN + len + CANARY_LEN + ENTRY_ALIGN);
        }
    }

    #[test]
    fn canary_depends_on_seq_and_view() {
        assert_ne!(canary(1, 1), canary(2, 1));
        assert_ne!(canary(1, 1), canary(1, 2));
        assert_ne!(canary(0, 0), 0);
    }

    proptest! {
        #[test]
        fn round_trip((h, p) in arb_entry()) {
            let bytes = encode(&h, &p);
            prop_assert_eq!(bytes.len(), footprint(p.len()));
            let (h2, p2) = decode(&bytes, u32::MAX).unwrap();
            prop_assert_eq!(h2, h);
            prop_assert_eq!(p2, &p[..]);
        }

        #[test]
        fn any_flipped_bit_is_rejected((h, p) in arb_entry(), bit in any::<proptest::sample::Index>()) {
            let mut bytes = encode(&h, &p);
            let i = bit.index(bytes.len() * 8);
            bytes[i / 8] ^= 1 << (i % 8);
            prop_assert!(decode(&bytes, u32::MAX).is_err(), "flip of bit {} accepted", i);
        }

        #[test]
        fn truncation_is_rejected((h, p) in arb_entry(), cut in any::<proptest::sample::Index>()) {
            let bytes = encode(&h, &p);
            let n = cut.index(bytes.len());
            prop_assert!(decode(&bytes[..n], u32::MAX).is_err());
        }
    }

    #[test]
    fn too_long_is_rejected() {
        let bytes = encode(&EntryHeader::new(Kind::Data, 1, 1, 1, 0), &[7u8; 100]);
        assert_eq!(
            decode(&bytes, 99),
            Err(DecodeError::TooLong { len: 100, max: 99 })
        );
    }

    #[test]
    fn output_digest_packs_hash_and_length() {
        let mut d = OutputDigest::default();
        assert_ne!(d.pack(), 0, "no output is a digest too");
        d.update(b"+OK\r\n");
        let (h, len) = OutputDigest::unpack(d.pack());
        assert_eq!(len, 5);
        let mut e = OutputDigest::default();
        e.update(b"+OK\r");
        e.update(b"\n");
        assert_eq!(OutputDigest::unpack(e.pack()).0, h);
    }

    #[test]
    fn output_hash_is_order_sensitive() {
        let mut a = OutputHash::default();
        a.update(b"ab");
        let mut b = OutputHash::default();
        b.update(b"ba");
        assert_ne!(a, b);
        let mut c = OutputHash::default();
        c.update(b"a");
        c.update(b"b");
        assert_eq!(a, c);
    }
}
