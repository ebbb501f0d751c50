//! Registered memory in shared memory, so that a peer's placement is a
//! memory copy.
//!
//! A sender places a WRITE into another process of its device (see
//! [`place`](crate::Placement)) with a system call per packet
//! (`/proc/<pid>/mem` or `process_vm_writev`): on the 2-CPU host that
//! call was a third of `ib_write_lat`'s round trip. So when an
//! application registers an MR that peers may write (remote write, or
//! local write: the responder of a READ writes its responses into the
//! READ's destination, [`crate::ReadHint`]), the MR's whole pages
//! are moved in place into a memfd (same addresses, same contents:
//! [`remap`](crate::remap)), and the MR's table entry names that memfd;
//! a peer maps it once (through `/proc/<pid>/fd/<n>`, which needs the
//! same rights as writing the process's memory) and copies each payload
//! into its mapping.
//!
//! A move must not lose a write to the old pages, so pages move only
//! when nothing else can be writing them ([`register`]):
//! - the application has no thread but the caller (this library's own
//!   threads write only into registered MRs);
//! - no other MR of the process (of any device) touches those pages, so
//!   neither this process's engine nor a peer writes them meanwhile;
//! - they are private anonymous memory (heap or `mmap`), not a file, not
//!   already shared, not the stack;
//! - with this thread's signals blocked;
//! - at most [`MAX_SEGMENT`] bytes per MR, [`MAX_TOTAL`] in all.
//!
//! Otherwise the MR stays where it is and placements take the system
//! call, as before. `RXE_EMU_SHARED_MR=off` turns the move off.
//!
//! What changes for the application: its registered pages are shared
//! memory from then on. `fork()` gives the child a private copy of them
//! (a `pthread_atfork` handler moves them back into private memory in the
//! child), as a kernel that copies pinned pages at fork does. When the
//! last MR on the pages is deregistered they move back into private
//! memory, if the application is still single-threaded then; otherwise
//! they stay shared (and are moved back at a later registration, or in
//! a forked child). `madvise(MADV_DONTNEED)` on them keeps their contents
//! (as for any shared memory), and a `mlock` of them before registration
//! does not carry over.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Mutex;

use crate::remap;

/// The largest MR whose pages move (bytes of whole pages).
pub const MAX_SEGMENT: u64 = 64 << 20;
/// Bytes of moved pages in all, at most.
pub const MAX_TOTAL: u64 = 256 << 20;
/// Moved ranges (in use or waiting to move back), at most: each keeps a
/// file descriptor open.
const MAX_SEGMENTS: usize = 64;

/// Where a peer writes an MR's whole pages: the owner's memfd (its file
/// descriptor number in the owner, and its inode, checked after opening
/// it), and the memfd offset of the MR's first whole page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPages {
    pub fd: i32,
    pub ino: u64,
    pub off: u64,
}

/// `host..host + len`'s whole pages: `[first, end)` (empty if none).
pub fn whole_pages(host: u64, len: u64) -> (u64, u64) {
    let p = remap::page_size();
    let first = host.div_ceil(p).saturating_mul(p);
    let end = host.saturating_add(len) / p * p;
    (first, end.max(first))
}

struct Segment {
    start: u64,
    len: u64,
    fd: OwnedFd,
    ino: u64,
    /// Registered MRs whose whole pages lie in it.
    users: usize,
}

struct Mr {
    host: u64,
    len: u64,
    /// The inode of the segment it counts as a user of.
    seg: Option<u64>,
}

struct State {
    segments: Vec<Segment>,
    mrs: Vec<Mr>,
    /// This library's own threads (progress threads).
    own: Vec<i32>,
}

/// Held by every change of [`STATE`] and across `fork()` (prepare to
/// parent/child), so a child never sees a change half made. A flag rather
/// than the mutex itself: a `std` guard cannot be kept from one fork
/// handler to the next.
static LOCK: AtomicBool = AtomicBool::new(false);
static STATE: Mutex<State> = Mutex::new(State {
    segments: Vec::new(),
    mrs: Vec::new(),
    own: Vec::new(),
});

