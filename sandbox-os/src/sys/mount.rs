//! The mount syscalls: `mount`, `umount2`, `pivot_root`, `openat2`, and the new mount API
//! (`open_tree`, `move_mount`, `mount_setattr`, `fsopen`/`fsconfig`/`fsmount`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::ptr;

use super::{check, check_long, cstring};

/// `mount(2)` with optional source, fstype and data.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let target = cstring(target)?;
    let to_c = |s: Option<&str>| {
        s.map(|s| {
            CString::new(s)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in mount argument"))
        })
        .transpose()
    };
    let source = to_c(source)?;
    let fstype = to_c(fstype)?;
    let data = to_c(data)?;
    let ptr_or_null = |c: &Option<CString>| c.as_ref().map_or(ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is NUL-terminated or null, as mount(2) accepts.
    check(unsafe {
        libc::mount(
            ptr_or_null(&source),
            target.as_ptr(),
            ptr_or_null(&fstype),
            flags,
            ptr_or_null(&data).cast(),
        )
    })
    .map(drop)
}

/// `umount2(target, flags)`.
pub fn umount(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = cstring(target)?;
    // SAFETY: NUL-terminated path.
    check(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

/// `pivot_root(new_root, put_old)`.
pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let new_root = cstring(new_root)?;
    let put_old = cstring(put_old)?;
    // SAFETY: NUL-terminated paths.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// `openat2(dirfd, path, flags, resolve)` returning an owned fd.
pub fn openat2(dirfd: RawFd, path: &Path, flags: u64, resolve: u64) -> io::Result<OwnedFd> {
    let path = cstring(path)?;
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags,
        mode: 0,
        resolve,
    };
    // SAFETY: `how` is a valid open_how of the size passed; the path is NUL-terminated.
    let fd = check_long(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `open_tree(dirfd, path, flags)`: a detached clone of a mount tree when
/// `OPEN_TREE_CLONE` is set.
pub fn open_tree(dirfd: RawFd, path: &CStr, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: NUL-terminated path; integer arguments.
    let fd =
        check_long(unsafe { libc::syscall(libc::SYS_open_tree, dirfd, path.as_ptr(), flags) })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `move_mount(from_fd, "", to_fd, "", F_EMPTY_PATH | T_EMPTY_PATH)`: attaches the detached
/// tree `from` onto the directory or file `to`.
pub fn move_mount_fd(from: RawFd, to: RawFd) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    let empty = c"";
    // SAFETY: empty NUL-terminated paths with the EMPTY_PATH flags; integer fds.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from,
            empty.as_ptr(),
            to,
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), attr)`.
pub fn mount_setattr(fd: RawFd, recursive: bool, attr_set: u64, attr_clr: u64) -> io::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
        attr_set,
        attr_clr,
        propagation: 0,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `attr` is a valid mount_attr of the size passed; empty NUL-terminated path.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd,
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Creates a detached tmpfs with the given mount options (`fsopen` + `fsconfig` +
/// `fsmount`).
pub fn detached_tmpfs(options: &[(&str, &str)], attrs: u64) -> io::Result<OwnedFd> {
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    // SAFETY: NUL-terminated fs name; flags integer.
    let fs = check_long(unsafe {
        libc::syscall(
            libc::SYS_fsopen,
            c"tmpfs".as_ptr(),
            1, /* FSOPEN_CLOEXEC */
        )
    })?;
    // SAFETY: fresh fd from the kernel.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
    for (key, value) in options {
        let key = CString::new(*key).map_err(io::Error::other)?;
        let value = CString::new(*value).map_err(io::Error::other)?;
        // SAFETY: NUL-terminated key and value strings.
        check_long(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        })?;
    }
    // SAFETY: integer arguments with null key/value as FSCONFIG_CMD_CREATE requires.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            ptr::null::<libc::c_char>(),
            ptr::null::<libc::c_void>(),
            0,
        )
    })?;
    // SAFETY: integer arguments.
    let mnt = check_long(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            1, /* FSMOUNT_CLOEXEC */
            attrs,
        )
    })?;
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(mnt as RawFd) })
}
