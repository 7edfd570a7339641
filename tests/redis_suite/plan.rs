//! What `tests/redis_suite.rs` runs and how it judges it, without I/O: the
//! units file (`units.toml`), the outcomes `runtest` prints, and the rule
//! that a test passing against plain Redis must pass through lockstep.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `units.toml`: the units to run and what is excluded through lockstep.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// `runtest --tags` (the suite's default: `-slow`).
    pub tags: String,
    /// How long one unit may run on either side before it counts as hung.
    pub unit_timeout_secs: u64,
    /// The units, in the order they run.
    pub units: Vec<Unit>,
}

/// One unit of Redis's suite (`unit/type/list`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unit {
    /// The unit's name as `runtest --single` takes it.
    pub name: String,
    /// Tests of this unit not run through lockstep.
    #[serde(default)]
    pub exclude: Vec<Exclusion>,
}

/// A test left out through lockstep, and why.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exclusion {
    /// The test's exact name (`runtest --skiptest`).
    pub test: String,
    /// Why it cannot pass through lockstep (or not yet).
    pub reason: String,
}

impl Plan {
    /// Parses and checks the units file: every exclusion names a reason,
    /// no unit twice.
    pub fn parse(text: &str) -> Result<Plan, String> {
        let plan: Plan = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut seen = std::collections::BTreeSet::new();
        for u in &plan.units {
            if !seen.insert(u.name.as_str()) {
                return Err(format!("unit {} is listed twice", u.name));
            }
            for x in &u.exclude {
                if x.reason.trim().is_empty() {
                    return Err(format!(
                        "{}: exclusion {:?} gives no reason",
                        u.name, x.test
                    ));
                }
            }
        }
        Ok(plan)
    }
}

/// How one test of a unit ended, as `runtest` reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `[ok]`.
    Passed,
    /// `[err]`, with the first lines of what it printed.
    Failed(String),
}

/// What one side's run of a unit reported.
#[derive(Debug, Default)]
pub struct UnitRun {
    /// Each test that ran, by name (`[skip]` and `[ignore]` ones do not).
    pub tests: BTreeMap<String, Outcome>,
    /// `[exception]` lines: the unit stopped there.
    pub exceptions: Vec<String>,
    /// Whether `runtest` got to the unit's `done` line.
    pub finished: bool,
}

impl UnitRun {
    /// Tests that passed.
    pub fn passed(&self) -> usize {
        self.tests
            .values()
            .filter(|o| **o == Outcome::Passed)
            .count()
    }
}

/// Removes the terminal colours `runtest` prints.
fn plain_text(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads `runtest`'s output for one unit.
pub fn parse_output(unit: &str, output: &str) -> UnitRun {
    let mut run = UnitRun::default();
    let lines: Vec<String> = output.lines().map(plain_text).collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(rest) = line.strip_prefix("[ok]: ") {
            // "[ok]: NAME (12 ms)"
            let name = rest.rsplit_once(" (").map_or(rest, |(n, _)| n);
            run.tests.insert(name.to_string(), Outcome::Passed);
        } else if let Some(rest) = line.strip_prefix("[err]: ") {
            // "[err]: NAME in tests/unit/x.tcl", then what failed.
            let name = rest.rsplit_once(" in tests/").map_or(rest, |(n, _)| n);
            let detail: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| !l.starts_with('['))
                .take(3)
                .map(|l| l.as_str())
                .collect();
            run.tests
                .insert(name.to_string(), Outcome::Failed(detail.join(" | ")));
        } else if let Some(rest) = line.strip_prefix("[exception]: ") {
            run.exceptions.push(rest.to_string());
        } else if line.contains("done]: ") && line.ends_with(')') && line.contains(unit) {
            run.finished = true;
        }
    }
    run
}

/// What is wrong with the lockstep side of one unit compared with the
/// plain side: each test that passed plain and did not pass through
/// lockstep (failed, or never ran because the unit stopped), and a unit
/// that did not finish.
pub fn regressions(unit: &str, plain: &UnitRun, lockstep: &UnitRun) -> Vec<String> {
    let mut out = Vec::new();
    if !lockstep.finished {
        out.push(format!(
            "{unit}: did not finish through lockstep{}",
            lockstep
                .exceptions
                .first()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        ));
    }
    for (name, o) in &plain.tests {
        if *o != Outcome::Passed {
            continue;
        }
        match lockstep.tests.get(name) {
            Some(Outcome::Passed) => {}
            Some(Outcome::Failed(why)) => out.push(format!(
                "{unit}: `{name}` passes plain, fails through lockstep: {why}"
            )),
            // An excluded test is skipped, so it is not in the list; one
            // that never ran because the unit stopped is named above.
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "Testing unit/x\n\
        [\u{1b}[0;32;49mok\u{1b}[0m]: SET and GET (3 ms)\n\
        [\u{1b}[0;31;49merr\u{1b}[0m]: MULTI (nested) in tests/unit/x.tcl\n\
        Expected 'a' to equal 'b' (context: type eval line 3)\n\
        [\u{1b}[0;36;49mignore\u{1b}[0m]: Not supported on external server\n\
        [1/1 \u{1b}[0;33;49mdone\u{1b}[0m]: unit/x (2 seconds)\n";

    #[test]
    fn runtest_output_reads_as_outcomes() {
        let run = parse_output("unit/x", OUTPUT);
        assert!(run.finished);
        assert_eq!(run.tests["SET and GET"], Outcome::Passed);
        assert!(
            matches!(&run.tests["MULTI (nested)"], Outcome::Failed(w) if w.contains("Expected 'a'"))
        );
        assert_eq!(run.tests.len(), 2);
    }

    #[test]
    fn a_test_passing_plain_and_failing_through_lockstep_is_named() {
        let plain = parse_output("unit/x", &OUTPUT.replace("[err]: MULTI", "[ok]: MULTI"));
        let plain = UnitRun {
            tests: plain
                .tests
                .into_keys()
                .map(|k| (k, Outcome::Passed))
                .collect(),
            ..plain
        };
        let lockstep = parse_output("unit/x", OUTPUT);
        let r = regressions("unit/x", &plain, &lockstep);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].contains("`MULTI (nested)`"), "{r:?}");
        // Failing on both sides is no regression.
        assert!(regressions("unit/x", &lockstep, &lockstep).is_empty());
    }

    #[test]
    fn a_unit_that_stops_is_a_regression() {
        let plain = parse_output("unit/x", OUTPUT);
        let cut = parse_output("unit/x", "[ok]: SET and GET (3 ms)\n");
        let r = regressions("unit/x", &plain, &cut);
        assert!(r.iter().any(|l| l.contains("did not finish")), "{r:?}");
    }

    #[test]
    fn the_units_file_parses_and_gives_every_exclusion_a_reason() {
        let plan = Plan::parse(include_str!("units.toml")).unwrap();
        assert!(!plan.units.is_empty());
        let bad = "tags = \"-slow\"\nunit_timeout_secs = 1\n[[units]]\nname = \"u\"\nexclude = [{ test = \"t\", reason = \" \" }]\n";
        assert!(Plan::parse(bad).unwrap_err().contains("no reason"));
    }
}
