//! A tamper-evident audit log: one JSON record per line, each carrying the SHA-256 of the
//! record before it, so altering, removing or reordering a record breaks the chain at the
//! first record touched.
//!
//! A record is `{"seq", "time_ms", "prev", "event", "hash"}`: `seq` counts from 1, `prev` is
//! the previous record's `hash` (64 zeros for the first), `hash` is the SHA-256 (hex) of the
//! record's JSON without `hash` (keys sorted, no spaces), so any change to any field of any
//! record shows. [`verify`] names the first record that does not fit. Cutting records off
//! the *end* leaves a valid shorter chain; keep the last `hash` elsewhere (or pass it to
//! [`verify_head`]) to detect that.
//!
//! [`AuditLog`] appends to a file; [`AuditLog::record`] flushes and, for policy events
//! (refusals, elevations), `fsync`s before returning, so the decision is on disk before it
//! takes effect. Every event is also emitted through `tracing` (target `strata::audit`).

use std::fmt;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `prev` of the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Something that happened, as the log records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum AuditEvent {
    /// A run ended (whatever its status).
    Run {
        /// The tool, described briefly (never a whole script).
        tool: String,
        /// The backend that ran it.
        backend: String,
        /// `exited 0`, `signaled 9`, `limit wall`, ...
        status: String,
        /// The agent the run acted for, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
        /// Denials the receipt lists (`capability: detail`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        denials: Vec<String>,
        /// The tier the run was checked against, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tier: Option<String>,
        /// The risk the router used, if a risk was routed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        risk: Option<String>,
        /// Grants beyond the tier the run used (their ids).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        elevations: Vec<u64>,
    },
    /// A run was refused before anything ran.
    Refusal {
        /// The tool, described briefly.
        tool: String,
        /// The error kind (`unenforceable`, `denied`, ...).
        error: String,
        /// The error message.
        message: String,
    },
    /// A policy decision (tier, elevation, approval, message check).
    Policy {
        /// What was decided about (`elevation`, `tier`, `message`, ...).
        subject: String,
        /// `granted`, `refused`, `expired`, `used`, ...
        decision: String,
        /// Details.
        detail: String,
    },
}

impl AuditEvent {
    /// The record of a finished run, or of its refusal.
    pub fn of_run(
        tool: &crate::Tool,
        result: &crate::Result<crate::RunOutput>,
        agent: Option<String>,
    ) -> AuditEvent {
        match result {
            Ok(out) => AuditEvent::Run {
                tool: tool.describe(),
                backend: out.receipt.backend.to_string(),
                status: out.status.to_string(),
                agent,
                denials: out
                    .receipt
                    .denials
                    .iter()
                    .map(|d| format!("{}: {}", d.capability, d.detail))
                    .collect(),
                tier: out.receipt.policy.as_ref().and_then(|p| p.tier.clone()),
                risk: out
                    .receipt
                    .policy
                    .as_ref()
                    .and_then(|p| p.route.as_ref())
                    .map(|r| r.risk.to_string()),
                elevations: out
                    .receipt
                    .policy
                    .as_ref()
                    .map(|p| p.elevations.iter().map(|g| g.id).collect())
                    .unwrap_or_default(),
            },
            Err(e) => AuditEvent::Refusal {
                tool: tool.describe(),
                error: e.kind().code().to_string(),
                message: e.to_string(),
            },
        }
    }

    /// Whether the event is a policy event: such records are `fsync`ed before
    /// [`AuditLog::record`] returns.
    pub fn is_policy(&self) -> bool {
        matches!(self, AuditEvent::Refusal { .. } | AuditEvent::Policy { .. })
    }
}

/// One line of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// Position in the log, from 1.
    pub seq: u64,
    /// When it was recorded, milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The previous record's hash ([`GENESIS`] for the first).
    pub prev: String,
    /// What happened.
    pub event: AuditEvent,
    /// SHA-256 (hex) of this record without this field.
    pub hash: String,
}

/// The fields a record's hash covers, in a fixed order.
#[derive(Serialize)]
struct Unsealed<'a> {
    event: &'a AuditEvent,
    prev: &'a str,
    seq: u64,
    time_ms: u64,
}

impl AuditRecord {
    /// The hash this record should carry.
    pub fn expected_hash(&self) -> String {
        seal(self.seq, self.time_ms, &self.prev, &self.event)
    }
}

