//! The commit discipline the suite runs its clusters in: every config a
//! test writes carries `commit_line()`. `LOCKSTEP_TEST_COMMIT` = `output`
//! (the default, as in a config without the key) or `input`; the suite
//! script runs the cluster tests once per mode.

/// `output` or `input`; anything else stops the test with why.
pub fn commit_mode() -> &'static str {
    match std::env::var("LOCKSTEP_TEST_COMMIT").as_deref() {
        Err(_) | Ok("") | Ok("output") => "output",
        Ok("input") => "input",
        Ok(other) => panic!("LOCKSTEP_TEST_COMMIT={other:?}: must be output or input"),
    }
}

/// The config line selecting `commit_mode()`.
pub fn commit_line() -> String {
    format!("commit = \"{}\"\n", commit_mode())
}