struct Locked;

impl Locked {
    fn take() -> Locked {
        while LOCK
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        Locked
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        LOCK.store(false, Release);
    }
}

fn with_state<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let _l = Locked::take();
    let mut st = STATE.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut st)
}

fn disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| {
        std::env::var("RXE_EMU_SHARED_MR")
            .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "off" | "0" | "no"))
    })
}

/// The calling thread is one of this library's own (a progress thread):
/// it does not count as an application thread.
pub fn note_own_thread() {
    let t = remap::gettid();
    with_state(|st| st.own.push(t));
}

/// The calling thread, noted by [`note_own_thread`], ends.
pub fn forget_own_thread() {
    let t = remap::gettid();
    with_state(|st| st.own.retain(|&o| o != t));
}

/// One line of `/proc/self/maps`.
struct Vma {
    start: u64,
    end: u64,
    perms: String,
    offset: u64,
    inode: u64,
    path: String,
}

fn maps() -> Option<Vec<Vma>> {
    let text = std::fs::read_to_string("/proc/self/maps").ok()?;
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (range, perms, offset, _dev, inode) =
            (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (a, b) = range.split_once('-')?;
        out.push(Vma {
            start: u64::from_str_radix(a, 16).ok()?,
            end: u64::from_str_radix(b, 16).ok()?,
            perms: perms.to_string(),
            offset: u64::from_str_radix(offset, 16).ok()?,
            inode: inode.parse().ok()?,
            path: f.collect::<Vec<_>>().join(" "),
        });
    }
    Some(out)
}

/// Whether `start..end` lies in one private anonymous read-write mapping
/// (the heap or an anonymous `mmap`; not the stack, a file, or shared
/// memory).
fn private_anonymous(vmas: &[Vma], start: u64, end: u64) -> bool {
    vmas.iter().any(|v| {
        v.start <= start
            && end <= v.end
            && v.perms == "rw-p"
            && v.inode == 0
            && (v.path.is_empty() || v.path == "[heap]")
    })
}

/// Whether the segment's range is still its memfd, mapped at the offsets
/// it was moved to (the application may have unmapped it since).
fn still_mapped(vmas: &[Vma], s: &Segment) -> bool {
    let end = s.start + s.len;
    let mut pos = s.start;
    for v in vmas {
        if v.end <= pos || v.start > pos {
            continue;
        }
        if v.inode != s.ino
            || !v.perms.ends_with('s')
            || v.offset + (pos - v.start) != pos - s.start
        {
            return false;
        }
        pos = v.end;
        if pos >= end {
            return true;
        }
    }
    false
}

/// Whether the process has no thread but the caller and this library's.
fn only_caller_runs(own: &[i32]) -> bool {
    let me = remap::gettid();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    for e in dir {
        let Ok(e) = e else { return false };
        let Some(tid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            return false;
        };
        if tid != me && !own.contains(&tid) {
            return false;
        }
    }
    true
}

/// An MR of `len` bytes at `host` is being registered (any MR, of any
/// device: its range keeps other moves off its pages). With `share` (the
/// device places into it), move its whole pages into shared memory if
/// that is safe now (see the module's notes). Call [`deregister`] with
/// the same range when it goes.
pub fn register(host: u64, len: u64, share: bool) {
    register_checked(host, len, share, true)
}

/// [`register`]; `threads`: check that no other application thread runs
/// (tests, whose harness has threads of its own, vouch for it instead).
fn register_checked(host: u64, len: u64, share: bool, threads: bool) {
    if share {
        // Before any page moves, and not under LOCK: glibc's fork holds
        // its handler list's lock while it runs `fork_prepare`, which
        // waits for LOCK.
        remap::at_fork(fork_prepare, fork_parent, fork_child);
    }
    with_state(|st| {
        move_back_leftovers(st, threads);
        let seg = if share && !disabled() {
            share_pages(st, host, len, threads)
        } else {
            None
        };
        st.mrs.push(Mr { host, len, seg });
    })
}

