//! `rdma_getaddrinfo`/`rdma_freeaddrinfo`: names resolved with libc's
//! `getaddrinfo`, as librdmacm's `addrinfo.c` does (without its IB ACM
//! and SA paths, which RoCE does not have). Results are malloc'd, as
//! programs may free parts of them with `free`.
//!
//! And rdma-core v60's `rdma_resolve_addrinfo`/`rdma_query_addrinfo`
//! (RDMACM_1.4), as its `cma.c` does them with DNS: the name is resolved
//! at once with `rdma_getaddrinfo`, the answer kept on the id, and an
//! RDMA_CM_EVENT_ADDRINFO_RESOLVED put on the id's channel; a name that
//! does not resolve fails the call itself (-1, errno the getaddrinfo
//! code, as rdma-core sets it), and no event comes. `RAI_SA` (resolution
//! of an IB service through the subnet administrator) is EOPNOTSUPP, as
//! the kernel refuses it on a port without an SA; RoCE has none.

use std::ffi::{c_char, c_int, c_void, CStr};

use emulator_daemon::cmproto::{event as ev, CmErr};

use crate::abi::*;
use crate::id::{self, CmId};
use crate::{err, event};

/// A malloc'd copy of `len` bytes at `src`.
///
/// # Safety
/// `src` is readable for `len` bytes.
unsafe fn dup(src: *const c_void, len: usize) -> *mut c_void {
    // SAFETY: malloc, then a copy of the caller's bytes into it.
    unsafe {
        let p = libc::malloc(len.max(1));
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(src as *const u8, p as *mut u8, len);
        }
        p
    }
}

fn to_ai_hints(h: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: all-zero is a valid addrinfo (NULL pointers).
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if h.ai_flags & RAI_PASSIVE != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if h.ai_flags & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if h.ai_family != AF_IB {
        ai.ai_family = h.ai_family;
    }
    ai.ai_socktype = match h.ai_qp_type {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
        IBV_QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    ai.ai_protocol = match h.ai_port_space {
        RDMA_PS_TCP => libc::IPPROTO_TCP,
        RDMA_PS_IPOIB | RDMA_PS_UDP => libc::IPPROTO_UDP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
        _ => 0,
    };
    ai
}

/// Fill `rai` from the first `getaddrinfo` answer (librdmacm
/// `ucma_convert_to_rai`).
///
/// # Safety
/// `ai` is a valid answer of getaddrinfo.
unsafe fn from_ai(rai: &mut rdma_addrinfo, h: &rdma_addrinfo, ai: &libc::addrinfo) -> c_int {
    rai.ai_qp_type = if h.ai_qp_type != 0 {
        h.ai_qp_type
    } else {
        match ai.ai_socktype {
            libc::SOCK_STREAM => IBV_QPT_RC,
            libc::SOCK_DGRAM => IBV_QPT_UD,
            _ => 0,
        }
    };
    rai.ai_port_space = if h.ai_port_space != 0 {
        h.ai_port_space
    } else {
        match ai.ai_protocol {
            libc::IPPROTO_TCP => RDMA_PS_TCP,
            libc::IPPROTO_UDP => RDMA_PS_UDP,
            _ => 0,
        }
    };
    rai.ai_family = ai.ai_family;
    // SAFETY: getaddrinfo's address is ai_addrlen bytes; its canonical
    // name is a C string.
    unsafe {
        let addr = dup(ai.ai_addr as *const c_void, ai.ai_addrlen as usize) as *mut libc::sockaddr;
        if addr.is_null() {
            return libc::EAI_MEMORY;
        }
        let canon = if ai.ai_canonname.is_null() {
            std::ptr::null_mut()
        } else {
            libc::strdup(ai.ai_canonname)
        };
        if ai.ai_flags & libc::AI_PASSIVE != 0 {
            rai.ai_flags = RAI_PASSIVE;
            rai.ai_src_canonname = canon;
            rai.ai_src_addr = addr;
            rai.ai_src_len = ai.ai_addrlen;
        } else {
            rai.ai_dst_canonname = canon;
            rai.ai_dst_addr = addr;
            rai.ai_dst_len = ai.ai_addrlen;
        }
    }
    0
}

/// librdmacm `rdma_getaddrinfo`: returns 0, or a getaddrinfo error code
/// (with errno set for the `-1` cases), as librdmacm does.
///
/// # Safety
/// The arguments are NULL or valid as `rdma_getaddrinfo(3)` says.
unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: all-zero is a valid rdma_addrinfo.
    let nohints: rdma_addrinfo = unsafe { std::mem::zeroed() };
    // SAFETY: NULL or the program's hints.
    let h = unsafe { hints.as_ref() }.unwrap_or(&nohints);
    // SAFETY: calloc'd, so freeable by rdma_freeaddrinfo (and free).
    let rai =
        unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
    if rai.is_null() {
        crate::set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: rai is ours and zeroed.
    let r = unsafe { &mut *rai };
    let mut ret = 0;
    if !node.is_null() || !service.is_null() {
        let aih = to_ai_hints(h);
        let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: libc getaddrinfo with the program's strings.
        ret = unsafe {
            libc::getaddrinfo(
                node,
                service,
                if hints.is_null() {
                    std::ptr::null()
                } else {
                    &aih
                },
                &mut ai,
            )
        };
        if ret == 0 {
            // SAFETY: getaddrinfo's answer, freed right after.
            unsafe {
                ret = from_ai(r, h, &*ai);
                libc::freeaddrinfo(ai);
            }
        } else {
            crate::debug(|| {
                // SAFETY: gai_strerror returns a static string.
                let why = unsafe { CStr::from_ptr(libc::gai_strerror(ret)) };
                format!("rdma_getaddrinfo: getaddrinfo: {}", why.to_string_lossy())
            });
        }
    } else {
        r.ai_flags = h.ai_flags;
        r.ai_family = h.ai_family;
        r.ai_qp_type = h.ai_qp_type;
        r.ai_port_space = h.ai_port_space;
        if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
            // SAFETY: the program's address of ai_dst_len bytes.
            r.ai_dst_addr =
                unsafe { dup(h.ai_dst_addr as *const c_void, h.ai_dst_len as usize) } as _;
            r.ai_dst_len = h.ai_dst_len;
        }
    }
    if ret == 0 && r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
        // SAFETY: the program's address of ai_src_len bytes.
        r.ai_src_addr = unsafe { dup(h.ai_src_addr as *const c_void, h.ai_src_len as usize) } as _;
        r.ai_src_len = h.ai_src_len;
    }
    if ret != 0 {
        // SAFETY: ours.
        unsafe { freeaddrinfo(rai) };
        return ret;
    }
    // SAFETY: the program's out pointer.
    unsafe { *res = rai };
    0
}

