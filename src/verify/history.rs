//! The history `lockstep verify` records: one event per invocation and one
//! per completion of every client operation, Jepsen-style, written as JSON
//! lines (`history.jsonl`) and read back by the checkers.
//!
//! A completion is `ok` (it happened, with what it returned), `fail` (it
//! certainly did not happen: the server refused it before acting) or
//! `info` (unknown: the client timed out or lost its connection, so it may
//! have happened or not; checkers must allow both). A process whose
//! operation ended `info` never invokes again (the next operation of that
//! client is a new process), so each process has at most one operation
//! open at a time.

use serde::{Deserialize, Serialize};

/// How an event ends (or begins) an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// One micro-operation of a list-append transaction, written as Elle's
/// `["append", key, value]` and `["r", key, [values…] | null]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mop {
    /// Append `value` to the list at `key`.
    Append { key: u64, value: i64 },
    /// Read the whole list at `key` (None: not known yet, on invoke).
    Read { key: u64, value: Option<Vec<i64>> },
}

/// What an operation is, with what it carried or returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "f", content = "value", rename_all = "kebab-case")]
pub enum Op {
    /// A list-append transaction (`MULTI`, `RPUSH`/`LRANGE`…, `EXEC`).
    Txn(Vec<Mop>),
    /// A register read (`GET`); `value` None on invoke, or a nil reply.
    Read { key: u64, value: Option<i64> },
    /// A register write (`SET`).
    Write { key: u64, value: i64 },
    /// A compare-and-set through `EVAL`: ok only if the register held `from`.
    Cas { key: u64, from: i64, to: i64 },
    /// An `INCR` of a counter; `result` what it returned (None on invoke
    /// or when unknown).
    Incr { key: u64, result: Option<i64> },
    /// The final read of a counter after the run healed.
    CounterRead { key: u64, value: Option<i64> },
}

/// One event of the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history (0, 1, 2, …).
    pub index: u64,
    #[serde(rename = "type")]
    pub kind: Kind,
    /// The client process (see the module doc on `info`).
    pub process: u64,
    /// Nanoseconds since the run began.
    pub time_ns: u64,
    #[serde(flatten)]
    pub op: Op,
    /// The node the client talked to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    /// Why it failed or is unknown, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Serialize for Mop {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = s.serialize_tuple(3)?;
        match self {
            Mop::Append { key, value } => {
                t.serialize_element("append")?;
                t.serialize_element(key)?;
                t.serialize_element(value)?;
            }
            Mop::Read { key, value } => {
                t.serialize_element("r")?;
                t.serialize_element(key)?;
                t.serialize_element(value)?;
            }
        }
        t.end()
    }
}

impl<'de> Deserialize<'de> for Mop {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Mop, D::Error> {
        use serde::de::Error;
        let (f, key, value): (String, u64, serde_json::Value) = Deserialize::deserialize(d)?;
        match f.as_str() {
            "append" => Ok(Mop::Append {
                key,
                value: serde_json::from_value(value).map_err(D::Error::custom)?,
            }),
            "r" => Ok(Mop::Read {
                key,
                value: serde_json::from_value(value).map_err(D::Error::custom)?,
            }),
            other => Err(D::Error::custom(format!(
                "a micro-operation is \"append\" or \"r\", not {other:?}"
            ))),
        }
    }
}

/// Reads a `history.jsonl`: one event per line; an error names the line.
pub fn parse(text: &str) -> anyhow::Result<Vec<Event>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| anyhow::anyhow!("history line {}: {e}", i + 1))
        })
        .collect()
}

/// Writes events as JSON lines.
pub fn to_jsonl(events: &[Event]) -> String {
    let mut out = String::new();
    for e in events {
        out.push_str(&serde_json::to_string(e).expect("an event serializes"));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_elle_style_json_lines() {
        let events = vec![
            Event {
                index: 0,
                kind: Kind::Invoke,
                process: 3,
                time_ns: 10,
                op: Op::Txn(vec![
                    Mop::Append { key: 1, value: 7 },
                    Mop::Read {
                        key: 1,
                        value: None,
                    },
                ]),
                node: None,
                error: None,
            },
            Event {
                index: 1,
                kind: Kind::Ok,
                process: 3,
                time_ns: 20,
                op: Op::Txn(vec![
                    Mop::Append { key: 1, value: 7 },
                    Mop::Read {
                        key: 1,
                        value: Some(vec![5, 7]),
                    },
                ]),
                node: Some(1),
                error: None,
            },
            Event {
                index: 2,
                kind: Kind::Info,
                process: 4,
                time_ns: 30,
                op: Op::Incr {
                    key: 0,
                    result: None,
                },
                node: Some(2),
                error: Some("timed out".into()),
            },
        ];
        let text = to_jsonl(&events);
        assert!(
            text.lines()
                .nth(1)
                .unwrap()
                .contains(r#""value":[["append",1,7],["r",1,[5,7]]]"#),
            "{text}"
        );
        assert!(text.contains(r#""type":"info""#) && text.contains(r#""f":"incr""#));
        assert_eq!(parse(&text).unwrap(), events);
        let bad = parse("{\"index\":0}\n").unwrap_err().to_string();
        assert!(bad.starts_with("history line 1:"), "{bad}");
    }
}
