//! A process's output, kept in a bounded ring so a client can connect later and follow it:
//! chunks of stdout and stderr in the order they were read, each with a sequence number. When
//! the ring is over its byte budget the oldest chunks go, and a reader that had not read
//! them learns how many bytes it missed.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Which output stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Bytes kept per process by default: 1 MiB (stdout and stderr together).
pub const DEFAULT_RING_BYTES: usize = 1 << 20;

/// One process's recent output; readers keep a byte offset into everything ever written.
#[derive(Debug)]
pub struct Ring {
    /// `(offset of the chunk's first byte, stream, bytes)`, oldest first.
    chunks: VecDeque<(u64, Stream, Vec<u8>)>,
    bytes: usize,
    capacity: usize,
    /// Bytes ever written.
    end: u64,
}

/// What a reader gets from [`Ring::read_from`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// Bytes that left the ring before the reader got to them.
    pub missed: u64,
    /// The chunks, oldest first.
    pub chunks: Vec<(Stream, Vec<u8>)>,
    /// The offset the reader goes on from.
    pub next: u64,
}

impl Ring {
    /// An empty ring keeping at most `capacity` bytes (at least the newest chunk).
    pub fn new(capacity: usize) -> Ring {
        Ring {
            chunks: VecDeque::new(),
            bytes: 0,
            capacity,
            end: 0,
        }
    }

    /// Appends a chunk, dropping the oldest ones beyond the capacity.
    pub fn push(&mut self, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.chunks.push_back((self.end, stream, data.to_vec()));
        self.end += data.len() as u64;
        self.bytes += data.len();
        while self.bytes > self.capacity && self.chunks.len() > 1 {
            if let Some((_, _, old)) = self.chunks.pop_front() {
                self.bytes -= old.len();
            }
        }
    }

    /// Everything from byte offset `from` on (0: from the start).
    pub fn read_from(&self, from: u64) -> Read {
        let first = self
            .chunks
            .front()
            .map_or(self.end, |(offset, _, _)| *offset);
        let mut chunks = Vec::new();
        for (offset, stream, data) in &self.chunks {
            let stop = offset + data.len() as u64;
            if stop <= from {
                continue;
            }
            let skip = usize::try_from(from.saturating_sub(*offset)).unwrap_or(usize::MAX);
            chunks.push((*stream, data[skip.min(data.len())..].to_vec()));
        }
        Read {
            missed: first.saturating_sub(from),
            chunks,
            next: self.end.max(from),
        }
    }

    /// Bytes ever written (the offset a reader that is up to date has).
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Bytes held now.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_flood_keeps_only_the_newest_bytes_and_says_what_was_missed() {
        let mut ring = Ring::new(10);
        for i in 0..100u8 {
            ring.push(Stream::Stdout, &[i; 4]);
        }
        assert!(ring.len() <= 10, "{}", ring.len());
        let read = ring.read_from(0);
        assert_eq!(read.missed, 400 - ring.len() as u64);
        assert_eq!(read.chunks.last(), Some(&(Stream::Stdout, vec![99; 4])));
        assert_eq!(read.next, 400);
    }

    #[test]
    fn a_follower_gets_only_what_is_new_in_order_across_streams() {
        let mut ring = Ring::new(1 << 10);
        ring.push(Stream::Stdout, b"a");
        ring.push(Stream::Stderr, b"b");
        let first = ring.read_from(0);
        assert_eq!(first.chunks.len(), 2);
        ring.push(Stream::Stdout, b"c");
        let second = ring.read_from(first.next);
        assert_eq!(second.chunks, vec![(Stream::Stdout, b"c".to_vec())]);
        assert_eq!(second.missed, 0);
    }
}
