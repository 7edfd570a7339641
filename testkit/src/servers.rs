//! The command lines of the servers a cluster replicates, on a loopback
//! port, ready for the preload's environment to be added.

use std::path::Path;
use std::process::Command;

/// `redis-server` on 127.0.0.1:`port` with its data in `dir` and the given
/// settings (`lockstep_common::config::REDIS_REPLICA_ARGS` for a replica).
pub fn redis_command(port: u16, dir: &Path, settings: &[&str]) -> Command {
    let mut c = Command::new("redis-server");
    c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(settings)
        .arg("--dir")
        .arg(dir);
    c
}

/// `memcached -t 1` on 127.0.0.1:`port` (TCP only).
pub fn memcached_command(port: u16) -> Command {
    let mut c = Command::new("memcached");
    c.args(["-u", "root", "-t", "1", "-U", "0", "-l", "127.0.0.1"])
        .args(["-p", &port.to_string()]);
    c
}
