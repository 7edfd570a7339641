//! The command lines of a local cluster's processes: a node's follower,
//! the servers it replicates on a loopback port, and the environment that
//! puts a server under the preload.

use std::path::Path;
use std::process::Command;

use crate::binaries::Binaries;

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

/// The follower `program` of node `id` of the cluster configured in
/// `config`.
pub fn follower_command(program: &Path, config: &Path, id: u64) -> Command {
    let mut c = Command::new(program);
    c.arg("--config")
        .arg(config)
        .args(["--node", &id.to_string()]);
    c
}

/// Runs `cmd` under the preload `lib` as node `id` of the cluster
/// configured in `config`.
pub fn under_preload<'a>(
    cmd: &'a mut Command,
    lib: &Path,
    config: &Path,
    id: u64,
) -> &'a mut Command {
    cmd.env("LD_PRELOAD", lib)
        .env("LOCKSTEP_CONFIG", config)
        .env("LOCKSTEP_NODE", id.to_string())
}

/// `server` as node `id`'s server: under the preload, launched by
/// `lockstep launch-server` in a PID namespace of its own, its output
/// appended to `log` (see [`in_own_pid_namespace`]). How `lockstep up` and
/// the tests start every server.
pub fn preloaded_server(
    bins: &Binaries,
    config: &Path,
    id: u64,
    server: &mut Command,
    log: &Path,
) -> Command {
    under_preload(server, &bins.preload, config, id);
    in_own_pid_namespace(&bins.lockstep, server, log)
}

/// `cmd` (a server command, its environment included) run through
/// `lockstep launch-server` (`lockstep`: that executable) in a PID
/// namespace of its own, its output appended to `log`: what makes its
/// process image restorable. The environment goes to the server only (the
/// launcher itself runs without the preload).
pub fn in_own_pid_namespace(lockstep: &Path, cmd: &Command, log: &Path) -> Command {
    let mut c = Command::new(lockstep);
    c.arg("launch-server").arg("--log").arg(log);
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            let mut kv = k.to_os_string();
            kv.push("=");
            kv.push(v);
            c.arg("--env").arg(kv);
        }
    }
    c.arg("--").arg(cmd.get_program()).args(cmd.get_args());
    c
}
