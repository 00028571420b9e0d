//! An elevation request as a human reads it ([`ElevationRequest::prompt`]).
//!
//! Everything in a request comes from the agent or its tool call: paths, arguments, a
//! script, environment values. Written raw to a terminal, an escape sequence in a path
//! (`ESC [2J`, a cursor move, an OSC title) could erase or rewrite the prompt the human
//! answers, and a bidirectional override (U+202E) could show `/etc` as something else.
//! [`escape`] makes all of them visible text. Unlike the CLI's output filter, which keeps
//! newlines and colours of a tool's output, it keeps nothing that is not plain printable
//! text: a prompt line is one line.

use std::fmt::Write as _;

use super::elevation::{ElevationRequest, ScriptRequest};
use sandbox_core::caps::{Access, Caps, Net};

/// At most this many bytes of one argument, environment value or script line are shown;
/// longer ones are cut (on a character boundary) and marked with their length and SHA-256.
pub const MAX_SHOWN_ARG: usize = 512;
/// At most this many bytes of a script are shown.
pub const MAX_SHOWN_SCRIPT: usize = 2048;
/// At most this many lines of a script are shown.
pub const MAX_SHOWN_SCRIPT_LINES: usize = 40;

/// `text` with everything but plain printable characters written as visible escapes:
/// `\` as `\\`; C0 controls (newline and tab included), DEL and the C1 controls
/// U+0080..U+009F as `\xNN`; bidirectional controls (U+061C, U+200E, U+200F,
/// U+202A..U+202E, U+2066..U+2069), zero-width and other invisible formatting characters
/// (U+00AD, U+180E, U+200B..U+200D, U+2028, U+2029, U+2060..U+2064, U+FEFF,
/// U+FFF9..U+FFFB) as `\u{NNNN}`. The result is one line that shows what the bytes are,
/// and no terminal acts on it.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || (0x7f..=0x9f).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_invisible_format(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Characters that change how text around them is shown, or show as nothing.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

/// `text` escaped and, if longer than `max` bytes, cut there with a note of its whole
/// length and SHA-256.
fn shown(text: &str, max: usize) -> String {
    if text.len() <= max {
        return escape(text);
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}… [{} bytes in all, sha256 {}]",
        escape(&text[..cut]),
        text.len(),
        super::elevation::sha256_hex(text.as_bytes())
    )
}

/// `"arg"`, escaped, with `"` as `\"`.
fn quoted(arg: &str) -> String {
    format!("\"{}\"", shown(arg, MAX_SHOWN_ARG).replace('"', "\\\""))
}

/// The text of [`ElevationRequest::prompt`].
pub(crate) fn render(request: &ElevationRequest) -> String {
    let mut out = String::new();
    let who = match &request.agent {
        Some(agent) => format!("agent {}", escape(agent)),
        None => "this run".to_string(),
    };
    let _ = writeln!(
        out,
        "strata: {who} (tier {}) asks to run {} with:",
        escape(&request.tier),
        escape(&request.tool)
    );
    for need in &request.needs {
        let _ = writeln!(
            out,
            "  {} ({})",
            escape(&need.capability),
            escape(&need.detail)
        );
    }
    if let Some(argv) = &request.argv {
        let args: Vec<String> = argv.iter().map(|a| quoted(a)).collect();
        let _ = writeln!(out, "command line: {}", args.join(" "));
    }
    if let Some(script) = &request.script {
        script_lines(&mut out, script);
    }
    if let Some(caps) = &request.caps {
        caps_lines(&mut out, caps, request.stdin_bytes);
    }
    out
}

