//! The seccomp policy of the process sandbox, as reviewed data.
//!
//! Two filters are installed, both checking the architecture first (a syscall made through
//! another ABI, such as `int 0x80`, kills the process):
//!
//! 1. The **table** ([`ALLOWED`], [`DENIED`]), compiled to a binary search: listed
//!    syscalls pass; denied ones, which let a tool reach beyond its sandbox, fail with
//!    `EPERM`; every other syscall, including new ones the table does not know yet and
//!    x32-ABI numbers, fails with `ENOSYS` so programs fall back to older calls (glibc
//!    retries `clone3`, whose flags seccomp cannot inspect, as `clone`).
//! 2. The **argument rules** ([`DENIED_WHEN`]): `EPERM` when an argument (a namespace flag
//!    to `clone`, a terminal-injection `ioctl`, a socket family, a setuid/setgid mode, a
//!    device node, a file lease) is what makes an otherwise allowed syscall dangerous.
//!    Installed last, it is evaluated first.
//!
//! Calls whose arguments seccomp cannot inspect are left out of the table so they fail with
//! `ENOSYS` and callers fall back to a filterable one: `openat2` (its mode sits in a
//! struct; libc falls back to `openat`). Shared kernel state is refused the same way:
//! Linux AIO (`io_setup` draws on a host-wide event budget) and inotify (per-uid instance
//! limits, and watches on read-only mounts shared with the host report host activity;
//! tools fall back to polling).

use std::collections::BTreeMap;

use crate::seccomp_table;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// One allowed syscall and why the tools we run need it.
pub struct Allowed {
    /// Syscall number (x86_64).
    pub nr: i64,
    /// Name, for reviews and test output.
    pub name: &'static str,
    /// Why it is allowed.
    pub why: &'static str,
}

macro_rules! allow {
    ($($name:ident => $why:literal,)*) => {
        &[$(Allowed { nr: libc::$name as i64, name: stringify!($name), why: $why },)*]
    };
}

