//! Multicast: the daemon joins the group (for RoCE an IP multicast group
//! whose MGID is the group address as a GID); the library attaches the
//! id's UD QP to the MGID when MULTICAST_JOIN arrives, as librdmacm's
//! `ucma_process_join` does.

use std::ffi::{c_int, c_void};

use emulator_daemon::cmproto::{event as ev, CmErr, CmEvent, Request};

use crate::abi::*;
use crate::id::{cm, complete, CmId, Mc};
use crate::{conn, err, ffi, qp, sockaddr};

/// Fill a MULTICAST_JOIN/ERROR event and attach the QP on a join.
pub fn process(c: &CmId, e: &CmEvent, out: &mut rdma_cm_event, pd: &mut [u8; 256]) {
    let _ = pd;
    let group = e.addrs.dst.map(|(a, _)| a);
    let (context, flags) = {
        let mut st = c.st();
        let mc = st.mcs.iter_mut().find(|m| Some(m.addr) == group).or(None);
        match mc {
            Some(m) => {
                if e.event == ev::MULTICAST_JOIN {
                    m.mgid = Some(e.addrs.dgid.unwrap_or_else(|| sockaddr::ip_gid(m.addr)));
                }
                (m.context, m.join_flags)
            }
            None => (std::ptr::null_mut(), 0),
        }
    };
    let mgid = e
        .addrs
        .dgid
        .or(group.map(sockaddr::ip_gid))
        .unwrap_or_default();
    let mut ah = if c.verbs().is_null() {
        ibv_ah_attr::default()
    } else {
        qp::ah_attr(c)
    };
    ah.grh.dgid = ibv_gid { raw: mgid };
    ah.grh.hop_limit = 1;
    let p = e.param.clone().unwrap_or_default();
    out.param.ud = rdma_ud_param {
        private_data: context as *const c_void,
        private_data_len: 0,
        ah_attr: ah,
        qp_num: if p.qp_num == 0 { 0x00ff_ffff } else { p.qp_num },
        qkey: if p.qkey == 0 { RDMA_UDP_QKEY } else { p.qkey },
    };
    if e.event != ev::MULTICAST_JOIN {
        return;
    }
    let qpp = c.qp();
    if qpp.is_null() || flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
        return;
    }
    let gid = ibv_gid { raw: mgid };
    // SAFETY: the id's QP is live.
    let r = unsafe { ffi::ibv_attach_mcast(qpp, &gid, 0) };
    if r != 0 {
        out.event = ev::MULTICAST_ERROR as c_int;
        out.status = -r;
    }
}

fn join(
    c: &CmId,
    addr: *mut libc::sockaddr,
    flags: u32,
    context: *mut c_void,
) -> Result<(), CmErr> {
    // SAFETY: the program's address, readable as its family says.
    let (group, _) = unsafe { sockaddr::read(addr)? };
    c.st().mcs.push(Mc {
        addr: group,
        context,
        join_flags: flags,
        mgid: None,
    });
    if let Err(e) = conn::request(&Request::Join {
        id: c.handle,
        addr: group,
        flags,
    }) {
        let mut st = c.st();
        if let Some(i) = st.mcs.iter().rposition(|m| m.addr == group) {
            st.mcs.remove(i);
        }
        return Err(e);
    }
    complete(c)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    crate::call("rdma_join_multicast", || {
        // SAFETY: the program's id.
        let c = unsafe { cm(id)? };
        join(c, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    crate::call("rdma_join_multicast_ex", || {
        // SAFETY: the program's id and attributes.
        let (c, a) = unsafe { (cm(id)?, attr.as_ref()) };
        let Some(a) = a else {
            return Err(err(libc::EINVAL, "attr is NULL"));
        };
        if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return Err(err(libc::ENOTSUP, "unknown comp_mask bits"));
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0 {
            return Err(err(libc::EINVAL, "no address"));
        }
        if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
            || a.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED
        {
            return Err(err(libc::EINVAL, "bad join flags"));
        }
        join(c, a.addr, a.join_flags, context)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    crate::call("rdma_leave_multicast", || {
        // SAFETY: the program's id and address.
        let (c, (group, _)) = unsafe { (cm(id)?, sockaddr::read(addr)?) };
        let mc = {
            let mut st = c.st();
            match st.mcs.iter().position(|m| m.addr == group) {
                Some(i) => st.mcs.remove(i),
                None => {
                    return Err(err(
                        libc::EADDRNOTAVAIL,
                        format!("the id has not joined {group}"),
                    ))
                }
            }
        };
        let qpp = c.qp();
        if let (false, Some(g)) = (qpp.is_null(), mc.mgid) {
            if mc.join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER {
                let gid = ibv_gid { raw: g };
                // SAFETY: the id's QP is live.
                unsafe { ffi::ibv_detach_mcast(qpp, &gid, 0) };
            }
        }
        conn::request(&Request::Leave {
            id: c.handle,
            addr: group,
        })
        .map(|_| ())
    })
}
