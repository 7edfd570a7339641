//! A tiny `log` backend for the preload: one line per record, formatted on
//! the stack and written with the real `write()` (never through the hooks,
//! never through `std::io::Stderr`'s lock), to stderr or to a file.
//!
//! `LOCKSTEP_LOG` = `LEVEL`, `LEVEL:PATH` or `PATH` (LEVEL one of off,
//! error, warn, info, debug, trace; default warn). Anything else — such as
//! an env_logger filter meant for the follower — falls back to the level
//! named first if any, else warn.

use std::fmt::{self, Write as _};
use std::os::unix::io::IntoRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use log::{LevelFilter, Log, Metadata, Record};

use crate::sys;

struct Logger {
    fd: AtomicI32,
}

static LOGGER: Logger = Logger {
    fd: AtomicI32::new(2),
};

/// Where and how much to log, parsed from `LOCKSTEP_LOG`.
#[derive(Debug, PartialEq, Eq)]
pub struct LogSpec {
    /// Most verbose level logged.
    pub level: LevelFilter,
    /// Log file (None: stderr).
    pub path: Option<String>,
}

fn level(word: &str) -> Option<LevelFilter> {
    Some(match word.trim().to_ascii_lowercase().as_str() {
        "off" => LevelFilter::Off,
        "error" => LevelFilter::Error,
        "warn" | "warning" => LevelFilter::Warn,
        "info" => LevelFilter::Info,
        "debug" => LevelFilter::Debug,
        "trace" => LevelFilter::Trace,
        _ => return None,
    })
}

/// Parses a `LOCKSTEP_LOG` value.
pub fn parse(spec: &str) -> LogSpec {
    let spec = spec.trim();
    if spec.starts_with('/') || spec.starts_with('.') {
        return LogSpec {
            level: LevelFilter::Info,
            path: Some(spec.to_string()),
        };
    }
    let (head, path) = match spec.split_once(':') {
        Some((h, p)) if !p.is_empty() && level(h).is_some() => (h, Some(p.to_string())),
        _ => (spec, None),
    };
    let lvl = level(head)
        .or_else(|| {
            // e.g. "info,lockstep=debug": take the first bare level.
            head.split(',')
                .find_map(|w| level(w.rsplit('=').next().unwrap_or(w)))
        })
        .unwrap_or(LevelFilter::Warn);
    LogSpec { level: lvl, path }
}

/// Installs the logger as configured by `LOCKSTEP_LOG` (once; later calls
/// and a host program that has its own logger are left alone).
pub fn init_from_env() {
    let spec = parse(&std::env::var("LOCKSTEP_LOG").unwrap_or_default());
    if let Some(path) = &spec.path {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // The fd lives as long as the process.
            Ok(f) => LOGGER.fd.store(f.into_raw_fd(), Ordering::Relaxed),
            Err(e) => {
                let mut line = Line::new();
                let _ = writeln!(
                    line,
                    "lockstep: cannot open log file {path}: {e}; logging to stderr"
                );
                sys::write_all(2, line.bytes());
            }
        }
    }
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(spec.level);
    }
}

/// A fixed line buffer: formatting into it never allocates; what does not
/// fit is cut off.
pub struct Line {
    buf: [u8; 1024],
    len: usize,
}

impl Line {
    /// An empty line.
    pub fn new() -> Line {
        Line {
            buf: [0; 1024],
            len: 0,
        }
    }

    /// The bytes written so far.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Default for Line {
    fn default() -> Self {
        Line::new()
    }
}

impl fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Keep room for a final newline.
        let room = self.buf.len() - 1 - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let mut line = Line::new();
        let _ = write!(
            line,
            "lockstep[{}] {:<5} {}: {}",
            std::process::id(),
            record.level(),
            record.target(),
            record.args()
        );
        line.buf[line.len] = b'\n';
        line.len += 1;
        sys::write_all(self.fd.load(Ordering::Relaxed), line.bytes());
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(
            parse(""),
            LogSpec {
                level: LevelFilter::Warn,
                path: None
            }
        );
        assert_eq!(parse("debug").level, LevelFilter::Debug);
        assert_eq!(
            parse("info:/tmp/x.log"),
            LogSpec {
                level: LevelFilter::Info,
                path: Some("/tmp/x.log".into())
            }
        );
        assert_eq!(parse("/tmp/y").path.as_deref(), Some("/tmp/y"));
        assert_eq!(parse("info,lockstep=debug").level, LevelFilter::Info);
        assert_eq!(parse("nonsense").level, LevelFilter::Warn);
    }

    #[test]
    fn lines_are_cut_not_overrun() {
        let mut l = Line::new();
        for _ in 0..100 {
            let _ = write!(l, "0123456789abcdef");
        }
        assert_eq!(l.bytes().len(), 1023);
    }
}
