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
//!
//! Several writers may share one log: handles in one process, and processes (four
//! `strata run --audit F` at once). Each append holds an exclusive lock on the file
//! ([`std::fs::File::lock`]: `flock` on Unix, `LockFileEx` on Windows; advisory, so only
//! writers that lock are ordered: every [`AuditLog`] does), reads and verifies what other
//! writers appended since this handle last read (their chain must continue from the head
//! this handle knows), then continues the chain from the new head. So records never share
//! a `seq` and the log verifies after any number of parallel appends. Opening takes a
//! shared lock while it verifies, so it never reads a record half-written.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
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
    /// An exec in a live sandbox started, was refused, or ended.
    Exec {
        /// The live sandbox's id.
        sandbox: String,
        /// The command line, arguments joined by spaces, at most [`EXEC_COMMAND_BYTES`]
        /// bytes (a longer one ends with its length and SHA-256: see [`exec_command`]).
        command: String,
        /// The exec's pid inside the sandbox, once it started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<i32>,
        /// `started`, `exited 0`, `signaled 9`, `timed out`, or `refused: REASON`.
        status: String,
        /// The agent the sandbox acts for, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
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

/// How much of an exec's command line an [`AuditEvent::Exec`] keeps: 1 KiB.
pub const EXEC_COMMAND_BYTES: usize = 1024;

/// `argv` as an [`AuditEvent::Exec`] records it: the arguments joined by spaces; a line
/// over [`EXEC_COMMAND_BYTES`] is cut there (at a character boundary) and ends with
/// `... (N bytes, sha256 HEX)` of the whole line, so a long script passed with `-c` is
/// identified without filling the log.
pub fn exec_command(argv: &[String]) -> String {
    let line = argv.join(" ");
    if line.len() <= EXEC_COMMAND_BYTES {
        return line;
    }
    let mut cut = EXEC_COMMAND_BYTES;
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    let digest = Sha256::digest(line.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}... ({} bytes, sha256 {hex})", &line[..cut], line.len())
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

/// Why the audit log file did not verify: it could not be read, or its chain is broken.
/// Both display as `audit log PATH: why`.
#[derive(Debug)]
pub enum AuditFileError {
    /// The file could not be opened.
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The chain does not verify.
    Broken {
        /// The file.
        path: std::path::PathBuf,
        /// The first record that does not fit.
        broken: AuditBreak,
    },
}

impl fmt::Display for AuditFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuditFileError::Io { path, source } => {
                write!(f, "audit log {}: {source}", path.display())
            }
            AuditFileError::Broken { path, broken } => {
                write!(f, "audit log {}: {broken}", path.display())
            }
        }
    }
}

impl std::error::Error for AuditFileError {}

/// Checks the log in the file `path`: the whole chain, and that it ends at `head` when given
/// ([`verify_head`]). The one check the CLI and both bindings run.
///
/// # Errors
/// [`AuditFileError::Io`] when the file cannot be opened, [`AuditFileError::Broken`] naming
/// the first record that does not fit.
pub fn verify_file(path: &std::path::Path, head: Option<&str>) -> Result<Verified, AuditFileError> {
    let file = std::fs::File::open(path).map_err(|source| AuditFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let reader = std::io::BufReader::new(file);
    match head {
        Some(head) => verify_head(reader, head),
        None => verify(reader),
    }
    .map_err(|broken| AuditFileError::Broken {
        path: path.to_path_buf(),
        broken,
    })
}

/// Checks a whole log.
///
/// # Errors
/// The first record that does not fit ([`AuditBreak`]); I/O errors as
/// [`BreakReason::Malformed`].
pub fn verify(reader: impl BufRead) -> Result<Verified, AuditBreak> {
    let start = Verified {
        records: 0,
        head: GENESIS.to_string(),
    };
    walk(reader, start, false).map(|(verified, _)| verified)
}

/// Checks the records `reader` holds as the continuation of a chain that ends at `start`
/// (their first `seq` is `start.records + 1`, their first `prev` is `start.head`; lines
/// are numbered from `start.records + 1`). Returns the new end of the chain and the bytes
/// read. With `whole_lines`, a last record without its newline is refused as malformed (a
/// writer stopped in the middle of it; appending after it would merge two records).
fn walk(
    mut reader: impl BufRead,
    start: Verified,
    whole_lines: bool,
) -> Result<(Verified, u64), AuditBreak> {
    let Verified {
        mut records,
        mut head,
    } = start;
    let mut bytes = 0u64;
    let mut line = Vec::new();
    loop {
        line.clear();
        let line_no = records + 1;
        let malformed = |why: String| AuditBreak {
            line: line_no,
            reason: BreakReason::Malformed(why),
        };
        let read = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| malformed(e.to_string()))?;
        if read == 0 {
            break;
        }
        bytes += read as u64;
        match line.last() {
            Some(b'\n') => {
                line.pop();
            }
            _ if whole_lines => {
                return Err(malformed(
                    "the record is incomplete (no newline): a writer stopped in the middle of it"
                        .into(),
                ))
            }
            _ => {}
        }
        let record: AuditRecord =
            serde_json::from_slice(&line).map_err(|e| malformed(e.to_string()))?;
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
    Ok((Verified { records, head }, bytes))
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

/// An append-only audit log file. Any number of handles, in any number of processes, may
/// append to the same file (see the module docs).
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: File,
    /// The chain this handle has verified (or written).
    chain: Verified,
    /// Bytes of the file that chain takes up (the next unread byte).
    len: u64,
}

/// A lock on a whole file, released when dropped.
struct FileLock<'a>(&'a File);

