//! The report directory of `lockstep verify`: the history, the faults,
//! the checkers' verdicts, a summary in words and a timeline chart.
//!
//! - `history.jsonl`: one event per line (see `history`);
//! - `faults.json`: each fault injected, with its window;
//! - `verdict.json`: each checker's verdict and anomalies;
//! - `summary.md`: operations, faults, anomalies and the availability
//!   during each kind of fault, as `lockstep verify` prints it;
//! - `timeline.png`: completed operations per second and their latency
//!   over the run, each fault's window shaded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use serde::Serialize;

use super::check::{Validity, Verdict};
use super::history::{self, Event, Kind};
use crate::chart::{draw_err, load_font, text_style, GRID, INK, MUTED};

/// One fault as it was injected and healed.
#[derive(Clone, Debug, Serialize)]
pub struct FaultWindow {
    /// Its kind (`kill-leader`, `partition-halves`, …).
    pub fault: String,
    /// What exactly was done (which nodes).
    pub detail: String,
    /// When it began and when it was healed, ns since the run began.
    pub start_ns: u64,
    pub end_ns: u64,
}

/// How many operations each fault kind let complete.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Availability {
    pub invoked: usize,
    pub ok: usize,
    pub fail: usize,
    pub info: usize,
    /// Answered by a server that served: ok, or a compare-and-set that
    /// found another value (a `fail` that is not a refusal).
    pub served: usize,
}

impl Availability {
    /// The share of invoked operations a serving leader answered.
    pub fn ratio(&self) -> f64 {
        if self.invoked == 0 {
            0.0
        } else {
            self.served as f64 / self.invoked as f64
        }
    }
}

/// Whether a failed operation was answered by a serving leader (its
/// condition did not hold) rather than refused.
fn answered(e: &Event) -> bool {
    e.error
        .as_deref()
        .is_some_and(|m| m.starts_with(super::client::CAS_MISMATCH))
}

/// Operations invoked inside each fault kind's windows, and outside any
/// ("none"), by how they completed.
pub fn availability(events: &[Event], faults: &[FaultWindow]) -> BTreeMap<String, Availability> {
    let mut open: BTreeMap<u64, String> = BTreeMap::new();
    let mut out: BTreeMap<String, Availability> = BTreeMap::new();
    let during = |t: u64| {
        faults
            .iter()
            .find(|f| f.start_ns <= t && t < f.end_ns)
            .map_or_else(|| "none".to_string(), |f| f.fault.clone())
    };
    for e in events {
        match e.kind {
            Kind::Invoke => {
                let k = during(e.time_ns);
                out.entry(k.clone()).or_default().invoked += 1;
                open.insert(e.process, k);
            }
            done => {
                if let Some(k) = open.remove(&e.process) {
                    let a = out.entry(k).or_default();
                    match done {
                        Kind::Ok => a.ok += 1,
                        Kind::Fail => a.fail += 1,
                        _ => a.info += 1,
                    }
                    if done == Kind::Ok || (done == Kind::Fail && answered(e)) {
                        a.served += 1;
                    }
                }
            }
        }
    }
    out
}

/// The summary in words (markdown).
pub fn summary(
    events: &[Event],
    faults: &[FaultWindow],
    verdicts: &[Verdict],
    header: &str,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# lockstep verify\n\n{header}\n");
    let invoked = events.iter().filter(|e| e.kind == Kind::Invoke).count();
    let count = |k: Kind| events.iter().filter(|e| e.kind == k).count();
    let _ = writeln!(
        s,
        "Operations: {invoked} invoked, {} ok, {} failed (certainly not applied), {} unknown (timed out or cut off).\n",
        count(Kind::Ok),
        count(Kind::Fail),
        count(Kind::Info)
    );
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in faults {
        *kinds.entry(f.fault.as_str()).or_default() += 1;
    }
    let list: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
    let _ = writeln!(
        s,
        "Faults injected: {} ({}).\n",
        faults.len(),
        if list.is_empty() {
            "none".to_string()
        } else {
            list.join(", ")
        }
    );
    let _ = writeln!(
        s,
        "| checker | verdict | ok | failed | unknown | anomalies |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for v in verdicts {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            v.workload,
            validity_word(v.valid),
            v.ok,
            v.fail,
            v.info,
            v.anomalies.len()
        );
    }
    for v in verdicts {
        for a in &v.anomalies {
            let _ = writeln!(s, "\n**{}: {}.** {}", v.workload, a.kind, a.explanation);
        }
    }
    let _ = writeln!(
        s,
        "\nAvailability (operations invoked during each fault that a serving leader answered: ok, or a compare-and-set that found another value):\n"
    );
    let _ = writeln!(s, "| during | invoked | ok | failed | unknown | answered |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for (k, a) in availability(events, faults) {
        let _ = writeln!(
            s,
            "| {k} | {} | {} | {} | {} | {:.0}% |",
            a.invoked,
            a.ok,
            a.fail,
            a.info,
            100.0 * a.ratio()
        );
    }
    s
}

