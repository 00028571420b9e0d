//! Random names and uids, and timestamps, as the API server writes them.

use k8s_openapi::jiff::{Timestamp, Unit};

/// The alphabet of `generateName` suffixes (the API server's: no vowels, no `0`, `1`, `3`).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    if getrandom::fill(&mut buf).is_err() {
        // No OS randomness: fall back to the clock and a counter (names only need to be
        // unique, and a clash is answered 409 like any other).
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = Timestamp::now().as_nanosecond() as u64
            ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (seed.rotate_left(8 * (i as u32 % 8)) as u8).wrapping_add(i as u8);
        }
    }
    buf
}

/// Five random lowercase alphanumerics, as `generateName` appends.
pub(crate) fn suffix() -> String {
    bytes::<5>()
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

/// A random (version 4) UUID.
pub(crate) fn uid() -> String {
    let mut b = bytes::<16>();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Now, RFC 3339 in whole seconds (`2026-11-27T08:00:00Z`), as Kubernetes writes times.
pub(crate) fn now() -> String {
    let now = Timestamp::now();
    now.round(Unit::Second).unwrap_or(now).to_string()
}
