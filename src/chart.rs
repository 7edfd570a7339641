//! The PNG chart of `lockstep bench redis`: two grouped bar panels, one
//! group per workload and one bar per system — throughput relative to
//! plain Redis (each bar labelled with its req/s), and p99 latency on a
//! log scale.
//!
//! Drawn in pixel coordinates with plotters' bitmap backend rather than
//! with its chart builder: grouped bars with per-bar labels need exact
//! placement that its axes do not offer. Text goes through the `ab_glyph`
//! feature (pure Rust) with a TrueType font read at run time, so building
//! needs no fontconfig or freetype; running needs a font file, which
//! Debian's fonts-dejavu-core provides (scripts/setup installs it).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

/// Canvas size in pixels.
const W: i32 = 1600;
const H: i32 = 1180;
/// Plot area margins in pixels.
const LEFT: i32 = 90;
const RIGHT: i32 = 30;

/// Where a TrueType sans-serif font is looked for (`LOCKSTEP_FONT` first).
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// One bar: one system in one workload.
pub struct Bar {
    /// Index into the chart's series (colour and legend entry).
    pub series: usize,
    /// Height in the upper panel (1.0 = as fast as the reference).
    pub relative: f64,
    /// Label above the bar in the upper panel (e.g. "31.2k").
    pub label: String,
    /// p99 latency for the lower panel; no bar when unknown.
    pub p99_ms: Option<f64>,
}

/// One workload: a group of bars.
pub struct Group {
    /// Label under the group.
    pub name: String,
    /// Its bars, in legend order.
    pub bars: Vec<Bar>,
}

/// What the chart shows.
pub struct Chart {
    /// First line on top.
    pub title: String,
    /// Second line on top (run parameters).
    pub subtitle: String,
    /// Title of the upper panel (says what `relative` is relative to).
    pub relative_title: String,
    /// Legend entries: name and colour of each series.
    pub series: Vec<(String, RGBColor)>,
    /// The workloads.
    pub groups: Vec<Group>,
}

