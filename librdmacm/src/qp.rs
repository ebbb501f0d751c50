//! QPs, SRQs and CQs on ids, and the QP attributes of each state as
//! kernel rdma_cm gives them (`rdma_init_qp_attr`: `cma_ib_init_qp_attr`,
//! and `cm.c`'s `cm_init_qp_init_attr`/`_rtr_attr`/`_rts_attr` for a
//! connection over RoCE).

use std::ffi::{c_int, c_void};

use emulator_daemon::cmproto::CmErr;

use crate::abi::verbs::{ibv_global_route, ibv_srq_init_attr, ibv_srq_init_attr_ex};
use crate::abi::*;
use crate::id::{cm, raw, CmId, Role};
use crate::{err, ffi};

/// Kernel rdma_cm's packet life time of a RoCE path
/// (`CMA_IBOE_PACKET_LIFETIME`, 18 in Linux 6.1).
pub const CMA_IBOE_PACKET_LIFETIME: u8 = 18;

/// The QP's local ACK timeout both ends get from kernel cm over RoCE:
/// `cm_ack_timeout(15, 18)` = 19 for the active side after the REP (rxe's
/// ACK delay is 15), and the REQ's local ACK timeout (19) - 1 + 1 for the
/// passive side: 4.096 µs × 2^19 ≈ 2.1 s.
pub const QP_TIMEOUT: u8 = 19;

/// The hop limit of an IPv4 route (the kernel's default TTL), which
/// rdma_cm puts in a RoCE path.
pub const HOP_LIMIT: u8 = 64;

/// The Q_Key of a UD id: `RDMA_UDP_QKEY` for the UDP and IB port spaces
/// (kernel `cma_set_qkey`).
pub fn qkey_of(c: &CmId) -> u32 {
    match c.ps() {
        RDMA_PS_UDP | RDMA_PS_IB => RDMA_UDP_QKEY,
        _ => 0,
    }
}

/// The address vector of the connection, RoCE style (GRH always).
pub fn ah_attr(c: &CmId) -> ibv_ah_attr {
    let st = c.st();
    let sgid_index = crate::device::gid_index(c.verbs(), &st.sgid);
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: st.dgid },
            flow_label: 0,
            sgid_index,
            hop_limit: HOP_LIMIT,
            traffic_class: st.tos,
        },
        dlid: 0,
        sl: 0,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: 1,
    }
}

/// Kernel `rdma_init_qp_attr` for the state in `attr.qp_state`.
pub fn init_qp_attr(c: &CmId, attr: &mut ibv_qp_attr) -> Result<c_int, CmErr> {
    let ud = c.qp_type() == IBV_QPT_UD;
    let (cm, role) = {
        let st = c.st();
        (st.cm, st.role)
    };
    let state = attr.qp_state;
    let mut mask;
    if ud || !cm {
        // cma_ib_init_qp_attr: no CM connection (yet), or UD.
        if state != IBV_QPS_INIT && !ud {
            return Err(err(
                libc::EINVAL,
                "no connection yet: only the INIT attributes are known",
            ));
        }
        attr.pkey_index = 0;
        attr.port_num = 1;
        mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
        if ud {
            attr.qkey = qkey_of(c);
            mask |= IBV_QP_QKEY;
        } else {
            attr.qp_access_flags = 0;
            mask |= IBV_QP_ACCESS_FLAGS;
        }
        return Ok(mask);
    }
    let st = c.st();
    let rc = c.qp_type() == IBV_QPT_RC;
    match state {
        IBV_QPS_INIT => {
            // cm_init_qp_init_attr.
            mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
            attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
            if st.responder_resources > 0 {
                attr.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
            }
            attr.pkey_index = 0;
            attr.port_num = 1;
        }
        IBV_QPS_RTR => {
            // cm_init_qp_rtr_attr, then rdma_cm's rq_psn = seq_num.
            mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            drop(st);
            attr.ah_attr = ah_attr(c);
            let st = c.st();
            attr.path_mtu = c_int::from(st.path_mtu.max(1));
            attr.dest_qp_num = st.remote_qpn;
            attr.rq_psn = st.seq_num;
            if rc {
                mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
                attr.max_dest_rd_atomic = st.responder_resources;
                attr.min_rnr_timer = 0;
            }
            return Ok(mask);
        }
        IBV_QPS_RTS => {
            // cm_init_qp_rts_attr.
            mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
            attr.sq_psn = st.remote_psn;
            if rc {
                mask |=
                    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_TIMEOUT;
                attr.retry_cnt = st.retry_count;
                attr.rnr_retry = st.rnr_retry_count;
                attr.max_rd_atomic = st.initiator_depth;
                attr.timeout = st.ack_timeout.unwrap_or(QP_TIMEOUT);
            }
        }
        _ => {
            return Err(err(
                libc::EINVAL,
                format!("rdma_init_qp_attr: no attributes for QP state {state} ({role:?} side)"),
            ))
        }
    }
    Ok(mask)
}