/// A verdict in one word.
pub fn validity_word(v: Validity) -> &'static str {
    match v {
        Validity::Valid => "valid",
        Validity::Invalid => "INVALID",
        Validity::Unknown => "unknown",
    }
}

/// Writes the whole report into `dir`.
pub fn write(
    dir: &Path,
    events: &[Event],
    faults: &[FaultWindow],
    verdicts: &[Verdict],
    header: &str,
) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let put = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))
    };
    put("history.jsonl", &history::to_jsonl(events))?;
    put("faults.json", &serde_json::to_string_pretty(faults)?)?;
    put("verdict.json", &serde_json::to_string_pretty(verdicts)?)?;
    let text = summary(events, faults, verdicts, header);
    put("summary.md", &text)?;
    timeline(events, faults, header, &dir.join("timeline.png"))?;
    Ok(text)
}

/// Per second of the run: completed ok, failed or unknown, and the
/// latencies (ms) of the ok ones.
#[derive(Default)]
struct Second {
    ok: usize,
    not_ok: usize,
    latencies: Vec<f64>,
}

fn per_second(events: &[Event]) -> Vec<Second> {
    let mut open: BTreeMap<u64, u64> = BTreeMap::new();
    let mut out: Vec<Second> = Vec::new();
    for e in events {
        if e.kind == Kind::Invoke {
            open.insert(e.process, e.time_ns);
            continue;
        }
        let Some(start) = open.remove(&e.process) else {
            continue;
        };
        let s = (e.time_ns / 1_000_000_000) as usize;
        if out.len() <= s {
            out.resize_with(s + 1, Second::default);
        }
        if e.kind == Kind::Ok {
            out[s].ok += 1;
            out[s]
                .latencies
                .push(e.time_ns.saturating_sub(start) as f64 / 1e6);
        } else {
            out[s].not_ok += 1;
        }
    }
    out
}

/// The `q` quantile of `v` (sorted in place).
fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[((v.len() - 1) as f64 * q).round() as usize])
}

const FAULT_FILL: RGBColor = RGBColor(255, 224, 178);
const OK_LINE: RGBColor = RGBColor(31, 119, 180);
const BAD_LINE: RGBColor = RGBColor(214, 39, 40);

