//! System calls std does not wrap: waiting on several fds with a
//! sub-millisecond timeout, IP_MTU_DISCOVER, finding an address's
//! interface index, and datagrams with their IP TOS / traffic class
//! (`sendmmsg` with an `IP_TOS`/`IPV6_TCLASS` control message, `recvmsg`
//! reading the one `IP_RECVTOS`/`IPV6_RECVTCLASS` asks for).

use std::os::fd::RawFd;
use std::time::Duration;

/// Wait until one of `fds` is readable or `timeout` passes (`None`: no
/// limit). Returns false on timeout. EINTR counts as a timeout.
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> bool {
    wait_readable_mask(fds, timeout).is_some_and(|m| m != 0)
}

/// [`wait_readable`], telling which: bit `i` is set if `fds[i]` (of the
/// first 64) is readable or in error. `Some(0)` is a timeout (none was
/// readable); `None` a wait that ended without saying (EINTR, or an
/// error): then none is known to be quiet.
pub(crate) fn wait_readable_mask(fds: &[RawFd], timeout: Option<Duration>) -> Option<u64> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` is a valid, exclusively borrowed array of `pfds.len()`
    // pollfd structs; `tsp` is null or points to a timespec that outlives
    // the call; a null sigmask leaves the signal mask unchanged.
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if n < 0 {
        return None;
    }
    Some(
        pfds.iter()
            .take(64)
            .enumerate()
            .filter(|(_, p)| p.revents != 0)
            .fold(0, |m, (i, _)| m | 1 << i),
    )
}

/// Make the calling thread's timed waits end on time (`PR_SET_TIMERSLACK`
/// 1 ns). Linux's default slack of 50 µs makes a `ppoll` of 50 µs last
/// 100 µs or more; the progress thread's short waits are its latency.
pub(crate) fn set_timer_slack_1ns() {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long by value and
    // touches no memory of ours; it affects only the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

/// Bytes of control data that one `IP_TOS` / `IPV6_TCLASS` message (an
/// int) takes, padded as the kernel walks them.
fn tos_cmsg_space() -> usize {
    // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as libc::c_uint) as usize }
}

/// Send `items` on the UDP socket `fd`, in order, each as the datagram
/// `msg` makes of it (payload, destination, IP TOS / traffic class), in as
/// few `sendmmsg` calls as it takes. A datagram whose TOS is not 0 carries
/// it in an `IP_TOS` (IPv4) or `IPV6_TCLASS` (IPv6) control message, so
/// its DSCP and ECN bits reach the wire; one with TOS 0 has no control
/// data at all (the socket's own TOS, 0, applies: what kernel rxe sends).
/// Returns how many were sent: all of them, or fewer when the kernel
/// refused the next one (its error is then the caller's to count; an error
/// on the very first is returned). The message headers live in per-thread
/// buffers that are reused, so a call allocates only while a thread's
/// largest batch grows.
pub(crate) fn send_many<T>(
    fd: RawFd,
    items: &[T],
    msg: impl Fn(&T) -> (&[u8], std::net::SocketAddr, u8),
) -> std::io::Result<usize> {
    type Scratch = (
        Vec<socket2::SockAddr>,
        Vec<libc::iovec>,
        Vec<libc::mmsghdr>,
        Vec<u8>,
        Vec<u64>,
    );
    thread_local! {
        static SCRATCH: std::cell::RefCell<Scratch> = const {
            std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()))
        };
    }
    // A flush at process exit (the drop-in's atexit handler) comes after
    // the thread's storage is gone: it builds its headers in a fresh one.
    let send = |s: &mut Scratch| {
        let (addrs, iov, hdrs, toses, ctrl) = s;
        addrs.clear();
        iov.clear();
        hdrs.clear();
        toses.clear();
        ctrl.clear();
        for it in items {
            let (payload, dst, tos) = msg(it);
            addrs.push(dst.into());
            iov.push(libc::iovec {
                iov_base: payload.as_ptr() as *mut libc::c_void,
                iov_len: payload.len(),
            });
            toses.push(tos);
        }
        // Control data: `words` u64s (cmsghdr's alignment) per datagram
        // with a TOS, allocated first so no pointer into `ctrl` moves.
        let space = tos_cmsg_space();
        let words = space.div_ceil(8);
        ctrl.resize(toses.iter().filter(|t| **t != 0).count() * words, 0);
        let mut tos_items = 0;
        for k in 0..items.len() {
            // SAFETY: an all-zero mmsghdr is a valid value (null pointers,
            // zero lengths); the fields used are set just below.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = addrs[k].as_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_namelen = addrs[k].len();
            h.msg_hdr.msg_iov = &mut iov[k];
            h.msg_hdr.msg_iovlen = 1;
            let tos = toses[k];
            if tos != 0 {
                let v6 = addrs[k].is_ipv6();
                let buf = &mut ctrl[tos_items * words..(tos_items + 1) * words];
                tos_items += 1;
                h.msg_hdr.msg_control = buf.as_mut_ptr() as *mut libc::c_void;
                h.msg_hdr.msg_controllen = space as _;
                let (level, kind) = if v6 {
                    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
                } else {
                    (libc::IPPROTO_IP, libc::IP_TOS)
                };
                // SAFETY: `msg_control` points at `space` zeroed bytes of
                // `buf`, aligned for cmsghdr (u64) and large enough for
                // one header and an int (CMSG_SPACE), so CMSG_FIRSTHDR
                // returns a pointer to the start of `buf` and CMSG_DATA
                // one inside it with room for the int; both are written
                // through once, unaligned-safe for the int.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                    (*c).cmsg_level = level;
                    (*c).cmsg_type = kind;
                    (*c).cmsg_len =
                        libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as libc::c_uint) as _;
                    std::ptr::write_unaligned(
                        libc::CMSG_DATA(c) as *mut libc::c_int,
                        libc::c_int::from(tos),
                    );
                }
            }
            hdrs.push(h);
        }
        let mut done = 0;
        let mut first_err = None;
        while done < hdrs.len() {
            let n = (hdrs.len() - done).min(1024) as libc::c_uint; // UIO_MAXIOV
                                                                   // SAFETY: `hdrs[done..]` holds at least `n` initialised mmsghdr
                                                                   // structs; each points at one iovec of `iov` (the payloads of
                                                                   // `items`, borrowed for this call), one address of `addrs` and
                                                                   // either no control data or one control message in `ctrl`,
                                                                   // none of which moves or is freed before the call returns; the
                                                                   // kernel only reads them, and writes `msg_len`.
            let r = unsafe { libc::sendmmsg(fd, hdrs[done..].as_mut_ptr(), n, 0) };
            if r < 0 {
                if done == 0 {
                    first_err = Some(std::io::Error::last_os_error());
                }
                break;
            }
            if r == 0 {
                break;
            }
            done += r as usize;
            if (r as libc::c_uint) < n {
                break; // the next one was refused: the caller counts it
            }
        }
        // The headers point into `items`: leave no pointer behind.
        iov.clear();
        hdrs.clear();
        first_err.map_or(Ok(done), Err)
    };
    SCRATCH
        .try_with(|s| send(&mut s.borrow_mut()))
        .unwrap_or_else(|_| send(&mut Default::default()))
}

/// Receive one datagram from the UDP socket `fd` (non-blocking) into
/// `buf`, with its sender and the TOS / traffic-class byte of its IP
/// header. The socket must have `IP_RECVTOS` (IPv4) or `IPV6_RECVTCLASS`
/// (IPv6) set; without the control message the TOS reads as 0.
pub(crate) fn recv_with_tos(
    fd: RawFd,
    buf: &mut [u8],
) -> std::io::Result<(usize, std::net::SocketAddr, u8)> {
    let mut ctrl = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut tos = 0u8;
    // SAFETY: `try_init` hands us a zeroed sockaddr storage and its length
    // to fill. The msghdr points at that storage, at one iovec over `buf`
    // (exclusively borrowed, `buf.len()` bytes) and at `ctrl` (64 bytes,
    // aligned for cmsghdr), all alive for the call; recvmsg writes at most
    // those lengths and sets `msg_controllen` to what it wrote. The
    // control messages are then walked with CMSG_FIRSTHDR/CMSG_NXTHDR,
    // which stay within `msg_controllen`, and each data byte read lies
    // inside the message the kernel wrote (its cmsg_len is checked).
    let (n, from) = unsafe {
        socket2::SockAddr::try_init(|addr, len| {
            let mut h: libc::msghdr = std::mem::zeroed();
            h.msg_name = addr as *mut libc::c_void;
            h.msg_namelen = *len;
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = std::mem::size_of_val(&ctrl) as _;
            let r = libc::recvmsg(fd, &mut h, 0);
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            *len = h.msg_namelen;
            let mut c = libc::CMSG_FIRSTHDR(&h);
            while !c.is_null() {
                let data_len = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                match ((*c).cmsg_level, (*c).cmsg_type) {
                    (libc::IPPROTO_IP, libc::IP_TOS) if data_len >= 1 => {
                        tos = *libc::CMSG_DATA(c);
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
                        if data_len >= std::mem::size_of::<libc::c_int>() =>
                    {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        tos = v as u8;
                    }
                    _ => {}
                }
                c = libc::CMSG_NXTHDR(&h, c);
            }
            Ok(r as usize)
        })?
    };
    let from = from.as_socket().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "recvmsg: a sender that is not an IP address",
        )
    })?;
    Ok((n, from, tos))
}

/// Set IP_MTU_DISCOVER to IP_PMTUDISC_DO on an IPv4 socket: every datagram
/// carries DF, and Linux then gives it IP ID 0 (unconnected socket), the ID
/// the engine computed the ICRC over. Kernel rxe sends DF too.
pub(crate) fn set_dont_fragment(fd: RawFd) -> std::io::Result<()> {
    let val: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: `val` is a live c_int and its size is passed; `fd` is an open
    // socket owned by the caller for the duration of the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &val as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The index of the interface that holds `addr` (for IPv6 multicast, which
/// names interfaces by index), if any.
pub(crate) fn ifindex_of(addr: std::net::IpAddr) -> Option<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `list` on success; we free
    // it with freeifaddrs below and never use it afterwards.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = list;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until
        // freeifaddrs; its `ifa_addr` is null or points to a sockaddr whose
        // family says which sockaddr_* it is; `ifa_name` is a C string.
        unsafe {
            let ifa = &*p;
            let sa = ifa.ifa_addr;
            let here = if sa.is_null() {
                None
            } else {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let s = &*(sa as *const libc::sockaddr_in);
                        Some(std::net::IpAddr::V4(std::net::Ipv4Addr::from(
                            u32::from_be(s.sin_addr.s_addr),
                        )))
                    }
                    libc::AF_INET6 => {
                        let s = &*(sa as *const libc::sockaddr_in6);
                        Some(std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                            s.sin6_addr.s6_addr,
                        )))
                    }
                    _ => None,
                }
            };
            if here == Some(addr) {
                let i = libc::if_nametoindex(ifa.ifa_name);
                if i != 0 {
                    found = Some(i);
                    break;
                }
            }
            p = ifa.ifa_next;
        }
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;

    /// `send_many` delivers every datagram, each whole, in order, to its
    /// own destination, including more than one `sendmmsg` call's worth.
    #[test]
    fn send_many_sends_each_datagram_in_order() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        for s in [&b, &c] {
            socket2::SockRef::from(s)
                .set_recv_buffer_size(8 << 20)
                .unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
        }
        let (db, dc) = (b.local_addr().unwrap(), c.local_addr().unwrap());
        let payloads: Vec<Vec<u8>> = (0..1500u32)
            .map(|i| {
                let mut p = i.to_be_bytes().to_vec();
                p.resize(4 + (i as usize % 97), i as u8);
                p
            })
            .collect();
        let msgs: Vec<(usize, &Vec<u8>)> = payloads.iter().enumerate().collect();
        use std::os::fd::AsRawFd;
        let sent = super::send_many(a.as_raw_fd(), &msgs, |(i, p)| {
            (p.as_slice(), if i % 3 == 0 { dc } else { db }, 0)
        });
        assert_eq!(sent.unwrap(), 1500);
        let mut buf = [0u8; 256];
        for (i, p) in payloads.iter().enumerate() {
            let s = if i % 3 == 0 { &c } else { &b };
            let n = s.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], p.as_slice(), "datagram {i}");
        }
    }

    /// A send while the thread's storage is being torn down (as the
    /// drop-in's flush at process exit runs, after glibc has destroyed the
    /// main thread's thread-locals) still sends; it used to panic, and a
    /// panic there aborts the process.
    #[test]
    fn send_many_works_after_its_thread_storage_is_gone() {
        use std::os::fd::AsRawFd;
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let dst = b.local_addr().unwrap();
        struct AtExit(UdpSocket, std::net::SocketAddr);
        impl Drop for AtExit {
            fn drop(&mut self) {
                let r = super::send_many(self.0.as_raw_fd(), &[b"last"], |p| (&p[..], self.1, 0));
                assert_eq!(r.unwrap(), 1);
            }
        }
        thread_local! {
            static LAST: std::cell::RefCell<Option<AtExit>> = const { std::cell::RefCell::new(None) };
        }
        std::thread::spawn(move || {
            // Registered before send_many's own storage, so destroyed
            // after it (destructors run in reverse order).
            LAST.with(|l| *l.borrow_mut() = Some(AtExit(a.try_clone().unwrap(), dst)));
            let r = super::send_many(a.as_raw_fd(), &[b"first"], |p| (&p[..], dst, 0));
            assert_eq!(r.unwrap(), 1);
        })
        .join()
        .unwrap();
        let mut buf = [0u8; 16];
        for want in [&b"first"[..], b"last"] {
            let n = b.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], want);
        }
    }
}