fn modify(c: &CmId, attr: &mut ibv_qp_attr, mask: c_int, what: &str) -> Result<(), CmErr> {
    // SAFETY: the id's QP is live (callers check it is not NULL).
    let r = unsafe { ffi::ibv_modify_qp(c.qp(), attr, mask) };
    if r != 0 {
        return Err(err(r, format!("ibv_modify_qp to {what} failed")));
    }
    Ok(())
}

/// librdmacm `ucma_modify_qp_rtr`: INIT again (the connection may grant
/// remote access now), then RTR; `resp_res` overrides the responder
/// resources unless it is `RDMA_MAX_RESP_RES`.
pub fn modify_rtr(c: &CmId, resp_res: u8) -> Result<(), CmErr> {
    if c.qp().is_null() {
        return Ok(());
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        ..Default::default()
    };
    let m = init_qp_attr(c, &mut a)?;
    modify(c, &mut a, m, "INIT")?;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        ..Default::default()
    };
    let m = init_qp_attr(c, &mut a)?;
    if resp_res != RDMA_MAX_RESP_RES {
        a.max_dest_rd_atomic = resp_res;
    }
    modify(c, &mut a, m, "RTR")
}

/// librdmacm `ucma_modify_qp_rts`.
pub fn modify_rts(c: &CmId, init_depth: u8) -> Result<(), CmErr> {
    if c.qp().is_null() {
        return Ok(());
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        ..Default::default()
    };
    let m = init_qp_attr(c, &mut a)?;
    if init_depth != RDMA_MAX_INIT_DEPTH {
        a.max_rd_atomic = init_depth;
    }
    modify(c, &mut a, m, "RTS")
}

/// Move the id's QP (if any) to ERR.
pub fn modify_err_checked(c: &CmId) -> Result<(), CmErr> {
    if c.qp().is_null() {
        return Ok(());
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    modify(c, &mut a, IBV_QP_STATE, "ERR")
}

/// As [`modify_err_checked`], ignoring failure.
pub fn modify_err(c: &CmId) {
    let _ = modify_err_checked(c);
}

/// librdmacm `ucma_init_ud_qp`: a UD QP goes straight to RTS.
fn init_ud_qp(c: &CmId, qp: *mut ibv_qp) -> Result<(), CmErr> {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        ..Default::default()
    };
    let m = init_qp_attr(c, &mut a)?;
    // SAFETY: qp is the live QP just created.
    unsafe {
        let r = ffi::ibv_modify_qp(qp, &mut a, m);
        if r != 0 {
            return Err(err(r, "UD QP to INIT"));
        }
        a.qp_state = IBV_QPS_RTR;
        let r = ffi::ibv_modify_qp(qp, &mut a, IBV_QP_STATE);
        if r != 0 {
            return Err(err(r, "UD QP to RTR"));
        }
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = 0;
        let r = ffi::ibv_modify_qp(qp, &mut a, IBV_QP_STATE | IBV_QP_SQ_PSN);
        if r != 0 {
            return Err(err(r, "UD QP to RTS"));
        }
    }
    Ok(())
}

/// librdmacm `ucma_init_conn_qp`: a connected QP goes to INIT.
fn init_conn_qp(c: &CmId, qp: *mut ibv_qp) -> Result<(), CmErr> {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        ..Default::default()
    };
    let m = init_qp_attr(c, &mut a)?;
    // SAFETY: qp is the live QP just created.
    let r = unsafe { ffi::ibv_modify_qp(qp, &mut a, m) };
    if r != 0 {
        return Err(err(r, "QP to INIT"));
    }
    Ok(())
}