fn seal(seq: u64, time_ms: u64, prev: &str, event: &AuditEvent) -> String {
    let unsealed = Unsealed {
        event,
        prev,
        seq,
        time_ms,
    };
    // Canonical: serde_json::Value sorts object keys (no preserve_order feature).
    let value = serde_json::to_value(&unsealed).unwrap_or_default();
    let bytes = serde_json::to_vec(&value).unwrap_or_default();
    hex(&Sha256::digest(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a log does not verify: the first record that does not fit, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditBreak {
    /// The line (from 1) of the first bad record.
    pub line: u64,
    /// What is wrong with it.
    pub reason: BreakReason,
}

/// How a record breaks the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakReason {
    /// Not a record (malformed JSON or fields).
    Malformed(String),
    /// Its hash does not match its contents: the record was altered.
    Altered,
    /// Its `seq` is not the next one: records before it were removed or reordered.
    Sequence {
        /// The `seq` expected here.
        expected: u64,
        /// The `seq` found.
        found: u64,
    },
    /// Its `prev` is not the previous record's hash: a record before it was removed,
    /// replaced or reordered.
    Chain,
    /// The log ends at a different record than the known head: records were cut off the
    /// end (or added).
    Head {
        /// The head expected.
        expected: String,
        /// The last hash found.
        found: String,
    },
}

impl fmt::Display for AuditBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            BreakReason::Malformed(why) => {
                write!(f, "record on line {} is malformed: {why}", self.line)
            }
            BreakReason::Altered => write!(
                f,
                "record on line {} was altered (its hash does not match its contents)",
                self.line
            ),
            BreakReason::Sequence { expected, found } => write!(
                f,
                "record on line {} has seq {found}, expected {expected}: records were removed or reordered",
                self.line
            ),
            BreakReason::Chain => write!(
                f,
                "record on line {} does not follow the record before it: a record was removed, replaced or reordered",
                self.line
            ),
            BreakReason::Head { expected, found } => write!(
                f,
                "the log ends at {found} after line {}, expected head {expected}: records were cut off or added",
                self.line
            ),
        }
    }
}

impl std::error::Error for AuditBreak {}

/// What a verified log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Records checked.
    pub records: u64,
    /// The last record's hash ([`GENESIS`] for an empty log).
    pub head: String,
}

/// Checks a whole log.
///
/// # Errors
/// The first record that does not fit ([`AuditBreak`]); I/O errors as
/// [`BreakReason::Malformed`].
pub fn verify(reader: impl BufRead) -> Result<Verified, AuditBreak> {
    let mut head = GENESIS.to_string();
    let mut records = 0u64;
    for (index, line) in reader.lines().enumerate() {
        let line_no = index as u64 + 1;
        let line = line.map_err(|e| AuditBreak {
            line: line_no,
            reason: BreakReason::Malformed(e.to_string()),
        })?;
        let record: AuditRecord = serde_json::from_str(&line).map_err(|e| AuditBreak {
            line: line_no,
            reason: BreakReason::Malformed(e.to_string()),
        })?;
        if record.expected_hash() != record.hash {
            return Err(AuditBreak {
                line: line_no,
                reason: BreakReason::Altered,
            });
        }
        if record.seq != records + 1 {
            return Err(AuditBreak {
                line: line_no,
                reason: BreakReason::Sequence {
                    expected: records + 1,
                    found: record.seq,
                },
            });
        }
        if record.prev != head {
            return Err(AuditBreak {
                line: line_no,
                reason: BreakReason::Chain,
            });
        }
        head = record.hash;
        records += 1;
    }
    Ok(Verified { records, head })
}

/// [`verify`], then checks that the log ends at `expected_head` (a hash kept elsewhere).
///
/// # Errors
/// As [`verify`], or [`BreakReason::Head`].
pub fn verify_head(reader: impl BufRead, expected_head: &str) -> Result<Verified, AuditBreak> {
    let verified = verify(reader)?;
    if verified.head != expected_head {
        return Err(AuditBreak {
            line: verified.records,
            reason: BreakReason::Head {
                expected: expected_head.to_string(),
                found: verified.head,
            },
        });
    }
    Ok(verified)
}

/// An append-only audit log file.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: std::fs::File,
    seq: u64,
    head: String,
}

