//! Where a benchmark's CPU goes: the CPU time each part of a system (the
//! leader's server, the backups' servers, the followers, the load client)
//! spent during a load, per request. On a host where every process shares
//! the same cores, throughput is CPU per request; this says whose.
//!
//! Read from `/proc/PID/stat` (user + system time of all of a process's
//! threads, in clock ticks) and, for the load client (a child the bench
//! waited for), from `getrusage(RUSAGE_CHILDREN)`.

use std::collections::BTreeMap;

use lockstep_launcher::process;

/// The parts a system's CPU is split into.
pub const PARTS: [&str; 4] = ["leader server", "backup servers", "followers", "client"];

/// The processes of each part (the client is measured apart).
#[derive(Clone, Debug, Default)]
pub struct Processes {
    /// Part name → pids.
    pub parts: BTreeMap<&'static str, Vec<u32>>,
}

impl Processes {
    /// Adds `pid` to `part`.
    pub fn add(&mut self, part: &'static str, pid: u32) {
        if pid != 0 {
            self.parts.entry(part).or_default().push(pid);
        }
    }
}

/// CPU seconds per part at one moment.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    seconds: BTreeMap<&'static str, f64>,
}

/// Takes a sample of `procs` and of the waited-for children (the client).
pub fn sample(procs: &Processes) -> Sample {
    let mut seconds = BTreeMap::new();
    for (part, pids) in &procs.parts {
        let s: f64 = pids.iter().filter_map(|&p| process_seconds(p)).sum();
        seconds.insert(*part, s);
    }
    seconds.insert("client", children_seconds());
    Sample { seconds }
}

/// µs of CPU per request of each part between `before` and `after`, for
/// `requests` requests; parts with no processes are absent.
pub fn per_request(before: &Sample, after: &Sample, requests: u64) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    if requests == 0 {
        return out;
    }
    for (part, a) in &after.seconds {
        if let Some(b) = before.seconds.get(part) {
            out.insert(
                (*part).to_string(),
                (a - b).max(0.0) * 1e6 / requests as f64,
            );
        }
    }
    out
}

/// User + system CPU seconds of process `pid`, all threads, if it lives.
pub fn process_seconds(pid: u32) -> Option<f64> {
    stat_seconds(&process::stat_fields(pid)?, ticks_per_second())
}

/// CPU seconds of process `pid` (user + system, all threads) and of the
/// children it waited for, if it lives.
pub fn process_and_children_seconds(pid: u32) -> Option<(f64, f64)> {
    let fields = process::stat_fields(pid)?;
    let ticks = ticks_per_second();
    Some((
        stat_seconds(&fields, ticks)?,
        stat_children_seconds(&fields, ticks)?,
    ))
}

/// utime + stime (fields 14 and 15) in seconds, from `/proc/PID/stat`'s
/// fields 3 on (`process::after_name`).
fn stat_seconds(fields: &str, ticks: f64) -> Option<f64> {
    stat_pair(fields, 14, ticks)
}

/// cutime + cstime (fields 16 and 17: the waited children's) in seconds.
fn stat_children_seconds(fields: &str, ticks: f64) -> Option<f64> {
    stat_pair(fields, 16, ticks)
}

/// Fields `at` and `at + 1` summed, in seconds; `fields` starts at field 3
/// (state).
fn stat_pair(fields: &str, at: usize, ticks: f64) -> Option<f64> {
    let mut f = fields.split_whitespace();
    let a: f64 = f.nth(at - 3)?.parse().ok()?;
    let b: f64 = f.next()?.parse().ok()?;
    Some((a + b) / ticks)
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no memory arguments.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPU seconds of every child this process waited for.
fn children_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A markdown table: one row per (system, load), µs of CPU per request per
/// part and in all.
pub fn table(rows: &[(String, String, BTreeMap<String, f64>)]) -> String {
    let mut t = String::from("| system | load |");
    for p in PARTS {
        t.push_str(&format!(" {p} µs |"));
    }
    t.push_str(" all µs |\n|---|---|");
    for _ in 0..=PARTS.len() {
        t.push_str("---|");
    }
    t.push('\n');
    for (system, load, parts) in rows {
        t.push_str(&format!("| {system} | {load} |"));
        for p in PARTS {
            match parts.get(p) {
                Some(v) => t.push_str(&format!(" {v:.1} |")),
                None => t.push_str(" - |"),
            }
        }
        t.push_str(&format!(" {:.1} |\n", parts.values().sum::<f64>()));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (redis server (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 1 2 3";
        assert_eq!(
            stat_seconds(process::after_name(line).unwrap(), 100.0),
            Some(3.0)
        );
        assert_eq!(
            stat_children_seconds(process::after_name(line).unwrap(), 100.0),
            Some(0.0)
        );
        let waited = "7 (f) S 1 7 7 0 -1 0 0 0 0 0 10 10 30 20 20 0 1 0 1 2 3";
        assert_eq!(
            stat_children_seconds(process::after_name(waited).unwrap(), 100.0),
            Some(0.5)
        );
        assert_eq!(process::after_name("garbage"), None);
        assert_eq!(stat_seconds("S 1 2", 100.0), None);
    }

    #[test]
    fn this_process_uses_some_cpu_and_the_table_sums_it() {
        let me = std::process::id();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(process_seconds(me).unwrap() > 0.0);
        assert_eq!(process_seconds(u32::MAX), None);
        let mut procs = Processes::default();
        procs.add("followers", me);
        let a = sample(&procs);
        let b = Sample {
            seconds: a.seconds.iter().map(|(k, v)| (*k, v + 0.5)).collect(),
        };
        let per = per_request(&a, &b, 1000);
        assert!((per["followers"] - 500.0).abs() < 1e-6);
        assert!((per["client"] - 500.0).abs() < 1e-6);
        let t = table(&[("lockstep".into(), "SET".into(), per)]);
        assert!(
            t.contains("| lockstep | SET | - | - | 500.0 | 500.0 | 1000.0 |"),
            "{t}"
        );
    }
}