/// The allowlist. Everything a POSIX shell, coreutils, CPython and Node.js need, and nothing
/// that changes state outside the sandbox's own namespaces and files.
pub const ALLOWED: &[Allowed] = allow! {
    // Reading and writing open files, pipes and sockets.
    SYS_read => "read from fds",
    SYS_write => "write to fds",
    SYS_readv => "vectored read",
    SYS_writev => "vectored write",
    SYS_pread64 => "positional read",
    SYS_pwrite64 => "positional write",
    SYS_preadv => "positional vectored read",
    SYS_pwritev => "positional vectored write",
    SYS_preadv2 => "positional vectored read with flags",
    SYS_pwritev2 => "positional vectored write with flags",
    SYS_lseek => "seek",
    SYS_close => "close fds",
    SYS_close_range => "close fd ranges (posix_spawn, Python subprocess)",
    SYS_dup => "duplicate fds",
    SYS_dup2 => "duplicate fds onto a number",
    SYS_dup3 => "duplicate fds with flags",
    SYS_fcntl => "fd flags and locks (leases and directory notifications are denied separately)",
    SYS_flock => "advisory locks",
    SYS_fsync => "flush file",
    SYS_fdatasync => "flush file data",
    SYS_sync_file_range => "flush part of a file",
    SYS_ftruncate => "truncate an fd opened for writing (landlock guards the path)",
    SYS_truncate => "truncate by path (landlock checks LANDLOCK_ACCESS_FS_TRUNCATE)",
    SYS_fallocate => "preallocate file space",
    SYS_fadvise64 => "readahead hints",
    SYS_readahead => "readahead",
    SYS_sendfile => "copy between fds (cp, Python shutil)",
    SYS_copy_file_range => "copy between files (cp)",
    SYS_splice => "move data through pipes",
    SYS_tee => "duplicate pipe data",
    SYS_vmsplice => "map user pages into a pipe",
    SYS_ioctl => "terminal and fd ioctls (TIOCSTI/TIOCLINUX are denied separately)",
    // Paths and metadata; landlock and the mount namespace decide which paths exist.
    SYS_open => "open files",
    SYS_openat => "open files",
    SYS_creat => "create files",
    SYS_stat => "file status",
    SYS_fstat => "file status of an fd",
    SYS_lstat => "link status",
    SYS_newfstatat => "file status relative to a dir fd",
    SYS_statx => "extended file status",
    SYS_statfs => "filesystem status (df, Python os.statvfs)",
    SYS_fstatfs => "filesystem status of an fd",
    SYS_access => "permission check",
    SYS_faccessat => "permission check relative to a dir fd",
    SYS_faccessat2 => "permission check with flags",
    SYS_readlink => "read symlinks",
    SYS_readlinkat => "read symlinks relative to a dir fd",
    SYS_getdents => "list directories",
    SYS_getdents64 => "list directories",
    SYS_getcwd => "current directory",
    SYS_chdir => "change directory",
    SYS_fchdir => "change directory by fd",
    SYS_rename => "rename within writable mounts",
    SYS_renameat => "rename relative to dir fds",
    SYS_renameat2 => "rename with flags",
    SYS_mkdir => "create directories",
    SYS_mkdirat => "create directories relative to a dir fd",
    SYS_rmdir => "remove directories",
    SYS_unlink => "remove files",
    SYS_unlinkat => "remove files relative to a dir fd",
    SYS_link => "hard links (landlock requires REFER across dirs)",
    SYS_linkat => "hard links relative to dir fds",
    SYS_symlink => "create symlinks",
    SYS_symlinkat => "create symlinks relative to a dir fd",
    SYS_mknod => "create FIFOs and sockets (devices and set-id modes are denied separately)",
    SYS_mknodat => "create FIFOs relative to a dir fd",
    SYS_chmod => "change modes (set-id bits are denied separately)",
    SYS_fchmod => "change modes by fd",
    SYS_fchmodat => "change modes relative to a dir fd",
    SYS_fchmodat2 => "change modes with flags",
    SYS_chown => "change owner (only to the one mapped uid)",
    SYS_fchown => "change owner by fd",
    SYS_lchown => "change owner of a link",
    SYS_fchownat => "change owner relative to a dir fd",
    SYS_umask => "file creation mask",
    SYS_utime => "set file times",
    SYS_utimes => "set file times",
    SYS_utimensat => "set file times (touch)",
    SYS_futimesat => "set file times relative to a dir fd",
    SYS_getxattr => "read extended attributes (ls, cp -a)",
    SYS_lgetxattr => "read extended attributes of a link",
    SYS_fgetxattr => "read extended attributes by fd",
    SYS_listxattr => "list extended attributes",
    SYS_llistxattr => "list extended attributes of a link",
    SYS_flistxattr => "list extended attributes by fd",
    SYS_setxattr => "write extended attributes in writable mounts",
    SYS_lsetxattr => "write extended attributes of a link",
    SYS_fsetxattr => "write extended attributes by fd",
    SYS_removexattr => "remove extended attributes",
    SYS_lremovexattr => "remove extended attributes of a link",
    SYS_fremovexattr => "remove extended attributes by fd",
    // Memory.
    SYS_brk => "heap",
    SYS_mmap => "map memory and files",
    SYS_munmap => "unmap memory",
    SYS_mprotect => "change protections (JITs: V8, CPython perf maps)",
    SYS_mremap => "grow mappings",
    SYS_madvise => "memory hints (allocators)",
    SYS_msync => "flush mapped files",
    SYS_mincore => "page residency (allocators)",
    SYS_mlock => "lock memory (bounded by RLIMIT_MEMLOCK)",
    SYS_mlock2 => "lock memory",
    SYS_munlock => "unlock memory",
    SYS_mlockall => "lock all memory (bounded by RLIMIT_MEMLOCK)",
    SYS_munlockall => "unlock all memory",
    SYS_membarrier => "memory barriers (V8, liburcu)",
    SYS_memfd_create => "anonymous files (memfd exec is refused by vm.memfd_noexec=2)",
    SYS_mseal => "seal mappings (glibc 2.41+)",
    SYS_get_mempolicy => "NUMA policy query (libnuma, OpenBLAS)",
    SYS_set_mempolicy => "NUMA policy of own memory",
    SYS_mbind => "NUMA policy of own ranges",
    SYS_pkey_alloc => "memory protection keys (V8)",
    SYS_pkey_free => "memory protection keys",
    SYS_pkey_mprotect => "memory protection keys",
    // Processes and threads inside the sandbox's pid namespace.
    SYS_fork => "fork",
    SYS_vfork => "vfork (posix_spawn)",
    SYS_clone => "threads and processes (namespace flags are denied separately)",
    SYS_execve => "run programs landlock allows executing",
    SYS_execveat => "run programs by fd",
    SYS_exit => "thread exit",
    SYS_exit_group => "process exit",
    SYS_wait4 => "reap children",
    SYS_waitid => "reap children",
    SYS_kill => "signal own processes (pid namespace + landlock signal scope)",
    SYS_tkill => "signal own threads",
    SYS_tgkill => "signal own threads",
    SYS_getpid => "own pid",
    SYS_getppid => "parent pid",
    SYS_gettid => "thread id",
    SYS_getpgid => "process group",
    SYS_setpgid => "job control in shells",
    SYS_getpgrp => "process group",
    SYS_getsid => "session id",
    SYS_setsid => "new session (daemonizing tools)",
    SYS_getuid => "own uid",
    SYS_geteuid => "effective uid",
    SYS_getgid => "own gid",
    SYS_getegid => "effective gid",
    SYS_getresuid => "uids",
    SYS_getresgid => "gids",
    SYS_getgroups => "supplementary groups",
    SYS_setuid => "setuid to the only mapped uid (no-op)",
    SYS_setgid => "setgid to the only mapped gid (no-op)",
    SYS_setreuid => "as setuid",
    SYS_setregid => "as setgid",
    SYS_setresuid => "as setuid",
    SYS_setresgid => "as setgid",
    SYS_setfsuid => "as setuid",
    SYS_setfsgid => "as setgid",
    SYS_personality => "query the execution domain (changing it is denied separately)",
    SYS_capget => "read capabilities (all empty)",
    SYS_capset => "drop capabilities (there are none to raise)",
    SYS_prctl => "process attributes (names, no_new_privs, dumpable)",
    SYS_arch_prctl => "thread-local storage setup",
    SYS_set_tid_address => "thread startup",
    SYS_set_robust_list => "thread startup",
    SYS_get_robust_list => "thread introspection",
    SYS_rseq => "restartable sequences (glibc)",
    SYS_futex => "locks and thread joins",
    SYS_futex_waitv => "vectored futex wait",
    SYS_sched_yield => "yield",
    SYS_sched_getaffinity => "CPU count (os.cpu_count, nproc)",
    SYS_sched_setaffinity => "pin own threads",
    SYS_sched_getparam => "scheduling query",
    SYS_sched_setparam => "own scheduling (no privilege to raise)",
    SYS_sched_getscheduler => "scheduling query",
    SYS_sched_setscheduler => "own scheduling (no privilege to raise)",
    SYS_sched_getattr => "scheduling query",
    SYS_sched_setattr => "own scheduling",
    SYS_sched_get_priority_max => "scheduling query",
    SYS_sched_get_priority_min => "scheduling query",
    SYS_sched_rr_get_interval => "scheduling query",
    SYS_getpriority => "nice value",
    SYS_setpriority => "lower own priority",
    SYS_ioprio_get => "I/O priority",
    SYS_ioprio_set => "lower own I/O priority",
    SYS_getcpu => "current CPU",
    SYS_pidfd_open => "process handles for own children",
    SYS_pidfd_send_signal => "signal own children by handle",
    SYS_seccomp => "tools may restrict themselves further",
    SYS_landlock_create_ruleset => "tools may restrict themselves further",
    SYS_landlock_add_rule => "tools may restrict themselves further",
    SYS_landlock_restrict_self => "tools may restrict themselves further",
    // Signals and time.
    SYS_rt_sigaction => "signal handlers",
    SYS_rt_sigprocmask => "signal masks",
    SYS_rt_sigreturn => "return from handlers",
    SYS_rt_sigsuspend => "wait for signals",
    SYS_rt_sigpending => "pending signals",
    SYS_rt_sigtimedwait => "wait for signals",
    SYS_rt_sigqueueinfo => "queue signals to own processes",
    SYS_rt_tgsigqueueinfo => "queue signals to own threads",
    SYS_sigaltstack => "alternate signal stacks (Rust, Go, CPython faulthandler)",
    SYS_pause => "wait for a signal",
    SYS_alarm => "timers",
    SYS_setitimer => "timers",
    SYS_getitimer => "timers",
    SYS_timer_create => "POSIX timers",
    SYS_timer_settime => "POSIX timers",
    SYS_timer_gettime => "POSIX timers",
    SYS_timer_getoverrun => "POSIX timers",
    SYS_timer_delete => "POSIX timers",
    SYS_timerfd_create => "timer fds (event loops)",
    SYS_timerfd_settime => "timer fds",
    SYS_timerfd_gettime => "timer fds",
    SYS_nanosleep => "sleep",
    SYS_clock_nanosleep => "sleep",
    SYS_clock_gettime => "clocks",
    SYS_clock_getres => "clocks",
    SYS_gettimeofday => "clocks",
    SYS_time => "clocks",
    SYS_times => "process times",
    SYS_getrusage => "resource usage",
    SYS_getrlimit => "read limits",
    SYS_setrlimit => "lower limits (raising needs CAP_SYS_RESOURCE)",
    SYS_prlimit64 => "read or lower limits",
    SYS_uname => "system name (hostname is the sandbox's)",
    SYS_sysinfo => "memory and uptime",
    SYS_getrandom => "randomness",
    SYS_restart_syscall => "restart after signals",
    // Event loops.
    SYS_poll => "wait on fds",
    SYS_ppoll => "wait on fds",
    SYS_select => "wait on fds",
    SYS_pselect6 => "wait on fds",
    SYS_epoll_create => "event loops",
    SYS_epoll_create1 => "event loops",
    SYS_epoll_ctl => "event loops",
    SYS_epoll_wait => "event loops",
    SYS_epoll_pwait => "event loops",
    SYS_epoll_pwait2 => "event loops",
    SYS_eventfd => "event notification",
    SYS_eventfd2 => "event notification",
    SYS_signalfd => "signal fds",
    SYS_signalfd4 => "signal fds",
    // Pipes and sockets; the network namespace decides what they reach.
    SYS_pipe => "pipes",
    SYS_pipe2 => "pipes",
    SYS_socket => "sockets (families other than unix, inet, inet6 and netlink-route are denied)",
    SYS_socketpair => "connected socket pairs",
    SYS_bind => "bind (inside the sandbox's own network namespace)",
    SYS_listen => "listen",
    SYS_accept => "accept",
    SYS_accept4 => "accept",
    SYS_connect => "connect (the network namespace decides what is reachable)",
    SYS_getsockname => "socket address",
    SYS_getpeername => "peer address",
    SYS_sendto => "send",
    SYS_recvfrom => "receive",
    SYS_sendmsg => "send with ancillary data",
    SYS_recvmsg => "receive with ancillary data",
    SYS_sendmmsg => "batched send",
    SYS_recvmmsg => "batched receive",
    SYS_shutdown => "half-close",
    SYS_setsockopt => "socket options",
    SYS_getsockopt => "socket options",
    // IPC inside the sandbox's own IPC namespace.
    SYS_shmget => "SysV shared memory (private IPC namespace)",
    SYS_shmat => "SysV shared memory",
    SYS_shmdt => "SysV shared memory",
    SYS_shmctl => "SysV shared memory",
    SYS_semget => "SysV semaphores (private IPC namespace)",
    SYS_semop => "SysV semaphores",
    SYS_semtimedop => "SysV semaphores",
    SYS_semctl => "SysV semaphores",
    SYS_msgget => "SysV queues (private IPC namespace)",
    SYS_msgsnd => "SysV queues",
    SYS_msgrcv => "SysV queues",
    SYS_msgctl => "SysV queues",
    SYS_mq_open => "POSIX queues (private IPC namespace)",
    SYS_mq_unlink => "POSIX queues",
    SYS_mq_timedsend => "POSIX queues",
    SYS_mq_timedreceive => "POSIX queues",
    SYS_mq_notify => "POSIX queues",
    SYS_mq_getsetattr => "POSIX queues",
};