impl AuditLog {
    /// Opens (or creates, mode 0600) the log at `path` and verifies what it holds, so new
    /// records continue an intact chain.
    ///
    /// # Errors
    /// [`crate::Error::InvalidRequest`] when the existing log does not verify (naming the
    /// first bad record) or cannot be opened.
    pub fn open(path: impl Into<PathBuf>) -> crate::Result<AuditLog> {
        let path = path.into();
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true).read(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let file = options
            .open(&path)
            .map_err(|e| crate::Error::invalid(format!("audit log {}: {e}", path.display())))?;
        let reader =
            std::io::BufReader::new(file.try_clone().map_err(|e| {
                crate::Error::invalid(format!("audit log {}: {e}", path.display()))
            })?);
        let verified = verify(reader).map_err(|e| {
            crate::Error::invalid(format!(
                "audit log {} does not verify: {e}; refusing to append to it",
                path.display()
            ))
        })?;
        Ok(AuditLog {
            path,
            file,
            seq: verified.records,
            head: verified.head,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last record's hash.
    pub fn head(&self) -> &str {
        &self.head
    }

    /// Appends `event` (and emits it through `tracing`). Policy events are `fsync`ed
    /// before this returns.
    ///
    /// # Errors
    /// When the record cannot be written (the caller should then not act on a policy
    /// decision).
    pub fn record(&mut self, event: AuditEvent) -> std::io::Result<AuditRecord> {
        let seq = self.seq + 1;
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64)
            .unwrap_or(0);
        let hash = seal(seq, time_ms, &self.head, &event);
        let record = AuditRecord {
            seq,
            time_ms,
            prev: self.head.clone(),
            event,
            hash,
        };
        let mut line = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.flush()?;
        if record.event.is_policy() {
            self.file.sync_data()?;
        }
        self.seq = seq;
        self.head = record.hash.clone();
        tracing::info!(
            target: "strata::audit",
            seq,
            hash = %record.hash,
            event = %serde_json::to_string(&record.event).unwrap_or_default(),
            "audit record"
        );
        Ok(record)
    }
}

/// Emits `event` through `tracing` only (target `strata::audit`), for sandboxes without a
/// log file.
pub fn trace(event: &AuditEvent) {
    tracing::info!(
        target: "strata::audit",
        event = %serde_json::to_string(event).unwrap_or_default(),
        "audit event"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u32) -> AuditEvent {
        AuditEvent::Run {
            tool: format!("tool {n}"),
            backend: "process".into(),
            status: "exited 0".into(),
            agent: None,
            denials: Vec::new(),
            tier: None,
            risk: None,
            elevations: Vec::new(),
        }
    }

    fn log_of(n: u32) -> (tempfile_free::Dir, Vec<String>) {
        let dir = tempfile_free::Dir::new();
        let path = dir.0.join("audit.jsonl");
        let mut log = AuditLog::open(&path).expect("open");
        for i in 0..n {
            log.record(event(i)).expect("record");
        }
        log.record(AuditEvent::Policy {
            subject: "elevation".into(),
            decision: "granted".into(),
            detail: "fs for 1 run".into(),
        })
        .expect("policy");
        let text = std::fs::read_to_string(&path).expect("read");
        (dir, text.lines().map(str::to_string).collect())
    }

    fn check(lines: &[String]) -> Result<Verified, AuditBreak> {
        verify(std::io::Cursor::new(lines.join("\n")))
    }

    /// A private directory without the tempfile crate (sandbox-core has no dev
    /// dependencies).
    mod tempfile_free {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "strata-audit-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                std::fs::create_dir_all(&path).expect("dir");
                Dir(path)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn intact_log_verifies_and_reopens_onto_the_same_chain() {
        let (dir, lines) = log_of(4);
        let verified = check(&lines).expect("intact");
        assert_eq!(verified.records, 5);
        let mut log = AuditLog::open(dir.0.join("audit.jsonl")).expect("reopen");
        assert_eq!(log.head(), verified.head);
        log.record(event(9)).expect("append");
        let text = std::fs::read_to_string(dir.0.join("audit.jsonl")).expect("read");
        assert_eq!(
            verify(std::io::Cursor::new(text))
                .expect("still intact")
                .records,
            6
        );
    }

    #[test]
    fn tampered_record_is_named() {
        let (_dir, mut lines) = log_of(4);
        lines[2] = lines[2].replace("tool 2", "tool X");
        let err = check(&lines).expect_err("altered");
        assert_eq!(err.line, 3);
        assert_eq!(err.reason, BreakReason::Altered);
    }

    #[test]
    fn removed_record_is_named() {
        let (_dir, mut lines) = log_of(4);
        lines.remove(1);
        let err = check(&lines).expect_err("removed");
        assert_eq!(err.line, 2);
        assert!(matches!(err.reason, BreakReason::Sequence { .. }), "{err}");
    }

    #[test]
    fn reordered_records_are_named() {
        let (_dir, mut lines) = log_of(4);
        lines.swap(1, 2);
        let err = check(&lines).expect_err("reordered");
        assert_eq!(err.line, 2);
    }

    #[test]
    fn rehashed_forgery_still_breaks_the_chain() {
        // An attacker who rewrites a record and recomputes its hash breaks the next link.
        let (_dir, mut lines) = log_of(4);
        let mut record: AuditRecord = serde_json::from_str(&lines[1]).expect("parse");
        record.event = event(77);
        record.hash = record.expected_hash();
        lines[1] = serde_json::to_string(&record).expect("json");
        let err = check(&lines).expect_err("forged");
        assert_eq!(err.line, 3);
        assert_eq!(err.reason, BreakReason::Chain);
    }

    #[test]
    fn truncated_tail_is_caught_only_against_a_kept_head() {
        let (_dir, lines) = log_of(4);
        let head = check(&lines).expect("intact").head;
        let cut = &lines[..3];
        assert!(check(cut).is_ok(), "a shorter chain is still a chain");
        let err = verify_head(std::io::Cursor::new(cut.join("\n")), &head).expect_err("cut");
        assert!(matches!(err.reason, BreakReason::Head { .. }), "{err}");
    }

    #[test]
    fn appending_to_a_tampered_log_is_refused() {
        let (dir, mut lines) = log_of(2);
        lines[0] = lines[0].replace("tool 0", "tool Z");
        std::fs::write(dir.0.join("audit.jsonl"), lines.join("\n") + "\n").expect("write");
        let err = AuditLog::open(dir.0.join("audit.jsonl")).expect_err("tampered");
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}
