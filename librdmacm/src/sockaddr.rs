//! `struct sockaddr` ↔ address and port, and the GIDs RoCEv2 gives an IP
//! address (kernel `rdma_ip2gid`: IPv4-mapped IPv6 for IPv4).

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use emulator_daemon::cmproto::CmErr;

use crate::abi::AF_IB;
use crate::err;

/// The address and port of `sa`, which the caller lets us read as far as
/// its family says. NULL or a family we do not know is EINVAL; `AF_IB`
/// (native InfiniBand addressing, which RoCE has no use for) is
/// EAFNOSUPPORT.
///
/// # Safety
/// `sa` is NULL or points to a `sockaddr_in` or `sockaddr_in6` as its
/// family says.
pub unsafe fn read(sa: *const libc::sockaddr) -> Result<(IpAddr, u16), CmErr> {
    if sa.is_null() {
        return Err(err(libc::EINVAL, "no address given"));
    }
    // SAFETY: the caller's sa is readable as its family says.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Ok((IpAddr::V4(ip), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Ok((IpAddr::V6(ip), u16::from_be(sin6.sin6_port)))
            }
            AF_IB => Err(err(
                libc::EAFNOSUPPORT,
                "AF_IB addresses are not supported (RoCE: use AF_INET or AF_INET6)",
            )),
            f => Err(err(
                libc::EINVAL,
                format!("address family {f} is not AF_INET/AF_INET6"),
            )),
        }
    }
}

/// Write `addr:port` into `st` (the rest zeroed).
pub fn write(st: &mut libc::sockaddr_storage, addr: IpAddr, port: u16) {
    // SAFETY: sockaddr_storage is plain bytes; all zeroes is valid.
    *st = unsafe { std::mem::zeroed() };
    let p = st as *mut libc::sockaddr_storage;
    match addr {
        IpAddr::V4(a) => {
            // SAFETY: a sockaddr_storage is larger than and aligned for a
            // sockaddr_in.
            let sin = unsafe { &mut *(p as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = port.to_be();
            sin.sin_addr.s_addr = u32::from(a).to_be();
        }
        IpAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(p as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = port.to_be();
            sin6.sin6_addr.s6_addr = a.octets();
        }
    }
}

/// The address and port stored in `st` (None if it holds none).
pub fn read_storage(st: &libc::sockaddr_storage) -> Option<(IpAddr, u16)> {
    // SAFETY: st is a whole sockaddr_storage, large enough for either
    // family's struct.
    unsafe { read(st as *const libc::sockaddr_storage as *const libc::sockaddr) }.ok()
}

/// The RoCEv2 GID of an IP address (kernel `rdma_ip2gid`).
pub fn ip_gid(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_both_families() {
        // SAFETY: zeroed storage is valid.
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        for (a, p) in [
            ("10.1.2.3".parse::<IpAddr>().unwrap(), 7174u16),
            ("fe80::1".parse().unwrap(), 1),
        ] {
            write(&mut st, a, p);
            assert_eq!(read_storage(&st), Some((a, p)));
        }
    }

    #[test]
    fn unknown_families_are_errors() {
        // SAFETY: zeroed storage is valid.
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        st.ss_family = AF_IB as libc::sa_family_t;
        let sa = &st as *const libc::sockaddr_storage as *const libc::sockaddr;
        // SAFETY: sa points to a whole storage.
        assert_eq!(unsafe { read(sa) }.unwrap_err().errno, libc::EAFNOSUPPORT);
        st.ss_family = 99;
        let sa = &st as *const libc::sockaddr_storage as *const libc::sockaddr;
        // SAFETY: as above.
        assert_eq!(unsafe { read(sa) }.unwrap_err().errno, libc::EINVAL);
        // SAFETY: NULL is allowed.
        assert_eq!(
            unsafe { read(std::ptr::null()) }.unwrap_err().errno,
            libc::EINVAL
        );
        assert_eq!(
            ip_gid("1.2.3.4".parse().unwrap()),
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 2, 3, 4]
        );
    }
}
