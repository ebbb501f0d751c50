//! A `NETLINK_RDMA` socket that rxe-emu answers (`around_device::netlink`
//! is the protocol). With a view set, `socket(AF_NETLINK, *,
//! NETLINK_RDMA)` gives the program one end of a `SOCK_SEQPACKET` socket
//! pair; what it sends there is answered on the other end, one datagram
//! per netlink message, as the kernel's RDMA core would answer about
//! rxe-emu's devices. `bind`, `getsockname`, `setsockopt(SOL_NETLINK)`,
//! `recvmsg`/`recvfrom`/`recv` (which name the kernel, port 0, as the
//! sender) and `close` know such sockets; every other socket, and every
//! socket of a program without a view, is passed on untouched.
//!
//! Unlike the file calls, this path allocates (the answer is built from
//! the view's files when a request is sent): it runs only for a socket
//! the program asked to be an RDMA netlink socket.

use std::ffi::{c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};

use libc::{size_t, sockaddr, socklen_t, ssize_t};

use crate::{view, Real};

/// Open RDMA netlink sockets at once (more fail with EMFILE).
const SLOTS: usize = 32;

struct Slot {
    /// The program's fd, -1 if free.
    fd: AtomicI32,
    /// Our end.
    peer: AtomicI32,
    /// Its netlink port id.
    portid: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    fd: AtomicI32::new(-1),
    peer: AtomicI32::new(-1),
    portid: AtomicU32::new(0),
};
static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Slots in use: the fast path of every hooked call is one load of it.
static IN_USE: AtomicUsize = AtomicUsize::new(0);
/// For port ids after the first (which is the pid, as the kernel's
/// autobind gives the first netlink socket of a process).
static NEXT_PORT: AtomicU32 = AtomicU32::new(0);

fn slot(fd: c_int) -> Option<&'static Slot> {
    if fd < 0 || IN_USE.load(Ordering::Acquire) == 0 {
        return None;
    }
    TABLE.iter().find(|s| s.fd.load(Ordering::Acquire) == fd)
}

static R_SOCKET: Real = Real::new(c"socket");
static R_BIND: Real = Real::new(c"bind");
static R_GETSOCKNAME: Real = Real::new(c"getsockname");
static R_SETSOCKOPT: Real = Real::new(c"setsockopt");
static R_SENDTO: Real = Real::new(c"sendto");
static R_SEND: Real = Real::new(c"send");
static R_SENDMSG: Real = Real::new(c"sendmsg");
static R_RECVMSG: Real = Real::new(c"recvmsg");
static R_RECVFROM: Real = Real::new(c"recvfrom");
static R_RECV: Real = Real::new(c"recv");
static R_CLOSE: Real = Real::new(c"close");

fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local and always writable.
    unsafe { *libc::__errno_location() = e };
}

/// The kernel's address, as a netlink reply names its sender.
fn kernel_addr() -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain data; all zeroes is valid.
    let mut a: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    a.nl_family = libc::AF_NETLINK as u16;
    a
}

/// Copy `a` into the caller's address buffer of `*len` bytes, as the
/// kernel does (truncated to the buffer; `*len` set to the full size).
///
/// # Safety
/// `addr` is NULL or has `*len` writable bytes; `len` is NULL or valid.
unsafe fn put_addr(a: &libc::sockaddr_nl, addr: *mut c_void, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let full = std::mem::size_of::<libc::sockaddr_nl>();
    // SAFETY: the caller's promise.
    let n = (unsafe { *len } as usize).min(full);
    // SAFETY: n bytes of ours into n of theirs.
    unsafe {
        std::ptr::copy_nonoverlapping(a as *const _ as *const u8, addr as *mut u8, n);
        *len = full as socklen_t;
    }
}

