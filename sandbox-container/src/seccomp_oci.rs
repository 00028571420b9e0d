//! The process sandbox's seccomp policy as an OCI/Docker seccomp profile, for the engine
//! runtimes (passed as `--security-opt seccomp=<json>`), so a Docker or Podman container
//! gets the same allowlist, and in particular cannot create set-id files or device nodes.
//!
//! The table (`ALLOWED`, `DENIED` of `sandbox_os::backend_api::seccomp`) carries over as is.
//! The argument rules cannot: libseccomp profiles allow a syscall when one of its argument
//! forms matches, so each conditionally denied syscall is listed by its *safe* forms
//! ([`SAFE_FORMS`]); a call in any other form gets the default `ENOSYS`. A unit test checks
//! these forms against `DENIED_WHEN` over many argument values.
//! `ioctl` and `fcntl` stay fully allowed here (an engine container's stdio is never the
//! host's terminal; a lease needs ownership of the file or `CAP_LEASE`, which engine
//! containers do not have for files they did not create).

use sandbox_os::backend_api::seccomp::{ALLOWED, DENIED, DENIED_WHEN};
use serde_json::{json, Value};

/// One argument comparison of an allowed form: `(index, op, value, value_two)` in the
/// profile's terms (`SCMP_CMP_MASKED_EQ` compares `arg & value == value_two`).
type Arg = (u32, &'static str, u64, u64);

const MASKED_EQ: &str = "SCMP_CMP_MASKED_EQ";
const EQ: &str = "SCMP_CMP_EQ";
const SETID: u64 = (libc::S_ISUID | libc::S_ISGID) as u64;
/// `__O_TMPFILE` (`O_TMPFILE` without `O_DIRECTORY`).
const O_TMPFILE_BIT: u64 = 0o20_000_000;
const CREATES: u64 = libc::O_CREAT as u64 | O_TMPFILE_BIT;
/// Set-id bits and the bit shared by character and block devices.
const SETID_OR_DEVICE: u64 = SETID | libc::S_IFCHR as u64;
const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP) as u64;

/// The allowed forms of each conditionally denied syscall: any one form (all of its
/// comparisons) allows the call.
pub const SAFE_FORMS: &[(&str, &[&[Arg]])] = &[
    ("clone", &[&[(0, MASKED_EQ, NAMESPACE_FLAGS, 0)]]),
    ("chmod", &[&[(1, MASKED_EQ, SETID, 0)]]),
    ("fchmod", &[&[(1, MASKED_EQ, SETID, 0)]]),
    ("fchmodat", &[&[(2, MASKED_EQ, SETID, 0)]]),
    ("fchmodat2", &[&[(2, MASKED_EQ, SETID, 0)]]),
    ("creat", &[&[(1, MASKED_EQ, SETID, 0)]]),
    ("mkdir", &[&[(1, MASKED_EQ, SETID, 0)]]),
    ("mkdirat", &[&[(2, MASKED_EQ, SETID, 0)]]),
    ("mknod", &[&[(1, MASKED_EQ, SETID_OR_DEVICE, 0)]]),
    ("mknodat", &[&[(2, MASKED_EQ, SETID_OR_DEVICE, 0)]]),
    (
        "open",
        &[&[(1, MASKED_EQ, CREATES, 0)], &[(2, MASKED_EQ, SETID, 0)]],
    ),
    (
        "openat",
        &[&[(2, MASKED_EQ, CREATES, 0)], &[(3, MASKED_EQ, SETID, 0)]],
    ),
    (
        "socket",
        &[
            &[(0, EQ, libc::AF_UNIX as u64, 0)],
            &[(0, EQ, libc::AF_INET as u64, 0)],
            &[(0, EQ, libc::AF_INET6 as u64, 0)],
            &[
                (0, EQ, libc::AF_NETLINK as u64, 0),
                (2, EQ, libc::NETLINK_ROUTE as u64, 0),
            ],
        ],
    ),
    (
        "personality",
        &[&[(0, EQ, 0, 0)], &[(0, EQ, 0xffff_ffff, 0)]],
    ),
];

/// Syscalls of [`DENIED_WHEN`] that the profile allows in every form (see the module doc).
const FULLY_ALLOWED: [&str; 2] = ["ioctl", "fcntl"];

fn name(syscall: &str) -> &str {
    syscall.strip_prefix("SYS_").unwrap_or(syscall)
}