fn script_lines(out: &mut String, script: &ScriptRequest) {
    let _ = writeln!(
        out,
        "{} script, {} bytes, sha256 {}:",
        script.language,
        script.bytes,
        escape(&script.sha256)
    );
    let mut used = 0;
    let mut lines: Vec<&str> = script.source.split('\n').collect();
    if lines.len() > 1 && lines.last() == Some(&"") {
        lines.pop();
    }
    let mut shown_lines = 0;
    for line in &lines {
        if shown_lines == MAX_SHOWN_SCRIPT_LINES || used >= MAX_SHOWN_SCRIPT {
            break;
        }
        let room = (MAX_SHOWN_SCRIPT - used).min(MAX_SHOWN_ARG);
        let _ = writeln!(out, "  | {}", shown(line, room));
        used += line.len() + 1;
        shown_lines += 1;
    }
    if shown_lines < lines.len() {
        let _ = writeln!(
            out,
            "  | … truncated: {} of {} lines shown; the whole script is {} bytes, sha256 {}",
            shown_lines,
            lines.len(),
            script.bytes,
            escape(&script.sha256)
        );
    }
}

fn caps_lines(out: &mut String, caps: &Caps, stdin_bytes: u64) {
    let _ = writeln!(out, "caps:");
    if caps.mounts.is_empty() {
        let _ = writeln!(out, "  files: no grants");
    }
    for mount in &caps.mounts {
        let access = match mount.access {
            Access::ReadWrite => "read-write",
            Access::ReadOnly => "read-only ",
            // An access this version does not know is shown as the widest.
            _ => "read-write",
        };
        let follows = if mount.follow_symlinks {
            " (follows symlinks)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {access} {} at {}{follows}",
            shown(&mount.host.to_string_lossy(), MAX_SHOWN_ARG),
            shown(&mount.guest.to_string_lossy(), MAX_SHOWN_ARG)
        );
    }
    let net = match &caps.net {
        Net::Allow(rules) if rules.is_empty() => "allowlist (empty: nothing)".to_string(),
        other => shown(&other.to_string(), MAX_SHOWN_ARG),
    };
    let _ = writeln!(out, "  network: {net}");
    for (key, value) in &caps.env {
        let _ = writeln!(
            out,
            "  env {}={}",
            shown(key, MAX_SHOWN_ARG),
            shown(value, MAX_SHOWN_ARG)
        );
    }
    for secret in &caps.secrets {
        let hosts: Vec<String> = secret.hosts.iter().map(|h| escape(h)).collect();
        let _ = writeln!(
            out,
            "  secret in {} for {}",
            escape(&secret.env),
            hosts.join(", ")
        );
    }
    if let Some(workdir) = &caps.workdir {
        let _ = writeln!(
            out,
            "  workdir {}",
            shown(&workdir.to_string_lossy(), MAX_SHOWN_ARG)
        );
    }
    if let Some(container) = &caps.container {
        let _ = writeln!(out, "  image {}", shown(&container.image, MAX_SHOWN_ARG));
    }
    if !caps.protect_host_executed {
        let _ = writeln!(
            out,
            "  host-executed paths in read-write grants are writable"
        );
    }
    if stdin_bytes > 0 {
        let _ = writeln!(out, "  stdin: {stdin_bytes} bytes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Need, Tier};
    use sandbox_core::tool::{ScriptLanguage, Tool};

    fn need(capability: &str) -> Need {
        Need {
            capability: capability.into(),
            detail: "tier low grants only paths within /tmp".into(),
        }
    }

    /// No byte a terminal acts on: no C0 or C1 control, no DEL, no bidi or invisible
    /// formatting character, except the newline ending each line.
    fn assert_inert(text: &str) {
        for line in text.split_terminator('\n') {
            for c in line.chars() {
                let n = c as u32;
                assert!(
                    n >= 0x20 && !(0x7f..=0x9f).contains(&n) && !is_invisible_format(c),
                    "raw {n:#x} in {line:?}"
                );
            }
        }
    }

    #[test]
    fn an_escape_sequence_in_a_requested_path_is_shown_escaped_to_the_human() {
        // A path that, printed raw, clears the screen, moves the cursor home and writes a
        // harmless-looking request over the real one; another with C1 CSI and a bidi
        // override; a third with a newline that would forge a line of the prompt.
        let paths = [
            "/tmp/\u{1b}[2J\u{1b}[Hread:/tmp/notes (fine)\u{1b}]0;ok\u{7}",
            "/tmp/\u{9b}1A/\u{202e}cte/",
            "/tmp/a\n  grant for one run? [y/N] y\r",
        ];
        for path in paths {
            let caps = Caps::new().read_only(path);
            let request = ElevationRequest::new(
                &Tier::low(),
                &Tool::command(["cat", path]),
                &caps,
                vec![need(&format!("read:{path}"))],
            );
            let text = request.prompt();
            assert_inert(&text);
            assert!(text.contains(&format!("read:{}", escape(path))), "{text}");
            assert!(!text.contains(path), "{text}");
        }
        assert_eq!(
            escape("/tmp/\u{1b}[2J\u{9b}\u{202e}\n\\"),
            "/tmp/\\x1b[2J\\x9b\\u{202e}\\x0a\\\\"
        );
        // Plain text and UTF-8 letters pass unchanged.
        assert_eq!(escape("/home/zoë/日本/x y"), "/home/zoë/日本/x y");
    }

    #[test]
    fn the_prompt_shows_the_whole_argv_and_the_caps() {
        let caps = Caps::new()
            .read_write("/tmp/ws")
            .env("MODE", "fast\u{1b}[8m")
            .net(Net::Host);
        let tool = Tool::command(["/bin/sh", "-c", "echo \"hi\" > /tmp/ws/out; rm -rf ~"]);
        let request =
            ElevationRequest::new(&Tier::low(), &tool, &caps, vec![need("write:/tmp/ws")]);
        let text = request.prompt();
        assert_inert(&text);
        assert!(
            text.contains(r#"command line: "/bin/sh" "-c" "echo \"hi\" > /tmp/ws/out; rm -rf ~""#),
            "{text}"
        );
        assert!(text.contains("read-write /tmp/ws at /tmp/ws"), "{text}");
        assert!(text.contains("network: host"), "{text}");
        assert!(text.contains("env MODE=fast\\x1b[8m"), "{text}");
        assert!(text.starts_with("strata: this run (tier low) asks to run /bin/sh with:\n"));
    }

    #[test]
    fn a_long_script_is_shown_truncated_with_its_length_and_hash() {
        let source: String = (0..200).map(|i| format!("print({i})\n")).collect();
        let tool = Tool::script(ScriptLanguage::Python, source.clone());
        let request = ElevationRequest::new(&Tier::low(), &tool, &Caps::new(), vec![]);
        let script = request.script.as_ref().expect("script");
        assert_eq!(script.bytes, source.len() as u64);
        let text = request.prompt();
        assert!(
            text.contains(&format!(
                "python script, {} bytes, sha256 {}:",
                source.len(),
                script.sha256
            )),
            "{text}"
        );
        assert!(text.contains("  | print(0)\n"), "{text}");
        assert!(!text.contains("print(199)"), "{text}");
        assert!(text.contains("truncated: 40 of 200 lines shown"), "{text}");
        // One endless line: cut by bytes, with its length and hash.
        let line = "x".repeat(10_000);
        let tool = Tool::script(ScriptLanguage::Javascript, line.clone());
        let text = ElevationRequest::new(&Tier::low(), &tool, &Caps::new(), vec![]).prompt();
        assert!(text.contains("[10000 bytes in all, sha256 "), "{text}");
        assert!(text.len() < 2 * MAX_SHOWN_SCRIPT, "{}", text.len());
        // A short script is shown whole, and its control characters escaped.
        let tool = Tool::script(ScriptLanguage::Sh, "echo hi\u{1b}]52;c;eA==\u{7}\nexit 0");
        let text = ElevationRequest::new(&Tier::low(), &tool, &Caps::new(), vec![]).prompt();
        assert_inert(&text);
        assert!(
            text.contains("  | echo hi\\x1b]52;c;eA==\\x07\n  | exit 0\n"),
            "{text}"
        );
        assert!(!text.contains("truncated"), "{text}");
    }
}
