//! The primitives under the keys and signatures: randomness, HMAC, HKDF, encodings.

use super::*;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

pub(super) fn random(buf: &mut [u8], what: &str) -> Result<()> {
    getrandom::fill(buf).map_err(|e| Error::Internal {
        message: format!("no OS randomness for a {what}: {e}"),
        source: None,
    })
}

/// HMAC-SHA256 keyed with `key` of any length, without the fallible constructor: HMAC pads
/// a key up to the block (64 bytes) with zeros and hashes a longer one first (RFC 2104), so
/// doing that here gives the same MAC.
pub(super) fn keyed(key: &[u8]) -> HmacSha256 {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mac = <HmacSha256 as KeyInit>::new(&block.into());
    block.zeroize();
    mac
}

pub(super) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = keyed(key);
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// HKDF-SHA256 (RFC 5869) with 32 bytes of output (one expand block); `ikm` and `info` are
/// the concatenation of their parts.
pub(super) fn hkdf(salt: &[u8], ikm: &[&[u8]], info: &[&[u8]]) -> [u8; 32] {
    let mut prk = hmac_sha256(salt, ikm);
    let mut parts: Vec<&[u8]> = info.to_vec();
    parts.push(&[1]);
    let okm = hmac_sha256(&prk, &parts);
    prk.zeroize();
    okm
}

/// Appends `bytes` with its length as a big-endian `u64`.
pub(super) fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(bytes);
}

pub(super) fn pair(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

/// A fixed-size replay-cache key for (sender, nonce).
pub(super) fn nonce_id(from: &str, nonce: &Nonce) -> [u8; 32] {
    let mut bytes = Vec::with_capacity(24 + from.len());
    put(&mut bytes, from.as_bytes());
    bytes.extend_from_slice(&nonce.0);
    Sha256::digest(&bytes).into()
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(super) fn check_name(what: &str, name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} name is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what} name {:?} is longer than {MAX_NAME_LEN} bytes",
            clip(name)
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(format!(
            "{what} name {:?} contains control characters",
            clip(name)
        ));
    }
    Ok(())
}

pub(super) fn clip(text: &str) -> String {
    match text.char_indices().nth(CLIP) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

pub(super) fn unhex<const N: usize>(what: &str, text: &str) -> Result<[u8; N]> {
    let wrong = || Error::invalid(format!("{what}: expected {} hex characters", N * 2));
    let digits = text.as_bytes();
    if digits.len() != N * 2 {
        return Err(wrong());
    }
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let hi = hex_digit(pair[0]).ok_or_else(wrong)?;
        let lo = hex_digit(pair[1]).ok_or_else(wrong)?;
        *byte = (hi << 4) | lo;
    }
    Ok(out)
}

pub(super) fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

pub(super) fn unbase64<const N: usize>(what: &str, text: &str) -> Result<[u8; N]> {
    let wrong = || Error::invalid(format!("{what}: expected base64 of {N} bytes"));
    let mut bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| wrong())?;
    let out = <[u8; N]>::try_from(bytes.as_slice()).map_err(|_| wrong());
    bytes.zeroize();
    out
}