fn share_pages(st: &mut State, host: u64, len: u64, threads: bool) -> Option<u64> {
    let (first, end) = whole_pages(host, len);
    if end <= first {
        return None;
    }
    // Inside pages already moved (another MR of the same buffer).
    if let Some(s) = st
        .segments
        .iter_mut()
        .find(|s| s.start <= first && end <= s.start + s.len)
    {
        if !still_mapped(&maps()?, s) {
            return None;
        }
        s.users += 1;
        return Some(s.ino);
    }
    // The checks that need no system call first: a program with threads
    // (UCX, MPI) pays one directory read per registration, not a read of
    // its whole memory map.
    let n = end - first;
    let total: u64 = st.segments.iter().map(|s| s.len).sum();
    if n > MAX_SEGMENT || total + n > MAX_TOTAL || st.segments.len() >= MAX_SEGMENTS {
        return None;
    }
    let p = remap::page_size();
    let touches = |h: u64, l: u64| {
        let lo = h / p * p;
        let hi = h.saturating_add(l).div_ceil(p).saturating_mul(p);
        lo < end && hi > first
    };
    if st.mrs.iter().any(|m| touches(m.host, m.len))
        || st.segments.iter().any(|s| touches(s.start, s.len))
        || (threads && !only_caller_runs(&st.own))
        || !private_anonymous(&maps()?, first, end)
    {
        return None;
    }
    let fd = {
        let _quiet = remap::SignalsBlocked::new();
        // SAFETY: whole pages of one private anonymous mapping of ours
        // (checked above), which no other thread writes: the application
        // has no other thread (checked, or vouched for by a test), ours
        // write only registered MRs and no MR touches these pages, and
        // this thread's signals are blocked. No Rust reference of this
        // library covers an application's buffer.
        unsafe { remap::into_memfd(first, n as usize) }.ok()?
    };
    let ino = std::fs::File::from(fd.try_clone().ok()?)
        .metadata()
        .ok()?
        .ino();
    st.segments.push(Segment {
        start: first,
        len: n,
        fd,
        ino,
        users: 1,
    });
    Some(ino)
}

/// The MR of `len` bytes at `host` is deregistered (or moved by a
/// re-registration). Its pages move back into private memory once no MR
/// uses them, if that is safe then.
pub fn deregister(host: u64, len: u64) {
    deregister_checked(host, len, true)
}

fn deregister_checked(host: u64, len: u64, threads: bool) {
    with_state(|st| {
        // An MR counted in a segment first: equal ranges are alike.
        let i = st
            .mrs
            .iter()
            .position(|m| m.host == host && m.len == len && m.seg.is_some())
            .or_else(|| st.mrs.iter().position(|m| m.host == host && m.len == len));
        let Some(i) = i else { return };
        let m = st.mrs.swap_remove(i);
        if let Some(ino) = m.seg {
            if let Some(s) = st.segments.iter_mut().find(|s| s.ino == ino) {
                s.users = s.users.saturating_sub(1);
            }
        }
        move_back_leftovers(st, threads);
    })
}

/// Move the segments no MR uses back into private memory, if no other
/// application thread runs; forget those no longer mapped.
fn move_back_leftovers(st: &mut State, threads: bool) {
    if st.segments.iter().all(|s| s.users > 0) {
        return;
    }
    let Some(vmas) = maps() else { return };
    let alone = !threads || only_caller_runs(&st.own);
    st.segments.retain(|s| {
        if s.users > 0 {
            return true;
        }
        if !still_mapped(&vmas, s) {
            return false;
        }
        if !alone {
            return true;
        }
        let _quiet = remap::SignalsBlocked::new();
        // SAFETY: the segment's own pages (checked: still its memfd),
        // which no MR uses any more, so neither this library nor a peer
        // writes them; no other application thread runs and this
        // thread's signals are blocked.
        unsafe { remap::into_private(s.start, s.len as usize) }.is_err()
    });
}

