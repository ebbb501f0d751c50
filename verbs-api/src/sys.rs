//! System calls std does not wrap: waiting on several fds with a
//! sub-millisecond timeout, IP_MTU_DISCOVER, and finding an address's
//! interface index.

use std::os::fd::RawFd;
use std::time::Duration;

/// Wait until one of `fds` is readable or `timeout` passes (`None`: no
/// limit). Returns false on timeout. EINTR counts as a timeout.
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> bool {
    wait_readable_which(fds, timeout) != 0
}

/// [`wait_readable`], telling which: bit `i` is set if `fds[i]` (of the
/// first 64) is readable or in error. 0 on timeout or EINTR.
pub(crate) fn wait_readable_which(fds: &[RawFd], timeout: Option<Duration>) -> u64 {
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
    if n <= 0 {
        return 0;
    }
    pfds.iter()
        .take(64)
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .fold(0, |m, (i, _)| m | 1 << i)
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

/// Send `items` on the UDP socket `fd`, in order, each as the datagram
/// `msg` makes of it (payload, destination), in as few `sendmmsg` calls
/// as it takes. Returns how many were sent: all of them, or fewer when
/// the kernel refused the next one (its error is then the caller's to
/// count; an error on the very first is returned). The message headers
/// live in per-thread buffers that are reused, so a call allocates only
/// while a thread's largest batch grows.
pub(crate) fn send_many<T>(
    fd: RawFd,
    items: &[T],
    msg: impl Fn(&T) -> (&[u8], std::net::SocketAddr),
) -> std::io::Result<usize> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<(Vec<socket2::SockAddr>, Vec<libc::iovec>, Vec<libc::mmsghdr>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
    }
    SCRATCH.with(|s| {
        let (addrs, iov, hdrs) = &mut *s.borrow_mut();
        addrs.clear();
        iov.clear();
        hdrs.clear();
        for it in items {
            let (payload, dst) = msg(it);
            addrs.push(dst.into());
            iov.push(libc::iovec {
                iov_base: payload.as_ptr() as *mut libc::c_void,
                iov_len: payload.len(),
            });
        }
        for k in 0..items.len() {
            // SAFETY: an all-zero mmsghdr is a valid value (null pointers,
            // zero lengths); the fields used are set just below.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = addrs[k].as_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_namelen = addrs[k].len();
            h.msg_hdr.msg_iov = &mut iov[k];
            h.msg_hdr.msg_iovlen = 1;
            hdrs.push(h);
        }
        let mut done = 0;
        let mut first_err = None;
        while done < hdrs.len() {
            let n = (hdrs.len() - done).min(1024) as libc::c_uint; // UIO_MAXIOV
                                                                   // SAFETY: `hdrs[done..]` holds at least `n` initialised mmsghdr
                                                                   // structs; each points at one iovec of `iov` (the payloads of
                                                                   // `items`, borrowed for this call) and one address of `addrs`,
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
    })
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
            (p.as_slice(), if i % 3 == 0 { dc } else { db })
        });
        assert_eq!(sent.unwrap(), 1500);
        let mut buf = [0u8; 256];
        for (i, p) in payloads.iter().enumerate() {
            let s = if i % 3 == 0 { &c } else { &b };
            let n = s.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], p.as_slice(), "datagram {i}");
        }
    }
}
