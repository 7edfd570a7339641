//! The glob patterns of `PSUBSCRIBE`.

/// Whether glob `pattern` (`*`, `?`, literal bytes) matches `s`.
pub fn glob(pattern: &[u8], s: &[u8]) -> bool {
    match pattern.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| glob(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && glob(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && glob(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_and_question_marks_match() {
        assert!(glob(b"*", b"+switch-master"));
        assert!(glob(b"+switch-*", b"+switch-master"));
        assert!(!glob(b"+sdown", b"+switch-master"));
        assert!(glob(b"+s?itch-master", b"+switch-master"));
    }
}
