//! The disk and file-size quota for writable preopens. wasmtime has none of its own, so the
//! WASI functions that add bytes to files are wrapped: preview 1 `fd_write`, `fd_pwrite`,
//! `fd_filestat_set_size`, and preview 2 `descriptor.write`, `descriptor.set-size`,
//! `descriptor.write-via-stream` and `descriptor.append-via-stream` (whose streams are
//! wrapped in turn).
//!
//! Semantics: `disk` caps the bytes written into files during the run (data written plus
//! growth by `set-size`; overwrites count, deletions do not refund) plus [`ENTRY_COST`] for
//! every file, directory, symbolic link or hard link the run creates (preview 1
//! `path_open` with `O_CREAT` of a new file, `path_create_directory`, `path_symlink`,
//! `path_link`; preview 2 `open-at` creating, `create-directory-at`, `symlink-at`,
//! `link-at`), so a flood of empty entries or long link targets, which take disk blocks
//! without a byte written, is held to the same limit; `file_size` caps the size any write
//! may give a file. A refused write fails with `ENOSPC` / `EFBIG`
//! (`insufficient-space` / `file-too-large`) and is recorded, so a run that then fails is
//! reported as ending at the disk or file-size limit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use wasmtime::component::Resource;
use wasmtime::{AsContextMut, Caller, Extern, Linker, StoreContextMut};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemView};
use wasmtime_wasi::p1::types as p1t;
use wasmtime_wasi::p1::wasi_snapshot_preview1::{self as p1, WasiSnapshotPreview1};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, ErrorCode, HostDescriptor, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::{DynOutputStream, OutputStream, Pollable, StreamError, StreamResult};
use wiggle::GuestMemory;

use crate::state::State;

/// The wasi:filesystem/types instance wasmtime-wasi defines (its bundled WIT version).
pub(crate) const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// What creating one directory entry (file, directory, link) costs against the disk
/// limit: one block, which is what a directory or a link target up to 4 KiB takes.
pub(crate) const ENTRY_COST: u64 = 4096;

/// Which quota refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Disk,
    FileSize,
}

/// Bytes written into files during one run, against the disk and file-size limits.
#[derive(Debug)]
pub(crate) struct DiskMeter {
    disk_limit: u64,
    file_limit: u64,
    written: AtomicU64,
    disk_refused: AtomicBool,
    file_refused: AtomicBool,
}

impl DiskMeter {
    pub(crate) fn new(disk_limit: u64, file_limit: u64) -> Self {
        DiskMeter {
            disk_limit,
            file_limit,
            written: AtomicU64::new(0),
            disk_refused: AtomicBool::new(false),
            file_refused: AtomicBool::new(false),
        }
    }

    /// Reserves `len` bytes of a write that leaves the file `new_end` bytes long.
    pub(crate) fn admit(&self, len: u64, new_end: u64) -> Result<(), Refusal> {
        if new_end > self.file_limit {
            self.file_refused.store(true, Ordering::SeqCst);
            return Err(Refusal::FileSize);
        }
        let mut current = self.written.load(Ordering::SeqCst);
        loop {
            let next = current.saturating_add(len);
            if next > self.disk_limit {
                self.disk_refused.store(true, Ordering::SeqCst);
                return Err(Refusal::Disk);
            }
            match self
                .written
                .compare_exchange(current, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Ok(()),
                Err(actual) => current = actual,
            }
        }
    }

    /// Reserves [`ENTRY_COST`] for an entry about to be created.
    pub(crate) fn admit_entry(&self) -> Result<(), Refusal> {
        self.admit(ENTRY_COST, 0)
    }

    /// Returns the part of a reservation that was not written.
    pub(crate) fn refund(&self, len: u64) {
        let _ = self
            .written
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                Some(w.saturating_sub(len))
            });
    }

    /// Bytes written so far.
    #[cfg(test)]
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    /// The refusals seen (disk, file size).
    pub(crate) fn refused(&self) -> (bool, bool) {
        (
            self.disk_refused.load(Ordering::SeqCst),
            self.file_refused.load(Ordering::SeqCst),
        )
    }
}

