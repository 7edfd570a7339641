//! The Memcached demo's client (`scripts/demo memcached`):
//!
//!   memcached_check load  ADDR [THREADS OPS]   order-sensitive workload
//!       (set/append/prepend/incr/decr/cas/delete on shared keys from many
//!       connections); prints its throughput.
//!   memcached_check compare ADDR ADDR...       waits until every server's
//!       full key dump (`lru_crawler metadump all` + gets: values and flags,
//!       not CAS ids) equals the first one's; exit status 1 if they differ.
//!
//! The client and the workload are the integration tests' own.

#[allow(unused_imports)]
use lockstep_testkit::cluster;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cluster::{memcached_mixed_workload, McItem, Memcache};

fn addr(s: &str) -> anyhow::Result<SocketAddr> {
    s.parse()
        .with_context(|| format!("{s:?} is not an ip:port address"))
}

fn dump(a: SocketAddr) -> anyhow::Result<std::collections::BTreeMap<String, McItem>> {
    Memcache::connect(a)
        .with_context(|| format!("cannot connect to {a}"))?
        .dump()
        .with_context(|| format!("cannot dump the keys of {a}"))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("load") if args.len() >= 2 => {
            let a = addr(&args[1])?;
            let threads: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(20);
            let ops: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(1000);
            let start = Instant::now();
            memcached_mixed_workload(a, threads, ops, 50);
            let secs = start.elapsed().as_secs_f64();
            let n = threads * ops;
            println!(
                "{n} requests from {threads} connections in {secs:.2} s: {:.0} requests per second",
                n as f64 / secs
            );
        }
        Some("compare") if args.len() >= 3 => {
            let addrs: Vec<SocketAddr> = args[1..]
                .iter()
                .map(|s| addr(s))
                .collect::<anyhow::Result<_>>()?;
            // A backup may still be applying the tail of the log.
            let start = Instant::now();
            let dumps = loop {
                let dumps = addrs
                    .iter()
                    .map(|&a| dump(a))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                if dumps.iter().all(|d| *d == dumps[0]) || start.elapsed() > Duration::from_secs(60)
                {
                    break dumps;
                }
                std::thread::sleep(Duration::from_millis(300));
            };
            for (a, d) in addrs.iter().zip(&dumps) {
                let bytes: usize = d.values().map(|(_, v)| v.len()).sum();
                let same = if d == &dumps[0] {
                    "identical"
                } else {
                    "DIFFERENT"
                };
                println!("{a}: {} keys, {bytes} value bytes: {same}", d.len());
            }
            if dumps.iter().any(|d| *d != dumps[0]) {
                bail!("the servers' key dumps differ");
            }
        }
        _ => bail!("usage: memcached_check load ADDR [THREADS OPS] | compare ADDR ADDR..."),
    }
    Ok(())
}