/// Where peers write the MR of `len` bytes at `host`, if its pages moved.
pub fn shared_pages(host: u64, len: u64) -> Option<SharedPages> {
    with_state(|st| {
        let ino = st
            .mrs
            .iter()
            .find(|m| m.host == host && m.len == len && m.seg.is_some())?
            .seg?;
        let s = st.segments.iter().find(|s| s.ino == ino)?;
        let (first, _) = whole_pages(host, len);
        Some(SharedPages {
            fd: s.fd.as_raw_fd(),
            ino,
            off: first - s.start,
        })
    })
}

/// Where peers write `len` bytes at `host`, if they lie in the moved
/// whole pages of one registered MR: that memfd, and where `host` lies in
/// it (a READ's destination: [`crate::ReadHint`]).
pub fn shared_range(host: u64, len: u64) -> Option<SharedPages> {
    let end = host.checked_add(len)?;
    with_state(|st| {
        let ino = st
            .mrs
            .iter()
            .filter(|m| m.seg.is_some())
            .find(|m| {
                let (first, last) = whole_pages(m.host, m.len);
                first <= host && end <= last
            })?
            .seg?;
        let s = st.segments.iter().find(|s| s.ino == ino)?;
        (s.start <= host && end <= s.start + s.len).then(|| SharedPages {
            fd: s.fd.as_raw_fd(),
            ino,
            off: host - s.start,
        })
    })
}

/// Moved ranges in use by MRs, and their bytes: `rxe-emu stat`'s
/// `shared_mr_pages` counts the bytes.
pub fn shared_bytes() -> u64 {
    with_state(|st| {
        st.segments
            .iter()
            .filter(|s| s.users > 0)
            .map(|s| s.len)
            .sum()
    })
}

unsafe extern "C" fn fork_prepare() {
    std::mem::forget(Locked::take());
}

unsafe extern "C" fn fork_parent() {
    LOCK.store(false, Release);
}

