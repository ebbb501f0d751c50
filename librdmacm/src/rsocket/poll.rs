//! `rpoll` and `rselect` over rsockets and ordinary fds (rsocket.c's
//! algorithm: check every fd without waiting; then arm each rsocket's CQ,
//! `poll(2)` the real fds behind the rsockets together with the ordinary
//! ones, and check again until something is ready or time runs out).

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Instant;

use super::stream::{self, state, RSocket};

/// rsocket.c `wake_up_interval`: the longest single sleep in `poll(2)`,
/// after which every rsocket is checked again (ms).
const WAKE_UP_INTERVAL: c_int = 5000;

/// rsocket.c `rs_poll_rs`: the ready events of one rsocket, advancing a
/// connect and taking completions on the way. `nonblock == false` with
/// [`stream::is_cq_armed`] arms the CQ before the caller sleeps.
fn poll_rs(
    rs: &Arc<RSocket>,
    events: i16,
    nonblock: bool,
    test: fn(&stream::Stream) -> bool,
) -> i16 {
    let mut g = rs.lock();
    loop {
        let st = g.state;
        if (st & state::CONNECTED != 0 || st == state::DISCONNECTED || st & state::ERROR != 0)
            && g.cq_fd().is_some()
        {
            g.cm_events();
            let (g2, _) = stream::process_cq(rs, g, nonblock, test);
            g = g2;
            let mut rev = 0;
            if events & libc::POLLIN != 0 && stream::conn_have_rdata(&g) {
                rev |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && stream::can_send(&g) {
                rev |= libc::POLLOUT;
            }
            // rsocket.c reports POLLHUP as soon as the peer's DISCONNECT
            // arrives, even with data still to read, and programs that
            // treat POLLHUP as an error (rstream's do_poll) then lose the
            // tail of the stream; like TCP, we report it once the data is
            // read (or when the caller does not ask for POLLIN).
            let unread = events & libc::POLLIN != 0 && stream::have_rdata(&g);
            if g.state & state::CONNECTED == 0 && !unread {
                rev |= if g.state == state::DISCONNECTED {
                    libc::POLLHUP
                } else {
                    libc::POLLERR
                };
            }
            return rev;
        }
        if st == state::LISTENING {
            let mut p = libc::pollfd {
                fd: g.cm_fd(),
                events,
                revents: 0,
            };
            // SAFETY: poll on one pollfd of ours, without waiting.
            unsafe { libc::poll(&mut p, 1, 0) };
            return p.revents;
        }
        if st & state::OPENING != 0 {
            match stream::do_connect(&mut g) {
                Err(e) if e.errno == libc::EINPROGRESS => {}
                _ => continue,
            }
        }
        if g.state == state::CONNECT_ERROR {
            return (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR;
        }
        return 0;
    }
}

fn sockets(fds: &[libc::pollfd]) -> Vec<Option<Arc<RSocket>>> {
    fds.iter().map(|p| super::lookup(p.fd)).collect()
}

/// rsocket.c `rs_poll_check`: every fd, without waiting.
fn check(fds: &mut [libc::pollfd], socks: &[Option<Arc<RSocket>>]) -> c_int {
    let mut n = 0;
    for (p, s) in fds.iter_mut().zip(socks) {
        match s {
            Some(rs) => p.revents = poll_rs(rs, p.events, true, stream::poll_all),
            None => {
                p.revents = 0;
                // SAFETY: poll on the program's one pollfd, without waiting.
                unsafe { libc::poll(p, 1, 0) };
            }
        }
        if p.revents != 0 {
            n += 1;
        }
    }
    n
}

pub fn rpoll(fds: &mut [libc::pollfd], timeout: c_int) -> c_int {
    let start = Instant::now();
    let socks = sockets(fds);
    let n = check(fds, &socks);
    if n != 0 || timeout == 0 {
        return n;
    }
    let mut rfds: Vec<libc::pollfd> = Vec::with_capacity(fds.len() * 2);
    // For each entry of rfds: which of the program's fds it stands for.
    let mut owner: Vec<usize> = Vec::with_capacity(fds.len() * 2);
    loop {
        // Arm: each rsocket's CQ asks for an event before we sleep.
        rfds.clear();
        owner.clear();
        let mut ready = false;
        for (i, (p, s)) in fds.iter_mut().zip(&socks).enumerate() {
            match s {
                Some(rs) => {
                    p.revents = poll_rs(rs, p.events, false, stream::is_cq_armed);
                    ready |= p.revents != 0;
                    let g = rs.lock();
                    rfds.push(libc::pollfd {
                        fd: g.cm_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                    owner.push(i);
                    if g.state >= state::CONNECTED {
                        if let Some(fd) = g.cq_fd() {
                            rfds.push(libc::pollfd {
                                fd,
                                events: libc::POLLIN,
                                revents: 0,
                            });
                            owner.push(i);
                        }
                    }
                }
                None => {
                    rfds.push(libc::pollfd {
                        fd: p.fd,
                        events: p.events,
                        revents: 0,
                    });
                    owner.push(i);
                }
            }
        }
        if ready {
            let n = check(fds, &socks);
            if n != 0 {
                return n;
            }
            continue;
        }
        let sleep = if timeout < 0 {
            WAKE_UP_INTERVAL
        } else {
            let left = i64::from(timeout) - start.elapsed().as_millis() as i64;
            if left <= 0 {
                for p in fds.iter_mut() {
                    p.revents = 0;
                }
                return 0;
            }
            (left as c_int).min(WAKE_UP_INTERVAL)
        };
        // SAFETY: poll on our array.
        let r = unsafe { libc::poll(rfds.as_mut_ptr(), rfds.len() as libc::nfds_t, sleep) };
        if r < 0 {
            return -1;
        }
        // Take the completion events that woke us, then check all.
        let mut n = 0;
        for (i, (p, s)) in fds.iter_mut().zip(&socks).enumerate() {
            match s {
                Some(rs) => {
                    let woke = rfds
                        .iter()
                        .zip(&owner)
                        .any(|(r, &o)| o == i && r.revents != 0);
                    if woke {
                        rs.lock().get_cq_event();
                    }
                    p.revents = poll_rs(rs, p.events, true, stream::poll_all);
                }
                None => {
                    p.revents = rfds
                        .iter()
                        .zip(&owner)
                        .find(|(_, &o)| o == i)
                        .map_or(0, |(r, _)| r.revents);
                }
            }
            if p.revents != 0 {
                n += 1;
            }
        }
        if n != 0 {
            return n;
        }
    }
}

/// rsocket.c `rselect`: `rpoll` over the fds of the sets.
///
/// # Safety
/// The sets are NULL or valid `fd_set`s; `timeout` is NULL or valid.
pub unsafe fn rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let nfds = nfds.clamp(0, libc::FD_SETSIZE as c_int);
    // SAFETY: as the caller promises.
    let isset =
        |set: *mut libc::fd_set, fd: c_int| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
    let mut fds = Vec::new();
    for fd in 0..nfds {
        let mut events = 0;
        if isset(readfds, fd) {
            events |= libc::POLLIN;
        }
        if isset(writefds, fd) {
            events |= libc::POLLOUT;
        }
        if events != 0 || isset(exceptfds, fd) {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let to = if timeout.is_null() {
        -1
    } else {
        // SAFETY: as the caller promises.
        let t = unsafe { *timeout };
        (t.tv_sec * 1000 + t.tv_usec / 1000) as c_int
    };
    let r = rpoll(&mut fds, to);
    // SAFETY: as the caller promises.
    unsafe {
        for set in [readfds, writefds, exceptfds] {
            if !set.is_null() {
                libc::FD_ZERO(set);
            }
        }
    }
    if r <= 0 {
        return r;
    }
    let mut cnt = 0;
    for p in &fds {
        // SAFETY: as the caller promises; fd < FD_SETSIZE.
        unsafe {
            if !readfds.is_null() && p.revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                libc::FD_SET(p.fd, readfds);
                cnt += 1;
            }
            if !writefds.is_null() && p.revents & libc::POLLOUT != 0 {
                libc::FD_SET(p.fd, writefds);
                cnt += 1;
            }
            if !exceptfds.is_null() && p.revents & !(libc::POLLIN | libc::POLLOUT) != 0 {
                libc::FD_SET(p.fd, exceptfds);
                cnt += 1;
            }
        }
    }
    cnt
}
