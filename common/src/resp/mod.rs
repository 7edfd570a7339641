//! RESP, the Redis protocol, in both directions and both versions: one
//! [`Value`] for what a server writes and a client reads back, encoded for
//! the connection's [`Proto`] ([`Value::encode`]) and read from a stream
//! ([`read_value`]); and commands, as a client writes them
//! ([`encode_command`]) and a server parses them ([`parse_command`]).
//!
//! The follower's Sentinel endpoint serves with it; the launcher's Redis
//! client (the benchmarks' load, the tests) talks to Redis with it.

mod command;
mod read;
mod value;

pub use command::{
    command_bytes, encode_command, parse_command, CommandError, Parsed, MAX_ARGS, MAX_LEN,
};
pub use read::read_value;
pub use value::{Proto, Value};