/// # Safety
/// `res` is NULL or a list from [`getaddrinfo`].
unsafe fn freeaddrinfo(mut res: *mut rdma_addrinfo) {
    while !res.is_null() {
        // SAFETY: every pointer in our list is malloc'd or NULL.
        unsafe {
            let r = &*res;
            let next = r.ai_next;
            for p in [
                r.ai_connect,
                r.ai_route,
                r.ai_src_canonname as *mut c_void,
                r.ai_dst_canonname as *mut c_void,
                r.ai_src_addr as *mut c_void,
                r.ai_dst_addr as *mut c_void,
            ] {
                libc::free(p);
            }
            libc::free(res as *mut c_void);
            res = next;
        }
    }
}

/// A list from [`getaddrinfo`] an id holds (librdmacm `resolved_ai`):
/// freed when dropped, unless taken.
pub struct AiList(*mut rdma_addrinfo);

impl Default for AiList {
    fn default() -> AiList {
        AiList(std::ptr::null_mut())
    }
}

impl AiList {
    pub fn is_empty(&self) -> bool {
        self.0.is_null()
    }

    /// The list, for the program to free; the holder keeps none.
    pub fn take(&mut self) -> *mut rdma_addrinfo {
        std::mem::replace(&mut self.0, std::ptr::null_mut())
    }
}

impl Drop for AiList {
    fn drop(&mut self) {
        // SAFETY: NULL or a list from getaddrinfo that no one else holds.
        unsafe { freeaddrinfo(self.take()) };
    }
}