/// In the child: its copy of every moved range becomes private memory
/// with the contents it has now, so that neither process sees the
/// other's writes from here on. The child has one thread.
unsafe extern "C" fn fork_child() {
    {
        let mut st = STATE.lock().unwrap_or_else(|p| p.into_inner());
        let vmas = maps().unwrap_or_default();
        for s in st.segments.drain(..) {
            // Not mapped here (the parent unmapped it, or asked for
            // MADV_DONTFORK): nothing to do.
            if still_mapped(&vmas, &s) {
                // SAFETY: the segment's pages in the only thread of the
                // child, signals blocked.
                let _quiet = remap::SignalsBlocked::new();
                let _ = unsafe { remap::into_private(s.start, s.len as usize) };
            }
        }
        for m in &mut st.mrs {
            m.seg = None;
        }
        st.own.clear();
    }
    LOCK.store(false, Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private anonymous buffer of `pages` pages, filled with `fill`.
    fn buffer(pages: usize, fill: u8) -> &'static mut [u8] {
        let p = remap::page_size() as usize;
        let v = vec![fill; pages * p + p];
        let b: &'static mut [u8] = Vec::leak(v);
        let off = b.as_ptr().align_offset(p);
        &mut b[off..off + pages * p]
    }

    /// Another handle on the inbox of `f`, as a process that maps it has.
    fn open_inbox(f: &crate::InboxFile) -> crate::Inbox {
        crate::Inbox::open(
            f.memfd().try_clone_to_owned().unwrap(),
            f.eventfd().try_clone_to_owned().unwrap(),
        )
        .unwrap()
    }

    /// The tests that place into shared pages, one at a time: they count
    /// their placements on the process's counter (`placed_shared`).
    fn placing_alone() -> std::sync::MutexGuard<'static, ()> {
        static PLACING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        PLACING.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn segment_of(host: u64) -> Option<(u64, u64)> {
        let vmas = maps().unwrap();
        vmas.iter()
            .find(|v| v.start <= host && host < v.end)
            .filter(|v| v.perms.ends_with('s'))
            .map(|v| (v.inode, v.offset))
    }

    #[test]
    fn pages_move_into_a_memfd_with_their_contents_and_back_at_deregistration() {
        let b = buffer(8, 0x5a);
        // Pages 1..6 of the buffer move; 0 and 6 are partial for this MR
        // and stay.
        let p = remap::page_size();
        let host = b.as_ptr() as u64 + 100;
        let len = 6 * p;
        register_checked(host, len, true, false);
        let sp = shared_pages(host, len).expect("moved");
        assert_eq!(sp.off, 0);
        assert!(segment_of(b.as_ptr() as u64 + p).is_some());
        assert!(segment_of(b.as_ptr() as u64).is_none());
        assert!(b.iter().all(|&x| x == 0x5a), "contents kept");
        // A second mapping of the memfd (as a peer makes) sees and makes
        // the same bytes.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", sp.fd))
            .unwrap();
        assert_eq!(f.metadata().unwrap().ino(), sp.ino);
        let fd: OwnedFd = f.into();
        let peer = crate::shm::Mapping::map(&fd, 5 * p as usize).unwrap();
        peer.write(8, b"placed!!");
        assert_eq!(&b[p as usize + 8..p as usize + 16], b"placed!!");
        b[p as usize + 100] = 7;
        let mut one = [0u8];
        peer.read(100, &mut one);
        assert_eq!(one[0], 7);
        assert!(shared_bytes() >= 5 * p);
        deregister_checked(host, len, false);
        assert!(shared_pages(host, len).is_none());
        assert!(segment_of(b.as_ptr() as u64 + p).is_none(), "private again");
        assert_eq!(&b[p as usize + 8..p as usize + 16], b"placed!!");
        assert_eq!(b[p as usize + 100], 7);
        // The peer's mapping is its own memory now.
        peer.write(8, b"too late");
        assert_eq!(&b[p as usize + 8..p as usize + 16], b"placed!!");
    }

    #[test]
    fn pages_another_mr_touches_or_that_are_not_private_anonymous_do_not_move() {
        let p = remap::page_size();
        let b = buffer(4, 1);
        let host = b.as_ptr() as u64;
        // Another MR (not shared) ending inside page 1.
        register_checked(host + p + 10, 20, false, false);
        register_checked(host, 4 * p, true, false);
        assert!(shared_pages(host, 4 * p).is_none());
        deregister_checked(host, 4 * p, false);
        deregister_checked(host + p + 10, 20, false);
        // Shared memory (a memfd mapped here).
        let fd = crate::shm::memfd("t", 4 * p).unwrap();
        let m = crate::shm::Mapping::map(&fd, 4 * p as usize).unwrap();
        let h = m.u64_at(0) as *const _ as u64;
        register_checked(h, 4 * p, true, false);
        assert!(shared_pages(h, 4 * p).is_none());
        deregister_checked(h, 4 * p, false);
        // Less than a whole page.
        register_checked(host + 10, p, true, false);
        assert!(shared_pages(host + 10, p).is_none());
        deregister_checked(host + 10, p, false);
        // A second MR inside moved pages shares them; they move back
        // only when both are gone.
        register_checked(host, 4 * p, true, false);
        register_checked(host + p, p, true, false);
        let a = shared_pages(host, 4 * p).unwrap();
        let c = shared_pages(host + p, p).unwrap();
        assert_eq!((a.ino, c.off), (c.ino, p));
        deregister_checked(host, 4 * p, false);
        assert!(segment_of(host + p).is_some());
        deregister_checked(host + p, p, false);
        assert!(segment_of(host + p).is_none());
    }

    #[test]
    fn this_test_process_has_other_threads_so_nothing_moves_unvouched() {
        let p = remap::page_size();
        let b = buffer(2, 3);
        let host = b.as_ptr() as u64;
        let t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        register(host, 2 * p, true);
        assert!(shared_pages(host, 2 * p).is_none());
        deregister(host, 2 * p);
        t.join().unwrap();
    }

    #[test]
    fn a_producer_places_into_moved_pages_with_a_copy_and_elsewhere_as_before() {
        let _alone = placing_alone();
        use crate::{Icrc, InboxFile, PlaceableMr, PlaceableQp, Placement};
        let p = remap::page_size();
        let b = buffer(3, 0);
        let host = b.as_ptr() as u64;
        // The MR starts 16 bytes before the buffer's first whole page:
        // those bytes are placed the usual way.
        let (mr_host, mr_len) = (host + p - 16, p + 16);
        register_checked(mr_host, mr_len, true, false);
        let shared = shared_pages(mr_host, mr_len).expect("moved");
        let f = InboxFile::create("t", 2, 1 << 17).unwrap();
        let open = || open_inbox(&f);
        let (tx, rx) = (open(), open());
        assert!(rx.publish_mr(&PlaceableMr {
            rkey: 0x77,
            pd: 1,
            iova: 0x1000,
            len: mr_len,
            host_addr: mr_host,
            shared: Some(shared),
        }));
        let qpn = 0x1_0011;
        let place = |psn: u32, va: u64, data: &[u8]| {
            rx.publish_qp(
                qpn,
                Some(&PlaceableQp {
                    qpn,
                    pd: 1,
                    epsn: psn,
                    mid_write: false,
                }),
            );
            let pl = Placement {
                qpn,
                psn,
                rkey: 0x77,
                va,
                data,
                ..Default::default()
            };
            let r = tx
                .placing_run(1)
                .unwrap()
                .place_and_push(4791, 0, &[0u8; 40], &pl, Icrc::Unchecked)
                .unwrap();
            let mut buf = vec![0u8; crate::MAX_DATAGRAM];
            rx.pop(&mut buf).unwrap();
            r
        };
        assert!(rx.offer_placement());
        let before = crate::placed_shared();
        // Inside the whole page: a copy into the producer's mapping.
        assert_eq!(place(1, 0x1000 + 16 + 8, b"shared!!"), Ok(host + p + 8));
        assert_eq!(crate::placed_shared(), before + 1);
        assert_eq!(&b[p as usize + 8..p as usize + 16], b"shared!!");
        // Across the partial page in front: the system call, as before.
        assert_eq!(place(2, 0x1000 + 8, &[5u8; 16]), Ok(mr_host + 8));
        assert_eq!(crate::placed_shared(), before + 1);
        assert_eq!(&b[p as usize - 8..p as usize + 8], &[5u8; 16]);
        // An entry naming a file that is not the one at that fd (another
        // inode): not mapped, the system call instead, every time.
        rx.unpublish_mr(0x77);
        assert!(rx.publish_mr(&PlaceableMr {
            rkey: 0x77,
            pd: 1,
            iova: 0x1000,
            len: mr_len,
            host_addr: mr_host,
            shared: Some(SharedPages {
                ino: shared.ino + 1,
                ..shared
            }),
        }));
        for psn in 3..5 {
            assert_eq!(place(psn, 0x1000 + 16 + 32, b"syscall!"), Ok(host + p + 32));
        }
        assert_eq!(crate::placed_shared(), before + 1);
        assert_eq!(&b[p as usize + 32..p as usize + 40], b"syscall!");
        rx.unpublish_mr(0x77);
        deregister_checked(mr_host, mr_len, false);
        assert_eq!(&b[p as usize + 8..p as usize + 16], b"shared!!");
    }

    /// The packets of a multi-packet WRITE: its FIRST is placed only if
    /// the responder is ready for a new message at its PSN and the whole
    /// message fits in the MR, and the rest only while the responder has
    /// not taken the FIRST yet or is in that message; only into shared
    /// pages. A placed payload is left out of its record when asked.
    #[test]
    fn the_packets_of_a_message_are_placed_while_its_responder_is_in_it() {
        let _alone = placing_alone();
        use crate::{Icrc, InboxFile, PlaceError, PlaceableMr, PlaceableQp, Placement};
        let p = remap::page_size();
        let b = buffer(3, 0);
        let host = b.as_ptr() as u64;
        // Its first 16 bytes in a partial page, the rest a whole page.
        let (mr_host, mr_len) = (host + p - 16, p + 16);
        register_checked(mr_host, mr_len, true, false);
        let shared = shared_pages(mr_host, mr_len).expect("moved");
        let f = InboxFile::create("t", 2, 1 << 17).unwrap();
        let (tx, rx) = (open_inbox(&f), open_inbox(&f));
        assert!(rx.offer_placement());
        let iova = 0x4000u64;
        assert!(rx.publish_mr(&PlaceableMr {
            rkey: 0x55,
            pd: 1,
            iova,
            len: mr_len,
            host_addr: mr_host,
            shared: Some(shared),
        }));
        let qpn = 0x1_0031;
        let qp = |epsn: u32, mid_write: bool| {
            rx.publish_qp(
                qpn,
                Some(&PlaceableQp {
                    qpn,
                    pd: 1,
                    epsn,
                    mid_write,
                }),
            )
        };
        // A datagram of an 8-byte header, the payload and a 4-byte ICRC;
        // the payload is left out of the record if it is placed.
        let mut buf = vec![0u8; crate::MAX_DATAGRAM];
        let mut place = |pl: Placement<'_>| {
            let mut dg = vec![0xa1u8; 8];
            dg.extend_from_slice(pl.data);
            dg.extend_from_slice(&[0xc2; 4]);
            let pl = Placement {
                elide: Some((8, pl.data.len())),
                ..pl
            };
            let r = tx
                .placing_run(1)
                .unwrap()
                .place_and_push(4791, 0, &dg, &pl, Icrc::Right)
                .unwrap();
            buf.fill(0xee);
            let got = rx.pop(&mut buf).unwrap();
            assert_eq!(got.placed, r.ok());
            assert_eq!(got.len, dg.len());
            assert_eq!(&buf[..8], &dg[..8]);
            assert_eq!(&buf[dg.len() - 4..dg.len()], &dg[dg.len() - 4..]);
            if r.is_ok() {
                assert_eq!(got.elided, Some((8, pl.data.len())));
                assert!(buf[8..dg.len() - 4].iter().all(|&x| x == 0xee));
            } else {
                assert_eq!((got.elided, &buf[..dg.len()]), (None, &dg[..]));
            }
            r
        };
        let whole = iova + 16;
        let first = |psn: u32, va: u64, data, span| Placement {
            qpn,
            psn,
            rkey: 0x55,
            va,
            data,
            span,
            ..Default::default()
        };
        let next = |psn: u32, first_psn: u32, va: u64, data| Placement {
            first_psn: Some(first_psn),
            ..first(psn, va, data, 0)
        };
        let no = Err(PlaceError::NotNow);
        qp(10, false);
        // The message would run past the MR's end: not even its FIRST.
        assert_eq!(place(first(10, whole, &[1; 64], p + 1)), no);
        // Into the partial page (a system call): not for a message.
        assert_eq!(place(first(10, iova, &[1; 8], 64)), no);
        assert!(b[p as usize - 16..p as usize + 64].iter().all(|&x| x == 0));
        // FIRST, then a MIDDLE before the responder took the FIRST.
        assert_eq!(place(first(10, whole, &[1; 64], 160)), Ok(host + p));
        assert_eq!(place(next(11, 10, whole + 64, &[2; 64])), Ok(host + p + 64));
        // The responder took the FIRST (published as in the message,
        // expecting 11): the LAST goes too.
        qp(11, true);
        assert_eq!(
            place(next(12, 10, whole + 128, &[3; 32])),
            Ok(host + p + 128)
        );
        let at = p as usize;
        assert!(b[at..at + 64].iter().all(|&x| x == 1));
        assert!(b[at + 64..at + 128].iter().all(|&x| x == 2));
        assert!(b[at + 128..at + 160].iter().all(|&x| x == 3));
        // A responder in the message but past this PSN, one ready for a
        // new message at another PSN than the FIRST's, one in a message at
        // the FIRST's own PSN, and one gone: nothing placed.
        qp(13, true);
        assert_eq!(place(next(12, 10, whole + 128, &[4; 32])), no);
        qp(11, false);
        assert_eq!(place(next(12, 10, whole + 128, &[4; 32])), no);
        qp(10, true);
        assert_eq!(place(next(12, 10, whole + 128, &[4; 32])), no);
        rx.publish_qp(qpn, None);
        assert_eq!(place(next(12, 10, whole + 128, &[4; 32])), no);
        // A new message while the responder is in one: not placed.
        qp(20, true);
        assert_eq!(place(first(20, whole, &[5; 64], 128)), no);
        assert!(b[at + 128..at + 160].iter().all(|&x| x == 3));
        assert!(b[at..at + 64].iter().all(|&x| x == 1));
        // PSNs wrap at 24 bits.
        qp(0xff_ffff, false);
        assert_eq!(place(first(0xff_ffff, whole, &[6; 64], 128)), Ok(host + p));
        qp(0, true);
        assert_eq!(
            place(next(0, 0xff_ffff, whole + 64, &[7; 64])),
            Ok(host + p + 64)
        );
        rx.unpublish_mr(0x55);
        deregister_checked(mr_host, mr_len, false);
    }

    #[test]
    fn a_producer_warmed_up_has_the_pages_mapped_before_its_first_placement() {
        let _alone = placing_alone();
        use crate::{Icrc, InboxFile, PlaceableMr, PlaceableQp, Placement};
        let p = remap::page_size();
        let b = buffer(2, 7);
        let host = b.as_ptr() as u64;
        register_checked(host, 2 * p, true, false);
        let shared = shared_pages(host, 2 * p).expect("moved");
        let f = InboxFile::create("t", 2, 1 << 17).unwrap();
        let open = || open_inbox(&f);
        let (tx, rx) = (open(), open());
        let mr = |ino| PlaceableMr {
            rkey: 0x99,
            pd: 1,
            iova: 0x2000,
            len: 2 * p,
            host_addr: host,
            shared: Some(SharedPages { ino, ..shared }),
        };
        assert!(rx.publish_mr(&mr(shared.ino)));
        // Placement not offered: nothing is opened.
        tx.warm_placement();
        assert!(!tx.shared_mapped(shared.ino));
        assert!(rx.offer_placement());
        tx.warm_placement();
        assert!(tx.shared_mapped(shared.ino));
        // Faulting the pages in changed none of their bytes.
        assert!(b.iter().all(|&x| x == 7));
        // The first placement goes through that mapping.
        let qpn = 0x1_0021;
        rx.publish_qp(
            qpn,
            Some(&PlaceableQp {
                qpn,
                pd: 1,
                epsn: 5,
                mid_write: false,
            }),
        );
        let before = crate::placed_shared();
        let pl = Placement {
            qpn,
            psn: 5,
            rkey: 0x99,
            va: 0x2000 + p + 4,
            data: b"warmed!!",
            ..Default::default()
        };
        let r = tx
            .placing_run(1)
            .unwrap()
            .place_and_push(4791, 0, &[0u8; 40], &pl, Icrc::Unchecked)
            .unwrap();
        assert_eq!(r, Ok(host + p + 4));
        assert_eq!(crate::placed_shared(), before + 1);
        assert_eq!(&b[p as usize + 4..p as usize + 12], b"warmed!!");
        // An entry naming another file at that fd is not mapped.
        let other = open();
        rx.unpublish_mr(0x99);
        assert!(rx.publish_mr(&mr(shared.ino + 1)));
        other.warm_placement();
        assert!(!other.shared_mapped(shared.ino) && !other.shared_mapped(shared.ino + 1));
        rx.unpublish_mr(0x99);
        deregister_checked(host, 2 * p, false);
    }

    #[test]
    fn a_forked_child_gets_private_pages_with_the_contents_at_fork() {
        let p = remap::page_size();
        let b = buffer(2, 9);
        let host = b.as_ptr() as u64;
        register_checked(host, 2 * p, true, false);
        assert!(shared_pages(host, 2 * p).is_some());
        // SAFETY: the child only reads and writes its own memory and
        // leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let ok = b[5] == 9 && segment_of(host).is_none();
            b[5] = 42;
            // SAFETY: ends the child without running the parent's
            // destructors or test harness.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert_eq!(b[5], 9, "the child's write stays in the child");
        assert!(segment_of(host).is_some(), "still shared in the parent");
        deregister_checked(host, 2 * p, false);
    }
}
