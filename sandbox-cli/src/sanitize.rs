//! Neutralises terminal control sequences in a tool's output before they reach the user's
//! terminal, so a tool cannot write the clipboard (OSC 52), retitle the window (OSC 0/2),
//! move the cursor over earlier output, or send device control strings.
//!
//! Kept as they are: printable ASCII, valid UTF-8 (except the C1 controls U+0080 to
//! U+009F), `\n`, `\r`, `\t`, backspace, and SGR sequences (`ESC [` digits, `;` and `:`
//! `m`: colours and text attributes, at most [`MAX_SGR`] bytes). Every other control byte
//! (the ESC that starts any other sequence, C0 controls such as BEL, DEL, C1 controls,
//! bytes that are not valid UTF-8) is written as the visible text `\xNN` instead, so the
//! sequence shows on screen and does nothing: `ESC ] 52 ; c ; … BEL` becomes
//! `\x1b]52;c;…\x07`. The filter is a streaming state machine: a sequence split across
//! writes is handled, and it holds at most [`MAX_SGR`] bytes between writes.

/// Longest SGR sequence passed through; a longer one is escaped like any other sequence.
pub const MAX_SGR: usize = 64;

const ESC: u8 = 0x1b;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Between characters.
    #[default]
    Ground,
    /// After ESC.
    Escape,
    /// After `ESC [` and SGR parameter bytes.
    Sgr,
    /// Inside a multi-byte UTF-8 character: `need` more continuation bytes, the next one in
    /// `lo..=hi`.
    Utf8 { need: u8, lo: u8, hi: u8 },
}

/// The streaming filter for one output stream.
#[derive(Debug, Default)]
pub struct Sanitizer {
    state: State,
    /// The unfinished SGR candidate or UTF-8 character (at most [`MAX_SGR`] bytes).
    held: Vec<u8>,
}

impl Sanitizer {
    /// A filter in its initial state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Filters `input` into `out`. Bytes of an unfinished sequence are held until the next
    /// call (or [`Sanitizer::finish`]).
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &byte in input {
            self.byte(byte, out);
        }
    }

    /// Flushes an unfinished sequence, escaped, and resets the filter.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.flush_escaped(out);
    }

    fn byte(&mut self, byte: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Ground => self.ground(byte, out),
            State::Escape => {
                if byte == b'[' {
                    self.held.push(byte);
                    self.state = State::Sgr;
                } else {
                    self.flush_escaped(out);
                    self.ground(byte, out);
                }
            }
            State::Sgr => match byte {
                b'0'..=b'9' | b';' | b':' if self.held.len() < MAX_SGR - 1 => {
                    self.held.push(byte);
                }
                b'm' => {
                    self.held.push(byte);
                    out.append(&mut self.held);
                    self.state = State::Ground;
                }
                _ => {
                    self.flush_escaped(out);
                    self.ground(byte, out);
                }
            },
            State::Utf8 { need, lo, hi } => {
                if (lo..=hi).contains(&byte) {
                    self.held.push(byte);
                    if need == 1 {
                        self.state = State::Ground;
                        // U+0080..=U+009F: C1 controls, encoded as C2 80..=9F.
                        if self.held[0] == 0xc2 && self.held[1] <= 0x9f {
                            self.flush_escaped(out);
                        } else {
                            out.append(&mut self.held);
                        }
                    } else {
                        self.state = State::Utf8 {
                            need: need - 1,
                            lo: 0x80,
                            hi: 0xbf,
                        };
                    }
                } else {
                    self.flush_escaped(out);
                    self.ground(byte, out);
                }
            }
        }
    }

    fn ground(&mut self, byte: u8, out: &mut Vec<u8>) {
        let utf8 = |need, lo, hi| State::Utf8 { need, lo, hi };
        // Lead bytes and the range of the first continuation byte (Unicode Table 3-7):
        // no overlong forms, no surrogates, nothing past U+10FFFF.
        let next = match byte {
            0x20..=0x7e | b'\n' | b'\r' | b'\t' | 0x08 => {
                out.push(byte);
                return;
            }
            ESC => State::Escape,
            0xc2..=0xdf => utf8(1, 0x80, 0xbf),
            0xe0 => utf8(2, 0xa0, 0xbf),
            0xe1..=0xec | 0xee..=0xef => utf8(2, 0x80, 0xbf),
            0xed => utf8(2, 0x80, 0x9f),
            0xf0 => utf8(3, 0x90, 0xbf),
            0xf1..=0xf3 => utf8(3, 0x80, 0xbf),
            0xf4 => utf8(3, 0x80, 0x8f),
            // Other C0 controls, DEL, C1 controls, stray continuation and invalid bytes.
            _ => {
                escape(byte, out);
                return;
            }
        };
        self.held.push(byte);
        self.state = next;
    }

    /// Writes the held bytes with every non-printable byte escaped, and returns to ground.
    fn flush_escaped(&mut self, out: &mut Vec<u8>) {
        for &byte in &self.held {
            if (0x20..=0x7e).contains(&byte) {
                out.push(byte);
            } else {
                escape(byte, out);
            }
        }
        self.held.clear();
        self.state = State::Ground;
    }
}