fn errno(code: p1t::Errno) -> i32 {
    code as i32
}

fn p1_refusal(r: Refusal) -> i32 {
    errno(match r {
        Refusal::Disk => p1t::Errno::Nospc,
        Refusal::FileSize => p1t::Errno::Fbig,
    })
}

fn p2_refusal(r: Refusal) -> ErrorCode {
    match r {
        Refusal::Disk => ErrorCode::InsufficientSpace,
        Refusal::FileSize => ErrorCode::FileTooLarge,
    }
}

fn io_refusal(r: Refusal) -> std::io::Error {
    std::io::Error::from(match r {
        Refusal::Disk => rustix::io::Errno::NOSPC,
        Refusal::FileSize => rustix::io::Errno::FBIG,
    })
}

// ---------------------------------------------------------------------------------------
// WASI preview 1
// ---------------------------------------------------------------------------------------

/// Length of the first non-empty buffer of a `ciovec` array, which is all wasmtime's
/// `fd_write` writes per call. `None` when the array is out of bounds (the real
/// implementation then reports the fault).
fn first_iovec_len(mem: &[u8], iovs: i32, count: i32) -> Option<u64> {
    let base = usize::try_from(iovs as u32).ok()?;
    for i in 0..usize::try_from(count as u32).ok()? {
        let at = base.checked_add(i.checked_mul(8)?)?;
        let entry = mem.get(at..at.checked_add(8)?)?;
        let len = u32::from_le_bytes([entry[4], entry[5], entry[6], entry[7]]);
        if len != 0 {
            return Some(u64::from(len));
        }
    }
    Some(0)
}

/// For a write of `len` bytes to `fd` at `offset` (or the cursor): the file end after the
/// write, when `fd` is a regular file.
async fn p1_file_end(
    wasi: &mut wasmtime_wasi::p1::WasiP1Ctx,
    mem: &mut GuestMemory<'_>,
    fd: i32,
    len: u64,
    offset: Option<u64>,
) -> Option<u64> {
    let fd = p1t::Fd::from(fd as u32);
    let stat = wasi.fd_filestat_get(mem, fd).await.ok()?;
    if stat.filetype != p1t::Filetype::RegularFile {
        return None;
    }
    let start = match offset {
        Some(offset) => offset,
        None => {
            let flags = wasi.fd_fdstat_get(mem, fd).await.ok()?.fs_flags;
            if flags.contains(p1t::Fdflags::APPEND) {
                stat.size
            } else {
                wasi.fd_tell(mem, fd).ok()?
            }
        }
    };
    Some(stat.size.max(start.saturating_add(len)))
}

fn memory_of(caller: &mut Caller<'_, State>) -> Option<wasmtime::Memory> {
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => Some(m),
        _ => None,
    }
}

/// Shared body of `fd_write` and `fd_pwrite`.
async fn p1_write(
    mut caller: Caller<'_, State>,
    fd: i32,
    iovs: i32,
    count: i32,
    offset: Option<i64>,
    result_ptr: i32,
) -> wasmtime::Result<i32> {
    let Some(memory) = memory_of(&mut caller) else {
        wasmtime::bail!("missing required memory export");
    };
    let fuel = caller.as_context_mut().hostcall_fuel();
    let (mem, state) = memory.data_and_store_mut(&mut caller);
    // As wasmtime-wasi's own wrappers do: the budget for host-side copies of this call.
    state.wasi.set_hostcall_fuel(fuel);
    let len = first_iovec_len(mem, iovs, count);
    let meter = Arc::clone(&state.meter);
    let mut gm = GuestMemory::Unshared(mem);
    let mut reserved = 0;
    if let Some(len) = len.filter(|l| *l > 0) {
        let at = offset.map(|o| o as u64);
        if let Some(end) = p1_file_end(&mut state.wasi, &mut gm, fd, len, at).await {
            if let Err(refusal) = meter.admit(len, end) {
                return Ok(p1_refusal(refusal));
            }
            reserved = len;
        }
    }
    let rc = match offset {
        None => p1::fd_write(&mut state.wasi, &mut gm, fd, iovs, count, result_ptr).await?,
        Some(off) => {
            p1::fd_pwrite(&mut state.wasi, &mut gm, fd, iovs, count, off, result_ptr).await?
        }
    };
    if reserved > 0 {
        let written = if rc == 0 {
            let at = usize::try_from(result_ptr as u32).unwrap_or(usize::MAX);
            let mem = memory.data(&caller);
            mem.get(at..at.saturating_add(4))
                .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .unwrap_or(0)
        } else {
            0
        };
        meter.refund(reserved.saturating_sub(written));
    }
    Ok(rc)
}

