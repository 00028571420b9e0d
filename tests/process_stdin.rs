//! Streaming stdin on the process backend (`RunContext::stdin`): the bytes arrive exactly,
//! a producer is held back instead of buffered, and no producer (endless, silent) keeps a
//! run alive past its timeout or leaves anything open.

mod common;

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use sha2::{Digest, Sha256};
use strata::{Caps, ErrorKind, LimitKind, RunContext, StdinSource, Tool, STDIN_BUFFER};

/// A generous outer guard: a run that should end at its 1 s timeout must end well before.
const GUARD: Duration = Duration::from_secs(20);

fn streaming(source: &Arc<StdinSource>) -> RunContext {
    RunContext {
        stdin: Some(Arc::clone(source)),
        ..RunContext::default()
    }
}

/// Writes `chunk` to the pipe until a write fails (the reading side closed); returns how
/// many bytes went in.
fn endless_producer(mut writer: File) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let chunk = vec![b'y'; 16 * 1024];
        let mut written = 0u64;
        while let Ok(n) = writer.write(&chunk) {
            written += n as u64;
        }
        written
    })
}

fn pseudo_random(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn is_nonblocking(fd: &impl AsRawFd) -> bool {
    // SAFETY: fcntl on a descriptor the caller holds open; no pointers.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0, "fcntl: {}", std::io::Error::last_os_error());
    flags & libc::O_NONBLOCK != 0
}

#[test]
fn stdin_stream_reaches_the_tool_exactly() {
    let prefix = b"caps bytes first|".to_vec();
    let data = pseudo_random(4 << 20);
    let mut expected = Sha256::new();
    expected.update(&prefix);
    expected.update(&data);
    let expected = format!("{:x}", expected.finalize());

    let (reader, mut writer) = pipe();
    let source = Arc::new(StdinSource::from_fd(reader));
    let producer = std::thread::spawn(move || writer.write_all(&data));
    let caps = Caps::new().stdin(prefix);
    let out = sandbox()
        .run_with(&Tool::command(["sha256sum"]), &caps, &streaming(&source))
        .expect("run");
    producer.join().expect("producer").expect("all written");
    let line = ok_stdout(&out);
    assert_eq!(line.split_whitespace().next(), Some(expected.as_str()));
}

#[test]
fn stdin_stream_from_endless_producer_is_held_back_and_times_out() {
    let (reader, writer) = pipe();
    let source = Arc::new(StdinSource::from_fd(reader));
    let producer = endless_producer(writer);
    let caps = Caps::new().timeout(Duration::from_secs(1));
    let start = Instant::now();
    // The tool never reads its stdin.
    let out = sandbox()
        .run_with(&Tool::command(["sleep", "100"]), &caps, &streaming(&source))
        .expect("run");
    assert!(start.elapsed() < GUARD, "took {:?}", start.elapsed());
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
    // The run closed the stream, so the producer's next write failed and it stopped.
    let written = producer.join().expect("producer");
    eprintln!("the producer got {written} bytes in");
    // What the producer got in: its own pipe, the host's buffer and the tool's pipe
    // (64 KiB each by default), never the megabytes an unbounded reader would take.
    assert!(
        written <= (STDIN_BUFFER as u64) * 8,
        "{written} bytes were taken from a producer the tool never read"
    );
}

#[test]
fn stdin_stream_from_endless_producer_into_a_reading_tool_times_out() {
    let (reader, writer) = pipe();
    let source = Arc::new(StdinSource::from_fd(reader));
    let producer = endless_producer(writer);
    let caps = Caps::new().timeout(Duration::from_secs(1));
    let start = Instant::now();
    let out = sandbox()
        .run_with(&sh("cat > /dev/null"), &caps, &streaming(&source))
        .expect("run");
    assert!(start.elapsed() < GUARD, "took {:?}", start.elapsed());
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
    let written = producer.join().expect("producer");
    assert!(written > 0, "the tool read nothing");
}

#[test]
fn silent_stdin_stream_cannot_outlive_the_timeout() {
    let (reader, writer) = pipe();
    let source = Arc::new(StdinSource::from_fd(reader));
    let caps = Caps::new().timeout(Duration::from_secs(1));
    let start = Instant::now();
    // The producer neither writes nor closes; the tool waits for input.
    let out = sandbox()
        .run_with(&Tool::command(["cat"]), &caps, &streaming(&source))
        .expect("run");
    assert!(start.elapsed() < GUARD, "took {:?}", start.elapsed());
    assert_eq!(out.limit(), Some(LimitKind::Wall), "{}", out.status);
    drop(writer);
}

#[test]
fn tool_closing_its_stdin_stops_the_stream_without_error() {
    let (reader, writer) = pipe();
    let source = Arc::new(StdinSource::from_fd(reader));
    let producer = endless_producer(writer);
    let out = sandbox()
        .run_with(
            &Tool::command(["head", "-c", "10"]),
            &Caps::new(),
            &streaming(&source),
        )
        .expect("run");
    assert_eq!(ok_stdout(&out), "y".repeat(10));
    producer.join().expect("producer");
}

#[test]
fn end_of_stream_closes_the_tools_stdin() {
    let (reader, mut writer) = pipe();
    let source = Arc::new(StdinSource::from_fd(reader));
    writer.write_all(b"one\ntwo\n").expect("write");
    drop(writer);
    let out = sandbox()
        .run_with(
            &Tool::command(["wc", "-l"]),
            &Caps::new(),
            &streaming(&source),
        )
        .expect("run");
    assert_eq!(ok_stdout(&out).trim(), "2");
}

#[test]
fn stdin_stream_feeds_one_run_and_its_blocking_mode_is_restored() {
    let (reader, mut writer) = pipe();
    let probe = reader.try_clone().expect("dup");
    let source = Arc::new(StdinSource::from_fd(reader));
    writer.write_all(b"once").expect("write");
    drop(writer);
    assert!(!is_nonblocking(&probe));
    let out = sandbox()
        .run_with(&Tool::command(["cat"]), &Caps::new(), &streaming(&source))
        .expect("run");
    assert_eq!(ok_stdout(&out), "once");
    assert!(
        !is_nonblocking(&probe),
        "O_NONBLOCK left on the caller's file description"
    );
    let err = sandbox()
        .run_with(&Tool::command(["cat"]), &Caps::new(), &streaming(&source))
        .expect_err("a used stream is refused");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("already used"), "{err}");
}

#[test]
fn refused_request_leaves_the_stream_to_the_caller() {
    let (reader, _writer) = pipe();
    let source = Arc::new(StdinSource::from_fd(reader));
    let caps = Caps::new().read_only("relative/path");
    let err = sandbox()
        .run_with(&Tool::command(["cat"]), &caps, &streaming(&source))
        .expect_err("invalid caps");
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(!source.is_taken());
}

#[test]
fn regular_file_stdin_stream_is_read_to_its_end() {
    let mut file = tempfile::tempfile().expect("tempfile");
    let data = pseudo_random(300 * 1024);
    file.write_all(&data).expect("write");
    std::io::Seek::rewind(&mut file).expect("rewind");
    let source = Arc::new(StdinSource::from_fd(file));
    let out = sandbox()
        .run_with(
            &Tool::command(["wc", "-c"]),
            &Caps::new(),
            &streaming(&source),
        )
        .expect("run");
    assert_eq!(ok_stdout(&out).trim(), data.len().to_string());
}
