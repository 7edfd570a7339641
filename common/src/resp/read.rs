//! Reading one value from a stream, as a client reads a reply.

use std::io::{self, BufRead};

use super::Value;

/// Reads one value (nested aggregates included), RESP2 or RESP3: a RESP3
/// null (`_`) reads as [`Value::Null`]. Fails with `UnexpectedEof` when the
/// stream ends before the value starts and `InvalidData` on a line that is
/// no value; the stream's own errors (timeouts) pass through.
pub fn read_value(r: &mut impl BufRead) -> io::Result<Value> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    let line = line.trim_end_matches("\r\n");
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad reply line {line:?}"),
        )
    };
    let (kind, rest) = line.split_at(1.min(line.len()));
    let count = || rest.parse::<i64>().map_err(|_| bad());
    Ok(match kind {
        "+" => Value::Simple(rest.into()),
        "-" => Value::Error(rest.into()),
        ":" => Value::Int(count()?),
        "_" if rest.is_empty() => Value::Null,
        "$" => {
            let n = count()?;
            if n < 0 {
                Value::Null
            } else {
                // The payload and its CRLF, which is not checked.
                let mut b = vec![0u8; n as usize + 2];
                r.read_exact(&mut b)?;
                b.truncate(n as usize);
                Value::Bulk(b)
            }
        }
        "*" => match count()? {
            n if n < 0 => Value::NullArray,
            n => Value::Array(read_values(r, n)?),
        },
        ">" => match count()? {
            n if n < 0 => return Err(bad()),
            n => Value::Push(read_values(r, n)?),
        },
        "%" => {
            let mut pairs = Vec::new();
            for _ in 0..count()?.max(0) {
                pairs.push((read_value(r)?, read_value(r)?));
            }
            Value::Map(pairs)
        }
        _ => return Err(bad()),
    })
}

/// Reads an aggregate's `n` elements.
fn read_values(r: &mut impl BufRead, n: i64) -> io::Result<Vec<Value>> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(read_value(r)?);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::Proto;
    use proptest::prelude::*;

    #[test]
    fn reads_every_kind() {
        let mut r: &[u8] = b"+OK\r\n-ERR no\r\n:7\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n$0\r\n\r\n\
              %1\r\n+a\r\n:2\r\n*-1\r\n_\r\n>2\r\n+m\r\n:3\r\n";
        let mut next = || read_value(&mut r).unwrap();
        assert_eq!(next(), Value::Simple("OK".into()));
        assert_eq!(next(), Value::Error("ERR no".into()));
        assert_eq!(next(), Value::Int(7));
        assert_eq!(next(), Value::bulk("abc"));
        assert_eq!(next(), Value::Null);
        assert_eq!(
            next(),
            Value::Array(vec![Value::Int(1), Value::Bulk(Vec::new())])
        );
        assert_eq!(
            next(),
            Value::Map(vec![(Value::Simple("a".into()), Value::Int(2))])
        );
        assert_eq!(next(), Value::NullArray);
        assert_eq!(next(), Value::Null);
        assert_eq!(
            next(),
            Value::Push(vec![Value::Simple("m".into()), Value::Int(3)])
        );
        let e = read_value(&mut r).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_line_that_is_no_value_is_invalid_data() {
        for bad in [
            &b"?x\r\n"[..],
            b":x\r\n",
            b"$\r\n",
            b"_1\r\n",
            b">-1\r\n",
            b"\r\n",
        ] {
            let e = read_value(&mut &bad[..]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
    }

    /// What `v` reads back as once written in RESP2: RESP3's own types
    /// become the arrays Redis sends a RESP2 client instead.
    fn as_resp2(v: Value) -> Value {
        match v {
            Value::Array(items) | Value::Push(items) => {
                Value::Array(items.into_iter().map(as_resp2).collect())
            }
            Value::Map(pairs) => Value::Array(
                pairs
                    .into_iter()
                    .flat_map(|(k, v)| [as_resp2(k), as_resp2(v)])
                    .collect(),
            ),
            v => v,
        }
    }

    /// What `v` reads back as once written in RESP3: both nulls are `_`.
    fn as_resp3(v: Value) -> Value {
        match v {
            Value::NullArray => Value::Null,
            Value::Array(items) => Value::Array(items.into_iter().map(as_resp3).collect()),
            Value::Push(items) => Value::Push(items.into_iter().map(as_resp3).collect()),
            Value::Map(pairs) => Value::Map(
                pairs
                    .into_iter()
                    .map(|(k, v)| (as_resp3(k), as_resp3(v)))
                    .collect(),
            ),
            v => v,
        }
    }

    fn value() -> impl Strategy<Value = Value> {
        // Simple strings and errors are one line: no CR or LF.
        let line = "[^\r\n]{0,12}";
        let leaf = prop_oneof![
            line.prop_map(Value::Simple),
            line.prop_map(Value::Error),
            any::<i64>().prop_map(Value::Int),
            proptest::collection::vec(any::<u8>(), 0..24).prop_map(Value::Bulk),
            Just(Value::Null),
            Just(Value::NullArray),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            let items = proptest::collection::vec(inner.clone(), 0..4);
            prop_oneof![
                items.clone().prop_map(Value::Array),
                items.prop_map(Value::Push),
                proptest::collection::vec((inner.clone(), inner), 0..3).prop_map(Value::Map),
            ]
        })
    }

    proptest! {
        #[test]
        fn values_read_back_as_written(v in value(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
            for (proto, want) in [(Proto::Resp2, as_resp2(v.clone())), (Proto::Resp3, as_resp3(v.clone()))] {
                let mut bytes = v.encode(proto);
                let len = bytes.len();
                bytes.extend_from_slice(&tail);
                let mut r = &bytes[..];
                prop_assert_eq!(read_value(&mut r).unwrap(), want.clone());
                // Exactly the value's bytes are consumed: the next one starts where it ends.
                prop_assert_eq!(r.len(), bytes.len() - len);
                // Reading back is faithful: what was read writes the same bytes.
                prop_assert_eq!(want.encode(proto), bytes[..len].to_vec());
            }
        }
    }
}