async fn p1_set_size(mut caller: Caller<'_, State>, fd: i32, size: i64) -> wasmtime::Result<i32> {
    let Some(memory) = memory_of(&mut caller) else {
        wasmtime::bail!("missing required memory export");
    };
    let fuel = caller.as_context_mut().hostcall_fuel();
    let (mem, state) = memory.data_and_store_mut(&mut caller);
    state.wasi.set_hostcall_fuel(fuel);
    let meter = Arc::clone(&state.meter);
    let mut gm = GuestMemory::Unshared(mem);
    let size = size as u64;
    let mut reserved = 0;
    if let Ok(stat) = state
        .wasi
        .fd_filestat_get(&mut gm, p1t::Fd::from(fd as u32))
        .await
    {
        if stat.filetype == p1t::Filetype::RegularFile && size > stat.size {
            reserved = size - stat.size;
            if let Err(refusal) = meter.admit(reserved, size) {
                return Ok(p1_refusal(refusal));
            }
        }
    }
    let rc = p1::fd_filestat_set_size(&mut state.wasi, &mut gm, fd, size as i64).await?;
    if rc != 0 {
        meter.refund(reserved);
    }
    Ok(rc)
}

/// Which preview 1 call creates an entry.
enum P1Create {
    Dir {
        fd: i32,
        path: (i32, i32),
    },
    Symlink {
        old: (i32, i32),
        fd: i32,
        new: (i32, i32),
    },
    Link {
        old_fd: i32,
        flags: i32,
        old: (i32, i32),
        new_fd: i32,
        new: (i32, i32),
    },
}

/// `path_create_directory`, `path_symlink` and `path_link`, each charged [`ENTRY_COST`]
/// before it runs (refunded when it fails).
async fn p1_create(mut caller: Caller<'_, State>, call: P1Create) -> wasmtime::Result<i32> {
    let Some(memory) = memory_of(&mut caller) else {
        wasmtime::bail!("missing required memory export");
    };
    let fuel = caller.as_context_mut().hostcall_fuel();
    let (mem, state) = memory.data_and_store_mut(&mut caller);
    state.wasi.set_hostcall_fuel(fuel);
    let meter = Arc::clone(&state.meter);
    if let Err(refusal) = meter.admit_entry() {
        return Ok(p1_refusal(refusal));
    }
    let mut gm = GuestMemory::Unshared(mem);
    let wasi = &mut state.wasi;
    let rc = match call {
        P1Create::Dir { fd, path } => {
            p1::path_create_directory(wasi, &mut gm, fd, path.0, path.1).await?
        }
        P1Create::Symlink { old, fd, new } => {
            p1::path_symlink(wasi, &mut gm, old.0, old.1, fd, new.0, new.1).await?
        }
        P1Create::Link {
            old_fd,
            flags,
            old,
            new_fd,
            new,
        } => {
            p1::path_link(
                wasi, &mut gm, old_fd, flags, old.0, old.1, new_fd, new.0, new.1,
            )
            .await?
        }
    };
    if rc != 0 {
        meter.refund(ENTRY_COST);
    }
    Ok(rc)
}