/// Draws the timeline chart into `path`.
fn timeline(
    events: &[Event],
    faults: &[FaultWindow],
    header: &str,
    path: &Path,
) -> anyhow::Result<()> {
    load_font()?;
    let mut seconds = per_second(events);
    let end_s = (seconds.len().max(1)) as f64;
    let root = BitMapBackend::new(path, (1600, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    root.draw(&Text::new(
        "lockstep verify: operations over time (faults shaded)".to_string(),
        (800, 10),
        text_style(24.0, INK, HPos::Center, VPos::Top),
    ))
    .map_err(draw_err)?;
    root.draw(&Text::new(
        header.to_string(),
        (800, 42),
        text_style(14.0, MUTED, HPos::Center, VPos::Top),
    ))
    .map_err(draw_err)?;
    let body = root.margin(70, 10, 10, 20);
    let (upper, lower) = body.split_vertically(430);

    let max_rate = seconds
        .iter()
        .map(|s| s.ok.max(s.not_ok))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.1;
    let mut rate = ChartBuilder::on(&upper)
        .caption("operations completed per second", ("sans-serif", 18))
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..end_s, 0f64..max_rate)
        .map_err(draw_err)?;
    rate.configure_mesh()
        .light_line_style(GRID)
        .x_desc("seconds")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(draw_err)?;
    shade(&mut rate, faults, max_rate)?;
    rate.draw_series(LineSeries::new(
        seconds
            .iter()
            .enumerate()
            .map(|(i, s)| (i as f64 + 0.5, s.ok as f64)),
        OK_LINE.stroke_width(2),
    ))
    .map_err(draw_err)?
    .label("ok")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], OK_LINE.stroke_width(2)));
    rate.draw_series(LineSeries::new(
        seconds
            .iter()
            .enumerate()
            .map(|(i, s)| (i as f64 + 0.5, s.not_ok as f64)),
        BAD_LINE.stroke_width(2),
    ))
    .map_err(draw_err)?
    .label("failed or unknown")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BAD_LINE.stroke_width(2)));
    rate.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(GRID)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw_err)?;

    let lat: Vec<(f64, Option<f64>, Option<f64>)> = seconds
        .iter_mut()
        .enumerate()
        .map(|(i, s)| {
            (
                i as f64 + 0.5,
                quantile(&mut s.latencies, 0.5),
                quantile(&mut s.latencies, 1.0),
            )
        })
        .collect();
    let max_ms = lat.iter().filter_map(|l| l.2).fold(1.0f64, f64::max) * 1.5;
    let mut latency = ChartBuilder::on(&lower)
        .caption(
            "latency of ok operations, ms (log scale): median and slowest per second",
            ("sans-serif", 18),
        )
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..end_s, (0.01f64..max_ms).log_scale())
        .map_err(draw_err)?;
    latency
        .configure_mesh()
        .light_line_style(GRID)
        .x_desc("seconds")
        .y_label_formatter(&|v| crate::chart::fmt_ms(*v))
        .draw()
        .map_err(draw_err)?;
    shade(&mut latency, faults, max_ms)?;
    latency
        .draw_series(LineSeries::new(
            lat.iter()
                .filter_map(|&(x, p50, _)| Some((x, p50?.max(0.01)))),
            OK_LINE.stroke_width(2),
        ))
        .map_err(draw_err)?;
    latency
        .draw_series(LineSeries::new(
            lat.iter()
                .filter_map(|&(x, _, max)| Some((x, max?.max(0.01)))),
            MUTED.stroke_width(1),
        ))
        .map_err(draw_err)?;
    root.present()
        .map_err(draw_err)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Shades each fault's window on a chart whose y axis reaches `top`, with
/// the fault's name at the window's top.
fn shade<Y>(
    chart: &mut ChartContext<
        '_,
        BitMapBackend<'_>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, Y>,
    >,
    faults: &[FaultWindow],
    top: f64,
) -> anyhow::Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    let bottom = chart.y_range().start;
    for f in faults {
        let (x0, x1) = (f.start_ns as f64 / 1e9, f.end_ns as f64 / 1e9);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, bottom), (x1, top)],
                FAULT_FILL.mix(0.7).filled(),
            )))
            .map_err(draw_err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                f.fault.clone(),
                (x0, top),
                text_style(12.0, INK, HPos::Left, VPos::Top),
            )))
            .map_err(draw_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::history::Op;

    fn ev(index: u64, kind: Kind, process: u64, time_ns: u64) -> Event {
        Event {
            index,
            kind,
            process,
            time_ns,
            op: Op::Incr {
                key: 0,
                result: None,
            },
            node: Some(1),
            error: None,
        }
    }

    #[test]
    fn availability_counts_operations_by_the_fault_they_were_invoked_in() {
        let faults = vec![FaultWindow {
            fault: "kill-leader".into(),
            detail: "node 1".into(),
            start_ns: 100,
            end_ns: 200,
        }];
        let events = vec![
            ev(0, Kind::Invoke, 1, 10),
            ev(1, Kind::Ok, 1, 20),
            ev(2, Kind::Invoke, 1, 150),
            ev(3, Kind::Info, 1, 400),
            ev(4, Kind::Invoke, 2, 160),
            ev(5, Kind::Fail, 2, 170),
            ev(6, Kind::Invoke, 3, 190),
            ev(7, Kind::Ok, 3, 300),
        ];
        let a = availability(&events, &faults);
        assert_eq!(
            a["kill-leader"],
            Availability {
                invoked: 3,
                ok: 1,
                fail: 1,
                info: 1,
                served: 1
            }
        );
        assert_eq!(a["none"].ok, 1);
        assert!((a["kill-leader"].ratio() - 1.0 / 3.0).abs() < 1e-9);
    }
}
