//! RESP, both versions, as far as a Sentinel needs it: the values a
//! Sentinel sends, each encoded for the connection's protocol (RESP2, or
//! RESP3 once the client said `HELLO 3`), and the commands clients send.

/// The protocol a connection speaks (`HELLO` switches it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Proto {
    /// RESP2: every connection starts here.
    #[default]
    Resp2,
    /// RESP3: maps, nulls and push messages have their own types.
    Resp3,
}

impl Proto {
    /// The version number `HELLO` reports.
    pub fn number(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }
}

/// One value to send. Where RESP2 has no type of its own, it gets what
/// Redis sends a RESP2 client instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `+text`
    Simple(String),
    /// `-text`
    Error(String),
    /// `:n`
    Int(i64),
    /// `$len text`
    Bulk(Vec<u8>),
    /// No value: RESP3 `_`, RESP2 a null bulk (`$-1`).
    Null,
    /// No array: RESP3 `_`, RESP2 a null array (`*-1`).
    NullArray,
    /// `*n ...`
    Array(Vec<Value>),
    /// RESP3 `%n` key value ...; RESP2 a flat array of keys and values.
    Map(Vec<(Value, Value)>),
    /// An out-of-band message (pub/sub): RESP3 `>n ...`; RESP2 an array.
    Push(Vec<Value>),
}

impl Value {
    /// A bulk string.
    pub fn bulk(s: impl AsRef<[u8]>) -> Value {
        Value::Bulk(s.as_ref().to_vec())
    }

    /// An array of bulk strings.
    pub fn strings(v: Vec<String>) -> Value {
        Value::Array(v.into_iter().map(Value::bulk).collect())
    }

    /// A map of bulk strings to bulk strings.
    pub fn string_map(fields: Vec<(&str, String)>) -> Value {
        Value::Map(
            fields
                .into_iter()
                .map(|(k, v)| (Value::bulk(k), Value::bulk(v)))
                .collect(),
        )
    }

    /// The wire bytes in `proto`.
    pub fn encode(&self, proto: Proto) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(proto, &mut out);
        out
    }

    /// Appends the wire bytes in `proto` to `out`.
    pub fn encode_into(&self, proto: Proto, out: &mut Vec<u8>) {
        let resp3 = proto == Proto::Resp3;
        fn head(out: &mut Vec<u8>, tag: char, n: usize) {
            out.extend_from_slice(format!("{tag}{n}\r\n").as_bytes());
        }
        match self {
            Value::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Value::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Value::Bulk(b) => {
                head(out, '$', b.len());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Value::Null | Value::NullArray if resp3 => out.extend_from_slice(b"_\r\n"),
            Value::Null => out.extend_from_slice(b"$-1\r\n"),
            Value::NullArray => out.extend_from_slice(b"*-1\r\n"),
            Value::Array(items) | Value::Push(items) => {
                head(
                    out,
                    if resp3 && matches!(self, Value::Push(_)) {
                        '>'
                    } else {
                        '*'
                    },
                    items.len(),
                );
                for i in items {
                    i.encode_into(proto, out);
                }
            }
            Value::Map(pairs) => {
                if resp3 {
                    head(out, '%', pairs.len());
                } else {
                    head(out, '*', 2 * pairs.len());
                }
                for (k, v) in pairs {
                    k.encode_into(proto, out);
                    v.encode_into(proto, out);
                }
            }
        }
    }
}

/// A parsed command's arguments and the bytes of `buf` it used.
pub type Parsed = (Vec<Vec<u8>>, usize);

/// Parses one command from the front of `buf`: `Ok(Some((args, used)))`,
/// `Ok(None)` when more bytes are needed, `Err` on a protocol error. Takes
/// multibulk (`*2\r\n$4\r\nPING\r\n...`) and inline (`PING\r\n`) commands.
pub fn parse_command(buf: &[u8]) -> Result<Option<Parsed>, String> {
    const MAX: usize = 1 << 20;
    fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")?;
        Some((&buf[at..at + end], at + end + 2))
    }
    fn number(b: &[u8]) -> Result<i64, String> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("invalid length '{}'", String::from_utf8_lossy(b)))
    }
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        let Some(end) = buf.iter().position(|&b| b == b'\n') else {
            return if buf.len() > MAX {
                Err("too big inline request".into())
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
        return Ok(None);
    };
    let n = number(head)?;
    if !(0..=1024).contains(&n) {
        return Err("invalid multibulk length".into());
    }
    let mut args = Vec::with_capacity(n as usize);
    for _ in 0..n {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(format!("expected '$', got '{}'", buf[at] as char));
        }
        let Some((len, next)) = line(buf, at + 1) else {
            return Ok(None);
        };
        let len = number(len)?;
        if !(0..=MAX as i64).contains(&len) {
            return Err("invalid bulk length".into());
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

/// Whether glob `pattern` (`*`, `?`, literal bytes) matches `s`.
pub fn glob(pattern: &[u8], s: &[u8]) -> bool {
    match pattern.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && glob(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && glob(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_encode_for_each_protocol() {
        let map = Value::string_map(vec![("ip", "127.0.0.1".into()), ("port", "7001".into())]);
        assert_eq!(
            map.encode(Proto::Resp2),
            b"*4\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nport\r\n$4\r\n7001\r\n".to_vec()
        );
        assert_eq!(
            map.encode(Proto::Resp3),
            b"%2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n$4\r\nport\r\n$4\r\n7001\r\n".to_vec()
        );
        assert_eq!(Value::Null.encode(Proto::Resp2), b"$-1\r\n".to_vec());
        assert_eq!(Value::NullArray.encode(Proto::Resp2), b"*-1\r\n".to_vec());
        assert_eq!(Value::Null.encode(Proto::Resp3), b"_\r\n".to_vec());
        assert_eq!(Value::NullArray.encode(Proto::Resp3), b"_\r\n".to_vec());
        let push = Value::Push(vec![Value::bulk("message"), Value::Int(1)]);
        assert_eq!(
            push.encode(Proto::Resp2),
            b"*2\r\n$7\r\nmessage\r\n:1\r\n".to_vec()
        );
        assert_eq!(
            push.encode(Proto::Resp3),
            b">2\r\n$7\r\nmessage\r\n:1\r\n".to_vec()
        );
        let nested = Value::Array(vec![map.clone(), Value::Null]);
        assert_eq!(
            nested.encode(Proto::Resp3),
            [
                b"*2\r\n".to_vec(),
                map.encode(Proto::Resp3),
                b"_\r\n".to_vec()
            ]
            .concat()
        );
        for proto in [Proto::Resp2, Proto::Resp3] {
            assert_eq!(
                Value::Simple("OK".into()).encode(proto),
                b"+OK\r\n".to_vec()
            );
            assert_eq!(
                Value::Error("ERR x".into()).encode(proto),
                b"-ERR x\r\n".to_vec()
            );
            assert_eq!(Value::Int(-3).encode(proto), b":-3\r\n".to_vec());
            assert_eq!(Value::bulk("hi").encode(proto), b"$2\r\nhi\r\n".to_vec());
        }
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
        assert!(parse_command(b"*x\r\n").is_err());
        assert!(parse_command(b"*1\r\n:3\r\n").is_err());
        assert!(glob(b"*", b"+switch-master"));
        assert!(glob(b"+switch-*", b"+switch-master"));
        assert!(!glob(b"+sdown", b"+switch-master"));
        assert!(glob(b"+s?itch-master", b"+switch-master"));
    }
}