/// The profile, as the JSON the engine takes.
pub fn profile() -> Value {
    let conditional: Vec<&str> = DENIED_WHEN.iter().map(|d| name(d.name)).collect();
    let plain: Vec<&str> = ALLOWED
        .iter()
        .map(|a| name(a.name))
        .filter(|n| !conditional.contains(n) || FULLY_ALLOWED.contains(n))
        .collect();
    let denied: Vec<&str> = DENIED.iter().map(|d| name(d.name)).collect();
    let mut syscalls = vec![
        json!({"names": plain, "action": "SCMP_ACT_ALLOW"}),
        json!({"names": denied, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM}),
    ];
    for (syscall, forms) in SAFE_FORMS {
        for form in *forms {
            let args: Vec<Value> = form
                .iter()
                .map(|(index, op, value, two)| {
                    json!({"index": index, "value": value, "valueTwo": two, "op": op})
                })
                .collect();
            syscalls.push(json!({"names": [syscall], "action": "SCMP_ACT_ALLOW", "args": args}));
        }
    }
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": libc::ENOSYS,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": syscalls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_os::backend_api::seccomp::Cmp;

    /// Whether the process backend's argument rules deny `nr` with `args`.
    fn process_denies(syscall: &str, args: [u64; 6]) -> bool {
        DENIED_WHEN
            .iter()
            .filter(|d| name(d.name) == syscall)
            .flat_map(|d| d.rules.iter())
            .any(|rule| {
                rule.iter().all(|(i, cmp, v)| {
                    let a = args[usize::from(*i)];
                    match cmp {
                        Cmp::HasBits => a & v == *v,
                        Cmp::Eq32 => a as u32 == *v as u32,
                        Cmp::Ne32 => a as u32 != *v as u32,
                    }
                })
            })
    }

    fn profile_allows(syscall: &str, args: [u64; 6]) -> bool {
        let (_, forms) = SAFE_FORMS
            .iter()
            .find(|(n, _)| *n == syscall)
            .expect("listed");
        forms.iter().any(|form| {
            form.iter().all(|(i, op, v, two)| {
                let a = args[*i as usize];
                match *op {
                    MASKED_EQ => a & v == *two,
                    EQ => a == *v,
                    _ => false,
                }
            })
        })
    }

    #[test]
    fn safe_forms_match_the_process_rules() {
        let modes: Vec<u64> = (0..0o200_000u64)
            .step_by(0o111)
            .chain([
                0o4755, 0o2755, 0o6755, 0o20644, 0o60644, 0o10644, 0o140644, 0o100644,
            ])
            .collect();
        let flags = [
            0u64,
            libc::O_CREAT as u64,
            libc::O_CREAT as u64 | libc::O_WRONLY as u64,
            libc::O_TMPFILE as u64 | libc::O_RDWR as u64,
            libc::O_RDONLY as u64,
            libc::O_DIRECTORY as u64,
        ];
        for (syscall, _) in SAFE_FORMS {
            for &mode in &modes {
                for &flag in &flags {
                    let args = match *syscall {
                        "open" => [0, flag, mode, 0, 0, 0],
                        "openat" => [0, 0, flag, mode, 0, 0],
                        "chmod" | "fchmod" | "creat" | "mkdir" | "mknod" => [0, mode, 0, 0, 0, 0],
                        "fchmodat" | "fchmodat2" | "mkdirat" | "mknodat" => [0, 0, mode, 0, 0, 0],
                        "clone" => [mode << 13, 0, 0, 0, 0, 0],
                        "socket" => [mode % 48, 0, flag % 17, 0, 0, 0],
                        "personality" => [
                            if mode == 0 { 0xffff_ffff } else { mode % 3 },
                            0,
                            0,
                            0,
                            0,
                            0,
                        ],
                        other => panic!("no argument model for {other}"),
                    };
                    assert_eq!(
                        profile_allows(syscall, args),
                        !process_denies(syscall, args),
                        "{syscall} {args:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_conditional_syscall_has_safe_forms_or_is_fully_allowed() {
        for d in DENIED_WHEN {
            let n = name(d.name);
            assert!(
                SAFE_FORMS.iter().any(|(s, _)| *s == n) || FULLY_ALLOWED.contains(&n),
                "{n}"
            );
        }
    }

    #[test]
    fn profile_lists_every_table_entry_once() {
        let p = profile();
        let mut seen = std::collections::HashSet::new();
        for entry in p["syscalls"].as_array().expect("syscalls") {
            if entry.get("args").is_some() {
                continue;
            }
            for n in entry["names"].as_array().expect("names") {
                assert!(
                    seen.insert(n.as_str().expect("name").to_string()),
                    "{n} twice"
                );
            }
        }
        assert!(seen.contains("read") && seen.contains("ptrace") && !seen.contains("chmod"));
    }
}
