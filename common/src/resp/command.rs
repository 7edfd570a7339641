//! Commands: a RESP array of bulk strings as a client writes it, and as a
//! server parses it (that form, or an inline line as typed into telnet).

use super::value::{bulk, head};

/// Appends a command (a RESP array of bulk strings) to `out`: the bytes of
/// `Value::Array` of `Value::Bulk`s, without building the values (the
/// benchmarks' load encodes one per request).
pub fn encode_command(args: &[&[u8]], out: &mut Vec<u8>) {
    head(out, '*', args.len());
    for a in args {
        bulk(out, a);
    }
}

/// A command's bytes (a RESP array of bulk strings).
pub fn command_bytes(args: &[&[u8]]) -> Vec<u8> {
    let mut b = Vec::new();
    encode_command(args, &mut b);
    b
}

/// Why a server refuses the bytes of a command. The text is what Redis
/// puts after `ERR Protocol error: `.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// An inline command's line is still unfinished past [`MAX_LEN`] bytes.
    #[error("too big inline request")]
    InlineTooBig,
    /// A count or length that is no integer (its text, lossily).
    #[error("invalid length '{0}'")]
    InvalidLength(String),
    /// More arguments than [`MAX_ARGS`], or a negative count.
    #[error("invalid multibulk length")]
    MultibulkLength,
    /// An argument that is no bulk string: the type byte found.
    #[error("expected '$', got '{0}'")]
    NotBulk(char),
    /// An argument longer than [`MAX_LEN`], or a negative length.
    #[error("invalid bulk length")]
    BulkLength,
    /// A `*` count line still unfinished past [`MAX_HEADER`] bytes.
    #[error("too big mbulk count string")]
    CountTooBig,
    /// A `$` length line still unfinished past [`MAX_HEADER`] bytes.
    #[error("too big bulk count string")]
    LengthTooBig,
}

/// The most arguments a command may have.
pub const MAX_ARGS: usize = 1024;

/// The longest argument, and the longest unfinished inline line.
pub const MAX_LEN: usize = 1 << 20;

/// The longest unfinished `*` or `$` line: a peer that never ends one
/// would otherwise have it buffered, and scanned again at every read,
/// without bound.
pub const MAX_HEADER: usize = 64 << 10;

/// A parsed command's arguments and the bytes of `buf` it used.
pub type Parsed = (Vec<Vec<u8>>, usize);

