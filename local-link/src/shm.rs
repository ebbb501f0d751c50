//! The crate's only `unsafe`: creating a memfd and an eventfd, mapping a
//! memfd, reaching into the mapping (atomics and byte copies) at
//! bounds-checked offsets, and the process ID kept across calls.
//!
//! The mapping is shared with other processes, which may write anything
//! at any time. Nothing here ever hands out a reference to plain bytes of
//! it: bytes are copied in or out, and the words the processes
//! synchronise on are only ever touched as atomics.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A new memfd of `len` bytes (sparse: pages are allocated when written).
pub(crate) fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name.replace('\0', "?")).expect("no NUL left");
    // SAFETY: `cname` is a valid NUL-terminated string for the duration of
    // the call; memfd_create touches no other memory of ours.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned this fd to us; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    std::fs::File::from(fd.try_clone()?).set_len(len)?;
    Ok(fd)
}

/// A new non-blocking eventfd (its flags belong to the open file, so
/// every process that receives it sees it non-blocking too).
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes two integers and touches no memory of ours.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: eventfd just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A shared mapping of the first `len` bytes of a file.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is only reached through atomics and byte copies at
// checked offsets (below), which are as sound from any thread as from
// the other processes that share it.
unsafe impl Send for Mapping {}
// SAFETY: as for Send: no method gives out a non-atomic reference.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd`, shared and writable.
    pub(crate) fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a new mapping at an address the kernel chooses; it
        // aliases no Rust object. The file stays mapped after `fd` closes.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The mapping's address (for alignment: nothing is reached by it).
    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// Fault in the pages of `off..off + len` (clipped to the mapping)
    /// now, writable if `write`, in one system call rather than a page
    /// fault each on first use. Best effort: a kernel before 5.14 lacks
    /// `MADV_POPULATE_*`, and the pages then fault in as they are used.
    pub(crate) fn populate(&self, off: usize, len: usize, write: bool) {
        let start = off / 4096 * 4096;
        let end = off.saturating_add(len).min(self.len);
        if start >= end {
            return;
        }
        let advice = if write {
            libc::MADV_POPULATE_WRITE
        } else {
            libc::MADV_POPULATE_READ
        };
        // SAFETY: the range is inside the mapping and starts on a page
        // boundary (the mapping does); populating changes no byte of it.
        unsafe {
            libc::madvise(self.ptr.add(start).cast(), end - start, advice);
        }
    }

    fn check(&self, off: usize, n: usize, align: usize) {
        assert!(
            off % align == 0 && off.checked_add(n).is_some_and(|end| end <= self.len),
            "shared-memory access {off}+{n} outside a mapping of {} bytes",
            self.len
        );
    }

    /// The 64-bit word at `off` (8-aligned, inside the mapping).
    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8, 8);
        // SAFETY: in bounds and aligned (checked above; the mapping is
        // page-aligned); the word lives as long as `self`, and is only
        // ever accessed atomically by this crate.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) }
    }

    /// The 32-bit word at `off` (4-aligned, inside the mapping).
    pub(crate) fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4, 4);
        // SAFETY: as for `u64_at`.
        unsafe { AtomicU32::from_ptr(self.ptr.add(off).cast()) }
    }

    /// Copy `src` into the mapping at `off`.
    pub(crate) fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len(), 1);
        // SAFETY: the destination range is inside the mapping (checked),
        // which no Rust reference covers; `src` is a separate allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(off), src.len()) }
    }

    /// Copy the `len` bytes at `src` into the mapping at `off`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes, outside the mapping.
    pub(crate) unsafe fn write_raw(&self, off: usize, src: *const u8, len: usize) {
        self.check(off, len, 1);
        // SAFETY: the destination range is inside the mapping (checked),
        // which no Rust reference covers; the caller vouches for `src`.
        unsafe { std::ptr::copy_nonoverlapping(src, self.ptr.add(off), len) }
    }

    /// Ask the CPU to bring the lines of `off..off + len` (clipped to the
    /// mapping) into its cache: a hint, no access.
    /// (Elsewhere than on x86-64, nothing.)
    pub(crate) fn prefetch(&self, off: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let end = off.saturating_add(len).min(self.len);
            for at in (off & !63..end).step_by(64) {
                // SAFETY: a prefetch is a hint: it reads nothing into the
                // program and cannot fault; `at` is inside the mapping.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(self.ptr.add(at).cast()) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (off, len);
    }

    /// Ask the CPU to bring the lines of `off..off + len` (clipped to the
    /// mapping) into its cache for writing (`prefetchw`: ownership now,
    /// so that the stores that follow need not wait for it): a hint, no
    /// access. (Elsewhere than on x86-64, nothing.)
    pub(crate) fn prefetch_write(&self, off: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            let end = off.saturating_add(len).min(self.len);
            for at in (off & !63..end).step_by(64) {
                // SAFETY: `prefetchw` is a hint: it changes no byte and
                // cannot fault (a CPU without it runs it as a NOP); `at`
                // is inside the mapping. (`_mm_prefetch` with a write hint
                // becomes a read prefetch on the baseline x86-64 target.)
                unsafe {
                    std::arch::asm!(
                        "prefetchw [{}]",
                        in(reg) self.ptr.add(at),
                        options(nostack, preserves_flags, readonly)
                    )
                };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (off, len);
    }

    /// Copy bytes of the mapping at `off` into `dst`. Another process may
    /// be writing them: the copy then holds whatever it finds, which the
    /// caller validates like any packet from the network.
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len(), 1);
        // SAFETY: the source range is inside the mapping (checked); `dst`
        // is an exclusively borrowed, separate allocation.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), dst.as_mut_ptr(), dst.len()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing
        // borrowed from the mapping outlives `self`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of a
/// host (of one time namespace), as `std::time::Instant` uses it too but
/// does not expose.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec;
    // CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Copy `data` to address `addr` of process `pid` (`process_vm_writev`),
/// which the kernel allows only with ptrace rights over it (same user,
/// Yama's `ptrace_scope` permitting). The kernel checks every page of
/// the destination and reports an unmapped or read-only one as `EFAULT`.
/// Returns the bytes written, which may be fewer than asked.
pub(crate) fn write_to_process(pid: i32, addr: u64, data: &[u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` describes `data`, which the kernel only reads;
    // `remote` names memory of another process, which the kernel checks
    // (permissions, mappings) and never resolves in ours. One iovec each.
    let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Open process `pid`'s memory for writing (`/proc/<pid>/mem`): the
/// kernel allows it with the same ptrace rights as `process_vm_writev`.
/// Only where `/proc` is this process's PID namespace's (it shows this
/// process as `/proc/self` under its own ID): a `/proc` of another
/// namespace would name other processes by these IDs.
pub(crate) fn open_process_mem(pid: i32) -> io::Result<std::fs::File> {
    static OURS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ours = *OURS.get_or_init(|| {
        std::fs::read_link("/proc/self")
            .ok()
            .and_then(|p| p.to_str()?.parse::<u32>().ok())
            .is_some_and(|p| p == own_pid())
    });
    if !ours {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "/proc is not this process's PID namespace's",
        ));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/mem"))
}

/// Copy `data` to address `addr` through a `/proc/<pid>/mem` file, with
/// `write_to_process`'s results: an address the process has not mapped
/// writable (the file says `EIO`) is `EFAULT`; a process that is gone
/// writes nothing.
pub(crate) fn write_process_mem(f: &std::fs::File, addr: u64, data: &[u8]) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    match f.write_at(data, addr) {
        Err(e) if e.raw_os_error() == Some(libc::EIO) => {
            Err(io::Error::from_raw_os_error(libc::EFAULT))
        }
        r => r,
    }
}

/// This process's ID, read from the kernel once per process: a placement
/// names its producer by it, and `getpid` was one system call of each
/// placed WRITE (about 0.1 µs on the 2-CPU host, 5% of `ib_write_lat`). A
/// child of `fork` reads it afresh: the handler registered before the
/// first read forgets it in the child.
pub(crate) fn own_pid() -> u32 {
    use std::sync::atomic::Ordering::Relaxed;
    static PID: AtomicU32 = AtomicU32::new(0);
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget_in_child() {
        PID.store(0, Relaxed);
    }
    // u32::MAX: never kept (no handler).
    let pid = PID.load(Relaxed);
    if pid != 0 && pid != u32::MAX {
        return pid;
    }
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that fork runs in the child; it only
        // stores to a static atomic, which is async-signal-safe. Should
        // registration fail (ENOMEM), the ID would be kept across a fork:
        // then keep asking the kernel instead.
        if unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) } != 0 {
            PID.store(u32::MAX, Relaxed);
        }
    });
    let pid = std::process::id();
    let _ = PID.compare_exchange(0, pid, Relaxed, Relaxed);
    pid
}

/// Whether process `pid` still exists (a signal 0 reaches it, or it
/// exists but belongs to someone else).
pub(crate) fn process_exists(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it touches no memory.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    /// The kept process ID is this process's, in a child of `fork` too.
    #[test]
    fn own_pid_is_the_callers_after_a_fork_too() {
        assert_eq!(super::own_pid(), std::process::id());
        // SAFETY: the child only calls async-signal-safe functions (getpid,
        // atomic loads and stores, _exit) before it exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0, "fork failed");
        if child == 0 {
            // SAFETY: getpid and _exit touch no memory of ours.
            let ok = super::own_pid() == unsafe { libc::getpid() } as u32;
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: `status` is a valid int to write.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        assert_eq!(r, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child saw its parent's ID"
        );
        assert_eq!(super::own_pid(), std::process::id());
    }

    /// Both ways of writing into a process give the same results, which
    /// `WayChoice` relies on: an address the process maps read-only (a
    /// shared mapping, which `/proc/<pid>/mem`'s forced write does not
    /// break into either) is EFAULT and writes nothing; a writable one
    /// takes the bytes.
    #[test]
    fn both_ways_fault_on_read_only_memory_and_write_writable_memory() {
        let pid = super::own_pid() as i32;
        let mem = super::open_process_mem(pid).unwrap();
        let name = std::ffi::CString::new("ro").unwrap();
        // SAFETY: plain system calls on a new memfd and a new mapping that
        // no Rust object aliases; both are released below.
        let (fd, page) = unsafe {
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, 4096), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            (fd, p)
        };
        let ro = page as u64;
        let e = super::write_process_mem(&mem, ro, &[5; 8]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
        let e = super::write_to_process(pid, ro, &[6; 8]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
        // SAFETY: the mapping is 4096 readable bytes, alive until munmap.
        let now = unsafe { std::slice::from_raw_parts(page as *const u8, 8) }.to_vec();
        assert_eq!(now, [0u8; 8]);
        let target = Box::new([0u8; 16]);
        let at = target.as_ptr() as u64;
        assert_eq!(super::write_process_mem(&mem, at, &[7; 8]).unwrap(), 8);
        assert_eq!(super::write_to_process(pid, at + 8, &[9; 8]).unwrap(), 8);
        // SAFETY: the box is alive; the kernel wrote it behind the
        // compiler's back, so read it volatile.
        let got: Vec<u8> = (0..16)
            .map(|i| unsafe { std::ptr::read_volatile(target.as_ptr().add(i)) })
            .collect();
        assert_eq!(got, [[7u8; 8], [9u8; 8]].concat());
        // SAFETY: the mapping and the fd made above, no longer used.
        unsafe {
            libc::munmap(page, 4096);
            libc::close(fd);
        }
    }
}
