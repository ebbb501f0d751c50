//! The data path: posting work (`ibv_post_send`/`recv` and the `ibv_wr_*`
//! builder of `ibv_qp_ex`), polling completions (`ibv_poll_cq` and the
//! `ibv_start_poll` family of `ibv_cq_ex`), and the attribute conversions
//! between the C structs and `rxe-core`'s.

use std::ffi::{c_int, c_uint, c_void};

use rxe_core::{
    AhAttr, MigState, Mtu, QpAttr, QpState, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest,
    WorkCompletion,
};

use crate::abi::*;
use crate::debug;
use crate::objects::{cq, qp, srq, Ah, Qp};

// ---------------------------------------------------------------------------
// Attribute conversions

pub fn ah_attr_from_c(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: a.grh.dgid.raw,
        sgid_index: a.grh.sgid_index,
        flow_label: a.grh.flow_label,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        sl: a.sl,
        port_num: a.port_num,
        is_global: a.is_global != 0,
        dlid: a.dlid,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
    }
}

fn ah_attr_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global as u8,
        port_num: a.port_num,
    }
}

pub fn qp_attr_from_c(a: &ibv_qp_attr) -> QpAttr {
    QpAttr {
        qp_state: QpState::from_ibv(a.qp_state as u32),
        cur_qp_state: QpState::from_ibv(a.cur_qp_state as u32),
        path_mtu: Mtu::from_ibv(a.path_mtu as u32),
        path_mig_state: MigState::from_ibv(a.path_mig_state as u32).unwrap_or_default(),
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        cap: rxe_core::QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
        ah_attr: ah_attr_from_c(&a.ah_attr),
        alt_ah_attr: ah_attr_from_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: a.sq_draining != 0,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

pub fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    let st = |s: Option<QpState>| s.map_or(0, |s| s.ibv() as c_int);
    ibv_qp_attr {
        qp_state: st(a.qp_state),
        cur_qp_state: st(a.cur_qp_state.or(a.qp_state)),
        path_mtu: a.path_mtu.map_or(0, |m| m.ibv() as c_int),
        path_mig_state: a.path_mig_state.ibv() as c_int,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        cap: ibv_qp_cap::default(),
        ah_attr: ah_attr_to_c(&a.ah_attr),
        alt_ah_attr: ah_attr_to_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify as u8,
        sq_draining: a.sq_draining as u8,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

// ---------------------------------------------------------------------------
// Posting

/// The SGE list of a C work request.
///
/// # Safety
/// `sg` must point to `n` SGEs (or be NULL with `n` 0).
unsafe fn sges(sg: *const ibv_sge, n: c_int) -> Result<Vec<Sge>, c_int> {
    if n < 0 || (n > 0 && sg.is_null()) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: caller contract.
    let s = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    Ok(s.iter()
        .map(|g| Sge {
            addr: g.addr,
            length: g.length,
            lkey: g.lkey,
        })
        .collect())
}

/// `IBV_WR_*` opcodes.
mod op {
    pub const RDMA_WRITE: i32 = 0;
    pub const RDMA_WRITE_WITH_IMM: i32 = 1;
    pub const SEND: i32 = 2;
    pub const SEND_WITH_IMM: i32 = 3;
    pub const RDMA_READ: i32 = 4;
    pub const ATOMIC_CMP_AND_SWP: i32 = 5;
    pub const ATOMIC_FETCH_AND_ADD: i32 = 6;
    pub const LOCAL_INV: i32 = 7;
    pub const BIND_MW: i32 = 8;
    pub const SEND_WITH_INV: i32 = 9;
    pub const ATOMIC_WRITE: i32 = 15;
}

/// # Safety
/// `w` must be a valid C send WR whose pointers are valid. `wr.ud` is read
/// only for a UD QP (`is_ud`): on RC and UC the union holds `wr.rdma` or
/// whatever the program left there, as rdma-core's rxe provider ignores it.
unsafe fn send_wr_from_c(w: &ibv_send_wr, is_ud: bool) -> Result<SendWr, c_int> {
    // SAFETY: the union members are read according to the opcode, as the
    // C caller wrote them.
    let (rdma, atomic, ud, bind) = unsafe { (w.wr.rdma, w.wr.atomic, w.wr.ud, w.last.bind_mw) };
    let op = match w.opcode {
        op::RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        op::RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: u32::from_be(w.imm_data),
        },
        op::SEND => SendOp::Send,
        op::SEND_WITH_IMM => SendOp::SendWithImm {
            imm: u32::from_be(w.imm_data),
        },
        op::SEND_WITH_INV => SendOp::SendWithInv { rkey: w.imm_data },
        op::RDMA_READ => SendOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        op::ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpSwp {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        op::ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        op::LOCAL_INV => SendOp::LocalInv { rkey: w.imm_data },
        // The 8 bytes come from the SGE list (or inline data); the target
        // from wr.rdma, where the ibv_post_send API puts a remote address.
        op::ATOMIC_WRITE => SendOp::AtomicWrite {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        op::BIND_MW => {
            let lkey = if bind.bind_info.mr.is_null() {
                0
            } else {
                // SAFETY: a live MR of the program.
                unsafe { (*bind.bind_info.mr).lkey }
            };
            if bind.mw.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: a live MW of the program.
            let mw_rkey = unsafe { (*bind.mw).rkey };
            SendOp::BindMw {
                mw_rkey,
                new_key: bind.rkey as u8,
                bind: rxe_core::MwBindInfo {
                    mr_lkey: lkey,
                    addr: bind.bind_info.addr,
                    length: bind.bind_info.length,
                    access: rxe_core::AccessFlags::from_bits_truncate(
                        bind.bind_info.mw_access_flags,
                    ),
                },
            }
        }
        other => {
            debug(|| format!("ibv_post_send: opcode {other} is not one rxe supports"));
            return Err(libc::EINVAL);
        }
    };
    let ud = if !is_ud || ud.ah.is_null() || !matches!(w.opcode, op::SEND | op::SEND_WITH_IMM) {
        None
    } else {
        // SAFETY: a live AH of the program.
        let ah = unsafe { &*(ud.ah as *const Ah) };
        Some(UdDest {
            ah: ah.ah.handle(),
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
        })
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        // SAFETY: the WR's SGE list.
        sg_list: unsafe { sges(w.sg_list, w.num_sge) }?,
        flags: SendFlags::from_bits_truncate(w.send_flags),
        ud,
        // `qp_type.xrc.remote_srqn`: used by XRC_SEND QPs only.
        xrc_remote_srqn: Some(w.remote_srqn),
    })
}

/// `ibv_context_ops.post_send`.
pub unsafe extern "C" fn post_send(
    q: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    if q.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP.
    let qpo = unsafe { qp(q) };
    let is_ud = qpo.ibv.qp_base.qp_type == 4;
    let convert = |w: &ibv_send_wr| {
        // SAFETY: the caller's WR.
        unsafe { send_wr_from_c(w, is_ud) }.and_then(|mut s| {
            if is_ud && s.ud.is_none() {
                debug(|| "ibv_post_send: a UD send needs wr.ud.ah".into());
                return Err(libc::EINVAL);
            }
            if !is_ud {
                s.ud = None;
            }
            Ok(s)
        })
    };
    let fail = |at: *mut ibv_send_wr, e: c_int| {
        if !bad.is_null() {
            // SAFETY: caller output.
            unsafe { *bad = at };
        }
        e
    };
    if wr.is_null() {
        return 0;
    }
    // SAFETY: the caller's WR chain.
    let w = unsafe { &*wr };
    if w.next.is_null() {
        // One work request (the common case): no list to build.
        return match convert(w).and_then(|s| {
            qpo.qp
                .post_send(s)
                .map_err(|e| crate::fail("ibv_post_send", &e))
        }) {
            Ok(()) => 0,
            Err(e) => fail(wr, e),
        };
    }
    // A chain is queued whole before the requester runs, as kernel rxe's
    // provider writes every WQE and then rings the doorbell once. Those
    // before the first refused one (here or by the device) are posted.
    let (mut chain, mut at) = (Vec::new(), Vec::new());
    let mut wrong = None;
    while !wr.is_null() {
        // SAFETY: the caller's WR chain.
        let w = unsafe { &*wr };
        match convert(w) {
            Ok(s) => {
                chain.push(s);
                at.push(wr);
            }
            Err(e) => {
                wrong = Some((wr, e));
                break;
            }
        }
        wr = w.next;
    }
    if let Err((i, e)) = qpo.qp.post_send_list(chain) {
        return fail(at[i], crate::fail("ibv_post_send", &e));
    }
    match wrong {
        Some((p, e)) => fail(p, e),
        None => 0,
    }
}

/// # Safety
/// `w` must be a valid C receive WR.
unsafe fn recv_wr_from_c(w: &ibv_recv_wr) -> Result<RecvWr, c_int> {
    Ok(RecvWr {
        wr_id: w.wr_id,
        // SAFETY: the WR's SGE list.
        sg_list: unsafe { sges(w.sg_list, w.num_sge) }?,
    })
}

/// Post a chain of receive WRs with `post`, reporting the first failure.
unsafe fn post_recv_chain(
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    what: &str,
    post: impl Fn(RecvWr) -> verbs_api::Result<()>,
) -> c_int {
    while !wr.is_null() {
        // SAFETY: the caller's WR chain.
        let w = unsafe { &*wr };
        // SAFETY: as above.
        let r =
            unsafe { recv_wr_from_c(w) }.and_then(|r| post(r).map_err(|e| crate::fail(what, &e)));
        if let Err(e) = r {
            if !bad.is_null() {
                // SAFETY: caller output.
                unsafe { *bad = wr };
            }
            return e;
        }
        wr = w.next;
    }
    0
}

/// `ibv_context_ops.post_recv`.
pub unsafe extern "C" fn post_recv(
    q: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if q.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP; the caller's chain.
    let qpo = unsafe { qp(q) };
    if !qpo.ibv.qp_base.srq.is_null() {
        debug(|| "ibv_post_recv: this QP takes its receives from an SRQ".into());
        if !bad.is_null() {
            // SAFETY: caller output.
            unsafe { *bad = wr };
        }
        return libc::EINVAL;
    }
    // SAFETY: forwarded.
    unsafe { post_recv_chain(wr, bad, "ibv_post_recv", |r| qpo.qp.post_recv(r)) }
}

/// `ibv_context_ops.post_srq_recv`.
pub unsafe extern "C" fn post_srq_recv(
    s: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if s.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live SRQ; the caller's chain.
    let so = unsafe { srq(s) };
    // SAFETY: forwarded.
    unsafe { post_recv_chain(wr, bad, "ibv_post_srq_recv", |r| so.srq.post_recv(r)) }
}

// ---------------------------------------------------------------------------
// Polling

fn wc_to_c(w: &WorkCompletion) -> ibv_wc {
    let with_inv = w.wc_flags.contains(rxe_core::WcFlags::WITH_INV);
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as c_int,
        opcode: w.opcode as c_int,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        // imm_data is big-endian in memory; invalidated_rkey is host order.
        imm_data: if with_inv {
            w.invalidated_rkey
        } else {
            w.imm_data.to_be()
        },
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

/// `ibv_context_ops.poll_cq`.
pub unsafe extern "C" fn poll_cq(c: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if c.is_null() || n < 0 || (wc.is_null() && n > 0) {
        return -libc::EINVAL;
    }
    if n == 0 {
        return 0;
    }
    // SAFETY: a live CQ.
    let cqo = unsafe { cq(c) };
    // The thread's vector is reused: one allocation per poll less.
    thread_local! {
        static WCS: std::cell::Cell<Vec<WorkCompletion>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let mut v = WCS.take();
    v.clear();
    let r = match cqo.cq.poll_into(n as usize, &mut v) {
        Ok(_) => {
            for (i, w) in v.iter().enumerate() {
                // SAFETY: the caller's array has n >= v.len() entries.
                unsafe { *wc.add(i) = wc_to_c(w) };
            }
            v.len() as c_int
        }
        Err(e) => -crate::fail("ibv_poll_cq", &e),
    };
    v.clear();
    WCS.set(v);
    r
}

// --- ibv_cq_ex -------------------------------------------------------------

fn cq_of(c: *mut ibv_cq_ex) -> &'static crate::objects::Cq {
    // SAFETY: a live CQ handed to a cq_ex function by the program.
    unsafe { cq(c as *mut ibv_cq) }
}

/// Take the next completion into `cur`, polling the device when the buffer
/// is empty; sets the `status` and `wr_id` fields the inline readers use.
unsafe fn advance(c: *mut ibv_cq_ex) -> c_int {
    let cqo = cq_of(c);
    let mut ex = cqo.ex.lock().unwrap_or_else(|p| p.into_inner());
    if ex.buf.is_empty() {
        match cqo.cq.poll(16) {
            Ok(v) => ex.buf.extend(v),
            Err(e) => return crate::fail("ibv_start_poll", &e),
        }
    }
    match ex.buf.pop_front() {
        Some(w) => {
            // SAFETY: the program's live cq_ex.
            unsafe {
                (*c).status = w.status as c_int;
                (*c).wr_id = w.wr_id;
            }
            ex.cur = Some(w);
            0
        }
        None => {
            ex.cur = None;
            libc::ENOENT
        }
    }
}

unsafe extern "C" fn start_poll(c: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: a NULL-checked caller struct.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: forwarded.
    unsafe { advance(c) }
}

unsafe extern "C" fn next_poll(c: *mut ibv_cq_ex) -> c_int {
    // SAFETY: forwarded.
    unsafe { advance(c) }
}

unsafe extern "C" fn end_poll(c: *mut ibv_cq_ex) {
    cq_of(c).ex.lock().unwrap_or_else(|p| p.into_inner()).cur = None;
}

fn cur(c: *mut ibv_cq_ex) -> WorkCompletion {
    let ex = cq_of(c).ex.lock().unwrap_or_else(|p| p.into_inner());
    ex.cur.unwrap_or_else(|| {
        debug(|| "ibv_wc_read_*: called outside start_poll/end_poll".into());
        WorkCompletion {
            wr_id: 0,
            status: rxe_core::WcStatus::GeneralErr,
            opcode: rxe_core::WcOpcode::Send,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: rxe_core::WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    })
}

unsafe extern "C" fn read_opcode(c: *mut ibv_cq_ex) -> c_int {
    cur(c).opcode as c_int
}
unsafe extern "C" fn read_vendor_err(c: *mut ibv_cq_ex) -> u32 {
    cur(c).vendor_err
}
unsafe extern "C" fn read_byte_len(c: *mut ibv_cq_ex) -> u32 {
    cur(c).byte_len
}
unsafe extern "C" fn read_imm_data(c: *mut ibv_cq_ex) -> u32 {
    // ibv_wc_read_imm_data returns __be32; ibv_wc_read_invalidated_rkey
    // calls the same reader and converts it back with be32toh.
    let w = cur(c);
    if w.wc_flags.contains(rxe_core::WcFlags::WITH_INV) {
        w.invalidated_rkey.to_be()
    } else {
        w.imm_data.to_be()
    }
}
unsafe extern "C" fn read_qp_num(c: *mut ibv_cq_ex) -> u32 {
    cur(c).qp_num
}
unsafe extern "C" fn read_src_qp(c: *mut ibv_cq_ex) -> u32 {
    cur(c).src_qp
}
unsafe extern "C" fn read_wc_flags(c: *mut ibv_cq_ex) -> c_uint {
    cur(c).wc_flags.bits()
}
unsafe extern "C" fn read_slid(c: *mut ibv_cq_ex) -> u32 {
    cur(c).slid as u32
}
unsafe extern "C" fn read_sl(c: *mut ibv_cq_ex) -> u8 {
    cur(c).sl
}
unsafe extern "C" fn read_dlid_path_bits(c: *mut ibv_cq_ex) -> u8 {
    cur(c).dlid_path_bits
}

pub fn fill_cq_ex(c: &mut ibv_cq_ex) {
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    c.read_opcode = Some(read_opcode);
    c.read_vendor_err = Some(read_vendor_err);
    c.read_byte_len = Some(read_byte_len);
    c.read_imm_data = Some(read_imm_data);
    c.read_qp_num = Some(read_qp_num);
    c.read_src_qp = Some(read_src_qp);
    c.read_wc_flags = Some(read_wc_flags);
    c.read_slid = Some(read_slid);
    c.read_sl = Some(read_sl);
    c.read_dlid_path_bits = Some(read_dlid_path_bits);
}

// --- ibv_qp_ex -------------------------------------------------------------

/// Work requests built between `ibv_wr_start` and `ibv_wr_complete`.
#[derive(Default)]
pub struct WrBuild {
    pub wrs: Vec<SendWr>,
    /// Inline data copied at `wr_set_inline_data*` time: the program may
    /// reuse its buffer at once, so the SGEs of inline WRs point here.
    pub inline: Vec<Box<[u8]>>,
    /// First error met while building (reported by `wr_complete`).
    pub err: Option<c_int>,
}

fn qpx<'a>(q: *mut ibv_qp_ex) -> &'a Qp {
    // SAFETY: a live QP handed to an ibv_wr_* function by the program.
    unsafe { qp(q as *mut ibv_qp) }
}

/// Start a new WR with the `wr_id` and `wr_flags` the program set.
fn push(q: *mut ibv_qp_ex, op: SendOp) {
    let o = qpx(q);
    // SAFETY: the program's live qp_ex.
    let (wr_id, flags) = unsafe { ((*q).wr_id, (*q).wr_flags) };
    o.build
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .wrs
        .push(SendWr {
            wr_id,
            op,
            sg_list: Vec::new(),
            flags: SendFlags::from_bits_truncate(flags),
            ud: None,
            xrc_remote_srqn: None,
        });
}

/// Change the WR being built (the last one).
fn with_last(q: *mut ibv_qp_ex, what: &str, f: impl FnOnce(&mut WrBuild)) {
    let o = qpx(q);
    let mut b = o.build.lock().unwrap_or_else(|p| p.into_inner());
    if b.wrs.is_empty() {
        debug(|| format!("{what}: no work request started (call an ibv_wr_<opcode> first)"));
        b.err.get_or_insert(libc::EINVAL);
        return;
    }
    f(&mut b);
}

/// Fail the batch being built: `wr_complete` will return `errno` (the
/// first such error).
fn fail_batch(q: *mut ibv_qp_ex, errno: c_int) {
    qpx(q)
        .build
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .err
        .get_or_insert(errno);
}

unsafe extern "C" fn wr_start(q: *mut ibv_qp_ex) {
    let mut b = qpx(q).build.lock().unwrap_or_else(|p| p.into_inner());
    b.wrs.clear();
    b.inline.clear();
    b.err = None;
}

unsafe extern "C" fn wr_complete(q: *mut ibv_qp_ex) -> c_int {
    let o = qpx(q);
    let (wrs, inline, err) = {
        let mut b = o.build.lock().unwrap_or_else(|p| p.into_inner());
        (
            std::mem::take(&mut b.wrs),
            std::mem::take(&mut b.inline),
            b.err.take(),
        )
    };
    if let Some(e) = err {
        return e;
    }
    let is_ud = o.ibv.qp_base.qp_type == 4;
    if is_ud && wrs.iter().any(|w| w.ud.is_none() && !w.op.is_local()) {
        debug(|| "ibv_wr_complete: a UD send needs ibv_wr_set_ud_addr".into());
        return libc::EINVAL;
    }
    // Queued whole before the requester runs, as kernel rxe's provider
    // rings the doorbell once at ibv_wr_complete.
    if let Err((_, e)) = o.qp.post_send_list(wrs) {
        return crate::fail("ibv_wr_complete", &e);
    }
    // The engine copied inline data at post time.
    drop(inline);
    0
}

unsafe extern "C" fn wr_abort(q: *mut ibv_qp_ex) {
    // SAFETY: forwarded.
    unsafe { wr_start(q) }
}

unsafe extern "C" fn wr_send(q: *mut ibv_qp_ex) {
    push(q, SendOp::Send)
}
unsafe extern "C" fn wr_send_imm(q: *mut ibv_qp_ex, imm: u32) {
    push(
        q,
        SendOp::SendWithImm {
            imm: u32::from_be(imm),
        },
    )
}
unsafe extern "C" fn wr_send_inv(q: *mut ibv_qp_ex, rkey: u32) {
    push(q, SendOp::SendWithInv { rkey })
}
unsafe extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    push(q, SendOp::RdmaWrite { remote_addr, rkey })
}
unsafe extern "C" fn wr_rdma_write_imm(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    push(
        q,
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: u32::from_be(imm),
        },
    )
}
unsafe extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    push(q, SendOp::RdmaRead { remote_addr, rkey })
}
unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    push(
        q,
        SendOp::AtomicCmpSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        },
    )
}
unsafe extern "C" fn wr_atomic_fetch_add(q: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    push(
        q,
        SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        },
    )
}
/// `ibv_wr_atomic_write`: the 8 bytes at `data` are copied now (as the
/// rxe provider does) and sent as inline data of an ATOMIC WRITE.
unsafe extern "C" fn wr_atomic_write(
    q: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    data: *const c_void,
) {
    if data.is_null() {
        debug(|| "ibv_wr_atomic_write: no data".into());
        fail_batch(q, libc::EINVAL);
        return;
    }
    // SAFETY: the program passes 8 readable bytes (verbs.h contract).
    let d: Box<[u8]> = unsafe { std::slice::from_raw_parts(data as *const u8, 8) }.into();
    push(q, SendOp::AtomicWrite { remote_addr, rkey });
    set_inline(q, vec![d], "ibv_wr_atomic_write", true);
}
unsafe extern "C" fn wr_local_inv(q: *mut ibv_qp_ex, rkey: u32) {
    push(q, SendOp::LocalInv { rkey })
}
unsafe extern "C" fn wr_bind_mw(
    q: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    if mw.is_null() || info.is_null() {
        fail_batch(q, libc::EINVAL);
        return;
    }
    // SAFETY: the program's live MW and bind info.
    let (mw_rkey, i) = unsafe { ((*mw).rkey, &*info) };
    let lkey = if i.mr.is_null() {
        0
    } else {
        // SAFETY: a live MR of the program.
        unsafe { (*i.mr).lkey }
    };
    push(
        q,
        SendOp::BindMw {
            mw_rkey,
            new_key: rkey as u8,
            bind: rxe_core::MwBindInfo {
                mr_lkey: lkey,
                addr: i.addr,
                length: i.length,
                access: rxe_core::AccessFlags::from_bits_truncate(i.mw_access_flags),
            },
        },
    );
    // The window answers to the new key once the bind is posted.
    // SAFETY: the program's live MW.
    unsafe { (*mw).rkey = (mw_rkey & !0xff) | (rkey & 0xff) };
}
unsafe extern "C" fn wr_set_ud_addr(q: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    if ah.is_null() {
        with_last(q, "ibv_wr_set_ud_addr", |b| {
            b.err.get_or_insert(libc::EINVAL);
        });
        return;
    }
    // SAFETY: the program's live AH.
    let h = unsafe { &*(ah as *const Ah) }.ah.handle();
    with_last(q, "ibv_wr_set_ud_addr", |b| {
        if let Some(w) = b.wrs.last_mut() {
            w.ud = Some(UdDest {
                ah: h,
                remote_qpn: qpn,
                remote_qkey: qkey,
            });
        }
    })
}
unsafe extern "C" fn wr_set_xrc_srqn(q: *mut ibv_qp_ex, remote_srqn: u32) {
    with_last(q, "ibv_wr_set_xrc_srqn", |b| {
        if let Some(w) = b.wrs.last_mut() {
            w.xrc_remote_srqn = Some(remote_srqn);
        }
    })
}
unsafe extern "C" fn wr_set_sge(q: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_last(q, "ibv_wr_set_sge", |b| {
        if let Some(w) = b.wrs.last_mut() {
            w.sg_list = vec![Sge { addr, length, lkey }];
        }
    })
}
unsafe extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    // More SGEs than the QP was created with fail `ibv_wr_complete` with
    // ENOSPC, as the rxe provider's `wr_set_sge_list` has them fail.
    let max_sge = qpx(q).send_caps.0;
    if n > max_sge as usize {
        with_last(q, "ibv_wr_set_sge_list", |b| {
            debug(|| {
                format!("ibv_wr_set_sge_list: {n} SGEs exceed the QP's max_send_sge {max_sge}")
            });
            b.err.get_or_insert(libc::ENOSPC);
        });
        return;
    }
    // SAFETY: the program's array of n SGEs.
    let s = match unsafe { sges(list, n as c_int) } {
        Ok(s) => s,
        Err(e) => {
            with_last(q, "ibv_wr_set_sge_list", |b| {
                b.err.get_or_insert(e);
            });
            return;
        }
    };
    with_last(q, "ibv_wr_set_sge_list", |b| {
        if let Some(w) = b.wrs.last_mut() {
            w.sg_list = s;
        }
    })
}

