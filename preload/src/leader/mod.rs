//! The leader's path: its server's inputs become entries in the log, its
//! outputs wait for their commit, and its event-loop turns run one at a
//! time.
//!
//! Every attached node holds an [`engine::Engine`] (config, region,
//! transport: `setup` makes one whatever the role, for a backup may come
//! to lead), and a backup reads its region's role through it; what the
//! engine does beyond that, and all of the other modules here, runs only
//! while this node leads. The replay simulation's model leader runs
//! [`entry_tags`] and the engine's chunking, so that its backups replay
//! what this leader logs.
//!
//! - [`engine`]: the leader's I/O path: turn an input into entries in the
//!   local ring, post them to every peer (transport), wait for the acks the
//!   commit discipline asks for.
//! - [`entry_tags`]: how the engine tags the entries it appends, pure.
//! - [`held_output`]: output commit with one wait per event-loop turn.
//! - [`turn_lock`]: the leader's event-loop turns run one at a time.

pub mod engine;
pub mod entry_tags;
pub mod held_output;
pub mod turn_lock;
