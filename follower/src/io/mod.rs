//! The I/O the runtime drives, each behind one type: the stored log
//! ([`store::LogStore`], RocksDB), the ZooKeeper election
//! ([`zookeeper::ZkElection`]) and the feed of committed entries into the
//! server's apply ring ([`feed::Feeder`]).

pub mod entry_run;
pub mod feed;
pub mod recent_runs;
pub mod store;
pub mod zookeeper;