/// Writes `byte` as the four characters `\xNN`.
fn escape(byte: u8, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(&[
        b'\\',
        b'x',
        HEX[usize::from(byte >> 4)],
        HEX[usize::from(byte & 0xf)],
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]]) -> Vec<u8> {
        let mut filter = Sanitizer::new();
        let mut out = Vec::new();
        for chunk in chunks {
            filter.push(chunk, &mut out);
        }
        filter.finish(&mut out);
        out
    }

    fn one_byte_at_a_time(input: &[u8]) -> Vec<u8> {
        let chunks: Vec<&[u8]> = input.chunks(1).collect();
        run(&chunks)
    }

    #[test]
    fn osc52_clipboard_write_is_escaped() {
        let attack = b"before\x1b]52;c;cm0gLXJmIH4=\x07after";
        assert_eq!(
            run(&[attack]),
            b"before\\x1b]52;c;cm0gLXJmIH4=\\x07after".to_vec()
        );
        // With the string terminator ESC \ instead of BEL.
        assert_eq!(
            run(&[b"\x1b]52;p;eA==\x1b\\"]),
            b"\\x1b]52;p;eA==\\x1b\\".to_vec()
        );
    }

    #[test]
    fn title_change_is_escaped() {
        assert_eq!(
            run(&[b"\x1b]0;pwned\x07\x1b]2;pwned\x07"]),
            b"\\x1b]0;pwned\\x07\\x1b]2;pwned\\x07".to_vec()
        );
    }

    #[test]
    fn cursor_moves_and_screen_erases_are_escaped() {
        assert_eq!(
            run(&[b"ok\x1b[2J\x1b[H\x1b[1A\x1b[?1049h"]),
            b"ok\\x1b[2J\\x1b[H\\x1b[1A\\x1b[?1049h".to_vec()
        );
    }

    #[test]
    fn device_control_and_other_strings_are_escaped() {
        assert_eq!(
            run(&[b"\x1bP+q544e\x1b\\\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\"]),
            b"\\x1bP+q544e\\x1b\\\\x1b_apc\\x1b\\\\x1b^pm\\x1b\\\\x1bXsos\\x1b\\".to_vec()
        );
        // Single-byte C1 forms: CSI, OSC, DCS.
        assert_eq!(
            run(&[b"\x9b2J\x9d0;t\x07\x90q"]),
            b"\\x9b2J\\x9d0;t\\x07\\x90q".to_vec()
        );
        // Two-character escapes (reset, keypad mode, charset designation).
        assert_eq!(run(&[b"\x1bc\x1b=\x1b(0"]), b"\\x1bc\\x1b=\\x1b(0".to_vec());
    }

    #[test]
    fn sgr_colours_pass() {
        let colours = b"\x1b[1;31mred\x1b[0m \x1b[38;2;255;0;0mrgb\x1b[m \x1b[38:5:208mx\x1b[0m";
        assert_eq!(run(&[colours]), colours.to_vec());
    }

    #[test]
    fn split_sgr_passes() {
        assert_eq!(
            run(&[b"a\x1b", b"[3", b"1", b"mred\x1b[", b"0m"]),
            b"a\x1b[31mred\x1b[0m".to_vec()
        );
        let colours = b"\x1b[1;32mgreen\x1b[0m";
        assert_eq!(one_byte_at_a_time(colours), colours.to_vec());
    }

    #[test]
    fn split_osc_is_escaped() {
        assert_eq!(
            run(&[b"x\x1b", b"]52;c;", b"aGk=", b"\x07y"]),
            b"x\\x1b]52;c;aGk=\\x07y".to_vec()
        );
        assert_eq!(
            one_byte_at_a_time(b"\x1b]0;t\x07"),
            b"\\x1b]0;t\\x07".to_vec()
        );
    }

    #[test]
    fn text_utf8_and_plain_controls_pass() {
        let text = "héllo → 世界 🎉\r\n\tbs\x08!".as_bytes();
        assert_eq!(run(&[text]), text.to_vec());
        assert_eq!(one_byte_at_a_time(text), text.to_vec());
    }

    #[test]
    fn other_c0_controls_and_del_are_escaped() {
        assert_eq!(
            run(&[b"\x07\x00\x0b\x0c\x0e\x7f"]),
            b"\\x07\\x00\\x0b\\x0c\\x0e\\x7f".to_vec()
        );
    }

    #[test]
    fn invalid_utf8_is_escaped() {
        // Stray continuation, overlong, surrogate, past U+10FFFF, truncated sequences.
        assert_eq!(run(&[b"\x80a"]), b"\\x80a".to_vec());
        assert_eq!(run(&[b"\xc0\xaf"]), b"\\xc0\\xaf".to_vec());
        assert_eq!(run(&[b"\xed\xa0\x80"]), b"\\xed\\xa0\\x80".to_vec());
        assert_eq!(
            run(&[b"\xf4\x90\x80\x80"]),
            b"\\xf4\\x90\\x80\\x80".to_vec()
        );
        assert_eq!(run(&[b"\xe4\xb8x"]), b"\\xe4\\xb8x".to_vec());
        assert_eq!(run(&[b"\xe4\xb8"]), b"\\xe4\\xb8".to_vec());
        // A truncated character followed by ESC: the ESC still starts a sequence.
        assert_eq!(run(&[b"\xe4\x1b[0m"]), b"\\xe4\x1b[0m".to_vec());
    }

    #[test]
    fn utf8_encoded_c1_controls_are_escaped() {
        // U+009B (CSI) and U+009D (OSC) as UTF-8; U+00A0 (not a control) passes.
        assert_eq!(
            run(&["\u{9b}2J\u{9d}0;t".as_bytes(), "\u{a0}".as_bytes()]),
            b"\\xc2\\x9b2J\\xc2\\x9d0;t\xc2\xa0".to_vec()
        );
    }

    #[test]
    fn long_sequences_without_terminator_stay_bounded() {
        let mut filter = Sanitizer::new();
        let mut out = Vec::new();
        // An endless SGR-looking parameter list.
        filter.push(b"\x1b[", &mut out);
        for _ in 0..100_000 {
            filter.push(b"1;", &mut out);
            assert!(filter.held.len() <= MAX_SGR);
        }
        filter.push(b"m", &mut out);
        assert!(out.starts_with(b"\\x1b[1;1;"));
        assert!(!out.contains(&ESC));
        // An endless OSC: nothing is held at all.
        let mut out = Vec::new();
        filter.push(b"\x1b]52;c;", &mut out);
        for _ in 0..100_000 {
            filter.push(b"QUFB", &mut out);
            assert!(filter.held.is_empty());
        }
        assert!(!out.contains(&ESC));
        // The longest SGR that still passes.
        let mut sgr = b"\x1b[".to_vec();
        sgr.resize(MAX_SGR - 1, b'1');
        sgr.push(b'm');
        assert_eq!(run(&[&sgr]), sgr);
        let mut long = b"\x1b[".to_vec();
        long.resize(MAX_SGR, b'1');
        long.push(b'm');
        assert!(run(&[&long]).starts_with(b"\\x1b["));
    }

    #[test]
    fn unfinished_sequence_at_the_end_is_flushed_escaped() {
        assert_eq!(run(&[b"x\x1b"]), b"x\\x1b".to_vec());
        assert_eq!(run(&[b"x\x1b[31"]), b"x\\x1b[31".to_vec());
    }

    #[test]
    fn output_never_contains_raw_controls() {
        // Every byte value, in every position, one at a time and all at once.
        let all: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        for out in [run(&[&all]), one_byte_at_a_time(&all)] {
            let allowed =
                |b: &u8| (0x20..0x7f).contains(b) || b"\n\r\t\x08".contains(b) || *b >= 0xa0;
            let stray: Vec<u8> = out.iter().copied().filter(|b| !allowed(b)).collect();
            assert!(stray.is_empty(), "raw controls left: {stray:x?}");
        }
    }
}