impl<'a> FileLock<'a> {
    /// Waits for the exclusive lock (appending).
    fn exclusive(file: &'a File) -> std::io::Result<FileLock<'a>> {
        file.lock()?;
        Ok(FileLock(file))
    }

    /// Waits for a shared lock (reading: no append is under way).
    fn shared(file: &'a File) -> std::io::Result<FileLock<'a>> {
        file.lock_shared()?;
        Ok(FileLock(file))
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too; an unlock error leaves nothing to do.
        let _ = self.0.unlock();
    }
}

impl AuditLog {
    /// Opens (or creates, mode 0600) the log at `path` and verifies what it holds, so new
    /// records continue an intact chain. Waits while another writer is appending.
    ///
    /// # Errors
    /// [`crate::Error::InvalidRequest`] when the existing log does not verify (naming the
    /// first bad record; a last record without its newline counts) or cannot be opened or
    /// locked.
    pub fn open(path: impl Into<PathBuf>) -> crate::Result<AuditLog> {
        let path = path.into();
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true).read(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let cannot =
            |e: std::io::Error| crate::Error::invalid(format!("audit log {}: {e}", path.display()));
        let file = options.open(&path).map_err(cannot)?;
        let start = Verified {
            records: 0,
            head: GENESIS.to_string(),
        };
        let lock = FileLock::shared(&file).map_err(cannot)?;
        let read = read_from(&file, 0, start);
        drop(lock);
        let (chain, len) = read.map_err(|e| match e {
            ReadError::Io(e) => cannot(e),
            ReadError::Break(e) => crate::Error::invalid(format!(
                "audit log {} does not verify: {e}; refusing to append to it",
                path.display()
            )),
        })?;
        Ok(AuditLog {
            path,
            file,
            chain,
            len,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last record's hash, as of this handle's last open or append (other writers may
    /// have appended since).
    pub fn head(&self) -> &str {
        &self.chain.head
    }

    /// Appends `event` (and emits it through `tracing`): under the file's exclusive lock,
    /// first verifies the records other writers appended since this handle last read, then
    /// writes the next record of the chain. Policy events are `fsync`ed before this
    /// returns.
    ///
    /// # Errors
    /// When the lock cannot be taken, when what other writers appended does not continue
    /// the chain ([`std::io::ErrorKind::InvalidData`], naming the first bad record; nothing
    /// is appended), or when the record cannot be written (the caller should then not act
    /// on a policy decision).
    pub fn record(&mut self, event: AuditEvent) -> std::io::Result<AuditRecord> {
        let _lock = FileLock::exclusive(&self.file)?;
        catch_up(&self.file, &self.path, &mut self.chain, &mut self.len)?;
        let seq = self.chain.records + 1;
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64)
            .unwrap_or(0);
        let hash = seal(seq, time_ms, &self.chain.head, &event);
        let record = AuditRecord {
            seq,
            time_ms,
            prev: self.chain.head.clone(),
            event,
            hash,
        };
        let mut line = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        // One write of a whole line, at the end (append mode), under the lock. If it fails
        // half-way, the next append (by anyone) finds an incomplete record and refuses.
        (&self.file).write_all(&line)?;
        (&self.file).flush()?;
        if record.event.is_policy() {
            self.file.sync_data()?;
        }
        self.chain = Verified {
            records: seq,
            head: record.hash.clone(),
        };
        self.len += line.len() as u64;
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

/// Reads and verifies what other writers appended to `file` after byte `len` (called with
/// the exclusive lock held), moving `chain` and `len` to the end of the file.
fn catch_up(file: &File, path: &Path, chain: &mut Verified, len: &mut u64) -> std::io::Result<()> {
    let size = file.metadata()?.len();
    if size < *len {
        return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "audit log {} shrank from {} to {size} bytes since this handle read it: records were cut off; refusing to append",
                    path.display(),
                    *len
                ),
            ));
    }
    if size == *len {
        return Ok(());
    }
    let (verified, read) =
            read_from(file, *len, chain.clone()).map_err(|e| match e {
                ReadError::Io(e) => e,
                ReadError::Break(e) => std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "audit log {}: what another writer appended does not verify: {e}; refusing to append",
                        path.display()
                    ),
                ),
            })?;
    *chain = verified;
    *len += read;
    Ok(())
}

/// Why the unread part of a log could not be taken in.
enum ReadError {
    Io(std::io::Error),
    Break(AuditBreak),
}

/// Verifies the records of `file` from byte `offset` to its end as the continuation of
/// `start`; the new end of the chain and the bytes read. Records must end in a newline.
fn read_from(mut file: &File, offset: u64, start: Verified) -> Result<(Verified, u64), ReadError> {
    file.seek(SeekFrom::Start(offset)).map_err(ReadError::Io)?;
    walk(BufReader::new(file), start, true).map_err(ReadError::Break)
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

    /// The `seq` of every line of the log at `path`.
    fn seqs(path: &Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .expect("read")
            .lines()
            .map(|l| serde_json::from_str::<AuditRecord>(l).expect("record").seq)
            .collect()
    }

    #[test]
    fn parallel_appends_from_separate_handles_never_share_a_seq() {
        // Each thread opens its own handle (its own open file description, so the file
        // lock orders them as it orders separate processes), and every handle opens
        // before any writes: all of them start from the same, soon stale, head.
        const WRITERS: u32 = 4;
        const EACH: u32 = 25;
        let dir = tempfile_free::Dir::new();
        let path = dir.0.join("audit.jsonl");
        let handles: Vec<AuditLog> = (0..WRITERS)
            .map(|_| AuditLog::open(&path).expect("open"))
            .collect();
        let start = std::sync::Arc::new(std::sync::Barrier::new(WRITERS as usize));
        let threads: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(w, mut log)| {
                let start = std::sync::Arc::clone(&start);
                std::thread::spawn(move || {
                    start.wait();
                    for i in 0..EACH {
                        let n = w as u32 * 1000 + i;
                        // Policy events too, so some appends fsync while others wait.
                        let event = if i.is_multiple_of(5) {
                            AuditEvent::Policy {
                                subject: "elevation".into(),
                                decision: "granted".into(),
                                detail: format!("writer {w} event {n}"),
                            }
                        } else {
                            event(n)
                        };
                        log.record(event).expect("append");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("writer");
        }
        let total = u64::from(WRITERS * EACH);
        let file = std::fs::File::open(&path).expect("open");
        let verified = verify(std::io::BufReader::new(file)).expect("the log verifies");
        assert_eq!(verified.records, total);
        assert_eq!(seqs(&path), (1..=total).collect::<Vec<_>>());
        // A handle that last read long ago still continues the chain.
        let mut late = AuditLog::open(&path).expect("reopen");
        AuditLog::open(&path)
            .expect("another")
            .record(event(1))
            .expect("append");
        late.record(event(2)).expect("append after another writer");
        assert_eq!(seqs(&path).last(), Some(&(total + 2)));
        let file = std::fs::File::open(&path).expect("open");
        assert_eq!(
            verify(std::io::BufReader::new(file))
                .expect("verifies")
                .records,
            total + 2
        );
    }

    #[test]
    fn a_record_another_writer_appended_out_of_chain_refuses_the_append() {
        let (dir, _) = log_of(2);
        let path = dir.0.join("audit.jsonl");
        let mut log = AuditLog::open(&path).expect("open");
        // Another writer (without the lock, or a forger) appends a record that does not
        // continue the chain: a well-formed, self-consistent record with a wrong `prev`.
        let mut forged = AuditRecord {
            seq: 4,
            time_ms: 1,
            prev: GENESIS.to_string(),
            event: event(66),
            hash: String::new(),
        };
        forged.hash = forged.expected_hash();
        let mut text = std::fs::read_to_string(&path).expect("read");
        text.push_str(&serde_json::to_string(&forged).expect("json"));
        text.push('\n');
        std::fs::write(&path, &text).expect("append forged");
        let err = log.record(event(3)).expect_err("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("another writer"), "{err}");
        assert!(err.to_string().contains("line 4"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
    }

    #[test]
    fn a_record_cut_short_by_a_crashed_writer_refuses_later_appends() {
        let (dir, _) = log_of(2);
        let path = dir.0.join("audit.jsonl");
        let mut log = AuditLog::open(&path).expect("open");
        let mut text = std::fs::read_to_string(&path).expect("read");
        text.push_str("{\"seq\":4,\"time_ms\"");
        std::fs::write(&path, &text).expect("half a record");
        let err = log.record(event(3)).expect_err("refused");
        assert!(err.to_string().contains("line 4"), "{err}");
        let err = AuditLog::open(&path).expect_err("refused on open too");
        assert!(err.to_string().contains("incomplete"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
    }

    #[test]
    fn a_log_cut_short_under_an_open_handle_refuses_the_append() {
        let (dir, lines) = log_of(3);
        let path = dir.0.join("audit.jsonl");
        let mut log = AuditLog::open(&path).expect("open");
        std::fs::write(&path, lines[..2].join("\n") + "\n").expect("cut");
        let err = log.record(event(9)).expect_err("refused");
        assert!(err.to_string().contains("cut off"), "{err}");
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
