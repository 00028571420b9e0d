//! The guest's initramfs as booted: the agent binary as a small uncompressed cpio (newc)
//! segment, followed by the base archive `scripts/build-vm-guest.sh` built.
//!
//! Linux unpacks concatenated cpio segments (compressed or not) into one root, so the agent
//! is replaced without rebuilding the base archive.

use std::io::{self, Write};

/// Where `/init` of the base archive expects the agent.
pub const AGENT_PATH: &str = "strata-guest-agent";

/// One cpio newc archive holding `name` (a regular file in `/`, mode 0755, owner root) with
/// `data`, padded to a 512-byte multiple so the next segment starts aligned.
///
/// # Errors
/// When `data` is 4 GiB or larger (newc sizes are 32-bit).
pub fn agent_segment(name: &str, data: &[u8]) -> io::Result<Vec<u8>> {
    let size = u32::try_from(data.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "agent binary too large"))?;
    let mut out = Vec::with_capacity(data.len() + 1024);
    entry(&mut out, 1, name, 0o100755, data, size)?;
    entry(&mut out, 0, "TRAILER!!!", 0, &[], 0)?;
    while out.len() % 512 != 0 {
        out.push(0);
    }
    Ok(out)
}

fn entry(
    out: &mut Vec<u8>,
    ino: u32,
    name: &str,
    mode: u32,
    data: &[u8],
    size: u32,
) -> io::Result<()> {
    let namesize = name.len() + 1;
    // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor, rdevmajor,
    // rdevminor, namesize, check
    write!(
        out,
        "070701{ino:08x}{mode:08x}{:08x}{:08x}{:08x}{:08x}{size:08x}{:08x}{:08x}{:08x}{:08x}{namesize:08x}{:08x}",
        0,
        0,
        1,
        0,
        0,
        0,
        0,
        0,
        0
    )?;
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
    Ok(())
}

fn pad4(out: &mut Vec<u8>) {
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout_is_aligned_and_terminated() {
        let seg = agent_segment(AGENT_PATH, b"#!/bin/sh\n").expect("segment");
        assert!(seg.starts_with(b"070701"));
        assert_eq!(seg.len() % 512, 0);
        let text = String::from_utf8_lossy(&seg);
        assert!(text.contains("strata-guest-agent\0"));
        assert!(text.contains("TRAILER!!!\0"));
        // The header is 110 bytes; name + NUL padded to 4 from the header start.
        let data_at = (110 + AGENT_PATH.len() + 1).div_ceil(4) * 4;
        assert_eq!(&seg[data_at..data_at + 10], b"#!/bin/sh\n");
    }
}