/// librdmacm `ucma_destroy_cqs`.
fn destroy_cqs(c: &CmId) {
    let id = raw(c);
    // SAFETY: the id is live; its CQs and channels are ones we made.
    unsafe {
        if c.qp_type() == IBV_QPT_XRC_RECV && !(*id).srq.is_null() {
            return;
        }
        if !(*id).recv_cq.is_null() {
            ffi::ibv_destroy_cq((*id).recv_cq);
            if !(*id).send_cq.is_null() && (*id).send_cq != (*id).recv_cq {
                ffi::ibv_destroy_cq((*id).send_cq);
                (*id).send_cq = std::ptr::null_mut();
            }
            (*id).recv_cq = std::ptr::null_mut();
        }
        if !(*id).recv_cq_channel.is_null() {
            ffi::ibv_destroy_comp_channel((*id).recv_cq_channel);
            if !(*id).send_cq_channel.is_null() && (*id).send_cq_channel != (*id).recv_cq_channel {
                ffi::ibv_destroy_comp_channel((*id).send_cq_channel);
                (*id).send_cq_channel = std::ptr::null_mut();
            }
            (*id).recv_cq_channel = std::ptr::null_mut();
        }
    }
}

/// librdmacm `ucma_create_cqs`: a completion channel and CQ for each
/// direction the program gave no CQ for (the inline `rdma_get_send_comp`
/// and `rdma_get_recv_comp` of rdma_verbs.h use them).
fn create_cqs(c: &CmId, send_size: u32, recv_size: u32) -> Result<(), CmErr> {
    let id = raw(c);
    let ctx = c.verbs();
    // SAFETY: the id is live and has a device (ctx).
    let r = unsafe {
        (|| {
            if recv_size > 0 {
                (*id).recv_cq_channel = ffi::ibv_create_comp_channel(ctx);
                if (*id).recv_cq_channel.is_null() {
                    return Err("ibv_create_comp_channel");
                }
                (*id).recv_cq = ffi::ibv_create_cq(
                    ctx,
                    recv_size as c_int,
                    id as *mut c_void,
                    (*id).recv_cq_channel,
                    0,
                );
                if (*id).recv_cq.is_null() {
                    return Err("ibv_create_cq");
                }
            }
            if send_size > 0 {
                (*id).send_cq_channel = ffi::ibv_create_comp_channel(ctx);
                if (*id).send_cq_channel.is_null() {
                    return Err("ibv_create_comp_channel");
                }
                (*id).send_cq = ffi::ibv_create_cq(
                    ctx,
                    send_size as c_int,
                    id as *mut c_void,
                    (*id).send_cq_channel,
                    0,
                );
                if (*id).send_cq.is_null() {
                    return Err("ibv_create_cq");
                }
            }
            Ok(())
        })()
    };
    r.map_err(|what| {
        let e = crate::errno();
        destroy_cqs(c);
        err(
            if e == 0 { libc::ENOMEM } else { e },
            format!("{what} failed"),
        )
    })
}

/// librdmacm `rdma_create_qp_ex`.
///
/// # Safety
/// `attr` is the program's valid attributes.
pub unsafe fn create_qp_ex(c: &CmId, attr: &mut ibv_qp_init_attr_ex) -> Result<(), CmErr> {
    if !c.qp().is_null() {
        return Err(err(libc::EINVAL, "the id has a QP already"));
    }
    if c.verbs().is_null() {
        return Err(err(
            libc::EINVAL,
            "the id has no device yet (resolve or bind an address first)",
        ));
    }
    if attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr.pd = c.pd();
    // SAFETY: the program's PD.
    } else if unsafe { (*attr.pd).context } != c.verbs() {
        return Err(err(libc::EINVAL, "the PD belongs to another device"));
    }
    let id = raw(c);
    // SAFETY: the id is live.
    let (scq, rcq, srq) = unsafe { ((*id).send_cq, (*id).recv_cq, (*id).srq) };
    if (!rcq.is_null() && !attr.recv_cq.is_null() && rcq != attr.recv_cq)
        || (!scq.is_null() && !attr.send_cq.is_null() && scq != attr.send_cq)
    {
        return Err(err(libc::EINVAL, "CQs differ from the id's"));
    }
    let send = if attr.send_cq.is_null() && scq.is_null() {
        attr.cap.max_send_wr
    } else {
        0
    };
    let recv = if attr.recv_cq.is_null() && rcq.is_null() {
        attr.cap.max_recv_wr
    } else {
        0
    };
    create_cqs(c, send, recv)?;
    // SAFETY: the id is live; its CQs are ours.
    unsafe {
        if attr.send_cq.is_null() {
            attr.send_cq = (*id).send_cq;
        }
        if attr.recv_cq.is_null() {
            attr.recv_cq = (*id).recv_cq;
        }
        if !srq.is_null() && attr.srq.is_null() {
            attr.srq = srq;
        }
    }
    // SAFETY: a live context and the program's attributes.
    let qp = unsafe { ffi::ibv_create_qp_ex(c.verbs(), attr) };
    if qp.is_null() {
        let e = crate::errno();
        destroy_cqs(c);
        return Err(err(
            if e == 0 { libc::ENOMEM } else { e },
            "ibv_create_qp failed",
        ));
    }
    // ECE: rxe has none (ibv_query_ece is EOPNOTSUPP), as librdmacm's
    // init_ece then records vendor 0.
    let mut ece = ibv_ece::default();
    // SAFETY: qp is live.
    if unsafe { ffi::ibv_query_ece(qp, &mut ece) } == 0 {
        let mut st = c.st();
        st.local_ece.vendor_id = ece.vendor_id;
        st.local_ece.options = ece.options;
    }
    let r = if c.qp_type() == IBV_QPT_UD {
        init_ud_qp(c, qp)
    } else {
        init_conn_qp(c, qp)
    };
    if let Err(e) = r {
        // SAFETY: our QP, never handed out.
        unsafe { ffi::ibv_destroy_qp(qp) };
        destroy_cqs(c);
        return Err(e);
    }
    // SAFETY: the id is live; qp is ours to give it.
    unsafe {
        (*id).pd = (*qp).pd;
        (*id).qp = qp;
    }
    Ok(())
}