/// `rdma_resolve_addrinfo`'s work, the id marked resolving (librdmacm
/// `__rdma_resolve_addrinfo`).
///
/// # Safety
/// `node`, `service` and `hints` are NULL or valid.
unsafe fn resolve(
    c: &CmId,
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
) -> Result<(), CmErr> {
    // SAFETY: NULL or the program's hints.
    let flags = unsafe { hints.as_ref() }.map_or(0, |h| h.ai_flags);
    if flags & RAI_SA != 0 {
        if flags & RAI_DNS != 0 {
            return Err(err(
                libc::EOPNOTSUPP,
                "RAI_SA and RAI_DNS exclude each other",
            ));
        }
        if !node.is_null() {
            return Err(err(
                libc::EOPNOTSUPP,
                "RAI_SA takes no node, only a service",
            ));
        }
        if service.is_null() {
            return Err(err(libc::EINVAL, "RAI_SA needs a service"));
        }
        if c.verbs().is_null() {
            return Err(err(libc::EINVAL, "RAI_SA: the id is not bound to a device"));
        }
        return Err(err(
            libc::EOPNOTSUPP,
            "RAI_SA: RoCE has no subnet administrator to resolve an IB service",
        ));
    }
    let mut list = std::ptr::null_mut();
    // SAFETY: the program's arguments (valid or NULL) and our out pointer.
    let r = unsafe { getaddrinfo(node, service, hints, &mut list) };
    if r != 0 {
        // rdma-core gives errno rdma_getaddrinfo's return: getaddrinfo's
        // code (EAI_NONAME is -2). Its -1 failures set errno already
        // (rdma-core then makes errno -1; ours says why).
        if r == -1 {
            return Err(err(crate::errno(), "rdma_getaddrinfo failed"));
        }
        // SAFETY: gai_strerror returns a static string.
        let why = unsafe { CStr::from_ptr(libc::gai_strerror(r)) };
        return Err(err(
            r,
            format!("getaddrinfo: {} (errno is its code)", why.to_string_lossy()),
        ));
    }
    c.st().resolved_ai = AiList(list);
    if let Err(e) = event::post(c, ev::ADDRINFO_RESOLVED, 0, 0) {
        c.st().resolved_ai = AiList::default();
        return Err(e);
    }
    // A synchronous id waits for its event, as after rdma_resolve_addr.
    id::complete(c)
}

/// rdma-core v60+ `rdma_resolve_addrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_resolve_addrinfo(
    id: *mut rdma_cm_id,
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
) -> c_int {
    crate::call("rdma_resolve_addrinfo", || {
        // SAFETY: the program hands us an id we made (or NULL: EINVAL).
        let c = unsafe { id::cm(id)? };
        {
            let mut st = c.st();
            if st.resolving_ai {
                return Err(err(
                    libc::EBUSY,
                    "a resolution is under way, or its answer not yet queried",
                ));
            }
            st.resolving_ai = true;
        }
        // SAFETY: the program's arguments.
        let r = unsafe { resolve(c, node, service, hints) };
        if r.is_err() {
            c.st().resolving_ai = false;
        }
        r
    })
}