/// Answer a request sent on `s`: each reply message becomes a datagram
/// on our end, for the program to receive.
fn answer(s: &Slot, req: &[u8]) {
    let v = view();
    let devs = around_device::netlink::devices_from_view(
        Path::new(std::ffi::OsStr::from_bytes(v)),
        |name| {
            let Ok(c) = std::ffi::CString::new(name) else {
                return 0;
            };
            // SAFETY: a NUL-terminated interface name.
            unsafe { libc::if_nametoindex(c.as_ptr()) }
        },
    );
    let peer = s.peer.load(Ordering::Acquire);
    for m in around_device::netlink::answer(req, s.portid.load(Ordering::Acquire), &devs) {
        // SAFETY: our end of the pair and a buffer of m.len() bytes;
        // write(2) on a SOCK_SEQPACKET socket sends one datagram.
        unsafe { libc::write(peer, m.as_ptr() as *const c_void, m.len()) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    if domain != libc::AF_NETLINK
        || protocol != around_device::netlink::NETLINK_RDMA
        || view().is_empty()
    {
        return call!(
            R_SOCKET as unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
            -1,
            domain,
            ty,
            protocol
        );
    }
    let mut fds = [-1; 2];
    let flags = ty & (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    // SAFETY: a 2-element array for socketpair to fill.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | flags,
            0,
            fds.as_mut_ptr(),
        )
    } != 0
    {
        return -1;
    }
    // Our end never blocks the program: it is only written to.
    let Some(s) = TABLE.iter().find(|s| {
        s.fd.compare_exchange(-1, fds[0], Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }) else {
        // SAFETY: the two fds just made.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        set_errno(libc::EMFILE);
        return -1;
    };
    s.peer.store(fds[1], Ordering::Release);
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let n = NEXT_PORT.fetch_add(1, Ordering::AcqRel);
    s.portid.store(
        if n == 0 {
            pid
        } else {
            0x8000_0000 | (pid.wrapping_add(n) & 0x7fff_ffff)
        },
        Ordering::Release,
    );
    IN_USE.fetch_add(1, Ordering::AcqRel);
    fds[0]
}

#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = slot(fd) else {
        return call!(
            R_BIND as unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int,
            -1,
            fd,
            addr,
            len
        );
    };
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sockaddr_nl>() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a sockaddr_nl-sized buffer, as checked.
    let a = unsafe { &*(addr as *const libc::sockaddr_nl) };
    if i32::from(a.nl_family) != libc::AF_NETLINK {
        set_errno(libc::EINVAL);
        return -1;
    }
    if a.nl_pid != 0 {
        s.portid.store(a.nl_pid, Ordering::Release);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let Some(s) = slot(fd) else {
        return call!(
            R_GETSOCKNAME as unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
            -1,
            fd,
            addr,
            len
        );
    };
    let mut a = kernel_addr();
    a.nl_pid = s.portid.load(Ordering::Acquire);
    // SAFETY: the program's buffer and length.
    unsafe { put_addr(&a, addr as *mut c_void, len) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *const c_void,
    len: socklen_t,
) -> c_int {
    if level == libc::SOL_NETLINK && slot(fd).is_some() {
        // NETLINK_EXT_ACK, NETLINK_CAP_ACK, ...: our answers never carry
        // extended acknowledgements and always cap the echoed request.
        return 0;
    }
    call!(
        R_SETSOCKOPT
            as unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int,
        -1,
        fd,
        level,
        name,
        value,
        len
    )
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    dest: *const sockaddr,
    dest_len: socklen_t,
) -> ssize_t {
    let Some(s) = slot(fd) else {
        return call!(
            R_SENDTO
                as unsafe extern "C" fn(
                    c_int,
                    *const c_void,
                    size_t,
                    c_int,
                    *const sockaddr,
                    socklen_t,
                ) -> ssize_t,
            -1,
            fd,
            buf,
            len,
            flags,
            dest,
            dest_len
        );
    };
    if buf.is_null() && len > 0 {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the program's buffer of len bytes.
    let req = if len == 0 {
        &[][..]
    } else {
        unsafe { std::slice::from_raw_parts(buf as *const u8, len) }
    };
    answer(s, req);
    len as ssize_t
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    if slot(fd).is_some() {
        // SAFETY: as sendto, without an address.
        return unsafe { sendto(fd, buf, len, flags, std::ptr::null(), 0) };
    }
    call!(
        R_SEND as unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t,
        -1,
        fd,
        buf,
        len,
        flags
    )
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    let Some(s) = slot(fd) else {
        return call!(
            R_SENDMSG as unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> ssize_t,
            -1,
            fd,
            msg,
            flags
        );
    };
    if msg.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the program's msghdr and its iovecs.
    let m = unsafe { &*msg };
    let mut req = Vec::new();
    for i in 0..m.msg_iovlen {
        // SAFETY: msg_iovlen iovecs at msg_iov.
        let v = unsafe { &*m.msg_iov.add(i) };
        if v.iov_len > 0 && !v.iov_base.is_null() {
            // SAFETY: iov_len bytes at iov_base.
            req.extend_from_slice(unsafe {
                std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len)
            });
        }
    }
    answer(s, &req);
    req.len() as ssize_t
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    let ours = slot(fd).is_some();
    let r = call!(
        R_RECVMSG as unsafe extern "C" fn(c_int, *mut libc::msghdr, c_int) -> ssize_t,
        -1,
        fd,
        msg,
        flags
    );
    if ours && r >= 0 && !msg.is_null() {
        // SAFETY: the program's msghdr; its name buffer has msg_namelen
        // bytes.
        unsafe {
            let m = &mut *msg;
            put_addr(&kernel_addr(), m.msg_name, &mut m.msg_namelen);
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src: *mut sockaddr,
    src_len: *mut socklen_t,
) -> ssize_t {
    if slot(fd).is_none() {
        return call!(
            R_RECVFROM
                as unsafe extern "C" fn(
                    c_int,
                    *mut c_void,
                    size_t,
                    c_int,
                    *mut sockaddr,
                    *mut socklen_t,
                ) -> ssize_t,
            -1,
            fd,
            buf,
            len,
            flags,
            src,
            src_len
        );
    }
    let r = call!(
        R_RECV as unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t,
        -1,
        fd,
        buf,
        len,
        flags
    );
    if r >= 0 {
        // SAFETY: the program's address buffer and length.
        unsafe { put_addr(&kernel_addr(), src as *mut c_void, src_len) };
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if let Some(s) = slot(fd) {
        let peer = s.peer.swap(-1, Ordering::AcqRel);
        s.fd.store(-1, Ordering::Release);
        IN_USE.fetch_sub(1, Ordering::AcqRel);
        if peer >= 0 {
            // SAFETY: our end, closed once (swapped out above).
            unsafe { libc::syscall(libc::SYS_close, peer) };
        }
    }
    call!(R_CLOSE as unsafe extern "C" fn(c_int) -> c_int, -1, fd)
}
