//! The documentation, checked against the code it describes.
//!
//! - `docs/reference/config.md` documents every key the config parser
//!   accepts and no other; each key's documented default and allowed values
//!   are the parser's, and its TOML examples parse. The accepted keys are
//!   asked of the parser itself (serde names the expected fields when it
//!   meets an unknown one), so the list cannot drift from the code.
//! - `docs/reference/cli.md` documents every subcommand and flag that the
//!   built `lockstep` binary's `--help` shows, and names no subcommand the
//!   binary lacks.
//! - `docs/reference/metrics.md` documents every metric the follower
//!   exports (rendered by the follower's own metrics code), with its type,
//!   and names none it does not export.
//! - `docs/reference/status-json.md` documents every field of `lockstep
//!   status --json`; `docs/reference/environment.md` every `LOCKSTEP_*`
//!   variable the code reads.
//! - Every relative link and `#anchor` in README.md, CHANGELOG.md and
//!   docs/**/*.md points to a file and heading that exist.
//!
//! Nothing here starts a server or waits on a clock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use lockstep_common::Config;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel))
        .unwrap_or_else(|e| panic!("{rel}: cannot read it ({e}); it is part of the docs tree"))
}

/// Fails with every problem, one per line.
fn report(what: &str, problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n  - {}\n",
        problems.len(),
        problems.join("\n  - ")
    );
}

// ---------------------------------------------------------------------------
// Markdown: headings, sections, links (outside code blocks).
// ---------------------------------------------------------------------------

/// The lines of `md` outside fenced code blocks, with their numbers (1-based).
fn prose_lines(md: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    for (i, line) in md.lines().enumerate() {
        let t = line.trim_start();
        let ch = t.chars().next().unwrap_or(' ');
        if ch == '`' || ch == '~' {
            let n = t.chars().take_while(|&c| c == ch).count();
            if n >= 3 {
                match fence {
                    None => {
                        fence = Some((ch, n));
                        continue;
                    }
                    Some((c, m)) if c == ch && n >= m && t[n..].trim().is_empty() => {
                        fence = None;
                        continue;
                    }
                    _ => {}
                }
            }
        }
        if fence.is_none() {
            out.push((i + 1, line));
        }
    }
    out
}