/// `path_open`: with `O_CREAT` on a path that does not exist yet, charged [`ENTRY_COST`].
#[allow(clippy::too_many_arguments)]
async fn p1_open(
    mut caller: Caller<'_, State>,
    fd: i32,
    dirflags: i32,
    path: (i32, i32),
    oflags: i32,
    rights: (i64, i64),
    fdflags: i32,
    result_ptr: i32,
) -> wasmtime::Result<i32> {
    let Some(memory) = memory_of(&mut caller) else {
        wasmtime::bail!("missing required memory export");
    };
    let fuel = caller.as_context_mut().hostcall_fuel();
    let (mem, state) = memory.data_and_store_mut(&mut caller);
    state.wasi.set_hostcall_fuel(fuel);
    let meter = Arc::clone(&state.meter);
    let mut gm = GuestMemory::Unshared(mem);
    let creates = (oflags as u16) & p1t::Oflags::CREAT.bits() != 0;
    let mut reserved = false;
    if creates {
        let name = wiggle::GuestPtr::<str>::new((path.0 as u32, path.1 as u32));
        let exists = state
            .wasi
            .path_filestat_get(
                &mut gm,
                p1t::Fd::from(fd as u32),
                p1t::Lookupflags::empty(),
                name,
            )
            .await;
        // Any failure to stat may be a creation: charged, and refunded if the open fails.
        if exists.is_err() {
            if let Err(refusal) = meter.admit_entry() {
                return Ok(p1_refusal(refusal));
            }
            reserved = true;
        }
    }
    let rc = p1::path_open(
        &mut state.wasi,
        &mut gm,
        fd,
        dirflags,
        path.0,
        path.1,
        oflags,
        rights.0,
        rights.1,
        fdflags,
        result_ptr,
    )
    .await?;
    if reserved && rc != 0 {
        meter.refund(ENTRY_COST);
    }
    Ok(rc)
}

