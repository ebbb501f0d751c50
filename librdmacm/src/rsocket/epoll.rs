//! `repoll_create`, `repoll_ctl`, `repoll_wait` (rdma-core 65, node
//! `RDMACM_1.5`): epoll over rsockets and ordinary fds, which
//! `librspreload` puts behind `epoll_create`/`epoll_ctl`/`epoll_wait`.
//!
//! An epoll set is an interest list (fd, events, the caller's data) kept
//! here under a real fd number (an eventfd the program may close with
//! `rclose`); `repoll_wait` is [`super::poll::rpoll`] over a snapshot of
//! the list, level-triggered like rsocket.c's. A change by another thread
//! during a wait wakes it (a second eventfd in the polled set), so the
//! wait goes on with the new list, as rsocket.c's monitor thread reloads.
//!
//! Return conventions are rsocket.c's: `repoll_ctl` returns 0 or the
//! errno itself (EBADF, EINVAL, EEXIST, ENOENT; librspreload's
//! `epoll_ctl` passes it on), also leaving it in `errno`; `repoll_wait`
//! returns the number of events, 0 when time runs out, or -1 with errno
//! (rsocket.c returns an unknown set's EINVAL as a positive count, which
//! a caller would read as 22 events: we do not).

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;
use std::time::Instant;

/// One watched fd.
#[derive(Clone, Copy)]
struct Interest {
    fd: c_int,
    /// poll(2) events.
    events: i16,
    data: u64,
}

/// One epoll set: its interest list and the eventfd that wakes waiters.
struct Set {
    list: Vec<Interest>,
    wake: c_int,
}

static SETS: Mutex<Option<HashMap<c_int, Set>>> = Mutex::new(None);

fn sets() -> std::sync::MutexGuard<'static, Option<HashMap<c_int, Set>>> {
    SETS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The events epoll and poll(2) share, each as both name them.
const EVENTS: [(c_int, i16); 4] = [
    (libc::EPOLLIN, libc::POLLIN),
    (libc::EPOLLOUT, libc::POLLOUT),
    (libc::EPOLLERR, libc::POLLERR),
    (libc::EPOLLHUP, libc::POLLHUP),
];

fn epoll_to_poll(e: u32) -> i16 {
    EVENTS
        .iter()
        .filter(|(ep, _)| e & *ep as u32 != 0)
        .fold(0, |p, (_, pp)| p | pp)
}

fn poll_to_epoll(p: i16) -> u32 {
    EVENTS
        .iter()
        .filter(|(_, pp)| p & pp != 0)
        .fold(0, |e, (ep, _)| e | *ep as u32)
}

fn eventfd(cloexec: bool) -> c_int {
    let flags = libc::EFD_NONBLOCK | if cloexec { libc::EFD_CLOEXEC } else { 0 };
    // SAFETY: eventfd takes an initial value and flags.
    unsafe { libc::eventfd(0, flags) }
}

#[no_mangle]
pub extern "C" fn rxe_repoll_create(flags: c_int) -> c_int {
    crate::guard("repoll_create", -1, || {
        // rsocket.c passes O_CLOEXEC (EPOLL_CLOEXEC) on and ignores the rest.
        let cloexec = flags & libc::O_CLOEXEC != 0;
        let epfd = eventfd(cloexec);
        if epfd < 0 {
            return -1;
        }
        let wake = eventfd(true);
        if wake < 0 {
            // SAFETY: the eventfd made just now.
            unsafe { libc::close(epfd) };
            return -1;
        }
        sets().get_or_insert_with(HashMap::new).insert(
            epfd,
            Set {
                list: Vec::new(),
                wake,
            },
        );
        epfd
    })
}

