//! Secret handles (session ids, sandbox ids, access tokens, API keys) compared without
//! leaking where they differ.

/// Whether `given` equals `expected`, in time that depends only on the two lengths, never
/// on where the first differing byte is.
pub fn same(given: &[u8], expected: &[u8]) -> bool {
    if given.len() != expected.len() {
        return false;
    }
    let diff = given
        .iter()
        .zip(expected)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    // `black_box` keeps the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn equal_handles_match_and_any_difference_does_not() {
        assert!(same(b"s-0123", b"s-0123"));
        assert!(!same(b"s-0123", b"s-0124"));
        assert!(!same(b"x-0123", b"s-0123"));
        assert!(!same(b"s-012", b"s-0123"));
        assert!(same(b"", b""));
    }
}
