//! The crate's second `unsafe` module: replacing pages of this process's
//! own address space in place, contents kept (for [`shared_mr`](crate::shared_mr)).
//!
//! Each move builds the new pages elsewhere first (a fresh mapping, the
//! old contents copied into it) and then puts them over the old ones with
//! one `mremap(MREMAP_FIXED)`, which the kernel does atomically: no thread
//! ever finds the range unmapped. What it cannot do is keep a write that
//! another thread makes to the old pages after the copy: callers move
//! only pages that nothing else in the process can be writing (see
//! `shared_mr`), with this thread's signals blocked ([`SignalsBlocked`]).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// The size of a page here.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf takes an integer and touches no memory of ours.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// This thread's kernel ID.
pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Map `len` fresh bytes: shared from `fd` (offset 0), or private
/// anonymous memory.
fn map_fresh(len: usize, fd: Option<&OwnedFd>) -> io::Result<*mut u8> {
    let (flags, raw) = match fd {
        Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
        None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
    };
    // SAFETY: a new mapping at an address the kernel chooses; it aliases
    // no Rust object.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            raw,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// Copy the `len` bytes at `start` into the fresh mapping `fresh`, then
/// move `fresh` over them. On error the old pages stay as they were and
/// `fresh` is gone.
///
/// # Safety
/// `start..start + len` must be page-aligned, mapped readable memory of
/// this process that no other thread writes during the call, and that no
/// Rust reference covers; `fresh` a mapping of `len` bytes from
/// [`map_fresh`] that nothing else uses.
unsafe fn copy_and_move(start: u64, len: usize, fresh: *mut u8) -> io::Result<()> {
    // SAFETY: both ranges are mapped for `len` bytes (the caller's
    // promise, and map_fresh's), distinct mappings, so they do not
    // overlap; no Rust reference covers either.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, fresh, len) };
    // SAFETY: moves our own fresh mapping over the caller's range, which
    // it promised holds no Rust object; atomic for other threads.
    let p = unsafe {
        libc::mremap(
            fresh.cast(),
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            start as *mut libc::c_void,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: the move failed, so `fresh` is still ours alone.
        unsafe { libc::munmap(fresh.cast(), len) };
        return Err(e);
    }
    Ok(())
}

/// Put the `len` bytes at `start` into a new memfd, mapped shared in
/// their place with the same contents. Returns the memfd.
///
/// # Safety
/// As for [`copy_and_move`]: page-aligned mapped memory of this process
/// that no other thread writes meanwhile and no Rust reference covers.
pub(crate) unsafe fn into_memfd(start: u64, len: usize) -> io::Result<OwnedFd> {
    let fd = crate::shm::memfd("rxe-emu-mr", len as u64)?;
    let fresh = map_fresh(len, Some(&fd))?;
    // SAFETY: the caller's promise; `fresh` is new and ours.
    unsafe { copy_and_move(start, len, fresh)? };
    Ok(fd)
}

/// Put the `len` bytes at `start` back into private anonymous memory in
/// place, contents kept.
///
/// # Safety
/// As for [`into_memfd`].
pub(crate) unsafe fn into_private(start: u64, len: usize) -> io::Result<()> {
    let fresh = map_fresh(len, None)?;
    // SAFETY: the caller's promise; `fresh` is new and ours.
    unsafe { copy_and_move(start, len, fresh) }
}

/// This thread's signals blocked until dropped, so that no handler
/// writes pages while they move.
pub(crate) struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    pub(crate) fn new() -> SignalsBlocked {
        // SAFETY: plain-data sets filled by sigfillset / the kernel.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            SignalsBlocked(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut());
        }
    }
}

/// Run `prepare`, `parent` and `child` around every `fork()` of this
/// process (`pthread_atfork`); registered once.
pub(crate) fn at_fork(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers three functions of this library; glibc's
        // pthread_atfork records the calling object and drops them if
        // it is unloaded (dlclose).
        unsafe {
            libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
        }
    });
}