/// The fenced code blocks of `md`: (info string, body).
fn code_blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String, usize)> = None;
    for line in md.lines() {
        let t = line.trim_start();
        let n = t.chars().take_while(|&c| c == '`').count();
        match &mut open {
            None if n >= 3 => open = Some((t[n..].trim().to_string(), String::new(), n)),
            None => {}
            Some((info, body, m)) => {
                if n >= *m && t[n..].trim().is_empty() {
                    out.push((std::mem::take(info), std::mem::take(body)));
                    open = None;
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    out
}

/// A heading: its level and its text as written.
struct Heading {
    level: usize,
    text: String,
    line: usize,
}

fn headings(md: &str) -> Vec<Heading> {
    prose_lines(md)
        .into_iter()
        .filter_map(|(line, l)| {
            let level = l.chars().take_while(|&c| c == '#').count();
            if level == 0 || level > 6 || !l[level..].starts_with(' ') {
                return None;
            }
            let text = l[level..].trim().trim_end_matches('#').trim().to_string();
            Some(Heading { level, text, line })
        })
        .collect()
}

/// The heading text GitHub renders: code spans, emphasis and links reduced
/// to their text.
fn heading_plain_text(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(j), Some(k)) if j < k => {
                out.push_str(&after[..j]);
                rest = &after[k + 1..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.replace(['`', '*'], "")
}

/// GitHub's anchor for a heading: lowercase; letters, digits, '-', '_'
/// and spaces kept (spaces become '-'); everything else dropped.
fn slug(text: &str) -> String {
    heading_plain_text(text)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of `md`: heading slugs (a repeated one gets -1, -2, ...)
/// and explicit `<a name=...>` / `id=...` anchors.
fn anchors(md: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for h in headings(md) {
        let base = slug(&h.text);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    for (_, line) in prose_lines(md) {
        for attr in ["name=\"", "id=\""] {
            let mut rest = line;
            while let Some(i) = rest.find(attr) {
                rest = &rest[i + attr.len()..];
                if let Some(j) = rest.find('"') {
                    out.insert(rest[..j].to_string());
                }
            }
        }
    }
    out
}

/// `line` without its inline code spans.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find('`') {
        out.push_str(&rest[..i]);
        let n = rest[i..].chars().take_while(|&c| c == '`').count();
        let ticks = &rest[i..i + n];
        match rest[i + n..].find(ticks) {
            Some(j) => rest = &rest[i + n + j + n..],
            None => {
                out.push_str(&rest[i..]);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The link targets of `md` (inline links and images, and reference
/// definitions), with their line numbers; code is left out.
fn links(md: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(md) {
        let line = without_code_spans(line);
        // Reference definitions: `[label]: target`.
        let t = line.trim_start();
        if t.starts_with('[') {
            if let Some(i) = t.find("]:") {
                if let Some(target) = t[i + 2..].split_whitespace().next() {
                    out.push((n, target.trim_matches(['<', '>']).to_string()));
                    continue;
                }
            }
        }
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            // The target runs to the matching ')'.
            let mut depth = 0;
            let mut end = rest.len();
            for (j, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = j;
                        break;
                    }
                    ')' => depth -= 1,
                    _ => {}
                }
            }
            let inner = rest[..end].trim();
            let target = if let Some(stripped) = inner.strip_prefix('<') {
                stripped.split('>').next().unwrap_or("")
            } else {
                inner.split_whitespace().next().unwrap_or("")
            };
            out.push((n, target.to_string()));
            rest = &rest[end.min(rest.len())..];
        }
    }
    out
}

/// The text under the heading `title` up to the next heading of its level
/// or above (None: no such heading).
fn section<'a>(md: &'a str, title: &str) -> Option<&'a str> {
    let hs = headings(md);
    let i = hs.iter().position(|h| h.text == title)?;
    let level = hs[i].level;
    let lines: Vec<&str> = md.lines().collect();
    let start = hs[i].line; // the line after the heading (0-based index)
    let end = hs[i + 1..]
        .iter()
        .find(|h| h.level <= level)
        .map_or(lines.len(), |h| h.line - 1);
    let from = lines[..start].iter().map(|l| l.len() + 1).sum::<usize>();
    let to = lines[..end].iter().map(|l| l.len() + 1).sum::<usize>();
    md.get(from..to.min(md.len()))
}

/// Headings that are one code span and nothing else: "`election.mode`".
fn code_headings(md: &str, level: usize) -> BTreeSet<String> {
    headings(md)
        .into_iter()
        .filter(|h| h.level == level)
        .filter_map(|h| {
            let t = h.text.strip_prefix('`')?.strip_suffix('`')?;
            (!t.contains('`')).then(|| t.to_string())
        })
        .collect()
}

// ---------------------------------------------------------------------------
// 1. Config keys.
// ---------------------------------------------------------------------------

/// A field no config has: asking serde about it makes it list the fields
/// it does accept.
const PROBE: &str = "lockstep_docs_probe";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    /// `key = { ... }` / `[key]`.
    Table,
    /// `key = [{ ... }]` / `[[key]]`.
    Array,
}

/// TOML setting the value `leaf` at `path` (tables and arrays of tables
/// written inline).
fn toml_at(path: &[(String, Shape)], leaf: &str) -> String {
    let mut value = leaf.to_string();
    for (i, (key, shape)) in path.iter().enumerate().rev() {
        if *shape == Shape::Array {
            value = format!("[{value}]");
        }
        if i == 0 {
            return format!("{key} = {value}\n");
        }
        value = format!("{{ {key} = {value} }}");
    }
    value
}

/// The names serde lists after `marker` in `error` (`expected one of
/// `a`, `b``, `expected `a` or `b``, `there are no fields`).
fn listed_after(error: &str, marker: &str) -> Option<Vec<String>> {
    let i = error.find(marker)?;
    let rest = &error[i + marker.len()..];
    Some(
        rest.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// The fields the parser accepts in the table at `path` (None: the value
/// there is not a table of that shape).
fn accepted_fields(path: &[(String, Shape)]) -> Option<Vec<String>> {
    let text = toml_at(path, &format!("{{ {PROBE} = 1 }}"));
    let text = if path.is_empty() {
        format!("{PROBE} = 1\n")
    } else {
        text
    };
    let error = Config::parse(&text).err()?.0;
    listed_after(&error, &format!("unknown field `{PROBE}`"))
}

/// The values the parser accepts for the key at `path` when they are a
/// fixed list (an enum), else None.
fn accepted_values(path: &[(String, Shape)]) -> Option<Vec<String>> {
    let error = Config::parse(&toml_at(path, &format!("\"{PROBE}\"")))
        .err()?
        .0;
    listed_after(&error, &format!("unknown variant `{PROBE}`"))
}

/// Every key the config parser accepts, as a dotted path (`election.mode`,
/// `nodes.app`; tables too: `election`), with its enum values if it has a
/// fixed list of them. Asked of the parser, recursively.
fn config_keys() -> BTreeMap<String, Option<Vec<String>>> {
    fn walk(path: &[(String, Shape)], out: &mut BTreeMap<String, Option<Vec<String>>>) {
        let fields = accepted_fields(path).unwrap_or_else(|| {
            panic!(
                "the config parser did not list its fields at {path:?}: the unknown-field error of serde changed; update tests/docs.rs"
            )
        });
        for f in fields {
            let mut child = path.to_vec();
            let name: Vec<&str> = path
                .iter()
                .map(|(k, _)| k.as_str())
                .chain([f.as_str()])
                .collect();
            let name = name.join(".");
            let table = [Shape::Table, Shape::Array].into_iter().find(|&shape| {
                let mut p = path.to_vec();
                p.push((f.clone(), shape));
                accepted_fields(&p).is_some()
            });
            match table {
                Some(shape) => {
                    child.push((f.clone(), shape));
                    out.insert(name, None);
                    walk(&child, out);
                }
                None => {
                    child.push((f.clone(), Shape::Table));
                    out.insert(name, accepted_values(&child));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&[], &mut out);
    out
}

/// Top-level keys a minimal config needs, then its nodes; a fragment goes
/// between the two.
const BASE_TOP: &str = "cluster = \"docs\"\ndata_dir = \"/tmp/lockstep-docs-test\"\n";
const BASE_NODES: &str = "
[[nodes]]
id = 1
app = \"127.0.0.1:17001\"
control = \"127.0.0.1:17101\"

[[nodes]]
id = 2
app = \"127.0.0.1:17002\"
control = \"127.0.0.1:17102\"

[[nodes]]
id = 3
app = \"127.0.0.1:17003\"
control = \"127.0.0.1:17103\"
";

/// `fragment` made a whole config: the minimal one's keys that the
/// fragment does not set around it.
fn with_base(fragment: &str) -> String {
    let sets = |key: &str| {
        fragment
            .lines()
            .any(|l| l.trim_start().starts_with(key) && l.contains('='))
    };
    let mut text = String::new();
    for line in BASE_TOP.lines() {
        let key = line.split('=').next().unwrap_or("").trim();
        if !sets(key) {
            text.push_str(line);
            text.push('\n');
        }
    }
    text.push_str(fragment);
    if !fragment.contains("[[nodes]]") {
        text.push_str(BASE_NODES);
    }
    text
}

const CONFIG_MD: &str = "docs/reference/config.md";

#[test]
fn config_reference_documents_every_accepted_key() {
    let md = read(CONFIG_MD);
    let keys = config_keys();
    assert!(
        keys.contains_key("cluster") && keys.contains_key("election.mode"),
        "the key list asked of the parser looks wrong: {keys:?}"
    );
    let documented = code_headings(&md, 3);
    let mut problems = Vec::new();
    for (key, values) in &keys {
        if !documented.contains(key) {
            problems.push(format!(
                "{CONFIG_MD}: config key `{key}` is accepted by common/src/config.rs but not documented: add a `### \\`{key}\\`` section (type, default, allowed values, what it does, an example)"
            ));
            continue;
        }
        let Some(values) = values else { continue };
        let body = section(&md, &format!("`{key}`")).unwrap_or("");
        for v in values {
            if !body.contains(&format!("\"{v}\"")) {
                problems.push(format!(
                    "{CONFIG_MD}: config key `{key}` accepts \"{v}\" but its section does not name it: add `\"{v}\"` to its allowed values"
                ));
            }
        }
    }
    for key in &documented {
        if !keys.contains_key(key) {
            problems.push(format!(
                "{CONFIG_MD}: documents config key `{key}`, which common/src/config.rs does not accept: remove its section, or rename it to the key the code reads"
            ));
        }
    }
    report(CONFIG_MD, problems);
}

#[test]
fn config_reference_defaults_and_examples_are_the_parsers() {
    let md = read(CONFIG_MD);
    let mut problems = Vec::new();
    let base = Config::parse(&with_base("")).expect("the minimal config parses");
    // `- **Default:** `VALUE`` under a key: setting VALUE changes nothing.
    for key in code_headings(&md, 3) {
        let body = section(&md, &format!("`{key}`")).unwrap_or("");
        let Some(line) = body
            .lines()
            .find(|l| l.trim_start().starts_with("- **Default:**"))
        else {
            problems.push(format!(
                "{CONFIG_MD}: `{key}` has no `- **Default:**` line: add one (a TOML value in backticks, or the words \"none\" / \"required\")"
            ));
            continue;
        };
        let after = line.split("**Default:**").nth(1).unwrap_or("").trim();
        let Some(value) = after
            .strip_prefix('`')
            .and_then(|v| v.split('`').next())
            .filter(|_| !key.starts_with("nodes"))
        else {
            continue;
        };
        if key.contains('.') && !key.starts_with("election.") && !key.starts_with("snapshot_every.")
        {
            continue;
        }
        match Config::parse(&with_base(&format!("{key} = {value}\n"))) {
            Ok(c) if c == base => {}
            Ok(_) => problems.push(format!(
                "{CONFIG_MD}: `{key}`'s documented default `{value}` is not the default in common/src/config.rs: correct the Default line"
            )),
            Err(e) => problems.push(format!(
                "{CONFIG_MD}: `{key}`'s documented default `{value}` does not parse ({}): correct the Default line",
                e.0
            )),
        }
    }
    // Every TOML example parses (a fragment inside a minimal config).
    for (info, body) in code_blocks(&md) {
        if info.split_whitespace().next() != Some("toml") || info.contains("ignore") {
            continue;
        }
        if let Err(e) = Config::parse(&with_base(&body)) {
            let first = body.lines().next().unwrap_or("");
            problems.push(format!(
                "{CONFIG_MD}: the TOML example starting `{first}` does not parse: {}; fix the example (or mark its fence `toml ignore` if it is meant to fail)",
                e.0
            ));
        }
    }
    report(CONFIG_MD, problems);
}

// ---------------------------------------------------------------------------
// 2. Subcommands and flags.
// ---------------------------------------------------------------------------

fn lockstep_help(args: &[&str]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .arg("--help")
        .env("LOCKSTEP_LOG", "off")
        .output()
        .map_err(|e| format!("cannot run lockstep: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The subcommands and flags (`--name`, and `<NAME>` / `[NAME]` for
/// arguments) of one `--help` text.
fn help_items(help: &str) -> (Vec<String>, Vec<String>) {
    let mut commands = Vec::new();
    let mut flags = Vec::new();
    let mut part = "";
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            part = line.trim_end_matches(':');
            continue;
        }
        // Items are indented by two spaces (six for a flag without a short
        // form); the long help's descriptions by ten.
        let indent = line.len() - line.trim_start().len();
        let item = line.trim_start();
        if !(indent == 2 || indent == 6 && item.starts_with("--")) {
            continue;
        }
        let first = item.split_whitespace().next().unwrap_or("");
        match part {
            "Commands" if first != "help" && !first.is_empty() => commands.push(first.to_string()),
            "Options" => {
                for w in item.split([' ', ',']) {
                    if w.starts_with("--") && w.len() > 2 && w != "--help" && w != "--version" {
                        flags.push(w.to_string());
                    }
                }
            }
            "Arguments" if !first.is_empty() => {
                let name = first.trim_matches(['<', '>', '[', ']', '.']);
                flags.push(format!("<{name}>"));
            }
            _ => {}
        }
    }
    (commands, flags)
}

const CLI_MD: &str = "docs/reference/cli.md";

#[test]
fn cli_reference_documents_every_subcommand_and_flag() {
    let md = read(CLI_MD);
    let mut problems = Vec::new();
    // Every subcommand the help lists, recursively, with its flags.
    let mut queue: Vec<Vec<String>> = vec![vec![]];
    let mut found: BTreeSet<String> = BTreeSet::new();
    while let Some(path) = queue.pop() {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let help = lockstep_help(&args).unwrap_or_else(|e| panic!("lockstep {args:?} --help: {e}"));
        let (commands, flags) = help_items(&help);
        for c in commands {
            let mut p = path.clone();
            p.push(c);
            queue.push(p);
        }
        if path.is_empty() {
            continue;
        }
        let name = format!("lockstep {}", path.join(" "));
        found.insert(name.clone());
        let title = format!("`{name}`");
        let Some(body) = section(&md, &title) else {
            problems.push(format!(
                "{CLI_MD}: subcommand `{name}` (in `lockstep --help`) is not documented: add a `## \\`{name}\\`` (or ###) section with what it does and each flag"
            ));
            continue;
        };
        for f in flags {
            let shown = if let Some(arg) = f.strip_prefix('<') {
                format!("`{}", arg.trim_end_matches('>'))
            } else {
                format!("`{f}")
            };
            let arg_alt = format!("`<{}", f.trim_matches(['<', '>']));
            if !body.contains(&shown) && !body.contains(&arg_alt) {
                let what = match f.strip_prefix('<') {
                    Some(arg) => format!("the argument {}", arg.trim_end_matches('>')),
                    None => format!("the flag {f}"),
                };
                problems.push(format!(
                    "{CLI_MD}: `{name}` takes {what} (see `{name} --help`) but its section does not name it: add it to the section's table, in backticks"
                ));
            }
        }
    }
    // Every subcommand the reference names exists.
    for h in headings(&md) {
        let Some(name) = h
            .text
            .strip_prefix("`lockstep ")
            .and_then(|t| t.strip_suffix('`'))
        else {
            continue;
        };
        let args: Vec<&str> = name.split_whitespace().collect();
        if !found.contains(&format!("lockstep {name}")) && lockstep_help(&args).is_err() {
            problems.push(format!(
                "{CLI_MD}: line {}: documents `lockstep {name}`, which the binary does not have (`lockstep {name} --help` fails): remove the section or rename it",
                h.line
            ));
        }
    }
    report(CLI_MD, problems);
}

// ---------------------------------------------------------------------------
// 3. Metrics.
// ---------------------------------------------------------------------------

/// (name, type) of every `# TYPE` line of a Prometheus text.
fn typed_metrics(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect()
}

/// Every metric the follower exports, with its type: the counters,
/// histograms and node gauges rendered by the follower's own metrics code,
/// and the gauges `render_metrics` hands it (read from its source: they
/// need a running node to render).
fn exported_metrics() -> BTreeMap<String, String> {
    use lockstep_follower::serve::metrics::{Metrics, NodeGauges};
    let mut text = Metrics::default().render(&[]);
    NodeGauges {
        role: "leader",
        server_up: true,
        // Some: the ZooKeeper gauge is rendered too.
        zookeeper_connected: Some(true),
        apply_lag_entries: 0,
        apply_lag_seconds: 0.0,
        apply_rate: 0,
        failover_backlog_grows: false,
        snapshot_failing: false,
        snapshot_failures: 0,
        newest_snapshot: 0,
        log_entries: 0,
        log_bytes: 0,
        degraded: false,
    }
    .render(&mut text);
    let mut out = typed_metrics(&text);
    let src = read("follower/src/runtime/status.rs");
    let start = src
        .find("self.metrics.render(&[")
        .expect("follower/src/runtime/status.rs hands its gauges to Metrics::render: update tests/docs.rs to where it does now");
    let end = start + src[start..].find("]);").unwrap_or(src.len() - start);
    for piece in src[start..end].split('"').skip(1).step_by(2) {
        if piece.starts_with("lockstep_") && !piece.contains(' ') {
            out.insert(piece.to_string(), "gauge".to_string());
        }
    }
    out
}

const METRICS_MD: &str = "docs/reference/metrics.md";

/// The metrics the reference lists: table rows whose first cell is a
/// `lockstep_…` name in backticks, with the type in the second cell.
fn documented_metrics(md: &str) -> BTreeMap<String, String> {
    prose_lines(md)
        .into_iter()
        .filter_map(|(_, l)| {
            let cells: Vec<&str> = l.trim().trim_matches('|').split('|').collect();
            let name = cells.first()?.trim().strip_prefix('`')?;
            let name = name.split(['`', '{']).next()?;
            name.starts_with("lockstep_").then(|| {
                let ty = cells.get(1).map_or("", |c| c.trim());
                (name.to_string(), ty.to_string())
            })
        })
        .collect()
}

#[test]
fn metrics_reference_documents_every_exported_metric() {
    let md = read(METRICS_MD);
    let exported = exported_metrics();
    assert!(
        exported.contains_key("lockstep_view") && exported.contains_key("lockstep_acks_total"),
        "the exported metrics look wrong: {exported:?}"
    );
    let documented = documented_metrics(&md);
    let mut problems = Vec::new();
    for (name, ty) in &exported {
        match documented.get(name) {
            None => problems.push(format!(
                "{METRICS_MD}: metric `{name}` ({ty}) is exported by the follower but not documented: add a table row `| \\`{name}\\` | {ty} | labels | meaning |`"
            )),
            Some(d) if d != ty => problems.push(format!(
                "{METRICS_MD}: metric `{name}` is a {ty}, the reference says {d:?}: correct its type cell"
            )),
            Some(_) => {}
        }
    }
    for name in documented.keys() {
        if !exported.contains_key(name) {
            problems.push(format!(
                "{METRICS_MD}: documents metric `{name}`, which the follower does not export: remove its row, or rename it"
            ));
        }
    }
    report(METRICS_MD, problems);
}

// ---------------------------------------------------------------------------
// Status JSON fields and environment variables.
// ---------------------------------------------------------------------------

const STATUS_MD: &str = "docs/reference/status-json.md";

/// The JSON keys `src/status.rs` writes (`"name":` in its `json!` objects,
/// and `["name"] =` assignments).
fn status_json_keys() -> BTreeSet<String> {
    let src = read("src/status.rs");
    let code = src.split("#[cfg(test)]").next().unwrap_or(&src);
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("\":") {
        let head = &code[..i];
        if let Some(q) = head.rfind('"') {
            let k = &head[q + 1..];
            if !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.insert(k.to_string());
            }
        }
    }
    for (i, _) in code.match_indices("\"] = json!") {
        let head = &code[..i];
        if let Some(q) = head.rfind("[\"") {
            out.insert(head[q + 2..].to_string());
        }
    }
    out
}

#[test]
fn status_json_reference_documents_every_field() {
    let md = read(STATUS_MD);
    let keys = status_json_keys();
    assert!(
        keys.contains("leader_app") && keys.contains("lag_seconds"),
        "the status keys look wrong: {keys:?}"
    );
    let documented: BTreeSet<String> = prose_lines(&md)
        .into_iter()
        .filter_map(|(_, l)| {
            let first = l.trim().trim_matches('|').split('|').next()?.trim();
            let name = first.strip_prefix('`')?.split('`').next()?;
            Some(name.to_string())
        })
        .collect();
    let mut problems = Vec::new();
    for k in &keys {
        if !documented.contains(k) {
            problems.push(format!(
                "{STATUS_MD}: `lockstep status --json` writes field `{k}` (src/status.rs) but the reference has no row for it: add `| \\`{k}\\` | type | meaning |`"
            ));
        }
    }
    report(STATUS_MD, problems);
}

const ENV_MD: &str = "docs/reference/environment.md";

/// Every `LOCKSTEP_*` name in the workspace's Rust sources and scripts.
fn env_vars_in_code() -> BTreeSet<String> {
    fn scan(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    scan(&p, out);
                }
            } else if (name.ends_with(".rs") && name != "docs.rs")
                || p.parent().is_some_and(|d| d.ends_with("scripts"))
            {
                let Ok(text) = std::fs::read_to_string(&p) else {
                    continue;
                };
                for (i, _) in text.match_indices("LOCKSTEP_") {
                    let var: String = text[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if var.len() > "LOCKSTEP_".len() && !var.ends_with('_') {
                        out.insert(var);
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for d in [
        "src", "common", "preload", "follower", "launcher", "testkit", "tests", "benches",
        "examples", "scripts",
    ] {
        scan(&root().join(d), &mut out);
    }
    out
}

#[test]
fn environment_reference_documents_every_variable() {
    let md = read(ENV_MD);
    let documented = code_headings(&md, 3);
    let vars = env_vars_in_code();
    assert!(vars.contains("LOCKSTEP_CONFIG"), "{vars:?}");
    let mut problems = Vec::new();
    for v in &vars {
        if !documented.contains(v) {
            problems.push(format!(
                "{ENV_MD}: the code reads `{v}` but the reference has no `### \\`{v}\\`` section: add one (under the test-only section if only tests read it)"
            ));
        }
    }
    for v in &documented {
        if !vars.contains(v) {
            problems.push(format!(
                "{ENV_MD}: documents `{v}`, which no code reads any more: remove its section"
            ));
        }
    }
    report(ENV_MD, problems);
}

// ---------------------------------------------------------------------------
// 4. Links and anchors.
// ---------------------------------------------------------------------------

/// README.md, CHANGELOG.md and every docs/**/*.md, relative to the root.
fn doc_files() -> Vec<PathBuf> {
    fn scan(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                scan(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out: Vec<PathBuf> = ["README.md", "CHANGELOG.md"]
        .iter()
        .map(|f| root().join(f))
        .filter(|p| p.is_file())
        .collect();
    scan(&root().join("docs"), &mut out);
    out.sort();
    out
}

/// `path` with `.` and `..` folded (no symlinks are followed).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// `%20` and friends decoded.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What is wrong with the relative links of one markdown file.
fn link_problems(file: &Path) -> Vec<String> {
    let rel = file
        .strip_prefix(root())
        .unwrap_or(file)
        .display()
        .to_string();
    let md = std::fs::read_to_string(file).unwrap_or_default();
    let mut problems = Vec::new();
    for (line, target) in links(&md) {
        if target.is_empty()
            || target.starts_with("//")
            || target.split_once(':').is_some_and(|(scheme, _)| {
                !scheme.is_empty()
                    && !scheme.contains('/')
                    && !scheme.contains('#')
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
            })
        {
            continue; // http(s), mailto and other absolute URLs
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let path = percent_decode(path.split('?').next().unwrap_or(path));
        let dest = if path.is_empty() {
            file.to_path_buf()
        } else if let Some(abs) = path.strip_prefix('/') {
            root().join(abs)
        } else {
            normalize(&file.parent().unwrap_or(&root()).join(&path))
        };
        if !dest.exists() {
            problems.push(format!(
                "{rel}:{line}: link `{target}` points to {}, which does not exist: fix the path (relative to {rel}) or add the file",
                dest.strip_prefix(root()).unwrap_or(&dest).display()
            ));
            continue;
        }
        let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
            continue;
        };
        if dest.extension().is_none_or(|x| x != "md") {
            continue; // line anchors into source files and the like
        }
        let text = std::fs::read_to_string(&dest).unwrap_or_default();
        let anchor = percent_decode(anchor).to_lowercase();
        if !anchors(&text).contains(&anchor) {
            problems.push(format!(
                "{rel}:{line}: link `{target}`: {} has no heading with anchor #{anchor}: link to an existing heading (GitHub slug: lowercase, punctuation dropped, spaces to '-') or add it",
                dest.strip_prefix(root()).unwrap_or(&dest).display()
            ));
        }
    }
    problems
}

#[test]
fn relative_links_and_anchors_resolve() {
    let files = doc_files();
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "no README.md at the root"
    );
    let problems: Vec<String> = files.iter().flat_map(|f| link_problems(f)).collect();
    report("links in README.md, CHANGELOG.md and docs/", problems);
}

// ---------------------------------------------------------------------------
// The checkers themselves.
// ---------------------------------------------------------------------------

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Commit disciplines (`commit = \"output\" | \"input\"`)"),
        "commit-disciplines-commit--output--input"
    );
    assert_eq!(slug("`election.mode`"), "electionmode");
    assert_eq!(slug("What it is"), "what-it-is");
    assert_eq!(
        slug("snake_case and CPU: 2 cores"),
        "snake_case-and-cpu-2-cores"
    );
    assert_eq!(slug("[Linked](x.md) heading"), "linked-heading");
    let md = "# A\n\n## A\n\n```\n# not a heading\n```\n\n## A\n";
    let a = anchors(md);
    assert!(
        a.contains("a") && a.contains("a-1") && a.contains("a-2"),
        "{a:?}"
    );
    assert!(!a.contains("not-a-heading"));
}

#[test]
fn links_skip_code_and_keep_targets() {
    let md = "See [x](a.md#b) and `[y](not.md)`.\n\n```\n[z](code.md)\n```\n[ref]: c/d.md\n![img](e.svg \"title\")\n";
    let got: Vec<String> = links(md).into_iter().map(|(_, t)| t).collect();
    assert_eq!(got, ["a.md#b", "c/d.md", "e.svg"]);
}

#[test]
fn help_items_read_clap_output() {
    let help = "Usage: x\n\nCommands:\n  status  Shows\n  help    Print\n\nArguments:\n  [CONFIG]\n          Cluster config\n\nOptions:\n      --config <CONFIG>\n          Cluster\n          --not-a-flag in text\n  -h, --help\n          Print help\n";
    let (c, f) = help_items(help);
    assert_eq!(c, ["status"]);
    assert_eq!(f, ["<CONFIG>", "--config"]);
}