/// Parses one command from the front of `buf`: `Ok(Some((args, used)))`,
/// `Ok(None)` when more bytes are needed, `Err` on a protocol error. Takes
/// multibulk (`*2\r\n$4\r\nPING\r\n...`) and inline (`PING\r\n`) commands.
pub fn parse_command(buf: &[u8]) -> Result<Option<Parsed>, CommandError> {
    fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")?;
        Some((&buf[at..at + end], at + end + 2))
    }
    fn number(b: &[u8]) -> Result<i64, CommandError> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| CommandError::InvalidLength(String::from_utf8_lossy(b).into()))
    }
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        let Some(end) = buf.iter().position(|&b| b == b'\n') else {
            return if buf.len() > MAX_LEN {
                Err(CommandError::InlineTooBig)
            } else {
                Ok(None)
            };
        };
        let text = String::from_utf8_lossy(&buf[..end]);
        let args = text
            .split_whitespace()
            .map(|s| s.as_bytes().to_vec())
            .collect();
        return Ok(Some((args, end + 1)));
    }
    let Some((head, mut at)) = line(buf, 1) else {
        return if buf.len() > MAX_HEADER {
            Err(CommandError::CountTooBig)
        } else {
            Ok(None)
        };
    };
    let n = number(head)?;
    if !(0..=MAX_ARGS as i64).contains(&n) {
        return Err(CommandError::MultibulkLength);
    }
    let mut args = Vec::with_capacity(n as usize);
    for _ in 0..n {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(CommandError::NotBulk(buf[at] as char));
        }
        let Some((len, next)) = line(buf, at + 1) else {
            return if buf.len() - at > MAX_HEADER {
                Err(CommandError::LengthTooBig)
            } else {
                Ok(None)
            };
        };
        let len = number(len)?;
        if !(0..=MAX_LEN as i64).contains(&len) {
            return Err(CommandError::BulkLength);
        }
        let len = len as usize;
        if buf.len() < next + len + 2 {
            return Ok(None);
        }
        args.push(buf[next..next + len].to_vec());
        at = next + len + 2;
    }
    Ok(Some((args, at)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{Proto, Value};
    use proptest::prelude::*;

    #[test]
    fn a_count_or_length_line_never_ended_is_refused_past_its_bound() {
        // Short and unfinished: more bytes are needed.
        assert_eq!(parse_command(b"*12"), Ok(None));
        assert_eq!(parse_command(b"*1\r\n$12"), Ok(None));
        // A peer that never ends the line is refused, not buffered.
        let mut count = b"*".to_vec();
        count.resize(MAX_HEADER + 2, b'1');
        assert_eq!(parse_command(&count), Err(CommandError::CountTooBig));
        let mut length = b"*1\r\n$".to_vec();
        length.resize(MAX_HEADER + 8, b'1');
        assert_eq!(parse_command(&length), Err(CommandError::LengthTooBig));
        assert_eq!(
            CommandError::CountTooBig.to_string(),
            "too big mbulk count string"
        );
    }

    #[test]
    fn commands_encode_as_arrays_of_bulk_strings() {
        assert_eq!(
            command_bytes(&[b"SET", b"k", b"xyz"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nxyz\r\n"
        );
        let args: [&[u8]; 2] = [b"GET", b""];
        assert_eq!(
            command_bytes(&args),
            Value::Array(args.iter().map(Value::bulk).collect()).encode(Proto::Resp2)
        );
    }

    #[test]
    fn commands_parse_in_both_forms_and_in_pieces() {
        let full = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\nrest";
        assert_eq!(
            parse_command(full).unwrap(),
            Some((vec![b"PING".to_vec(), b"hi".to_vec()], full.len() - 4))
        );
        for cut in 0..full.len() - 4 {
            assert_eq!(parse_command(&full[..cut]).unwrap(), None, "{cut}");
        }
        assert_eq!(
            parse_command(b"sentinel masters\r\n").unwrap(),
            Some((vec![b"sentinel".to_vec(), b"masters".to_vec()], 18))
        );
    }

    #[test]
    fn refusals_say_what_redis_says() {
        let refusal = |b: &[u8]| parse_command(b).unwrap_err().to_string();
        assert_eq!(refusal(b"*x\r\n"), "invalid length 'x'");
        assert_eq!(refusal(b"*1\r\n:3\r\n"), "expected '$', got ':'");
        assert_eq!(refusal(b"*1025\r\n"), "invalid multibulk length");
        assert_eq!(refusal(b"*-1\r\n"), "invalid multibulk length");
        assert_eq!(refusal(b"*1\r\n$1048577\r\n"), "invalid bulk length");
        assert_eq!(refusal(b"*1\r\n$-1\r\n"), "invalid bulk length");
        assert_eq!(refusal(&vec![b'a'; MAX_LEN + 1]), "too big inline request");
        assert_eq!(parse_command(&vec![b'a'; MAX_LEN]).unwrap(), None);
    }

    proptest! {
        #[test]
        fn commands_parse_back_as_encoded(
            args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 0..8),
            tail in proptest::collection::vec(any::<u8>(), 0..8),
        ) {
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let mut bytes = command_bytes(&refs);
            let len = bytes.len();
            bytes.extend_from_slice(&tail);
            prop_assert_eq!(parse_command(&bytes).unwrap(), Some((args.clone(), len)));
            // A command cut short asks for more bytes, never fails.
            for cut in 0..len {
                prop_assert_eq!(parse_command(&bytes[..cut]).unwrap(), None);
            }
        }
    }
}
