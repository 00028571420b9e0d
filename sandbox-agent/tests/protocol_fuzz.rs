//! The agent protocol decoder never panics and never buffers past one frame, whatever
//! bytes arrive (random, or valid frames mutated).

use proptest::prelude::*;
use sandbox_agent::protocol::{encode, AgentMsg, Decoder, HostMsg, OutStream, MAX_FRAME};

fn valid_frames() -> Vec<u8> {
    let mut wire = Vec::new();
    for msg in [
        AgentMsg::Ready {
            version: 1,
            kernel: "6.1".into(),
        },
        AgentMsg::Output {
            stream: OutStream::Stdout,
            data: b"hello\0\xff".to_vec(),
        },
        AgentMsg::Error {
            message: "x".into(),
        },
    ] {
        wire.extend(encode(&msg).expect("encode"));
    }
    wire
}

fn drain_all(bytes: &[u8], split: usize) {
    let mut host = Decoder::new();
    let mut agent = Decoder::new();
    let split = split.min(bytes.len());
    for part in [&bytes[..split], &bytes[split..]] {
        host.feed(part);
        agent.feed(part);
        // Decode until more bytes are needed or an error (then the stream is dropped).
        for _ in 0..bytes.len() + 1 {
            match host.next_msg::<AgentMsg>() {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        for _ in 0..bytes.len() + 1 {
            match agent.next_msg::<HostMsg>() {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        assert!(host.pending() <= bytes.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048), split in 0usize..2048) {
        drain_all(&bytes, split);
    }

    #[test]
    fn mutated_frames_never_panic(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..16),
        cut in any::<usize>(),
        split in any::<usize>(),
    ) {
        let mut wire = valid_frames();
        for (at, byte) in flips {
            let i = at % wire.len();
            wire[i] = byte;
        }
        wire.truncate(cut % (wire.len() + 1));
        drain_all(&wire, split);
    }

    #[test]
    fn lengths_over_the_limit_are_refused(len in (MAX_FRAME as u32 + 1)..=u32::MAX) {
        let mut d = Decoder::new();
        d.feed(&len.to_be_bytes());
        prop_assert!(d.next_msg::<HostMsg>().is_err());
    }
}