/// One denied syscall and the escape it blocks.
pub struct Denied {
    /// Syscall number (x86_64).
    pub nr: i64,
    /// Name.
    pub name: &'static str,
    /// What it would let a tool do.
    pub why: &'static str,
}

macro_rules! deny {
    ($($name:ident => $why:literal,)*) => {
        &[$(Denied { nr: libc::$name as i64, name: stringify!($name), why: $why },)*]
    };
}

/// Syscalls that fail with `EPERM` whatever their arguments.
pub const DENIED: &[Denied] = deny! {
    SYS_ptrace => "inspect or control other processes",
    SYS_process_vm_readv => "read another process's memory",
    SYS_process_vm_writev => "write another process's memory",
    SYS_process_madvise => "advise on another process's memory",
    SYS_process_mrelease => "reap another process's memory",
    SYS_pidfd_getfd => "steal fds from another process",
    SYS_kcmp => "compare kernel objects of other processes",
    SYS_mount => "change the mount table",
    SYS_umount2 => "unmount and reveal what is under the sandbox's mounts",
    SYS_pivot_root => "change the root",
    SYS_chroot => "change the root",
    SYS_open_tree => "clone mount trees",
    SYS_move_mount => "move mounts",
    SYS_fsopen => "create filesystems",
    SYS_fsconfig => "configure filesystems",
    SYS_fsmount => "mount filesystems",
    SYS_fspick => "reconfigure filesystems",
    SYS_mount_setattr => "change mount flags (read-only)",
    SYS_unshare => "create namespaces (nested sandboxes widen kernel attack surface)",
    SYS_setns => "join other namespaces",
    SYS_open_by_handle_at => "open files by handle, bypassing paths (shocker)",
    SYS_name_to_handle_at => "learn file handles",
    SYS_bpf => "load eBPF programs",
    SYS_perf_event_open => "performance counters (side channels, kernel attack surface)",
    SYS_userfaultfd => "pause the kernel on page faults (exploit primitive)",
    SYS_io_uring_setup => "io_uring bypasses seccomp for the operations it performs",
    SYS_io_uring_enter => "io_uring",
    SYS_io_uring_register => "io_uring",
    SYS_keyctl => "kernel keyrings are not namespaced",
    SYS_add_key => "kernel keyrings",
    SYS_request_key => "kernel keyrings",
    SYS_fanotify_init => "watch the whole filesystem",
    SYS_fanotify_mark => "watch the whole filesystem",
    SYS_init_module => "load kernel modules",
    SYS_finit_module => "load kernel modules",
    SYS_delete_module => "unload kernel modules",
    SYS_kexec_load => "replace the kernel",
    SYS_kexec_file_load => "replace the kernel",
    SYS_reboot => "reboot",
    SYS_swapon => "enable swap",
    SYS_swapoff => "disable swap",
    SYS_syslog => "read the kernel log",
    SYS_acct => "process accounting",
    SYS_quotactl => "disk quotas",
    SYS_quotactl_fd => "disk quotas",
    SYS_settimeofday => "set the host clock",
    SYS_clock_settime => "set the host clock",
    SYS_clock_adjtime => "adjust the host clock",
    SYS_adjtimex => "adjust the host clock",
    SYS_iopl => "raw I/O port access",
    SYS_ioperm => "raw I/O port access",
    SYS_modify_ldt => "16-bit segments (exploit primitive)",
    SYS_lookup_dcookie => "kernel profiling",
    SYS_vhangup => "hang up terminals",
    SYS_uselib => "legacy library loading",
    SYS_migrate_pages => "move another process's pages",
    SYS_move_pages => "move another process's pages",
    SYS_memfd_secret => "memory hidden from the kernel's own checks",
    SYS_set_mempolicy_home_node => "NUMA policy (not needed)",
};