/// Inline data for the WR being built, copied now into one buffer, as the
/// rxe provider copies every buffer of the list, one after the other, into
/// its WQE's inline area: the number of buffers is not bounded by
/// `max_send_sge` (they are not SGEs), only their total length by
/// `max_inline_data`, and more than that fails `ibv_wr_complete` with
/// ENOSPC (rdma-core `providers/rxe/rxe.c`, `wr_set_inline_data_list`).
///
/// `operand`: the 8 bytes of `ibv_wr_atomic_write`, which the provider
/// copies into the WQE whatever `max_inline_data` is: no limit applies.
fn set_inline(q: *mut ibv_qp_ex, bufs: Vec<Box<[u8]>>, what: &str, operand: bool) {
    let total: usize = bufs.iter().map(|d| d.len()).sum();
    let max_inline = if operand {
        usize::MAX
    } else {
        qpx(q).send_caps.1 as usize
    };
    with_last(q, what, |b| {
        if total > max_inline {
            debug(|| {
                format!("{what}: {total} bytes of inline data exceed the QP's max_inline_data {max_inline}")
            });
            b.err.get_or_insert(libc::ENOSPC);
            return;
        }
        let data: Box<[u8]> = bufs.concat().into_boxed_slice();
        let sg = if data.is_empty() {
            Vec::new()
        } else {
            vec![Sge {
                addr: data.as_ptr() as u64,
                length: data.len() as u32,
                lkey: 0,
            }]
        };
        if let Some(w) = b.wrs.last_mut() {
            w.sg_list = sg;
            w.flags |= SendFlags::INLINE;
        }
        b.inline.push(data);
    })
}
unsafe extern "C" fn wr_set_inline_data(q: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    let d: Box<[u8]> = if len == 0 || addr.is_null() {
        Box::new([])
    } else {
        // SAFETY: the program's buffer of len bytes, copied now.
        unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.into()
    };
    set_inline(q, vec![d], "ibv_wr_set_inline_data", false);
}
unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    if n > 0 && list.is_null() {
        return set_inline(q, Vec::new(), "ibv_wr_set_inline_data_list", false);
    }
    let bufs = (0..n)
        .map(|i| {
            // SAFETY: the program's array of n buffers, copied now.
            let b = unsafe { &*list.add(i) };
            if b.length == 0 || b.addr.is_null() {
                Box::<[u8]>::from([])
            } else {
                // SAFETY: as above.
                unsafe { std::slice::from_raw_parts(b.addr as *const u8, b.length) }.into()
            }
        })
        .collect();
    set_inline(q, bufs, "ibv_wr_set_inline_data_list", false);
}

