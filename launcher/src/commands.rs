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

/// A replica's `redis-server` on `app` (a host's own address in its
/// network namespace), with its data in `dir`, reachable from other hosts
/// (protected mode off: its clients come from elsewhere, not loopback).
pub fn redis_on_host(app: std::net::SocketAddr, dir: &Path) -> Command {
    let mut c = Command::new("redis-server");
    c.args([
        "--port",
        &app.port().to_string(),
        "--bind",
        &app.ip().to_string(),
    ])
    .args(lockstep_common::config::REDIS_REPLICA_ARGS)
    .args(["--protected-mode", "no"])
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
        .env("LOCKSTEP_NODE", id.to_string());
    // Dated when the log began, as `lockstep run` would date it, where
    // the node knows that already.
    if let Some(us) = lockstep_common::Config::load(config)
        .ok()
        .and_then(|c| region_origin(&c, id))
    {
        cmd.env("LOCKSTEP_ORIGIN_US", us.to_string());
    }
    cmd
}

/// When node `id`'s cluster's log began (µs since the epoch), as the
/// node's region shows it now; None: not known there yet, or no region.
pub fn region_origin(config: &lockstep_common::Config, id: u64) -> Option<u64> {
    let spec = config.region_spec(id);
    lockstep_common::Region::open(&spec.default_path(), &spec)
        .ok()
        .map(|r| r.origin_us())
        .filter(|&us| us != 0)
}

/// `server` as node `id`'s server, started by `lockstep run` (the
/// preload and the config by absolute path, the app address checked, a
/// session and PID namespace of its own; see `lockstep run --help`), its
/// output appended to `log`. With `wait`, `run` starts it only once the
/// node's follower runs. How `lockstep up` and the tests start every
/// server. `server`'s environment reaches the server (through `run`, which
/// sets `LD_PRELOAD` on the server alone).
pub fn preloaded_server(
    bins: &Binaries,
    config: &Path,
    id: u64,
    server: &Command,
    log: &Path,
    wait: bool,
) -> Command {
    let mut c = Command::new(&bins.lockstep);
    c.arg("run")
        .arg("--config")
        .arg(config)
        .args(["--node", &id.to_string()])
        .arg("--log")
        .arg(log);
    if !wait {
        c.arg("--no-wait");
    }
    for (k, v) in server.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.arg("--")
        .arg(server.get_program())
        .args(server.get_args());
    c
}