/// A conditional denial: the syscall fails with `EPERM` only when one of the argument
/// conditions holds.
pub struct DeniedWhen {
    /// Syscall number.
    pub nr: i64,
    /// Name.
    pub name: &'static str,
    /// What the denied form would do.
    pub why: &'static str,
    /// Alternative rules (any matching one denies); each is a list of
    /// `(arg index, op, value)` that must all hold.
    pub rules: &'static [&'static [(u8, Cmp, u64)]],
}

/// Argument comparisons used by [`DENIED_WHEN`].
#[derive(Clone, Copy, Debug)]
pub enum Cmp {
    /// `(arg & mask) == mask` (the flag is set).
    HasBits,
    /// `arg == value` (low 32 bits).
    Eq32,
    /// `arg != value` (low 32 bits).
    Ne32,
}

const CLONE_NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

const S_ISUID: u64 = libc::S_ISUID as u64;
const S_ISGID: u64 = libc::S_ISGID as u64;
const O_CREAT: u64 = libc::O_CREAT as u64;
/// `O_TMPFILE` includes `O_DIRECTORY`; both bits are set on a real `O_TMPFILE` open.
const O_TMPFILE: u64 = libc::O_TMPFILE as u64;
/// The bit shared by `S_IFCHR` and `S_IFBLK` (and the invalid `S_IFLNK`) but not by
/// `S_IFIFO`, `S_IFSOCK` or `S_IFREG`.
const S_IFCHR_BIT: u64 = libc::S_IFCHR as u64;

