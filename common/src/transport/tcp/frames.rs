//! The wire format of the tcp transport: write frames (writer → region
//! server) and notices (region server → writer); see the module above for
//! the rules.

use crate::transport::check_remote_write;

/// Bytes of a frame header.
pub const HEADER_LEN: usize = 24;
/// Largest payload of one frame.
pub const MAX_WRITE: usize = 16 << 20;
/// Bytes of a notice.
pub const NOTICE_LEN: usize = 16;
/// Notice tag: the region refused a write from an older view.
pub const NOTICE_FENCED: u32 = 1;

/// A frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The writer's view.
    pub view: u64,
    /// Region offset of the write.
    pub offset: u64,
    /// Payload bytes.
    pub len: u32,
    /// Must be 0.
    pub flags: u32,
}

impl FrameHeader {
    /// The header's wire bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&self.view.to_le_bytes());
        h[8..16].copy_from_slice(&self.offset.to_le_bytes());
        h[16..20].copy_from_slice(&self.len.to_le_bytes());
        h[20..24].copy_from_slice(&self.flags.to_le_bytes());
        h
    }

    /// Parses wire bytes (any bytes parse; see [`FrameHeader::check`]).
    pub fn decode(h: &[u8; HEADER_LEN]) -> FrameHeader {
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let u32_at = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&h[i..i + 4]);
            u32::from_le_bytes(b)
        };
        FrameHeader {
            view: u64_at(0),
            offset: u64_at(8),
            len: u32_at(16),
            flags: u32_at(20),
        }
    }

    /// Checks the frame rules against a region of `region_len` bytes;
    /// the error says what is wrong.
    pub fn check(&self, region_len: u64) -> Result<(), String> {
        if self.flags != 0 {
            return Err(format!("unknown flags {:#x}", self.flags));
        }
        let len = self.len as usize;
        if len > MAX_WRITE {
            return Err(format!("length {len} is above the {MAX_WRITE}-byte limit"));
        }
        check_remote_write(self.offset, len, region_len).map_err(|e| e.to_string())
    }
}

pub(super) fn fenced_notice(view: u64) -> [u8; NOTICE_LEN] {
    let mut n = [0u8; NOTICE_LEN];
    n[0..4].copy_from_slice(&NOTICE_FENCED.to_le_bytes());
    n[8..16].copy_from_slice(&view.to_le_bytes());
    n
}

/// Parses a notice: its tag and the view it carries.
pub(super) fn decode_notice(n: &[u8; NOTICE_LEN]) -> (u32, u64) {
    let tag = u32::from_le_bytes([n[0], n[1], n[2], n[3]]);
    let mut v = [0u8; 8];
    v.copy_from_slice(&n[8..16]);
    (tag, u64::from_le_bytes(v))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_notices_round_trip() {
        assert_eq!(decode_notice(&fenced_notice(42)), (NOTICE_FENCED, 42));
    }

    #[test]
    fn header_round_trips_and_checks() {
        let h = FrameHeader {
            view: 7,
            offset: 4096,
            len: 64,
            flags: 0,
        };
        assert_eq!(FrameHeader::decode(&h.encode()), h);
        assert!(h.check(1 << 20).is_ok());
        let bad = |f: FrameHeader| f.check(1 << 20).unwrap_err();
        assert!(bad(FrameHeader { flags: 1, ..h }).contains("flags"));
        assert!(bad(FrameHeader { len: 0, ..h }).contains("aligned"));
        assert!(bad(FrameHeader { len: 12, ..h }).contains("aligned"));
        assert!(bad(FrameHeader { offset: 4, ..h }).contains("aligned"));
        assert!(bad(FrameHeader { offset: 8, ..h }).contains("outside"));
        assert!(bad(FrameHeader {
            offset: (1 << 20) - 8,
            ..h
        })
        .contains("outside"));
        assert!(bad(FrameHeader {
            offset: u64::MAX - 7,
            ..h
        })
        .contains("outside"));
        assert!(bad(FrameHeader {
            len: (MAX_WRITE + 8) as u32,
            ..h
        })
        .contains("limit"));
    }
}