/// `rdma_create_qp` as `rdma_create_qp_ex` with only a PD.
///
/// # Safety
/// `attr` is the program's valid attributes.
pub unsafe fn create_qp(
    c: &CmId,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<(), CmErr> {
    if attr.is_null() {
        return Err(err(libc::EINVAL, "qp_init_attr is NULL"));
    }
    // SAFETY: all-zero is valid for these attributes (NULL pointers).
    let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: ibv_qp_init_attr is the prefix of ibv_qp_init_attr_ex.
    unsafe {
        std::ptr::copy_nonoverlapping(
            attr as *const u8,
            &mut ex as *mut ibv_qp_init_attr_ex as *mut u8,
            std::mem::size_of::<ibv_qp_init_attr>(),
        );
    }
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = if pd.is_null() { c.pd() } else { pd };
    // SAFETY: ex is ours.
    let r = unsafe { create_qp_ex(c, &mut ex) };
    // SAFETY: as above, copying back what librdmacm copies back (the CQs
    // it made and the capabilities the provider granted).
    unsafe {
        std::ptr::copy_nonoverlapping(
            &ex as *const ibv_qp_init_attr_ex as *const u8,
            attr as *mut u8,
            std::mem::size_of::<ibv_qp_init_attr>(),
        );
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    crate::call("rdma_create_qp", || {
        // SAFETY: the program's id and attributes.
        unsafe { create_qp(cm(id)?, pd, qp_init_attr) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    crate::call("rdma_create_qp_ex", || {
        // SAFETY: the program's id and attributes.
        unsafe {
            let c = cm(id)?;
            match attr.as_mut() {
                Some(a) => create_qp_ex(c, a),
                None => Err(err(libc::EINVAL, "qp_init_attr is NULL")),
            }
        }
    })
}

/// librdmacm `rdma_destroy_qp`.
pub fn destroy_qp(c: &CmId) {
    let id = raw(c);
    // SAFETY: the id is live; its QP is the program's to destroy here.
    unsafe {
        if !(*id).qp.is_null() {
            ffi::ibv_destroy_qp((*id).qp);
        }
        (*id).qp = std::ptr::null_mut();
    }
    destroy_cqs(c);
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_destroy_qp(id: *mut rdma_cm_id) {
    crate::guard("rdma_destroy_qp", (), || {
        // SAFETY: the program's id.
        if let Ok(c) = unsafe { cm(id) } {
            destroy_qp(c);
        }
    })
}

/// librdmacm `rdma_create_srq_ex` (basic SRQs; rxe has no XRC through
/// rdma_cm).
///
/// # Safety
/// `attr` is the program's valid attributes.
unsafe fn create_srq_ex(c: &CmId, attr: &mut ibv_srq_init_attr_ex) -> Result<(), CmErr> {
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return Err(err(libc::EINVAL, "srq_type is not set"));
    }
    if c.verbs().is_null() {
        return Err(err(libc::EINVAL, "the id has no device yet"));
    }
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.pd = c.pd();
        attr.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    if attr.srq_type != IBV_SRQT_BASIC {
        return Err(err(
            libc::EOPNOTSUPP,
            "only basic SRQs can be made through rdma_cm on rxe-emu",
        ));
    }
    // SAFETY: a live context and the program's attributes.
    let srq = unsafe { ffi::ibv_create_srq_ex(c.verbs(), attr) };
    if srq.is_null() {
        let e = crate::errno();
        return Err(err(
            if e == 0 { libc::ENOMEM } else { e },
            "ibv_create_srq failed",
        ));
    }
    let id = raw(c);
    // SAFETY: the id is live.
    unsafe {
        if (*id).pd.is_null() {
            (*id).pd = attr.pd;
        }
        (*id).srq = srq;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    crate::call("rdma_create_srq_ex", || {
        // SAFETY: the program's id and attributes.
        unsafe {
            let c = cm(id)?;
            match attr.as_mut() {
                Some(a) => create_srq_ex(c, a),
                None => Err(err(libc::EINVAL, "attr is NULL")),
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    crate::call("rdma_create_srq", || {
        if attr.is_null() {
            return Err(err(libc::EINVAL, "attr is NULL"));
        }
        // SAFETY: the program's id; ibv_srq_init_attr is the prefix of
        // ibv_srq_init_attr_ex (zeroed beyond it).
        unsafe {
            let c = cm(id)?;
            let mut ex: ibv_srq_init_attr_ex = std::mem::zeroed();
            std::ptr::copy_nonoverlapping(
                attr as *const u8,
                &mut ex as *mut ibv_srq_init_attr_ex as *mut u8,
                std::mem::size_of::<ibv_srq_init_attr>(),
            );
            ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
            ex.srq_type = IBV_SRQT_BASIC;
            ex.pd = pd;
            let r = create_srq_ex(c, &mut ex);
            std::ptr::copy_nonoverlapping(
                &ex as *const ibv_srq_init_attr_ex as *const u8,
                attr as *mut u8,
                std::mem::size_of::<ibv_srq_init_attr>(),
            );
            r
        }
    })
}

/// librdmacm `rdma_destroy_srq`.
pub fn destroy_srq(c: &CmId) {
    let id = raw(c);
    // SAFETY: the id is live; its SRQ is the program's to destroy here.
    unsafe {
        if !(*id).srq.is_null() {
            ffi::ibv_destroy_srq((*id).srq);
        }
        (*id).srq = std::ptr::null_mut();
    }
    destroy_cqs(c);
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_destroy_srq(id: *mut rdma_cm_id) {
    crate::guard("rdma_destroy_srq", (), || {
        // SAFETY: the program's id.
        if let Ok(c) = unsafe { cm(id) } {
            destroy_srq(c);
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    crate::call("rdma_init_qp_attr", || {
        // SAFETY: the program's id and out pointers.
        unsafe {
            let c = cm(id)?;
            let (Some(a), false) = (qp_attr.as_mut(), qp_attr_mask.is_null()) else {
                return Err(err(libc::EINVAL, "qp_attr or qp_attr_mask is NULL"));
            };
            *qp_attr_mask = init_qp_attr(c, a)?;
        }
        Ok(())
    })
}

/// What the passive side of a connection request learns (kernel
/// `cm_req_handler` and rdma_cm's request event), recorded for the QP
/// attributes.
pub fn note_request(c: &CmId, p: &emulator_daemon::cmproto::ConnParam) {
    let mut st = c.st();
    st.role = Role::Passive;
    st.cm = true;
    st.remote_qpn = p.qp_num;
    st.remote_psn = p.psn & 0x00ff_ffff;
    st.responder_resources = p.responder_resources;
    st.initiator_depth = p.initiator_depth;
    st.retry_count = p.retry_count;
    st.rnr_retry_count = p.rnr_retry_count;
    st.remote_ece = ibv_ece {
        vendor_id: p.ece_vendor_id,
        options: p.ece_attr_mod,
        comp_mask: 0,
    };
}

/// What the active side learns from the REP (kernel `cm_rep_handler`):
/// the peer's QPN and PSN, the depths from our side's view, and the RNR
/// retry count the peer asks of us. The transport retry count stays ours.
pub fn note_reply(c: &CmId, p: &emulator_daemon::cmproto::ConnParam) {
    let mut st = c.st();
    st.cm = true;
    st.remote_qpn = p.qp_num;
    st.remote_psn = p.psn & 0x00ff_ffff;
    st.responder_resources = p.responder_resources;
    st.initiator_depth = p.initiator_depth;
    st.rnr_retry_count = p.rnr_retry_count;
    st.remote_ece = ibv_ece {
        vendor_id: p.ece_vendor_id,
        options: p.ece_attr_mod,
        comp_mask: 0,
    };
}