/// Replaces the preview 1 functions that grow files or create entries with metered
/// versions.
pub(crate) fn shim_p1(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    const M: &str = "wasi_snapshot_preview1";
    linker.allow_shadowing(true);
    linker.func_wrap_async(
        M,
        "fd_write",
        |caller: Caller<'_, State>, (fd, iovs, count, out): (i32, i32, i32, i32)| {
            Box::new(p1_write(caller, fd, iovs, count, None, out))
        },
    )?;
    linker.func_wrap_async(
        M,
        "fd_pwrite",
        |caller: Caller<'_, State>, (fd, iovs, count, off, out): (i32, i32, i32, i64, i32)| {
            Box::new(p1_write(caller, fd, iovs, count, Some(off), out))
        },
    )?;
    linker.func_wrap_async(
        M,
        "fd_filestat_set_size",
        |caller: Caller<'_, State>, (fd, size): (i32, i64)| Box::new(p1_set_size(caller, fd, size)),
    )?;
    linker.func_wrap_async(
        M,
        "path_create_directory",
        |caller: Caller<'_, State>, (fd, ptr, len): (i32, i32, i32)| {
            Box::new(p1_create(
                caller,
                P1Create::Dir {
                    fd,
                    path: (ptr, len),
                },
            ))
        },
    )?;
    linker.func_wrap_async(
        M,
        "path_symlink",
        |caller: Caller<'_, State>, (op, ol, fd, np, nl): (i32, i32, i32, i32, i32)| {
            let call = P1Create::Symlink {
                old: (op, ol),
                fd,
                new: (np, nl),
            };
            Box::new(p1_create(caller, call))
        },
    )?;
    linker.func_wrap_async(
        M,
        "path_link",
        |caller: Caller<'_, State>,
         (old_fd, flags, op, ol, new_fd, np, nl): (i32, i32, i32, i32, i32, i32, i32)| {
            let call = P1Create::Link {
                old_fd,
                flags,
                old: (op, ol),
                new_fd,
                new: (np, nl),
            };
            Box::new(p1_create(caller, call))
        },
    )?;
    linker.func_wrap_async(
        M,
        "path_open",
        |caller: Caller<'_, State>,
         (fd, dirflags, ptr, len, oflags, base, inheriting, fdflags, out): (
            i32,
            i32,
            i32,
            i32,
            i32,
            i64,
            i64,
            i32,
            i32,
        )| {
            Box::new(p1_open(
                caller,
                fd,
                dirflags,
                (ptr, len),
                oflags,
                (base, inheriting),
                fdflags,
                out,
            ))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// WASI preview 2
// ---------------------------------------------------------------------------------------

/// The host file behind a writable descriptor, if it is one.
fn writable_file(state: &mut State, fd: &Resource<Descriptor>) -> Option<Arc<std::fs::File>> {
    let view = state.filesystem();
    match view.table.get(fd) {
        Ok(Descriptor::File(f)) if !f.perms.write_not_permitted() => Some(Arc::clone(&f.file)),
        _ => None,
    }
}

fn file_len(file: &std::fs::File) -> u64 {
    file.metadata().map(|m| m.len()).unwrap_or(0)
}

type FsReturn<T> = wasmtime::Result<(Result<T, ErrorCode>,)>;

fn fs_result<T>(r: Result<T, wasmtime_wasi::p2::FsError>) -> FsReturn<T> {
    match r {
        Ok(v) => Ok((Ok(v),)),
        Err(e) => Ok((Err(e.downcast()?),)),
    }
}

async fn p2_write(
    mut store: StoreContextMut<'_, State>,
    fd: Resource<Descriptor>,
    buf: Vec<u8>,
    offset: u64,
) -> FsReturn<u64> {
    let state = store.data_mut();
    let meter = Arc::clone(&state.meter);
    let len = buf.len() as u64;
    let mut reserved = 0;
    if let Some(file) = writable_file(state, &fd) {
        let end = file_len(&file).max(offset.saturating_add(len));
        if let Err(refusal) = meter.admit(len, end) {
            return Ok((Err(p2_refusal(refusal)),));
        }
        reserved = len;
    }
    let mut view = state.filesystem();
    let r = HostDescriptor::write(&mut view, fd, buf, offset).await;
    meter.refund(reserved.saturating_sub(*r.as_ref().unwrap_or(&0)));
    fs_result(r)
}

async fn p2_set_size(
    mut store: StoreContextMut<'_, State>,
    fd: Resource<Descriptor>,
    size: u64,
) -> FsReturn<()> {
    let state = store.data_mut();
    let meter = Arc::clone(&state.meter);
    let mut reserved = 0;
    if let Some(file) = writable_file(state, &fd) {
        let current = file_len(&file);
        if size > current {
            reserved = size - current;
            if let Err(refusal) = meter.admit(reserved, size) {
                return Ok((Err(p2_refusal(refusal)),));
            }
        }
    }
    let mut view = state.filesystem();
    let r = HostDescriptor::set_size(&mut view, fd, size).await;
    if r.is_err() {
        meter.refund(reserved);
    }
    fs_result(r)
}

/// Charges [`ENTRY_COST`] for an entry `create` makes, refunded when it fails.
async fn p2_entry<T>(
    meter: &DiskMeter,
    create: impl std::future::Future<Output = Result<T, wasmtime_wasi::p2::FsError>>,
) -> FsReturn<T> {
    if let Err(refusal) = meter.admit_entry() {
        return Ok((Err(p2_refusal(refusal)),));
    }
    let r = create.await;
    if r.is_err() {
        meter.refund(ENTRY_COST);
    }
    fs_result(r)
}

async fn p2_create_directory(
    mut store: StoreContextMut<'_, State>,
    fd: Resource<Descriptor>,
    path: String,
) -> FsReturn<()> {
    let state = store.data_mut();
    let meter = Arc::clone(&state.meter);
    let mut view = state.filesystem();
    p2_entry(
        &meter,
        HostDescriptor::create_directory_at(&mut view, fd, path),
    )
    .await
}

async fn p2_symlink(
    mut store: StoreContextMut<'_, State>,
    fd: Resource<Descriptor>,
    old: String,
    new: String,
) -> FsReturn<()> {
    let state = store.data_mut();
    let meter = Arc::clone(&state.meter);
    let mut view = state.filesystem();
    p2_entry(&meter, HostDescriptor::symlink_at(&mut view, fd, old, new)).await
}

async fn p2_link(
    mut store: StoreContextMut<'_, State>,
    fd: Resource<Descriptor>,
    flags: PathFlags,
    old: String,
    new_fd: Resource<Descriptor>,
    new: String,
) -> FsReturn<()> {
    let state = store.data_mut();
    let meter = Arc::clone(&state.meter);
    let mut view = state.filesystem();
    p2_entry(
        &meter,
        HostDescriptor::link_at(&mut view, fd, flags, old, new_fd, new),
    )
    .await
}

/// `open-at`: with `create` on a path that does not exist yet, charged [`ENTRY_COST`].
async fn p2_open(
    mut store: StoreContextMut<'_, State>,
    fd: Resource<Descriptor>,
    path_flags: PathFlags,
    path: String,
    oflags: OpenFlags,
    flags: DescriptorFlags,
) -> FsReturn<Resource<Descriptor>> {
    let state = store.data_mut();
    let meter = Arc::clone(&state.meter);
    let mut view = state.filesystem();
    let mut reserved = false;
    if oflags.contains(OpenFlags::CREATE) {
        let parent = Resource::<Descriptor>::new_borrow(fd.rep());
        let exists =
            HostDescriptor::stat_at(&mut view, parent, PathFlags::empty(), path.clone()).await;
        // Any failure to stat may be a creation: charged, and refunded if the open fails.
        if exists.is_err() {
            if let Err(refusal) = meter.admit_entry() {
                return Ok((Err(p2_refusal(refusal)),));
            }
            reserved = true;
        }
    }
    let r = HostDescriptor::open_at(&mut view, fd, path_flags, path, oflags, flags).await;
    if reserved && r.is_err() {
        meter.refund(ENTRY_COST);
    }
    fs_result(r)
}

/// Opens a stream with `open` and, for a writable file, swaps it for a metered stream.
fn p2_stream(
    mut store: StoreContextMut<'_, State>,
    fd: Resource<Descriptor>,
    position: Option<u64>,
) -> FsReturn<Resource<DynOutputStream>> {
    let state = store.data_mut();
    let meter = Arc::clone(&state.meter);
    let file = writable_file(state, &fd);
    let mut view = state.filesystem();
    let opened = match position {
        Some(offset) => HostDescriptor::write_via_stream(&mut view, fd, offset),
        None => HostDescriptor::append_via_stream(&mut view, fd),
    };
    let stream = match opened {
        Ok(stream) => stream,
        Err(e) => return Ok((Err(e.downcast()?),)),
    };
    let Some(file) = file else {
        return Ok((Ok(stream),));
    };
    let inner = view.table.delete(stream)?;
    let metered: DynOutputStream = Box::new(MeteredStream {
        inner,
        meter,
        file,
        position,
    });
    Ok((Ok(view.table.push(metered)?),))
}

/// Replaces the preview 2 functions that grow files or create entries with metered
/// versions.
pub(crate) fn shim_p2(linker: &mut wasmtime::component::Linker<State>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    {
        let mut types = linker.instance(FILESYSTEM_TYPES)?;
        types.func_wrap_async(
            "[method]descriptor.write",
            |store: StoreContextMut<'_, State>,
             (fd, buf, offset): (Resource<Descriptor>, Vec<u8>, u64)| {
                Box::new(p2_write(store, fd, buf, offset))
            },
        )?;
        types.func_wrap_async(
            "[method]descriptor.set-size",
            |store: StoreContextMut<'_, State>, (fd, size): (Resource<Descriptor>, u64)| {
                Box::new(p2_set_size(store, fd, size))
            },
        )?;
        types.func_wrap(
            "[method]descriptor.write-via-stream",
            |store: StoreContextMut<'_, State>, (fd, offset): (Resource<Descriptor>, u64)| {
                p2_stream(store, fd, Some(offset))
            },
        )?;
        types.func_wrap(
            "[method]descriptor.append-via-stream",
            |store: StoreContextMut<'_, State>, (fd,): (Resource<Descriptor>,)| {
                p2_stream(store, fd, None)
            },
        )?;
        types.func_wrap_async(
            "[method]descriptor.create-directory-at",
            |store: StoreContextMut<'_, State>, (fd, path): (Resource<Descriptor>, String)| {
                Box::new(p2_create_directory(store, fd, path))
            },
        )?;
        types.func_wrap_async(
            "[method]descriptor.symlink-at",
            |store: StoreContextMut<'_, State>,
             (fd, old, new): (Resource<Descriptor>, String, String)| {
                Box::new(p2_symlink(store, fd, old, new))
            },
        )?;
        types.func_wrap_async(
            "[method]descriptor.link-at",
            |store: StoreContextMut<'_, State>,
             (fd, flags, old, new_fd, new): (
                Resource<Descriptor>,
                PathFlags,
                String,
                Resource<Descriptor>,
                String,
            )| { Box::new(p2_link(store, fd, flags, old, new_fd, new)) },
        )?;
        types.func_wrap_async(
            "[method]descriptor.open-at",
            |store: StoreContextMut<'_, State>,
             (fd, path_flags, path, oflags, flags): (
                Resource<Descriptor>,
                PathFlags,
                String,
                OpenFlags,
                DescriptorFlags,
            )| { Box::new(p2_open(store, fd, path_flags, path, oflags, flags)) },
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// A file output stream that charges every write to the run's [`DiskMeter`].
struct MeteredStream {
    inner: DynOutputStream,
    meter: Arc<DiskMeter>,
    file: Arc<std::fs::File>,
    /// Next write offset; `None` for an append stream.
    position: Option<u64>,
}

#[wasmtime_wasi::async_trait]
impl Pollable for MeteredStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for MeteredStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let len = bytes.len() as u64;
        let size = file_len(&self.file);
        let end = match self.position {
            Some(pos) => size.max(pos.saturating_add(len)),
            None => size.saturating_add(len),
        };
        if let Err(refusal) = self.meter.admit(len, end) {
            return Err(StreamError::LastOperationFailed(wasmtime::Error::new(
                io_refusal(refusal),
            )));
        }
        let r = self.inner.write(bytes);
        match &r {
            Ok(()) => {
                if let Some(pos) = &mut self.position {
                    *pos = pos.saturating_add(len);
                }
            }
            Err(_) => self.meter.refund(len),
        }
        r
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    fn write_zeroes(&mut self, nelem: usize) -> StreamResult<()> {
        let permit = self.check_write()?;
        if nelem > permit {
            return Err(StreamError::trap(
                "cannot write more zeroes than `check_write` allows",
            ));
        }
        self.write(Bytes::from(vec![0; nelem]))
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meter_counts_bytes_and_refuses_past_each_limit() {
        let m = DiskMeter::new(100, 60);
        assert_eq!(m.admit(50, 50), Ok(()));
        assert_eq!(m.admit(20, 70), Err(Refusal::FileSize));
        assert_eq!(m.admit(60, 60), Err(Refusal::Disk));
        m.refund(10);
        assert_eq!(m.written(), 40);
        assert_eq!(m.admit(60, 60), Ok(()));
        assert_eq!(m.refused(), (true, true));
    }

    #[test]
    fn first_iovec_is_bounds_checked() {
        let mut mem = vec![0u8; 32];
        mem[8..12].copy_from_slice(&100u32.to_le_bytes());
        mem[12..16].copy_from_slice(&0u32.to_le_bytes());
        mem[16..20].copy_from_slice(&200u32.to_le_bytes());
        mem[20..24].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(first_iovec_len(&mem, 8, 2), Some(7));
        assert_eq!(first_iovec_len(&mem, 8, 4), Some(7));
        assert_eq!(first_iovec_len(&mem, 24, 2), None);
        assert_eq!(first_iovec_len(&mem, -8, 1), None);
    }
}
