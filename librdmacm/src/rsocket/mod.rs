//! rsockets (`rsocket`, `rbind`, `rconnect`, `rsend`, `rpoll`, ...):
//! sockets over RDMA, as rdma-core implements them inside librdmacm
//! (`librdmacm/rsocket.c`, v44), speaking its protocol on the wire so
//! that our rsockets and rdma-core's connect to each other.
//!
//! **Stream sockets** (`SOCK_STREAM`) are implemented ([`stream`]): an
//! rsocket is a synchronous `rdma_cm_id` (made with no event channel)
//! with an RC QP; its number is the fd of the id's private event
//! channel, as in rsocket.c, so it never collides with a real fd.
//! `rpoll`/`rselect` poll the real fds behind each rsocket (its CQ's
//! completion channel and its CM event channel) together with any
//! ordinary fds; `repoll_*` (rdma-core 65) keep epoll sets over `rpoll`
//! ([`epoll`]).
//!
//! Not implemented, failing with `ENOSYS` (and saying so under
//! `RXE_EMU_DEBUG=1`): datagram rsockets (`SOCK_DGRAM`) and direct data
//! placement (`riomap`, `riounmap`, `riowrite`; we advertise an iomap of
//! size 0, as rsocket.c does by default). Keepalive messages are not
//! sent (the options are kept and reported).

mod epoll;
mod poll;
pub mod proto;
mod stream;
mod verbs;

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use emulator_daemon::cmproto::CmErr;

use crate::abi::*;
use crate::err;
use stream::{state, RSocket, Stream};

// ---------------------------------------------------------------- registry

/// Live rsockets by number (rsocket.c's `idm`).
static SOCKETS: Mutex<Option<HashMap<c_int, Arc<RSocket>>>> = Mutex::new(None);

fn insert(fd: c_int, s: Stream) -> Arc<RSocket> {
    let rs = Arc::new(RSocket {
        inner: Mutex::new(s),
    });
    SOCKETS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(fd, rs.clone());
    rs
}

pub(crate) fn lookup(fd: c_int) -> Option<Arc<RSocket>> {
    SOCKETS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()?
        .get(&fd)
        .cloned()
}

fn remove(fd: c_int) -> Option<Arc<RSocket>> {
    SOCKETS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()?
        .remove(&fd)
}

fn get(fd: c_int) -> Result<Arc<RSocket>, CmErr> {
    lookup(fd).ok_or_else(|| err(libc::EBADF, format!("{fd} is not an rsocket")))
}

/// Run an entry point that returns a count (or -1 with errno).
fn call_n<T: TryFrom<usize> + From<i8>>(what: &str, f: impl FnOnce() -> Result<usize, CmErr>) -> T {
    crate::guard(what, T::from(-1), || match f() {
        Ok(n) => T::try_from(n).unwrap_or(T::from(-1)),
        Err(e) => {
            // Would-block is a normal answer: no debug noise.
            if e.errno != libc::EAGAIN && e.errno != libc::EINPROGRESS {
                crate::debug(|| format!("{what}: {e}"));
            }
            crate::set_errno(e.errno);
            T::from(-1)
        }
    })
}

fn call(what: &str, f: impl FnOnce() -> Result<(), CmErr>) -> c_int {
    call_n::<isize>(what, || f().map(|()| 0)) as c_int
}

// ---------------------------------------------------------------- sockets

