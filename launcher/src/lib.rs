//! What `lockstep up`, the benchmarks and the tests share to run a local
//! cluster and look at it: its programs ([`binaries`]), its config ([`cluster_spec`]), launching
//! processes with their logs ([`process`]), the processes' command lines
//! ([`commands`]), a private
//! ZooKeeper ([`zookeeper`]), loopback ports ([`ports`]), hosts in network
//! namespaces with partitions between them ([`netns`]), the Redis and
//! memcached clients ([`resp`], [`memcache`]), the Redis and memcached load of the
//! benchmarks ([`load`]), finding the leader ([`leader`]), a seeded
//! generator ([`rng`]) and the bytes a node keeps on disk ([`disk`]). The
//! tests' own fixtures are in the dev-only `lockstep-testkit`.
//!
//! Quick start, a server under test with its output in a log:
//!
//! ```no_run
//! use lockstep_launcher::{commands, ports, process};
//! let port = ports::free_port();
//! let mut cmd = commands::memcached_command(port);
//! let log = process::open_log(std::path::Path::new("/tmp/mc.log"), false).unwrap();
//! let mut child = Some(process::spawn_logged(&mut cmd, log, process::Grouping::Inherit).unwrap());
//! process::kill_and_reap(&mut child);
//! ```
#![deny(missing_docs)]

pub mod binaries;
pub mod cluster_spec;
pub mod commands;
pub mod disk;
pub mod leader;
pub mod load;
pub mod memcache;
pub mod netns;
pub mod ports;
pub mod process;
pub mod resp;
pub mod rng;
pub mod zookeeper;
