//! The RESP value and how it is written in each protocol version.

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

/// One RESP value: what a server writes, what a client reads. Where RESP2
/// has no type of its own, encoding writes what Redis sends a RESP2 client
/// instead (so such a value reads back as that stand-in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// `+text`: a simple string (a status such as `OK`).
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
        match self {
            Value::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Value::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Value::Bulk(b) => bulk(out, b),
            Value::Null | Value::NullArray if resp3 => out.extend_from_slice(b"_\r\n"),
            Value::Null => out.extend_from_slice(b"$-1\r\n"),
            Value::NullArray => out.extend_from_slice(b"*-1\r\n"),
            Value::Array(items) | Value::Push(items) => {
                let tag = if resp3 && matches!(self, Value::Push(_)) {
                    '>'
                } else {
                    '*'
                };
                head(out, tag, items.len());
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

/// Appends an aggregate's or a bulk string's first line: `tag`, then `n`.
pub(super) fn head(out: &mut Vec<u8>, tag: char, n: usize) {
    out.extend_from_slice(format!("{tag}{n}\r\n").as_bytes());
}

/// Appends `b` as a bulk string.
pub(super) fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    head(out, '$', b.len());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
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
}