/// `ibv_wr_flush` (rdma-core 45): a FLUSH of `len` bytes at
/// `remote_addr` (`level` IBV_FLUSH_RANGE) or of the whole region of
/// `rkey` (IBV_FLUSH_MR), for global visibility and/or persistence
/// (`type`, IBV_FLUSH_GLOBAL | IBV_FLUSH_PERSISTENT). As the rxe provider's
/// `wr_flush`, the values go into the WQE unchecked (the responder judges
/// them) and the length is kept in 32 bits (`wqe->dma.length`).
unsafe extern "C" fn wr_flush(
    q: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    len: usize,
    r#type: u8,
    level: u8,
) {
    push(
        q,
        SendOp::Flush {
            remote_addr,
            rkey,
            length: len as u32,
            placement: r#type,
            selectivity: level,
        },
    )
}

pub fn fill_qp_ex(q: &mut ibv_qp_ex) {
    q.wr_flush = Some(wr_flush);
    q.wr_start = Some(wr_start);
    q.wr_complete = Some(wr_complete);
    q.wr_abort = Some(wr_abort);
    q.wr_send = Some(wr_send);
    q.wr_send_imm = Some(wr_send_imm);
    q.wr_send_inv = Some(wr_send_inv);
    q.wr_rdma_write = Some(wr_rdma_write);
    q.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    q.wr_rdma_read = Some(wr_rdma_read);
    q.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    q.wr_atomic_write = Some(wr_atomic_write);
    q.wr_local_inv = Some(wr_local_inv);
    q.wr_bind_mw = Some(wr_bind_mw);
    q.wr_set_ud_addr = Some(wr_set_ud_addr);
    q.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    q.wr_set_sge = Some(wr_set_sge);
    q.wr_set_sge_list = Some(wr_set_sge_list);
    q.wr_set_inline_data = Some(wr_set_inline_data);
    q.wr_set_inline_data_list = Some(wr_set_inline_data_list);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SEND on an RC or UC QP whose `wr` union still holds an RDMA
    /// address (a program that fills `wr.rdma` for every opcode, as
    /// rxe-interop-peer did) must not be read as `wr.ud.ah`: that pointer
    /// is garbage and dereferencing it crashed the program.
    #[test]
    fn rc_send_ignores_the_ud_union_member() {
        // SAFETY: all-zero is a valid ibv_send_wr (null pointers, no SGEs).
        let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
        w.opcode = op::SEND;
        w.wr.rdma = wr_rdma {
            remote_addr: 0xdead_beef_0000,
            rkey: 0x1234,
        };
        // SAFETY: no pointer of `w` is followed for a non-UD QP.
        let s = unsafe { send_wr_from_c(&w, false) }.expect("a valid RC SEND");
        assert!(s.ud.is_none());
        assert!(matches!(s.op, SendOp::Send));
    }
}