#[no_mangle]
pub extern "C" fn rxe_rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    let n: isize = call_n("rsocket", || {
        if domain != libc::AF_INET && domain != libc::AF_INET6 && domain != AF_IB {
            return Err(err(libc::ENOTSUP, format!("address family {domain}")));
        }
        if kind == libc::SOCK_DGRAM {
            return Err(err(
                libc::ENOSYS,
                "datagram rsockets (SOCK_DGRAM) are not implemented by rxe-emu's librdmacm",
            ));
        }
        if kind != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
            return Err(err(
                libc::ENOTSUP,
                format!("socket type {kind}, protocol {protocol}"),
            ));
        }
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: a synchronous id (private channel) into our pointer.
        if unsafe {
            crate::id::rxe_rdma_create_id(
                std::ptr::null_mut(),
                &mut id,
                std::ptr::null_mut(),
                RDMA_PS_TCP,
            )
        } != 0
        {
            let e = crate::errno();
            return Err(err(e, "rdma_create_id failed"));
        }
        // SAFETY: the new id and its channel are live.
        let fd = unsafe {
            (*id).route.addr.src_storage.ss_family = domain as libc::sa_family_t;
            (*(*id).channel).fd
        };
        stream::set_nonblock(fd);
        insert(fd, Stream::new(id, None));
        Ok(fd as usize)
    });
    n as c_int
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rbind(
    socket: c_int,
    addr: *const libc::sockaddr,
    _addrlen: libc::socklen_t,
) -> c_int {
    call("rbind", || {
        let rs = get(socket)?;
        let mut g = rs.lock();
        // SAFETY: our id; the program's address.
        if unsafe { crate::id::rxe_rdma_bind_addr(g.cm_id, addr as *mut libc::sockaddr) } != 0 {
            return Err(err(crate::errno(), "rdma_bind_addr failed"));
        }
        g.state = state::BOUND;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn rxe_rlisten(socket: c_int, backlog: c_int) -> c_int {
    call("rlisten", || {
        let rs = get(socket)?;
        let mut g = rs.lock();
        if g.state == state::LISTENING {
            return Ok(());
        }
        // SAFETY: our id.
        if unsafe { crate::id::rxe_rdma_listen(g.cm_id, backlog) } != 0 {
            return Err(err(crate::errno(), "rdma_listen failed"));
        }
        g.state = state::LISTENING;
        Ok(())
    })
}

/// Take the next connection request of a listener and accept it.
fn accept(listener: &Arc<RSocket>) -> Result<c_int, CmErr> {
    let mut lg = listener.lock();
    if lg.state != state::LISTENING {
        return Err(err(libc::EBADF, "not a listening rsocket"));
    }
    let nonblock = lg.fd_flags & libc::O_NONBLOCK != 0;
    loop {
        let mut new_id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: our listener (synchronous, non-blocking channel).
        let r = unsafe { crate::ep::rxe_rdma_get_request(lg.cm_id, &mut new_id) };
        if r != 0 {
            let e = crate::errno();
            if e != libc::EAGAIN && e != libc::EWOULDBLOCK {
                return Err(err(e, "rdma_get_request failed"));
            }
            if nonblock {
                return Err(err(libc::EAGAIN, "no connection waiting"));
            }
            let mut p = libc::pollfd {
                fd: lg.cm_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            drop(lg);
            // SAFETY: poll on one pollfd of ours.
            unsafe { libc::poll(&mut p, 1, stream::WAKE_MS * 100) };
            lg = listener.lock();
            if lg.state != state::LISTENING {
                return Err(err(libc::EBADF, "the listener was closed"));
            }
            continue;
        }
        match stream::accept_request(&lg, new_id) {
            Ok(s) => {
                let fd = s.cm_fd();
                let accepting = s.state == state::ACCEPTING;
                drop(lg);
                let rs = insert(fd, s);
                if accepting && !nonblock {
                    // rsocket.c hands out accepted sockets once established.
                    let g = rs.lock();
                    let (mut g, r) = stream::finish_connect(&rs, g);
                    if let Err(e) = r {
                        remove(fd);
                        stream::free(&mut g);
                        return Err(e);
                    }
                }
                return Ok(fd);
            }
            Err(e) => {
                crate::debug(|| format!("raccept: refusing a connection request: {e}"));
                // SAFETY: the request's id, ours to reject and destroy.
                unsafe {
                    crate::id::rxe_rdma_reject(new_id, std::ptr::null(), 0);
                    let mut dead = Stream::new(new_id, None);
                    stream::free(&mut dead);
                }
                if nonblock {
                    return Err(err(libc::EAGAIN, "no connection waiting"));
                }
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_raccept(
    socket: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> c_int {
    call_n::<isize>("raccept", || {
        let l = get(socket)?;
        let fd = accept(&l)?;
        if !addr.is_null() && !addrlen.is_null() {
            // SAFETY: the program's buffer and length.
            unsafe { rxe_rgetpeername(fd, addr, addrlen) };
        }
        Ok(fd as usize)
    }) as c_int
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rconnect(
    socket: c_int,
    addr: *const libc::sockaddr,
    addrlen: libc::socklen_t,
) -> c_int {
    call("rconnect", || {
        let rs = get(socket)?;
        let mut g = rs.lock();
        if addr.is_null() {
            return Err(err(libc::EINVAL, "address is NULL"));
        }
        if g.state == state::INIT || g.state == state::BOUND {
            let n = (addrlen as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
            // SAFETY: the program's address of addrlen bytes; our id.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    addr as *const u8,
                    &mut (*g.cm_id).route.addr.dst_storage as *mut _ as *mut u8,
                    n,
                )
            };
        }
        let nonblock = g.fd_flags & libc::O_NONBLOCK != 0;
        match stream::do_connect(&mut g) {
            Err(e) if e.errno == libc::EINPROGRESS && !nonblock => stream::finish_connect(&rs, g).1,
            r => r,
        }
    })
}

#[no_mangle]
pub extern "C" fn rxe_rshutdown(socket: c_int, how: c_int) -> c_int {
    call("rshutdown", || stream::shutdown(&*get(socket)?, how))
}

#[no_mangle]
pub extern "C" fn rxe_rclose(socket: c_int) -> c_int {
    call("rclose", || {
        if epoll::close(socket).is_some() {
            return Ok(());
        }
        let rs = remove(socket).ok_or_else(|| err(libc::EBADF, "not an rsocket"))?;
        if rs.lock().state & state::CONNECTED != 0 {
            let _ = stream::shutdown(&rs, libc::SHUT_RDWR);
        }
        stream::free(&mut rs.lock());
        Ok(())
    })
}

// ---------------------------------------------------------------- data

#[no_mangle]
pub unsafe extern "C" fn rxe_rrecv(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
) -> isize {
    call_n("rrecv", || {
        stream::recv(&*get(socket)?, buf as *mut u8, len, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src_addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> isize {
    // SAFETY: the program's arguments, passed on.
    let n = unsafe { rxe_rrecv(socket, buf, len, flags) };
    if n > 0 && !src_addr.is_null() && !addrlen.is_null() {
        // SAFETY: as above.
        unsafe { rxe_rgetpeername(socket, src_addr, addrlen) };
    }
    n
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rread(socket: c_int, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: the program's buffer.
    unsafe { rxe_rrecv(socket, buf, count, 0) }
}

/// As rsocket.c's `rrecvv`: only the first vector is filled.
unsafe fn recvv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int, flags: c_int) -> isize {
    if iov.is_null() || iovcnt <= 0 {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the program's vector of iovcnt >= 1 entries.
    unsafe { rxe_rrecv(socket, (*iov).iov_base, (*iov).iov_len, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rreadv(
    socket: c_int,
    iov: *const libc::iovec,
    iovcnt: c_int,
) -> isize {
    // SAFETY: the program's vector.
    unsafe { recvv(socket, iov, iovcnt, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rrecvmsg(
    socket: c_int,
    msg: *mut libc::msghdr,
    flags: c_int,
) -> isize {
    if msg.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the program's message header.
    unsafe {
        if !(*msg).msg_control.is_null() && (*msg).msg_controllen > 0 {
            crate::set_errno(libc::ENOTSUP);
            return -1;
        }
        recvv(socket, (*msg).msg_iov, (*msg).msg_iovlen as c_int, flags)
    }
}

fn sendv(socket: c_int, iov: &[(*const u8, usize)], flags: c_int) -> isize {
    call_n("rsend", || stream::send(&*get(socket)?, iov, flags))
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rsend(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    sendv(socket, &[(buf as *const u8, len)], flags)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rsendto(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dest_addr: *const libc::sockaddr,
    addrlen: libc::socklen_t,
) -> isize {
    if !dest_addr.is_null() || addrlen != 0 {
        crate::set_errno(libc::EISCONN);
        return -1;
    }
    sendv(socket, &[(buf as *const u8, len)], flags)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize {
    sendv(socket, &[(buf as *const u8, count)], 0)
}

/// The (pointer, length) pairs of a C iovec array.
unsafe fn iovs(iov: *const libc::iovec, iovcnt: c_int) -> Option<Vec<(*const u8, usize)>> {
    if iov.is_null() || iovcnt < 0 {
        return None;
    }
    // SAFETY: the program's vector of iovcnt entries.
    let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
    Some(
        v.iter()
            .map(|e| (e.iov_base as *const u8, e.iov_len))
            .collect(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rwritev(
    socket: c_int,
    iov: *const libc::iovec,
    iovcnt: c_int,
) -> isize {
    // SAFETY: the program's vector.
    match unsafe { iovs(iov, iovcnt) } {
        Some(v) => sendv(socket, &v, 0),
        None => {
            crate::set_errno(libc::EINVAL);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rsendmsg(
    socket: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
) -> isize {
    if msg.is_null() {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the program's message header.
    unsafe {
        if !(*msg).msg_control.is_null() && (*msg).msg_controllen > 0 {
            crate::set_errno(libc::ENOTSUP);
            return -1;
        }
        match iovs((*msg).msg_iov, (*msg).msg_iovlen as c_int) {
            Some(v) => sendv(socket, &v, flags),
            None => {
                crate::set_errno(libc::EINVAL);
                -1
            }
        }
    }
}

// ---------------------------------------------------------------- poll

#[no_mangle]
pub unsafe extern "C" fn rxe_rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    crate::guard("rpoll", -1, || {
        if fds.is_null() && nfds > 0 {
            crate::set_errno(libc::EFAULT);
            return -1;
        }
        let fds = if nfds == 0 {
            &mut [][..]
        } else {
            // SAFETY: the program's array of nfds entries.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        poll::rpoll(fds, timeout)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    crate::guard("rselect", -1, || {
        // SAFETY: the program's sets (or NULL) and timeout.
        unsafe { poll::rselect(nfds, readfds, writefds, exceptfds, timeout) }
    })
}

// ---------------------------------------------------------------- names, options

/// Copy an address out as rsocket.c's `rs_copy_addr` does.
unsafe fn copy_addr(
    src: &libc::sockaddr_storage,
    dst: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) {
    let size = if c_int::from(src.ss_family) == libc::AF_INET {
        std::mem::size_of::<libc::sockaddr_in>()
    } else {
        std::mem::size_of::<libc::sockaddr_in6>()
    };
    // SAFETY: the program's buffer of *len bytes.
    unsafe {
        let n = size.min(*len as usize);
        std::ptr::copy_nonoverlapping(src as *const _ as *const u8, dst as *mut u8, n);
        *len = size as libc::socklen_t;
    }
}

fn name(socket: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t, peer: bool) -> c_int {
    call(if peer { "rgetpeername" } else { "rgetsockname" }, || {
        if addr.is_null() || len.is_null() {
            return Err(err(libc::EFAULT, "address or length is NULL"));
        }
        let rs = get(socket)?;
        let g = rs.lock();
        // SAFETY: our live id; the program's buffers.
        unsafe {
            let a = &(*g.cm_id).route.addr;
            copy_addr(
                if peer { &a.dst_storage } else { &a.src_storage },
                addr,
                len,
            );
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rgetpeername(
    socket: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> c_int {
    name(socket, addr, addrlen, true)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rgetsockname(
    socket: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> c_int {
    name(socket, addr, addrlen, false)
}

/// `SOL_RDMA` and its options (rsocket.h).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

#[no_mangle]
pub unsafe extern "C" fn rxe_rsetsockopt(
    socket: c_int,
    level: c_int,
    optname: c_int,
    optval: *const c_void,
    optlen: libc::socklen_t,
) -> c_int {
    call("rsetsockopt", || {
        let rs = get(socket)?;
        let mut g = rs.lock();
        let int = |min: usize| -> Result<u32, CmErr> {
            if optval.is_null() || (optlen as usize) < min {
                return Err(err(libc::EINVAL, "option value too short"));
            }
            // SAFETY: at least 4 readable bytes of the program's value.
            Ok(unsafe { std::ptr::read_unaligned(optval as *const u32) })
        };
        let mut opt_on = false;
        let which: Option<&mut u64>;
        match level {
            libc::SOL_SOCKET => {
                match optname {
                    libc::SO_REUSEADDR => {
                        let v = int(4)?;
                        // SAFETY: our id; the program's value.
                        let r = unsafe {
                            crate::id::rxe_rdma_set_option(
                                g.cm_id,
                                RDMA_OPTION_ID,
                                RDMA_OPTION_ID_REUSEADDR,
                                optval as *mut c_void,
                                optlen as usize,
                            )
                        };
                        let e = crate::errno();
                        if r != 0 && e != libc::ENOSYS && g.state == state::INIT {
                            return Err(err(e, "rdma_set_option(REUSEADDR) failed"));
                        }
                        opt_on = v != 0;
                    }
                    libc::SO_RCVBUF => {
                        let v = int(4)?;
                        if g.cq_fd().is_none() {
                            g.rbuf_size = v.saturating_mul(2);
                        }
                    }
                    libc::SO_SNDBUF => {
                        let v = int(4)?;
                        if g.cq_fd().is_none() {
                            g.sbuf_size = v.saturating_mul(2);
                        }
                        if g.sbuf_size < proto::RS_SNDLOWAT {
                            g.sbuf_size = proto::RS_SNDLOWAT << 1;
                        }
                    }
                    libc::SO_LINGER => {
                        let l_onoff = int(std::mem::size_of::<libc::linger>())?;
                        // Inverted so that the default (0) is on.
                        opt_on = l_onoff == 0;
                    }
                    libc::SO_KEEPALIVE => {
                        let v = int(4)?;
                        if v != 0 {
                            g.opts |= stream::OPT_KEEPALIVE;
                            if g.keepalive_time == 0 {
                                g.keepalive_time = std::fs::read_to_string(
                                    "/proc/sys/net/ipv4/tcp_keepalive_time",
                                )
                                .ok()
                                .and_then(|s| s.trim().parse().ok())
                                .unwrap_or(7200);
                            }
                        } else {
                            g.opts &= !stream::OPT_KEEPALIVE;
                        }
                        opt_on = g.opts & stream::OPT_KEEPALIVE != 0;
                    }
                    libc::SO_OOBINLINE => opt_on = int(4)? != 0,
                    _ => return Err(err(libc::ENOTSUP, format!("SOL_SOCKET option {optname}"))),
                }
                which = Some(&mut g.so_opts);
            }
            libc::IPPROTO_TCP => {
                match optname {
                    libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG => {}
                    libc::TCP_KEEPIDLE => {
                        let v = int(4)? as i32;
                        if v <= 0 {
                            return Err(err(libc::EINVAL, "TCP_KEEPIDLE must be positive"));
                        }
                        g.keepalive_time = v as u32;
                    }
                    libc::TCP_NODELAY => opt_on = int(4)? != 0,
                    _ => return Err(err(libc::ENOTSUP, format!("IPPROTO_TCP option {optname}"))),
                }
                which = Some(&mut g.tcp_opts);
            }
            libc::IPPROTO_IPV6 => {
                if optname != libc::IPV6_V6ONLY {
                    return Err(err(libc::ENOTSUP, format!("IPPROTO_IPV6 option {optname}")));
                }
                opt_on = int(4)? != 0;
                // SAFETY: our id; the program's value.
                if unsafe {
                    crate::id::rxe_rdma_set_option(
                        g.cm_id,
                        RDMA_OPTION_ID,
                        RDMA_OPTION_ID_AFONLY,
                        optval as *mut c_void,
                        optlen as usize,
                    )
                } != 0
                {
                    return Err(err(crate::errno(), "rdma_set_option(AFONLY) failed"));
                }
                which = Some(&mut g.ipv6_opts);
            }
            SOL_RDMA => {
                if g.state >= state::OPENING {
                    return Err(err(
                        libc::EINVAL,
                        "SOL_RDMA options must be set before connecting",
                    ));
                }
                let cap = u32::from(proto::RS_QP_MAX_SIZE);
                match optname {
                    RDMA_SQSIZE => g.sq_size = int(4)?.min(cap) as u16,
                    RDMA_RQSIZE => g.rq_size = int(4)?.min(cap) as u16,
                    RDMA_INLINE => g.sq_inline = int(4)?.min(cap) as u16,
                    RDMA_IOMAPSIZE => {
                        // Direct placement (riomap) is not implemented:
                        // we keep advertising no iomap.
                        int(4)?;
                    }
                    RDMA_ROUTE => {
                        // A path record to use instead of resolving one:
                        // RoCE resolves its route from the addresses.
                    }
                    _ => return Err(err(libc::ENOTSUP, format!("SOL_RDMA option {optname}"))),
                }
                which = None;
            }
            _ => return Err(err(libc::ENOTSUP, format!("option level {level}"))),
        }
        if let Some(bits) = which {
            if (0..64).contains(&optname) {
                if opt_on {
                    *bits |= 1 << optname;
                } else {
                    *bits &= !(1 << optname);
                }
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rgetsockopt(
    socket: c_int,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: *mut libc::socklen_t,
) -> c_int {
    call("rgetsockopt", || {
        if optval.is_null() || optlen.is_null() {
            return Err(err(libc::EFAULT, "option buffer or length is NULL"));
        }
        let rs = get(socket)?;
        let mut g = rs.lock();
        let bit = |bits: u64| -> c_int {
            c_int::from((0..64).contains(&optname) && bits & (1 << optname) != 0)
        };
        let v: c_int = match (level, optname) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
                bit(g.so_opts)
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => g.rbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => g.sbuf_size as c_int,
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if (unsafe { *optlen } as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(err(libc::EINVAL, "SO_LINGER needs a struct linger"));
                }
                let l = libc::linger {
                    l_onoff: 1 - bit(g.so_opts),
                    l_linger: 0,
                };
                // SAFETY: the program's buffer holds a struct linger.
                unsafe {
                    std::ptr::write_unaligned(optval as *mut libc::linger, l);
                    *optlen = std::mem::size_of::<libc::linger>() as libc::socklen_t;
                }
                return Ok(());
            }
            (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut g.err),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => 1,
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => g.keepalive_time as c_int,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => bit(g.tcp_opts),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {
                // SAFETY: our live id and its path record.
                unsafe {
                    let r = &(*g.cm_id).route;
                    if r.num_paths > 0 && !r.path_rec.is_null() {
                        1 << (7 + u32::from((*r.path_rec).mtu))
                    } else {
                        2048
                    }
                }
            }
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => bit(g.ipv6_opts),
            (SOL_RDMA, RDMA_SQSIZE) => c_int::from(g.sq_size),
            (SOL_RDMA, RDMA_RQSIZE) => c_int::from(g.rq_size),
            (SOL_RDMA, RDMA_INLINE) => c_int::from(g.sq_inline),
            (SOL_RDMA, RDMA_IOMAPSIZE) => c_int::from(g.target_iomap_size),
            _ => {
                return Err(err(
                    libc::ENOTSUP,
                    format!("option {optname} at level {level}"),
                ))
            }
        };
        // SAFETY: the program's buffer (rsocket.c writes an int).
        unsafe {
            if (*optlen as usize) < std::mem::size_of::<c_int>() {
                return Err(err(libc::EINVAL, "option buffer shorter than an int"));
            }
            std::ptr::write_unaligned(optval as *mut c_int, v);
            *optlen = std::mem::size_of::<c_int>() as libc::socklen_t;
        }
        Ok(())
    })
}

/// `int rfcntl(int socket, int cmd, ... /* arg */)`. Stable Rust cannot
/// define a variadic function; on the SysV x86-64 and AAPCS64 (Linux)
/// ABIs an int vararg travels in the same register as a third int
/// parameter, so we read it as one (only F_SETFL uses it).
#[no_mangle]
pub extern "C" fn rxe_rfcntl(socket: c_int, cmd: c_int, arg: c_int) -> c_int {
    crate::guard("rfcntl", -1, || {
        let rs = match get(socket) {
            Ok(rs) => rs,
            Err(e) => return crate::fail("rfcntl", &e),
        };
        let mut g = rs.lock();
        match cmd {
            libc::F_GETFL => g.fd_flags,
            libc::F_SETFL => {
                // Our fds stay non-blocking; the flag decides whether
                // calls wait.
                g.fd_flags = arg;
                0
            }
            _ => crate::fail("rfcntl", &err(libc::ENOTSUP, format!("command {cmd}"))),
        }
    })
}

// ---------------------------------------------------------------- not implemented

fn enosys(name: &str) -> c_int {
    crate::debug(|| {
        format!("{name}: direct data placement (riomap/riowrite) is not implemented by rxe-emu's librdmacm (ENOSYS)")
    });
    crate::set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub extern "C" fn rxe_riomap(
    _socket: c_int,
    _buf: *mut c_void,
    _len: usize,
    _prot: c_int,
    _flags: c_int,
    _offset: libc::off_t,
) -> libc::off_t {
    libc::off_t::from(enosys("riomap"))
}

#[no_mangle]
pub extern "C" fn rxe_riounmap(_socket: c_int, _buf: *mut c_void, _len: usize) -> c_int {
    enosys("riounmap")
}

#[no_mangle]
pub extern "C" fn rxe_riowrite(
    _socket: c_int,
    _buf: *const c_void,
    _count: usize,
    _offset: libc::off_t,
    _flags: c_int,
) -> usize {
    enosys("riowrite") as isize as usize
}