/// The interest-list change of `repoll_ctl`: 0 or the errno.
fn ctl(list: &mut Vec<Interest>, op: c_int, fd: c_int, ev: Option<(u32, u64)>) -> c_int {
    let at = list.iter().position(|i| i.fd == fd);
    match (op, at, ev) {
        (libc::EPOLL_CTL_ADD, Some(_), _) => libc::EEXIST,
        (libc::EPOLL_CTL_ADD, None, Some((events, data))) => {
            list.push(Interest {
                fd,
                events: epoll_to_poll(events),
                data,
            });
            0
        }
        (libc::EPOLL_CTL_MOD, Some(i), Some((events, data))) => {
            list[i] = Interest {
                fd,
                events: epoll_to_poll(events),
                data,
            };
            0
        }
        (libc::EPOLL_CTL_DEL, Some(i), _) => {
            list.remove(i);
            0
        }
        (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, _, None) => libc::EFAULT,
        (libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL, None, _) => libc::ENOENT,
        _ => libc::EINVAL,
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_repoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut libc::epoll_event,
) -> c_int {
    let r = crate::guard("repoll_ctl", libc::EIO, || {
        if fd < 0 {
            return libc::EBADF;
        }
        if fd == epfd {
            return libc::EINVAL;
        }
        let ev = if event.is_null() {
            None
        } else {
            // SAFETY: the caller's epoll_event (a packed struct: copy the
            // fields out).
            let e = unsafe { std::ptr::read_unaligned(event) };
            Some((e.events, e.u64))
        };
        let mut g = sets();
        let Some(set) = g.as_mut().and_then(|m| m.get_mut(&epfd)) else {
            return libc::EINVAL;
        };
        let r = ctl(&mut set.list, op, fd, ev);
        if r == 0 {
            let one: u64 = 1;
            // SAFETY: 8 bytes to our eventfd (non-blocking; a full counter
            // already wakes every waiter).
            unsafe { libc::write(set.wake, &one as *const u64 as *const _, 8) };
        }
        r
    });
    if r != 0 {
        crate::debug(|| format!("repoll_ctl({epfd}, {op}, {fd}): errno {r}"));
        crate::set_errno(r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn rxe_repoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout: c_int,
) -> c_int {
    crate::guard("repoll_wait", -1, || {
        if maxevents <= 0 || events.is_null() {
            crate::set_errno(libc::EINVAL);
            return -1;
        }
        let start = Instant::now();
        loop {
            let (list, wake) = {
                let g = sets();
                let Some(set) = g.as_ref().and_then(|m| m.get(&epfd)) else {
                    crate::debug(|| format!("repoll_wait: {epfd} is not a repoll set"));
                    crate::set_errno(libc::EINVAL);
                    return -1;
                };
                (set.list.clone(), set.wake)
            };
            let mut fds: Vec<libc::pollfd> = list
                .iter()
                .map(|i| libc::pollfd {
                    fd: i.fd,
                    events: i.events,
                    revents: 0,
                })
                .collect();
            fds.push(libc::pollfd {
                fd: wake,
                events: libc::POLLIN,
                revents: 0,
            });
            let left = if timeout < 0 {
                -1
            } else {
                (i64::from(timeout) - start.elapsed().as_millis() as i64).max(0) as c_int
            };
            let n = super::poll::rpoll(&mut fds, left);
            if n < 0 {
                return -1;
            }
            let woken = fds.last().is_some_and(|w| w.revents != 0);
            if woken {
                let mut v = 0u64;
                // SAFETY: 8 bytes from our non-blocking eventfd.
                unsafe { libc::read(wake, &mut v as *mut u64 as *mut _, 8) };
            }
            let mut k = 0;
            for (p, i) in fds.iter().zip(&list) {
                if p.revents != 0 && k < maxevents as usize {
                    let e = libc::epoll_event {
                        events: poll_to_epoll(p.revents),
                        u64: i.data,
                    };
                    // SAFETY: the caller's array of maxevents entries.
                    unsafe { std::ptr::write_unaligned(events.add(k), e) };
                    k += 1;
                }
            }
            if k > 0 || n == 0 || !woken {
                return k as c_int;
            }
            // Only the interest list changed: wait on with the new one.
        }
    })
}

/// `rclose` of an epoll set's fd: forget the set, close its fds. `None`
/// if `fd` is no set.
pub(super) fn close(fd: c_int) -> Option<()> {
    let set = sets().as_mut()?.remove(&fd)?;
    // SAFETY: both eventfds are the set's, closed once.
    unsafe {
        libc::close(set.wake);
        libc::close(fd);
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctl_adds_modifies_and_deletes_as_epoll_ctl() {
        let mut l = Vec::new();
        let ev = Some((libc::EPOLLIN as u32, 7));
        assert_eq!(ctl(&mut l, libc::EPOLL_CTL_ADD, 5, ev), 0);
        assert_eq!(ctl(&mut l, libc::EPOLL_CTL_ADD, 5, ev), libc::EEXIST);
        assert_eq!(l[0].events, libc::POLLIN);
        let out = Some(((libc::EPOLLOUT | libc::EPOLLIN) as u32, 8));
        assert_eq!(ctl(&mut l, libc::EPOLL_CTL_MOD, 5, out), 0);
        assert_eq!((l[0].events, l[0].data), (libc::POLLIN | libc::POLLOUT, 8));
        assert_eq!(ctl(&mut l, libc::EPOLL_CTL_MOD, 6, out), libc::ENOENT);
        assert_eq!(ctl(&mut l, libc::EPOLL_CTL_ADD, 6, None), libc::EFAULT);
        assert_eq!(ctl(&mut l, 99, 5, ev), libc::EINVAL);
        assert_eq!(ctl(&mut l, libc::EPOLL_CTL_DEL, 5, None), 0);
        assert_eq!(ctl(&mut l, libc::EPOLL_CTL_DEL, 5, None), libc::ENOENT);
        assert!(l.is_empty());
    }

    #[test]
    fn wait_reports_a_ready_pipe_and_times_out_on_an_idle_one() {
        let mut p = [0; 2];
        // SAFETY: pipe writes two fds.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        let ep = rxe_repoll_create(0);
        assert!(ep >= 0);
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 42,
        };
        // SAFETY: a valid event.
        assert_eq!(
            unsafe { rxe_repoll_ctl(ep, libc::EPOLL_CTL_ADD, p[0], &mut ev) },
            0
        );
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: room for 4 events.
        assert_eq!(unsafe { rxe_repoll_wait(ep, out.as_mut_ptr(), 4, 50) }, 0);
        // SAFETY: one byte into the pipe.
        assert_eq!(
            unsafe { libc::write(p[1], b"x".as_ptr() as *const _, 1) },
            1
        );
        // SAFETY: as above.
        assert_eq!(unsafe { rxe_repoll_wait(ep, out.as_mut_ptr(), 4, 1000) }, 1);
        let (e, d) = (out[0].events, out[0].u64);
        assert_eq!((e, d), (libc::EPOLLIN as u32, 42));
        // SAFETY: as above; an unknown set.
        assert_eq!(unsafe { rxe_repoll_wait(-5, out.as_mut_ptr(), 4, 0) }, -1);
        assert!(close(ep).is_some());
        assert!(close(ep).is_none());
        // SAFETY: the pipe's fds.
        unsafe {
            libc::close(p[0]);
            libc::close(p[1]);
        }
    }
}