/// rdma-core v60+ `rdma_query_addrinfo`: hands the program the answer
/// of `rdma_resolve_addrinfo` (once; it frees it with
/// `rdma_freeaddrinfo`), ENOENT if there is none.
#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_query_addrinfo(
    id: *mut rdma_cm_id,
    info: *mut *mut rdma_addrinfo,
) -> c_int {
    crate::call("rdma_query_addrinfo", || {
        // SAFETY: the program hands us an id we made (or NULL: EINVAL).
        let c = unsafe { id::cm(id)? };
        if info.is_null() {
            return Err(err(libc::EINVAL, "info is NULL"));
        }
        let mut st = c.st();
        if !st.resolving_ai || st.resolved_ai.is_empty() {
            return Err(err(
                libc::ENOENT,
                "no rdma_resolve_addrinfo answer to query",
            ));
        }
        st.resolving_ai = false;
        // SAFETY: the program's out pointer.
        unsafe { *info = st.resolved_ai.take() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    crate::guard("rdma_getaddrinfo", -1, || {
        // SAFETY: the program's arguments.
        unsafe { getaddrinfo(node, service, hints, res) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    crate::guard("rdma_freeaddrinfo", (), || {
        // SAFETY: the program hands back our list.
        unsafe { freeaddrinfo(res) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn gai(
        node: Option<&str>,
        service: Option<&str>,
        h: Option<&rdma_addrinfo>,
    ) -> (c_int, *mut rdma_addrinfo) {
        let n = node.map(|s| CString::new(s).unwrap());
        let s = service.map(|s| CString::new(s).unwrap());
        let mut res = std::ptr::null_mut();
        // SAFETY: valid strings and hints.
        let r = unsafe {
            getaddrinfo(
                n.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                h.map_or(std::ptr::null(), |h| h as *const rdma_addrinfo),
                &mut res,
            )
        };
        (r, res)
    }

    #[test]
    fn numeric_active_and_passive() {
        // SAFETY: zeroed hints are valid.
        let mut h: rdma_addrinfo = unsafe { std::mem::zeroed() };
        h.ai_flags = RAI_NUMERICHOST;
        h.ai_port_space = RDMA_PS_TCP;
        let (r, res) = gai(Some("10.1.2.3"), Some("7471"), Some(&h));
        assert_eq!(r, 0);
        // SAFETY: our result.
        unsafe {
            let a = &*res;
            assert_eq!(a.ai_flags & RAI_PASSIVE, 0);
            assert_eq!(a.ai_family, libc::AF_INET);
            assert_eq!(a.ai_qp_type, IBV_QPT_RC);
            assert_eq!(a.ai_port_space, RDMA_PS_TCP);
            assert!(a.ai_src_addr.is_null());
            assert_eq!(
                crate::sockaddr::read(a.ai_dst_addr).unwrap(),
                ("10.1.2.3".parse().unwrap(), 7471)
            );
            freeaddrinfo(res);
        }
        h.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
        h.ai_qp_type = IBV_QPT_UD;
        h.ai_port_space = RDMA_PS_UDP;
        let (r, res) = gai(Some("::1"), Some("7174"), Some(&h));
        assert_eq!(r, 0);
        // SAFETY: our result.
        unsafe {
            let a = &*res;
            assert_eq!(a.ai_flags, RAI_PASSIVE);
            assert_eq!(a.ai_family, libc::AF_INET6);
            assert_eq!(a.ai_qp_type, IBV_QPT_UD);
            assert_eq!(a.ai_port_space, RDMA_PS_UDP);
            assert!(a.ai_dst_addr.is_null());
            assert_eq!(
                crate::sockaddr::read(a.ai_src_addr).unwrap(),
                ("::1".parse().unwrap(), 7174)
            );
            freeaddrinfo(res);
        }
    }

    #[test]
    fn hints_without_names_and_errors() {
        let (r, _) = gai(None, None, None);
        assert_eq!(r, -1);
        // SAFETY: zeroed hints are valid.
        let mut h: rdma_addrinfo = unsafe { std::mem::zeroed() };
        h.ai_flags = RAI_NUMERICHOST;
        let (r, _) = gai(Some("not-a-number"), None, Some(&h));
        assert_eq!(r, libc::EAI_NONAME);
        // Only hints: a copy of them, addresses included.
        let mut dst: libc::sockaddr_storage =
            // SAFETY: zeroed storage is valid.
            unsafe { std::mem::zeroed() };
        crate::sockaddr::write(&mut dst, "10.0.0.9".parse().unwrap(), 9);
        h.ai_dst_addr = &mut dst as *mut libc::sockaddr_storage as *mut libc::sockaddr;
        h.ai_dst_len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        h.ai_port_space = RDMA_PS_TCP;
        let (r, res) = gai(None, None, Some(&h));
        assert_eq!(r, 0);
        // SAFETY: our result.
        unsafe {
            assert_eq!((*res).ai_port_space, RDMA_PS_TCP);
            assert_eq!(
                crate::sockaddr::read((*res).ai_dst_addr).unwrap(),
                ("10.0.0.9".parse().unwrap(), 9)
            );
            freeaddrinfo(res);
        }
        // A source in the hints is copied when the name gave none.
        let (r, res) = gai(
            Some("10.0.0.8"),
            None,
            Some(&{
                let mut h2: rdma_addrinfo =
                // SAFETY: zeroed hints are valid.
                unsafe { std::mem::zeroed() };
                h2.ai_flags = RAI_NUMERICHOST;
                h2.ai_src_addr = h.ai_dst_addr;
                h2.ai_src_len = h.ai_dst_len;
                h2
            }),
        );
        assert_eq!(r, 0);
        // SAFETY: our result.
        unsafe {
            assert_eq!(
                crate::sockaddr::read((*res).ai_src_addr).unwrap(),
                ("10.0.0.9".parse().unwrap(), 9)
            );
            freeaddrinfo(res);
        }
    }
}
