//! A small logger for life inside someone else's process: level from
//! `LOCKSTEP_LOG` (error|warn|info|debug; default warn), one line per record
//! to stderr through the real `write`, or appended to a file given as
//! `LOCKSTEP_LOG=level:/path/to/file`.

use std::io::Write;
use std::sync::Mutex;

struct Logger {
    file: Option<Mutex<std::fs::File>>,
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = format!("[lockstep {} pid {}] {}\n", r.level(), std::process::id(), r.args());
        match &self.file {
            Some(f) => {
                let _ = f.lock().map(|mut f| f.write_all(line.as_bytes()));
            }
            None => crate::hooks::stderr_write(line.as_bytes()),
        }
    }

    fn flush(&self) {}
}

/// Installs the logger once (later calls do nothing).
pub fn install() {
    let spec = std::env::var("LOCKSTEP_LOG").unwrap_or_default();
    let (level, path) = match spec.split_once(':') {
        Some((l, p)) => (l.to_string(), Some(p.to_string())),
        None => (spec, None),
    };
    let level = match level.as_str() {
        "error" => log::LevelFilter::Error,
        "info" => log::LevelFilter::Info,
        "debug" | "trace" => log::LevelFilter::Debug,
        "off" => log::LevelFilter::Off,
        _ => log::LevelFilter::Warn,
    };
    let file = path.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
            .map(Mutex::new)
    });
    if log::set_boxed_logger(Box::new(Logger { file })).is_ok() {
        log::set_max_level(level);
    }
}
