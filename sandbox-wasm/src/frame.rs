//! The byte protocol between the layered host and the backend: the host's standard output
//! carries frames `[tag: u8][len: u32 LE][payload]` — guest stdout, guest stderr, and one
//! final result. Pure code, unit-tested.

/// A chunk of the guest's standard output.
pub(crate) const STDOUT: u8 = 1;
/// A chunk of the guest's standard error.
pub(crate) const STDERR: u8 = 2;
/// The JSON result, last.
pub(crate) const RESULT: u8 = 3;

/// Encodes one frame.
pub(crate) fn encode(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(tag);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Incremental decoder.
#[derive(Default, Debug)]
pub(crate) struct Decoder {
    pending: Vec<u8>,
    /// Set when the stream is not made of frames; nothing more is decoded.
    pub corrupt: bool,
}

impl Decoder {
    /// Feeds bytes; calls `on_frame(tag, payload)` for each complete frame.
    pub(crate) fn feed(&mut self, bytes: &[u8], mut on_frame: impl FnMut(u8, &[u8])) {
        if self.corrupt {
            return;
        }
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        while self.pending.len() - at >= 5 {
            let tag = self.pending[at];
            if !(STDOUT..=RESULT).contains(&tag) {
                self.corrupt = true;
                return;
            }
            let len = u32::from_le_bytes([
                self.pending[at + 1],
                self.pending[at + 2],
                self.pending[at + 3],
                self.pending[at + 4],
            ]) as usize;
            if self.pending.len() - at - 5 < len {
                break;
            }
            on_frame(tag, &self.pending[at + 5..at + 5 + len]);
            at += 5 + len;
        }
        self.pending.drain(..at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_arbitrary_chunking() {
        let mut wire = encode(STDOUT, b"hello");
        wire.extend(encode(STDERR, b""));
        wire.extend(encode(RESULT, b"{}"));
        for split in 0..wire.len() {
            let mut d = Decoder::default();
            let mut seen = Vec::new();
            d.feed(&wire[..split], |t, p| seen.push((t, p.to_vec())));
            d.feed(&wire[split..], |t, p| seen.push((t, p.to_vec())));
            assert_eq!(
                seen,
                vec![
                    (STDOUT, b"hello".to_vec()),
                    (STDERR, vec![]),
                    (RESULT, b"{}".to_vec())
                ]
            );
            assert!(d.pending.is_empty());
        }
    }

    #[test]
    fn unknown_tags_mark_the_stream_corrupt() {
        let mut d = Decoder::default();
        d.feed(b"\x09\x00\x00\x00\x00", |_, _| panic!("no frame"));
        assert!(d.corrupt);
    }
}