/// Mode argument 1 carries a set-id bit.
const SETID_MODE_ARG1: &[&[(u8, Cmp, u64)]] =
    &[&[(1, Cmp::HasBits, S_ISUID)], &[(1, Cmp::HasBits, S_ISGID)]];
/// Mode argument 2 carries a set-id bit.
const SETID_MODE_ARG2: &[&[(u8, Cmp, u64)]] =
    &[&[(2, Cmp::HasBits, S_ISUID)], &[(2, Cmp::HasBits, S_ISGID)]];

/// Conditional denials.
pub const DENIED_WHEN: &[DeniedWhen] = &[
    DeniedWhen {
        nr: libc::SYS_clone,
        name: "SYS_clone",
        why: "clone with a namespace flag creates nested namespaces",
        rules: &[
            &[(0, Cmp::HasBits, CLONE_NS_FLAGS[0])],
            &[(0, Cmp::HasBits, CLONE_NS_FLAGS[1])],
            &[(0, Cmp::HasBits, CLONE_NS_FLAGS[2])],
            &[(0, Cmp::HasBits, CLONE_NS_FLAGS[3])],
            &[(0, Cmp::HasBits, CLONE_NS_FLAGS[4])],
            &[(0, Cmp::HasBits, CLONE_NS_FLAGS[5])],
            &[(0, Cmp::HasBits, CLONE_NS_FLAGS[6])],
        ],
    },
    DeniedWhen {
        nr: libc::SYS_ioctl,
        name: "SYS_ioctl",
        why: "TIOCSTI/TIOCLINUX inject input into a terminal the host reads",
        rules: &[&[(1, Cmp::Eq32, libc::TIOCSTI)], &[(1, Cmp::Eq32, libc::TIOCLINUX)]],
    },
    DeniedWhen {
        nr: libc::SYS_socket,
        name: "SYS_socket",
        why: "socket families beyond unix/inet/inet6/netlink (packet, vsock, alg, bluetooth...) reach kernel code and devices",
        rules: &[
            &[
                (0, Cmp::Ne32, libc::AF_UNIX as u64),
                (0, Cmp::Ne32, libc::AF_INET as u64),
                (0, Cmp::Ne32, libc::AF_INET6 as u64),
                (0, Cmp::Ne32, libc::AF_NETLINK as u64),
            ],
            &[
                (0, Cmp::Eq32, libc::AF_NETLINK as u64),
                (2, Cmp::Ne32, libc::NETLINK_ROUTE as u64),
            ],
        ],
    },
    DeniedWhen {
        nr: libc::SYS_chmod,
        name: "SYS_chmod",
        why: "a setuid/setgid mode plants a privilege in a writable grant",
        rules: SETID_MODE_ARG1,
    },
    DeniedWhen {
        nr: libc::SYS_fchmod,
        name: "SYS_fchmod",
        why: "a setuid/setgid mode plants a privilege in a writable grant",
        rules: SETID_MODE_ARG1,
    },
    DeniedWhen {
        nr: libc::SYS_fchmodat,
        name: "SYS_fchmodat",
        why: "a setuid/setgid mode plants a privilege in a writable grant",
        rules: SETID_MODE_ARG2,
    },
    DeniedWhen {
        nr: libc::SYS_fchmodat2,
        name: "SYS_fchmodat2",
        why: "a setuid/setgid mode plants a privilege in a writable grant",
        rules: SETID_MODE_ARG2,
    },
    DeniedWhen {
        nr: libc::SYS_creat,
        name: "SYS_creat",
        why: "creating a file with a setuid/setgid mode plants a privilege",
        rules: SETID_MODE_ARG1,
    },
    DeniedWhen {
        nr: libc::SYS_open,
        name: "SYS_open",
        why: "O_CREAT/O_TMPFILE with a setuid/setgid mode plants a privilege",
        rules: &[
            &[(1, Cmp::HasBits, O_CREAT), (2, Cmp::HasBits, S_ISUID)],
            &[(1, Cmp::HasBits, O_CREAT), (2, Cmp::HasBits, S_ISGID)],
            &[(1, Cmp::HasBits, O_TMPFILE), (2, Cmp::HasBits, S_ISUID)],
            &[(1, Cmp::HasBits, O_TMPFILE), (2, Cmp::HasBits, S_ISGID)],
        ],
    },
    DeniedWhen {
        nr: libc::SYS_openat,
        name: "SYS_openat",
        why: "O_CREAT/O_TMPFILE with a setuid/setgid mode plants a privilege",
        rules: &[
            &[(2, Cmp::HasBits, O_CREAT), (3, Cmp::HasBits, S_ISUID)],
            &[(2, Cmp::HasBits, O_CREAT), (3, Cmp::HasBits, S_ISGID)],
            &[(2, Cmp::HasBits, O_TMPFILE), (3, Cmp::HasBits, S_ISUID)],
            &[(2, Cmp::HasBits, O_TMPFILE), (3, Cmp::HasBits, S_ISGID)],
        ],
    },
    DeniedWhen {
        nr: libc::SYS_mkdir,
        name: "SYS_mkdir",
        why: "a setuid/setgid directory mode is refused like a file's",
        rules: SETID_MODE_ARG1,
    },
    DeniedWhen {
        nr: libc::SYS_mkdirat,
        name: "SYS_mkdirat",
        why: "a setuid/setgid directory mode is refused like a file's",
        rules: SETID_MODE_ARG2,
    },
    DeniedWhen {
        nr: libc::SYS_mknod,
        name: "SYS_mknod",
        why: "device nodes, and regular files created with a setuid/setgid mode",
        rules: &[
            &[(1, Cmp::HasBits, S_ISUID)],
            &[(1, Cmp::HasBits, S_ISGID)],
            &[(1, Cmp::HasBits, S_IFCHR_BIT)],
        ],
    },
    DeniedWhen {
        nr: libc::SYS_mknodat,
        name: "SYS_mknodat",
        why: "device nodes, and regular files created with a setuid/setgid mode",
        rules: &[
            &[(2, Cmp::HasBits, S_ISUID)],
            &[(2, Cmp::HasBits, S_ISGID)],
            &[(2, Cmp::HasBits, S_IFCHR_BIT)],
        ],
    },
    DeniedWhen {
        nr: libc::SYS_fcntl,
        name: "SYS_fcntl",
        why: "a lease blocks host writers of a granted file; F_NOTIFY reports host activity on shared mounts",
        rules: &[
            &[(1, Cmp::Eq32, libc::F_SETLEASE as u64)],
            &[(1, Cmp::Eq32, libc::F_NOTIFY as u64)],
        ],
    },
    DeniedWhen {
        nr: libc::SYS_personality,
        name: "SYS_personality",
        why: "personality flags such as ADDR_NO_RANDOMIZE weaken exploit mitigations",
        rules: &[&[(0, Cmp::Ne32, 0), (0, Cmp::Ne32, 0xffff_ffff)]],
    },
];

