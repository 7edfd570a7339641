//! Loopback ports for the servers that tests and benchmarks start. Taken outside the kernel's
//! ephemeral range: a port from there (what binding port 0 hands out) can
//! be the local end of some unrelated outgoing connection by the time the
//! server binds it, and then the bind fails.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// Ports handed out per window.
const WINDOW: u32 = 12_000;

/// The first port of the window: just below the ephemeral range when there
/// is room, else just above it.
fn window_start() -> u32 {
    let range =
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut it = range
        .split_whitespace()
        .filter_map(|s| s.parse::<u32>().ok());
    let (lo, hi) = (it.next().unwrap_or(32_768), it.next().unwrap_or(60_999));
    if lo >= WINDOW + 1_024 {
        lo - WINDOW
    } else {
        (hi + 1).min(65_535 - WINDOW)
    }
}

/// A loopback port nothing is bound to now, or None when the whole window
/// is taken. Within one process no port is handed out twice (until the
/// window wraps); processes start at different places in it.
pub fn try_free_port() -> Option<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = window_start();
    let base = std::process::id() % WINDOW;
    for _ in 0..WINDOW {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (start + (base + i) % WINDOW) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Some(port);
        }
    }
    None
}

/// Like [`try_free_port`]; panics when the window is taken (tests).
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|| panic!("no free loopback port from {} on", window_start()))
}
