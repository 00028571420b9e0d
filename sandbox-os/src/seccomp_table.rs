//! Compiles the syscall table (allowed / denied / default) into a classic-BPF program that
//! finds a syscall by binary search.
//!
//! seccompiler emits one linear chain per syscall, which is right for argument rules but
//! costs O(n) per syscall; the kernel evaluates the filter for every syscall number when
//! the filter is installed (to build its allow cache), so a 280-entry linear allowlist took
//! ~1.7 ms to install. A binary search makes that O(log n): the same table installs in a
//! fraction of the time and every syscall the tool makes is cheaper to check. Argument
//! rules stay in seccompiler ([`crate::seccomp::DENIED_WHEN`]).

use seccompiler::sock_filter;

/// `struct seccomp_data` offsets.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// `AUDIT_ARCH_X86_64`.
pub const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
/// The x32 ABI marks its syscall numbers with this bit.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `SECCOMP_RET_*` actions.
pub const RET_KILL_PROCESS: u32 = 0x8000_0000;
/// Allow the syscall.
pub const RET_ALLOW: u32 = 0x7fff_0000;
/// Fail the syscall with an errno (OR the errno in).
pub const RET_ERRNO: u32 = 0x0005_0000;

// Classic BPF opcodes (class | size/op | mode/source).
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JMP_JA: u16 = 0x05; // BPF_JMP | BPF_JA
const BPF_JMP_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JMP_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// Largest number of entries searched linearly at a leaf.
const LEAF: usize = 4;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Builds the program: kill on a foreign architecture, `default` for x32 numbers, then a
/// binary search over `table` (syscall number, action) with `default` for misses.
/// `table` must not contain duplicates.
pub fn compile(table: &[(u32, u32)], default: u32) -> Vec<sock_filter> {
    let mut sorted = table.to_vec();
    sorted.sort_unstable_by_key(|(nr, _)| *nr);
    let mut prog = vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFFSET_NR),
        jump(BPF_JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, default),
    ];
    emit(&sorted, default, &mut prog);
    prog
}

fn emit(entries: &[(u32, u32)], default: u32, prog: &mut Vec<sock_filter>) {
    if entries.len() <= LEAF {
        for (nr, action) in entries {
            prog.push(jump(BPF_JMP_JEQ_K, *nr, 0, 1));
            prog.push(stmt(BPF_RET_K, *action));
        }
        prog.push(stmt(BPF_RET_K, default));
        return;
    }
    let mid = entries.len() / 2;
    // if nr >= pivot goto right (via a JA with a 32-bit offset) else fall into left.
    prog.push(jump(BPF_JMP_JGE_K, entries[mid].0, 0, 1));
    let ja = prog.len();
    prog.push(stmt(BPF_JMP_JA, 0));
    emit(&entries[..mid], default, prog);
    let right = prog.len();
    prog[ja].k = (right - ja - 1) as u32;
    emit(&entries[mid..], default, prog);
}

/// Runs `prog` on a syscall the way the kernel does (only the opcodes [`compile`] emits).
/// Used by tests to check the compiled table against its source, entry by entry.
#[cfg(test)]
pub fn evaluate(prog: &[sock_filter], arch: u32, nr: u32) -> Option<u32> {
    let mut acc = 0u32;
    let mut pc = 0usize;
    while let Some(ins) = prog.get(pc) {
        pc += 1;
        match ins.code {
            BPF_LD_W_ABS => {
                acc = match ins.k {
                    OFFSET_NR => nr,
                    OFFSET_ARCH => arch,
                    _ => return None,
                }
            }
            BPF_JMP_JA => pc += ins.k as usize,
            BPF_JMP_JEQ_K => pc += usize::from(if acc == ins.k { ins.jt } else { ins.jf }),
            BPF_JMP_JGE_K => pc += usize::from(if acc >= ins.k { ins.jt } else { ins.jf }),
            BPF_RET_K => return Some(ins.k),
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_gets_its_table_action_and_misses_get_the_default() {
        let default = RET_ERRNO | 38;
        let table: Vec<(u32, u32)> = (0..600u32)
            .filter(|n| !n.is_multiple_of(3))
            .map(|n| {
                (
                    n,
                    if n.is_multiple_of(7) {
                        RET_ERRNO | 1
                    } else {
                        RET_ALLOW
                    },
                )
            })
            .collect();
        let prog = compile(&table, default);
        for nr in 0..700u32 {
            let expected = table
                .iter()
                .find(|(n, _)| *n == nr)
                .map_or(default, |(_, a)| *a);
            assert_eq!(
                evaluate(&prog, AUDIT_ARCH_X86_64, nr),
                Some(expected),
                "nr {nr}"
            );
            assert_eq!(
                evaluate(&prog, AUDIT_ARCH_X86_64, nr | X32_SYSCALL_BIT),
                Some(default),
                "x32 nr {nr}"
            );
        }
        assert_eq!(
            evaluate(&prog, 0x4000_0003, 1),
            Some(RET_KILL_PROCESS),
            "i386 is killed"
        );
    }

    #[test]
    fn search_is_logarithmic() {
        let table: Vec<(u32, u32)> = (0..512u32).map(|n| (n, RET_ALLOW)).collect();
        let prog = compile(&table, RET_ERRNO);
        assert!(prog.len() < 3 * table.len(), "{} instructions", prog.len());
        // The deepest path: count executed instructions for the last entry.
        let mut steps = 0;
        let mut pc = 0usize;
        let mut acc = 0u32;
        while let Some(ins) = prog.get(pc) {
            steps += 1;
            pc += 1;
            match ins.code {
                BPF_LD_W_ABS => {
                    acc = if ins.k == OFFSET_ARCH {
                        AUDIT_ARCH_X86_64
                    } else {
                        511
                    }
                }
                BPF_JMP_JA => pc += ins.k as usize,
                BPF_JMP_JEQ_K => pc += usize::from(if acc == ins.k { ins.jt } else { ins.jf }),
                BPF_JMP_JGE_K => pc += usize::from(if acc >= ins.k { ins.jt } else { ins.jf }),
                _ => break,
            }
        }
        assert!(steps < 40, "{steps} steps to reach the last syscall");
    }

    #[test]
    fn empty_table_returns_default() {
        let prog = compile(&[], RET_ALLOW);
        assert_eq!(evaluate(&prog, AUDIT_ARCH_X86_64, 0), Some(RET_ALLOW));
    }
}