/// Errors building the filters.
pub type BuildError = seccompiler::BackendError;

fn condition(arg: u8, cmp: Cmp, value: u64) -> Result<SeccompCondition, BuildError> {
    match cmp {
        Cmp::HasBits => SeccompCondition::new(
            arg,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(value),
            value,
        ),
        Cmp::Eq32 => SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value),
        Cmp::Ne32 => SeccompCondition::new(arg, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, value),
    }
}

/// The syscall table as (number, action) pairs: allowed syscalls `SECCOMP_RET_ALLOW`,
/// denied ones `EPERM`.
pub fn table() -> Vec<(u32, u32)> {
    let allowed = ALLOWED
        .iter()
        .map(|a| (a.nr as u32, seccomp_table::RET_ALLOW));
    let denied = DENIED
        .iter()
        .map(|d| (d.nr as u32, seccomp_table::RET_ERRNO | libc::EPERM as u32));
    allowed.chain(denied).collect()
}

/// Builds the two BPF programs. Pure: nothing is installed.
///
/// 1. The table filter (binary search, the private `seccomp_table`): architecture check, then
///    allowed / `EPERM` / default `ENOSYS`.
/// 2. The argument filter (seccompiler): [`DENIED_WHEN`] rules fail with `EPERM`,
///    everything else passes to the table's verdict.
pub fn build() -> Result<[BpfProgram; 2], BuildError> {
    let table_filter =
        seccomp_table::compile(&table(), seccomp_table::RET_ERRNO | libc::ENOSYS as u32);
    let mut deny: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for when in DENIED_WHEN {
        let rules = when
            .rules
            .iter()
            .map(|conds| {
                let conds = conds
                    .iter()
                    .map(|(arg, cmp, value)| condition(*arg, *cmp, *value))
                    .collect::<Result<Vec<_>, _>>()?;
                SeccompRule::new(conds)
            })
            .collect::<Result<Vec<_>, _>>()?;
        deny.insert(when.nr, rules);
    }
    let argument_filter = SeccompFilter::new(
        deny,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )?;
    Ok([table_filter, argument_filter.try_into()?])
}

