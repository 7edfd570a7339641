//! The little of protobuf's wire format CRIU's images need: a message as
//! its fields (number, wire type, raw value), read and written again
//! byte for byte, so that a field can be read (`stats-dump`'s freeze time)
//! or rewritten (`files.img`'s paths and addresses, see
//! [`relocate`](super::relocate)) without CRIU's schemas. An image file is
//! two magic words, then length-prefixed messages.

use std::borrow::Cow;

/// A malformed image.
#[derive(Debug, thiserror::Error)]
#[error("CRIU image: {0}")]
pub struct ImageError(String);

pub(super) fn bad(what: impl Into<String>) -> ImageError {
    ImageError(what.into())
}

pub(super) const WIRE_VARINT: u8 = 0;
pub(super) const WIRE_FIXED64: u8 = 1;
pub(super) const WIRE_LEN: u8 = 2;
pub(super) const WIRE_FIXED32: u8 = 5;

/// One protobuf field: its number, wire type and raw value (a varint's
/// value; the bytes of the others).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Field<'a> {
    pub(super) num: u32,
    pub(super) wire: u8,
    pub(super) varint: u64,
    pub(super) bytes: Cow<'a, [u8]>,
}

pub(super) fn read_varint(b: &[u8], at: &mut usize) -> Result<u64, ImageError> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at).ok_or_else(|| bad("truncated varint"))?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(bad("varint longer than 10 bytes"))
}

pub(super) fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(super) fn parse(msg: &[u8]) -> Result<Vec<Field<'_>>, ImageError> {
    let mut fields = Vec::new();
    let mut at = 0;
    while at < msg.len() {
        let key = read_varint(msg, &mut at)?;
        let (num, wire) = ((key >> 3) as u32, (key & 7) as u8);
        let take = |at: &mut usize, n: usize| -> Result<&[u8], ImageError> {
            let s = msg
                .get(*at..*at + n)
                .ok_or_else(|| bad(format!("field {num} runs past its message")))?;
            *at += n;
            Ok(s)
        };
        let (varint, bytes): (u64, &[u8]) = match wire {
            WIRE_VARINT => (read_varint(msg, &mut at)?, &[]),
            WIRE_FIXED64 => (0, take(&mut at, 8)?),
            WIRE_FIXED32 => (0, take(&mut at, 4)?),
            WIRE_LEN => {
                let n = read_varint(msg, &mut at)? as usize;
                (0, take(&mut at, n)?)
            }
            w => return Err(bad(format!("field {num}: unknown wire type {w}"))),
        };
        fields.push(Field {
            num,
            wire,
            varint,
            bytes: Cow::Borrowed(bytes),
        });
    }
    Ok(fields)
}

pub(super) fn encode(fields: &[Field<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in fields {
        write_varint(u64::from(f.num) << 3 | u64::from(f.wire), &mut out);
        match f.wire {
            WIRE_VARINT => write_varint(f.varint, &mut out),
            WIRE_LEN => {
                write_varint(f.bytes.len() as u64, &mut out);
                out.extend_from_slice(&f.bytes);
            }
            _ => out.extend_from_slice(&f.bytes),
        }
    }
    out
}

/// The values of a repeated uint32 field, packed or not.
pub(super) fn repeated_u32(fields: &[Field<'_>], num: u32) -> Result<Vec<u32>, ImageError> {
    let mut out = Vec::new();
    for f in fields.iter().filter(|f| f.num == num) {
        match f.wire {
            WIRE_VARINT => out.push(f.varint as u32),
            WIRE_LEN => {
                let mut at = 0;
                while at < f.bytes.len() {
                    out.push(read_varint(&f.bytes, &mut at)? as u32);
                }
            }
            w => return Err(bad(format!("field {num}: wire type {w} for a uint32"))),
        }
    }
    Ok(out)
}

/// Replaces repeated uint32 field `num` by `values` (unpacked, where the
/// first of the old ones stood).
pub(super) fn set_repeated_u32(fields: &mut Vec<Field<'_>>, num: u32, values: &[u32]) {
    let at = fields
        .iter()
        .position(|f| f.num == num)
        .unwrap_or(fields.len());
    fields.retain(|f| f.num != num);
    let new = values.iter().map(|&v| Field {
        num,
        wire: WIRE_VARINT,
        varint: u64::from(v),
        bytes: Cow::Borrowed(&[]),
    });
    fields.splice(at..at, new);
}

pub(super) fn varint_field(fields: &[Field<'_>], num: u32) -> Option<u64> {
    fields
        .iter()
        .find(|f| f.num == num && f.wire == WIRE_VARINT)
        .map(|f| f.varint)
}

pub(super) fn set_varint(fields: &mut [Field<'_>], num: u32, v: u64) {
    for f in fields.iter_mut().filter(|f| f.num == num) {
        f.varint = v;
    }
}

/// Building messages in tests.
#[cfg(test)]
pub(super) mod build {
    use super::*;

    fn key(num: u32, wire: u8, out: &mut Vec<u8>) {
        write_varint(u64::from(num) << 3 | u64::from(wire), out);
    }

    /// Appends varint field `num`.
    pub fn vfield(num: u32, v: u64, out: &mut Vec<u8>) {
        key(num, WIRE_VARINT, out);
        write_varint(v, out);
    }

    /// Appends length-delimited field `num`.
    pub fn lfield(num: u32, b: &[u8], out: &mut Vec<u8>) {
        key(num, WIRE_LEN, out);
        write_varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }
}

#[cfg(test)]
mod tests {
    use super::build::{lfield, vfield};
    use super::*;

    proptest::proptest! {
        /// Re-encoding a parsed message gives its bytes back (the
        /// messages CRIU writes use minimal varints, as this does).
        #[test]
        fn parse_and_encode_round_trip(
            fields in proptest::collection::vec((1u32..40, 0u64..u64::MAX, proptest::collection::vec(0u8..=255, 0..20), proptest::bool::ANY), 0..12)
        ) {
            let mut msg = Vec::new();
            for (num, v, b, is_len) in &fields {
                if *is_len { lfield(*num, b, &mut msg) } else { vfield(*num, *v, &mut msg) }
            }
            let parsed = parse(&msg).unwrap();
            proptest::prop_assert_eq!(encode(&parsed), msg);
        }
    }
}