/// Registers a sans-serif font with plotters (once per process).
pub(crate) fn load_font() -> anyhow::Result<()> {
    static LOADED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let candidates: Vec<PathBuf> = std::env::var_os("LOCKSTEP_FONT")
                .map(PathBuf::from)
                .into_iter()
                .chain(FONT_PATHS.iter().map(PathBuf::from))
                .collect();
            let path = candidates.iter().find(|p| p.is_file()).ok_or_else(|| {
                "no TrueType font found (install Debian's fonts-dejavu-core, or set LOCKSTEP_FONT to a .ttf file)".to_string()
            })?;
            let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            // plotters keeps registered fonts for the whole process and
            // wants them 'static: leaking this one buffer (once) is that.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{} is not a usable TrueType font", path.display()))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

pub(crate) fn text_style(size: f64, color: RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    ("sans-serif", size)
        .into_font()
        .color(&color)
        .pos(Pos::new(h, v))
}

pub(crate) const GRID: RGBColor = RGBColor(220, 220, 220);
pub(crate) const INK: RGBColor = RGBColor(30, 30, 30);
pub(crate) const MUTED: RGBColor = RGBColor(90, 90, 90);

/// Where the bars of a group go: (x0, x1) per bar.
fn bar_slots(group_x0: i32, group_w: i32, n: usize) -> Vec<(i32, i32)> {
    if n == 0 {
        return Vec::new();
    }
    // 80% of the group is bars, the rest is the gap between groups.
    let inner = group_w * 8 / 10;
    let bar_w = (inner / n as i32).clamp(4, 60);
    let start = group_x0 + (group_w - bar_w * n as i32) / 2;
    (0..n as i32)
        .map(|i| (start + i * bar_w + 1, start + (i + 1) * bar_w - 1))
        .collect()
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

pub(crate) fn draw_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

/// One panel: a title, horizontal grid lines with labels, grouped bars.
/// `y_of` maps a value to a pixel row; `bar` picks a bar's value and label.
#[allow(clippy::too_many_arguments)]
fn panel(
    root: &Area,
    chart: &Chart,
    top: i32,
    bottom: i32,
    title: &str,
    grid: &[(f64, String)],
    y_of: &dyn Fn(f64) -> i32,
    bar: &dyn Fn(&Bar) -> Option<(f64, String)>,
) -> anyhow::Result<()> {
    root.draw(&Text::new(
        title.to_string(),
        (LEFT, top),
        text_style(18.0, INK, HPos::Left, VPos::Top),
    ))
    .map_err(draw_err)?;
    let plot_top = top + 34;
    for (v, label) in grid {
        let y = y_of(*v);
        if y < plot_top || y > bottom {
            continue;
        }
        root.draw(&PathElement::new(
            vec![(LEFT, y), (W - RIGHT, y)],
            GRID.stroke_width(1),
        ))
        .map_err(draw_err)?;
        root.draw(&Text::new(
            label.clone(),
            (LEFT - 8, y),
            text_style(14.0, MUTED, HPos::Right, VPos::Center),
        ))
        .map_err(draw_err)?;
    }
    let groups = chart.groups.len().max(1) as i32;
    let group_w = (W - LEFT - RIGHT) / groups;
    for (gi, g) in chart.groups.iter().enumerate() {
        let gx = LEFT + gi as i32 * group_w;
        let bars: Vec<(&Bar, f64, String)> = g
            .bars
            .iter()
            .filter_map(|b| bar(b).map(|(v, l)| (b, v, l)))
            .collect();
        for ((b, v, label), (x0, x1)) in bars.iter().zip(bar_slots(gx, group_w, bars.len())) {
            let y = y_of(*v).clamp(plot_top, bottom);
            let color = chart.series[b.series].1;
            root.draw(&Rectangle::new([(x0, y), (x1, bottom)], color.filled()))
                .map_err(draw_err)?;
            root.draw(&Text::new(
                label.clone(),
                ((x0 + x1) / 2, y - 3),
                text_style(12.0, INK, HPos::Center, VPos::Bottom),
            ))
            .map_err(draw_err)?;
        }
        root.draw(&Text::new(
            g.name.clone(),
            (gx + group_w / 2, bottom + 8),
            text_style(16.0, INK, HPos::Center, VPos::Top),
        ))
        .map_err(draw_err)?;
    }
    root.draw(&PathElement::new(
        vec![(LEFT, bottom), (W - RIGHT, bottom)],
        INK.stroke_width(1),
    ))
    .map_err(draw_err)?;
    Ok(())
}

/// A round step for about `lines` grid lines up to `max`.
fn nice_step(max: f64, lines: f64) -> f64 {
    let raw = (max / lines).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// Draws `chart` into the PNG file `path`.
pub fn draw(chart: &Chart, path: &Path) -> anyhow::Result<()> {
    load_font()?;
    if chart.groups.is_empty() {
        bail!("nothing to draw");
    }
    let root = BitMapBackend::new(path, (W as u32, H as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    root.draw(&Text::new(
        chart.title.clone(),
        (W / 2, 12),
        text_style(26.0, INK, HPos::Center, VPos::Top),
    ))
    .map_err(draw_err)?;
    root.draw(&Text::new(
        chart.subtitle.clone(),
        (W / 2, 48),
        text_style(15.0, MUTED, HPos::Center, VPos::Top),
    ))
    .map_err(draw_err)?;
    // Legend: one swatch and name per system, centred in one row.
    let entry_w = (W - LEFT - RIGHT) / chart.series.len().max(1) as i32;
    for (i, (name, color)) in chart.series.iter().enumerate() {
        let x = LEFT + i as i32 * entry_w + 10;
        root.draw(&Rectangle::new([(x, 82), (x + 18, 100)], color.filled()))
            .map_err(draw_err)?;
        root.draw(&Text::new(
            name.clone(),
            (x + 26, 91),
            text_style(15.0, INK, HPos::Left, VPos::Center),
        ))
        .map_err(draw_err)?;
    }

    // Upper panel: relative throughput, linear from 0.
    let (top1, bottom1) = (130, 600);
    let max_rel = chart
        .groups
        .iter()
        .flat_map(|g| g.bars.iter().map(|b| b.relative))
        .fold(1.0f64, f64::max)
        * 1.08;
    let plot_top1 = top1 + 34 + 16;
    let y1 = |v: f64| bottom1 - ((v / max_rel) * (bottom1 - plot_top1) as f64).round() as i32;
    let step = nice_step(max_rel, 5.0);
    let grid1: Vec<(f64, String)> = (0..)
        .map(|i| i as f64 * step)
        .take_while(|v| *v <= max_rel)
        .map(|v| (v, format!("{v:.2}")))
        .collect();
    panel(
        &root,
        chart,
        top1,
        bottom1,
        &chart.relative_title,
        &grid1,
        &y1,
        &|b| Some((b.relative, b.label.clone())),
    )?;

    // Lower panel: p99 latency, log scale over whole decades.
    let (top2, bottom2) = (680, H - 50);
    let p99s: Vec<f64> = chart
        .groups
        .iter()
        .flat_map(|g| g.bars.iter().filter_map(|b| b.p99_ms))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = p99s
        .iter()
        .cloned()
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor()
        .min(0.0);
    let hi = p99s
        .iter()
        .cloned()
        .fold(0.01f64, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let plot_top2 = top2 + 34 + 16;
    let y2 = |v: f64| {
        let f = (v.max(1e-9).log10() - lo) / (hi - lo);
        bottom2 - (f * (bottom2 - plot_top2) as f64).round() as i32
    };
    let grid2: Vec<(f64, String)> = (lo as i32..=hi as i32)
        .map(|e| {
            let v = 10f64.powi(e);
            // Decades print as 0.01, 0.1, 1, 10, 100 (no trailing zeros).
            let label = if e < 0 {
                format!("{v:.*}", (-e) as usize)
            } else {
                format!("{v:.0}")
            };
            (v, format!("{label} ms"))
        })
        .collect();
    panel(
        &root,
        chart,
        top2,
        bottom2,
        "p99 latency, ms (log scale; lower is better)",
        &grid2,
        &y2,
        &|b| {
            b.p99_ms
                .filter(|v| *v > 0.0)
                .map(|v| (v.max(10f64.powf(lo)), fmt_ms(v)))
        },
    )?;
    root.present()
        .map_err(draw_err)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Milliseconds with about three significant digits.
pub fn fmt_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(1.08, 5.0), 0.25);
        assert_eq!(nice_step(3.2, 5.0), 1.0);
        assert_eq!(nice_step(0.4, 4.0), 0.1);
    }

    #[test]
    fn bars_stay_inside_their_group() {
        let slots = bar_slots(100, 200, 7);
        assert_eq!(slots.len(), 7);
        assert!(slots.first().unwrap().0 >= 100 && slots.last().unwrap().1 <= 300);
        assert!(slots.windows(2).all(|w| w[0].1 < w[1].0));
    }
}