/// Installs both filters on the calling thread (inherited by children), the table first so
/// the argument filter, installed last and evaluated first, decides for argument rules.
/// Requires `no_new_privs` or CAP_SYS_ADMIN.
pub fn install(programs: &[BpfProgram; 2]) -> Result<(), seccompiler::Error> {
    for program in programs {
        seccompiler::apply_filter(program)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn filters_compile() {
        let [allow, deny] = build().expect("build");
        assert!(
            allow.len() > ALLOWED.len(),
            "one jump per allowed syscall at least"
        );
        assert!(!deny.is_empty());
    }

    #[test]
    fn no_syscall_is_both_allowed_and_unconditionally_denied() {
        let denied: HashSet<i64> = DENIED.iter().map(|d| d.nr).collect();
        for a in ALLOWED {
            assert!(!denied.contains(&a.nr), "{} is on both lists", a.name);
        }
    }

    #[test]
    fn every_rule_says_why_and_appears_once() {
        let mut seen = HashSet::new();
        for (name, nr, why) in ALLOWED
            .iter()
            .map(|a| (a.name, a.nr, a.why))
            .chain(DENIED.iter().map(|d| (d.name, d.nr, d.why)))
        {
            assert!(why.len() > 3, "{name} needs a reason");
            assert!(seen.insert(nr), "{name} is listed twice");
        }
        for when in DENIED_WHEN {
            assert!(
                !when.rules.is_empty() && when.why.len() > 3,
                "{}",
                when.name
            );
            assert!(
                ALLOWED.iter().any(|a| a.nr == when.nr),
                "{} is conditionally denied, so its safe form must be allowed",
                when.name
            );
        }
    }

    #[test]
    fn the_dangerous_classics_are_denied() {
        let names: HashSet<&str> = DENIED.iter().map(|d| d.name).collect();
        for must in [
            "SYS_ptrace",
            "SYS_mount",
            "SYS_unshare",
            "SYS_setns",
            "SYS_bpf",
            "SYS_keyctl",
            "SYS_io_uring_setup",
            "SYS_userfaultfd",
            "SYS_open_by_handle_at",
            "SYS_perf_event_open",
            "SYS_kexec_load",
            "SYS_init_module",
        ] {
            assert!(names.contains(must), "{must} must be denied");
        }
    }
}
