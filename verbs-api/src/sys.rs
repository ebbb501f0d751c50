//! The one system call std does not wrap: waiting on several fds with a
//! sub-millisecond timeout.

use std::os::fd::RawFd;
use std::time::Duration;

/// Wait until one of `fds` is readable or `timeout` passes (`None`: no
/// limit). Returns false on timeout. EINTR counts as a timeout.
pub(crate) fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> bool {
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
    n > 0
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
