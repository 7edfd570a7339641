//! liblockstep.so: preloaded into an unmodified server (`LD_PRELOAD`), it
//! turns the server's socket inputs into replicated log entries when this
//! node leads, and reports what the server consumed from replay
//! connections when it is a backup.
//!
//! Environment: `LOCKSTEP_CONFIG` (cluster config path), `LOCKSTEP_NODE`
//! (this node's id), `LOCKSTEP_LOG` (level, optionally `level:/file`),
//! `LOCKSTEP_ALLOW_UNREPLICATED=1` (debugging only: run unreplicated when
//! the config or region is unusable instead of refusing to serve).

pub mod hooks;
mod logger;
pub mod state;
