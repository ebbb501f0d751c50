//! The responder: executes incoming requests and produces ACKs, NAKs, READ
//! responses and atomic acknowledgements (kernel `rxe_resp.c`), plus the
//! receive-queue side of flushing.

use crate::counters::count;
use std::net::IpAddr;

use wire::aeth::{NakCode, Syndrome, CREDITS_INVALID};
use wire::atomic::AtomicAckRepr;
use wire::{OpFlags, Opcode, PacketRepr, Psn};

use crate::dma::{self, ScatterError};
use crate::engine::{flushed_recv_wc, Ctx, RxDatagram};
use crate::mem::{AtomicOp, Memory};
use crate::mr::{AccessFlags, KeyError};
use crate::qp::{
    ActiveRecv, ActiveWrite, DeferredRequest, Qp, ReadReply, RecvWqe, Resource, MAX_DEFERRED,
};
use crate::qp_attr::{QpState, QpType};
use crate::req::{aeth, enter_error};
use crate::tx::{self, Headers, Route};
use crate::wr::{
    WcFlags, WcOpcode, WcStatus, WorkCompletion, FLUSH_GLOBAL, FLUSH_MR, FLUSH_PERSISTENT,
};
use crate::{AsyncEventKind, EventObject};

/// The ACK syndrome kernel rxe always sends: ACK with the "invalid" credit
/// count (end-to-end credits are not used), 0x1f on the wire.
const ACK: Syndrome = Syndrome::Ack {
    credits: CREDITS_INVALID,
};

/// Flush the receive side with WR_FLUSH_ERR: the WQE being filled, then the
/// QP's own receive queue (an SRQ keeps its WQEs for other QPs).
pub(crate) fn flush_recv_queue<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    if let Some(a) = qp.recv.take() {
        let wc = flushed_recv_wc(qp, a.wqe.wr_id);
        ctx.post_cq(qp.recv_cq, wc, false);
    }
    while let Some(r) = qp.rq.pop_front() {
        let wc = flushed_recv_wc(qp, r.wr_id);
        ctx.post_cq(qp.recv_cq, wc, false);
    }
    qp.write = None;
    qp.resp_opcode = None;
}

/// The kind of a responder error, by IBTA class (9.9.3.1, kernel
/// `do_class_ac_error`).
enum Fault {
    /// Class C: NAK with this code, the receive WQE (if any) completes with
    /// this status, the QP goes to ERR and raises this event.
    Fatal {
        nak: NakCode,
        status: WcStatus,
        event: AsyncEventKind,
        why: String,
    },
    /// RNR: no receive WQE.
    Rnr,
    /// Drop silently (UC/UD, or an RC packet that cannot be answered).
    Drop,
}

fn route(qp: &Qp, model: crate::cc::CcModel) -> Option<Route> {
    qp.path.map(|(src, dst)| Route {
        src,
        dst,
        src_port: qp.src_port,
        xrc: qp.qp_type.is_xrc(),
        mig_req: crate::model::bth_mig_req(model, qp.qp_type, qp.attr.path_mig_state),
    })
}

/// Send an ACK or NAK with the current MSN.
fn send_ack<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, syndrome: Syndrome, psn: Psn) {
    let Some(r) = route(qp, ctx.cfg.cc.model) else {
        return;
    };
    let mut h = Headers::new(Opcode::RC_ACKNOWLEDGE, qp.attr.dest_qp_num, psn);
    h.aeth = Some(aeth(syndrome, qp.msn));
    if tx::emit::<M, ()>(ctx, r, &h, 0, |_, _| Ok(None)).is_err() {
        count!(ctx, qp, send_err);
    } else {
        qp.counters.sent_pkts += 1;
    }
}

fn send_atomic_ack<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, psn: Psn, orig: u64) {
    let Some(r) = route(qp, ctx.cfg.cc.model) else {
        return;
    };
    let mut h = Headers::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, qp.attr.dest_qp_num, psn);
    h.aeth = Some(aeth(ACK, qp.msn));
    h.atomic_ack = Some(AtomicAckRepr { orig });
    if tx::emit::<M, ()>(ctx, r, &h, 0, |_, _| Ok(None)).is_err() {
        count!(ctx, qp, send_err);
    } else {
        qp.counters.sent_pkts += 1;
    }
}

/// Acknowledge an ATOMIC WRITE or a FLUSH (kernel `send_read_response_ack`): an
/// RDMA_READ_RESPONSE_ONLY with an ACK AETH, the current MSN and no
/// payload, at the request's PSN.
fn send_read_response_ack<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, psn: Psn) {
    let Some(r) = route(qp, ctx.cfg.cc.model) else {
        return;
    };
    let mut h = Headers::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, qp.attr.dest_qp_num, psn);
    h.aeth = Some(aeth(ACK, qp.msn));
    if tx::emit::<M, ()>(ctx, r, &h, 0, |_, _| Ok(None)).is_err() {
        count!(ctx, qp, send_err);
    } else {
        qp.counters.sent_pkts += 1;
    }
}

/// Start answering a READ (or replaying one from `start_psn`): the
/// responses are built by [`continue_read`] as the driver polls.
fn start_read_reply<M>(qp: &mut Qp, ctx: &mut Ctx<M>, reply: ReadReply) {
    qp.read_reply = Some(reply);
    ctx.read_ready.push_back(qp.qpn);
}

/// Build the next response of the QP's READ reply (kernel `read_reply`).
/// Returns whether more remain. The rkey is checked again for every
/// packet: the MR may have been deregistered, and its memory handed back
/// to the application, since the READ arrived. Then the QP gets the access
/// error it would have got had the READ arrived after the deregistration
/// (kernel rxe holds a reference to the MR instead; we cannot hold the
/// application's memory).
pub(crate) fn continue_read<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>) -> bool {
    let Some(mut rr) = qp.read_reply.take() else {
        return false;
    };
    let Some(r) = route(qp, ctx.cfg.cc.model) else {
        return false;
    };
    let mtu = qp.mtu;
    let n = rr.len.div_ceil(mtu).max(1);
    let i = rr.sent;
    let off = i * mtu;
    let chunk = (rr.len - off).min(mtu);
    let (first, last) = (i == 0 && rr.start_psn == rr.first_psn, i == n - 1);
    let opcode = match (first, last) {
        (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
        (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
    };
    let psn = rr.start_psn.add(i);
    let mut h = Headers::new(opcode, qp.attr.dest_qp_num, psn);
    if first || last {
        h.aeth = Some(aeth(ACK, rr.msn));
    }
    let host = if chunk == 0 {
        0
    } else {
        match ctx.keys.check_remote(
            qp.pd,
            qp.qpn,
            rr.rkey,
            rr.va + u64::from(off),
            u64::from(chunk),
            AccessFlags::REMOTE_READ,
        ) {
            Ok(h) => h.host_addr,
            Err(e) => {
                let f = access(e, "RDMA READ (the MR changed during the reply)");
                responder_fault(qp, ctx, psn, f);
                return false;
            }
        }
    };
    let built = tx::emit(ctx, r, &h, chunk as usize, |ctx, buf| {
        if buf.is_empty() {
            Ok(None)
        } else if tx::gathers(ctx, host, buf.len()) {
            Ok(Some(host))
        } else {
            ctx.mem.read(host, buf).map(|()| None)
        }
    });
    if built.is_ok() {
        qp.counters.sent_pkts += 1;
    }
    if let Err(e) = built {
        let m = match e {
            tx::EmitError::Fill(f) => f.to_string(),
            tx::EmitError::Build(b) => b.to_string(),
        };
        // The memory under a valid rkey cannot be read (a page of an
        // on-demand-paging MR that is no longer mapped): an access error,
        // as later kernels' read_reply answers a failed copy
        // (RESPST_ERR_RKEY_VIOLATION) and as a NIC answers a page fault it
        // cannot resolve. Building the packet itself failing is ours.
        let f = match e {
            tx::EmitError::Fill(_) => fatal(
                NakCode::RemoteAccessError,
                WcStatus::RemAccessErr,
                AsyncEventKind::QpAccessErr,
                format!("RDMA READ: the MR's memory could not be read: {m}"),
            ),
            tx::EmitError::Build(_) => fatal(
                NakCode::RemoteOperationalError,
                WcStatus::RemOpErr,
                AsyncEventKind::QpFatal,
                format!("READ response could not be built: {m}"),
            ),
        };
        responder_fault(qp, ctx, psn, f);
        return false;
    }
    rr.sent += 1;
    if rr.sent < n {
        qp.read_reply = Some(rr);
        true
    } else {
        false
    }
}

/// Hold a request that arrived while a READ reply is under way.
pub(crate) fn defer_request<M>(qp: &mut Qp, ctx: &mut Ctx<M>, dg: &RxDatagram<'_>) {
    if qp.deferred.len() >= MAX_DEFERRED {
        count!(ctx, qp, resp_deferred_drops);
        return;
    }
    qp.deferred.push_back(DeferredRequest {
        src: dg.src,
        dst: dg.dst,
        src_port: dg.src_port,
        dst_port: dg.dst_port,
        payload: dg.payload.to_vec(),
    });
}

/// Handle, in order, the requests held behind a READ reply that has
/// ended, until one of them starts another READ reply.
pub(crate) fn resume_deferred<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    while qp.read_reply.is_none() {
        let Some(d) = qp.deferred.pop_front() else {
            return;
        };
        if !qp.can_receive() {
            qp.deferred.clear();
            return;
        }
        // It parsed when it arrived; the bytes are unchanged.
        let Ok(pkt) = PacketRepr::parse(&d.payload) else {
            continue;
        };
        let dg = RxDatagram {
            src: d.src,
            dst: d.dst,
            src_port: d.src_port,
            dst_port: d.dst_port,
            ipv4_id: None,
            payload: &d.payload,
            ecn: wire::Ecn::NotEct,
        };
        on_request(qp, ctx, &pkt, &dg);
    }
}

/// Take a receive WQE: from the SRQ if the QP has one, else the RQ.
fn take_recv<M>(qp: &mut Qp, ctx: &mut Ctx<M>) -> Option<ActiveRecv> {
    match qp.srq {
        Some(h) => {
            let srq = ctx.srqs.get_mut(&h)?;
            let (wqe, fire) = srq.take()?;
            if fire {
                ctx.event(
                    AsyncEventKind::SrqLimitReached,
                    EventObject::Srq(h),
                    format!(
                        "SRQ {} has fewer WQEs than its limit; post more receives",
                        h.0
                    ),
                );
            }
            Some(ActiveRecv { wqe, offset: 0 })
        }
        None => qp.rq.pop_front().map(|wqe| ActiveRecv { wqe, offset: 0 }),
    }
}

fn has_recv<M>(qp: &Qp, ctx: &Ctx<M>) -> bool {
    qp.recv.is_some()
        || match qp.srq {
            Some(h) => ctx.srqs.get(&h).is_some_and(|s| !s.queue.is_empty()),
            None => !qp.rq.is_empty(),
        }
}

/// Handle a request packet (it has the REQ flag) for this QP.
///
/// An XRC target first takes the PD, receive queue and CQ of the XRC SRQ
/// the request's XRCETH names (IBTA A14.5.3: it must be an XRC SRQ of the
/// QP's XRC domain, else the request is NAKed as invalid), then handles
/// the request as RC does, under the RC twin of its opcode.
pub(crate) fn on_request<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
    dg: &RxDatagram<'_>,
) {
    if qp.qp_type != QpType::XrcRecv {
        on_rc_request(qp, ctx, pkt, dg);
        return;
    }
    let Some(x) = pkt.xrceth else {
        count!(ctx, qp, rcvd_malformed);
        return;
    };
    if let Err(why) = xrc_bind(qp, ctx, x.srqn) {
        responder_fault(qp, ctx, pkt.bth.psn, invalid(why));
        return;
    }
    let mut rc = pkt.clone();
    rc.bth.opcode = pkt.bth.opcode.xrc_to_rc().unwrap_or(pkt.bth.opcode);
    on_rc_request(qp, ctx, &rc, dg);
}

/// Point an XRC target QP at the XRC SRQ number `srqn`.
fn xrc_bind<M>(qp: &mut Qp, ctx: &Ctx<M>, srqn: u32) -> Result<(), String> {
    let h = crate::SrqHandle(srqn);
    let Some(s) = ctx.srqs.get(&h) else {
        return Err(format!(
            "the request names XRC SRQ {srqn:#x}, which does not exist"
        ));
    };
    match s.xrc {
        Some((xrcd, cq)) if Some(xrcd) == qp.xrcd => {
            qp.srq = Some(h);
            qp.pd = s.pd;
            qp.recv_cq = cq;
            Ok(())
        }
        _ => Err(format!(
            "the request names SRQ {srqn:#x}, which is not an XRC SRQ of XRC_RECV QP {:#x}'s XRC domain",
            qp.qpn
        )),
    }
}

fn on_rc_request<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
    dg: &RxDatagram<'_>,
) {
    if qp.state == QpState::Rtr && !qp.comm_est_sent {
        // IBTA 11.6.3.1: the first packet received in RTR establishes the
        // connection.
        qp.comm_est_sent = true;
        ctx.event(
            AsyncEventKind::CommEst,
            EventObject::Qp(qp.qpn),
            format!("QP {:#x} received its first packet while in RTR", qp.qpn),
        );
    }
    if qp.qp_type == QpType::Ud {
        ud_receive(qp, ctx, pkt, dg);
        return;
    }
    let Some(info) = pkt.bth.opcode.info() else {
        return;
    };
    let flags = info.flags;
    let psn = pkt.bth.psn;

    // --- PSN (kernel check_psn) ---
    if qp.qp_type.is_reliable() {
        let d = psn.diff(qp.resp_psn);
        if d > 0 {
            // Class B: one NAK per gap, then silence until the gap closes.
            if !qp.sent_psn_nak {
                qp.sent_psn_nak = true;
                count!(ctx, qp, out_of_seq_request);
                send_ack(
                    qp,
                    ctx,
                    Syndrome::Nak(NakCode::PsnSequenceError),
                    qp.resp_psn,
                );
            }
            return;
        }
        if d < 0 {
            count!(ctx, qp, duplicate_request);
            duplicate(qp, ctx, pkt, flags);
            return;
        }
        qp.sent_psn_nak = false;
    } else if qp.drop_msg || psn != qp.resp_psn {
        // UC (IBTA 9.8.3.2): after a gap, drop until the next FIRST/ONLY.
        if flags.contains(OpFlags::START) {
            qp.drop_msg = false;
            abandon_message(qp);
        } else {
            qp.drop_msg = true;
            qp.resp_psn = psn.next();
            count!(ctx, qp, rcvd_dropped_msgs);
            return;
        }
    }

    match execute(qp, ctx, pkt, flags) {
        Ok(()) => {}
        Err(Fault::Rnr) => {
            // IBTA 9.7.5.2.8: RNR NAK carries the QP's min_rnr_timer; the PSN
            // is not consumed, the requester retries it.
            count!(ctx, qp, send_rnr_err);
            let t = qp.attr.min_rnr_timer & 0x1f;
            send_ack(qp, ctx, Syndrome::RnrNak { timer: t }, psn);
        }
        Err(Fault::Drop) => {
            count!(ctx, qp, rcvd_dropped_msgs);
            if qp.qp_type == QpType::Uc {
                abandon_message(qp);
                qp.drop_msg = !flags.contains(OpFlags::END);
                qp.resp_psn = psn.next();
            }
        }
        Err(f @ Fault::Fatal { .. }) => responder_fault(qp, ctx, psn, f),
    }
}

/// A fatal responder error at `psn` (IBTA classes C/D of 9.7.5.2): NAK it
/// (RC), complete the receive in progress with the error, raise the
/// event, and move the QP to ERR.
fn responder_fault<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, psn: Psn, f: Fault) {
    let Fault::Fatal {
        nak,
        status,
        event,
        why,
    } = f
    else {
        return;
    };
    if qp.qp_type.is_reliable() {
        send_ack(qp, ctx, Syndrome::Nak(nak), psn);
    }
    if let Some(a) = qp.recv.take() {
        let mut wc = WorkCompletion::new(a.wqe.wr_id, status, WcOpcode::Recv, qp.qpn);
        wc.byte_len = a.offset as u32;
        ctx.post_cq(qp.recv_cq, wc, false);
    }
    let why = format!("responder: {why}");
    ctx.event(event, EventObject::Qp(qp.qpn), why.clone());
    enter_error(qp, ctx, Some(why));
}

/// UC: forget a partially received message; its receive WQE is reused for
/// the next one (IBTA class D1; kernel `do_class_d1e_error`).
fn abandon_message(qp: &mut Qp) {
    if let Some(a) = qp.recv.as_mut() {
        a.offset = 0;
    }
    qp.write = None;
    qp.resp_opcode = None;
}

fn fatal(nak: NakCode, status: WcStatus, event: AsyncEventKind, why: String) -> Fault {
    Fault::Fatal {
        nak,
        status,
        event,
        why,
    }
}

fn invalid(why: String) -> Fault {
    fatal(
        NakCode::InvalidRequest,
        WcStatus::RemInvReqErr,
        AsyncEventKind::QpReqErr,
        why,
    )
}

fn access(e: KeyError, what: &str) -> Fault {
    fatal(
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
        AsyncEventKind::QpAccessErr,
        format!("{what}: {e}"),
    )
}

/// Class C for RC, drop for UC.
fn class_c(qp: &Qp, f: Fault) -> Fault {
    if qp.qp_type.is_reliable() {
        f
    } else {
        Fault::Drop
    }
}

/// Validate and execute an in-sequence request (kernel check_op_seq,
/// check_op_valid, check_resource, check_length, check_rkey, execute,
/// do_complete, acknowledge).
fn execute<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
    flags: OpFlags,
) -> Result<(), Fault> {
    let op = pkt.bth.opcode;
    let psn = pkt.bth.psn;
    let is_send = flags.contains(OpFlags::SEND);
    let is_write = flags.contains(OpFlags::WRITE);
    let (start, end) = (flags.contains(OpFlags::START), flags.contains(OpFlags::END));

    // --- opcode sequence (kernel check_op_seq) ---
    let expect_continue = qp.resp_opcode.and_then(|o| o.info()).map(|i| i.flags);
    let seq_ok = match expect_continue {
        None => start,
        Some(prev) if prev.contains(OpFlags::SEND) => is_send && !start,
        Some(prev) if prev.contains(OpFlags::WRITE) => is_write && !start,
        Some(_) => start,
    };
    if !seq_ok {
        let why = match qp.resp_opcode {
            Some(prev) => format!(
                "{} at PSN {psn} cannot follow {} (a message was cut short)",
                op.name(),
                prev.name()
            ),
            None => format!(
                "{} at PSN {psn} arrived without the FIRST packet of its message",
                op.name()
            ),
        };
        if qp.qp_type == QpType::Uc && start {
            // A new message while one was in progress: the old one is lost.
            abandon_message(qp);
            return Err(Fault::Drop);
        }
        return Err(class_c(qp, invalid(why)));
    }

    // --- QP access (kernel check_op_valid) ---
    let qp_access = AccessFlags::from_bits_truncate(qp.attr.qp_access_flags);
    let needed = if flags.contains(OpFlags::READ) {
        Some((AccessFlags::REMOTE_READ, "IBV_ACCESS_REMOTE_READ"))
    } else if is_write || flags.contains(OpFlags::ATOMIC_WRITE) {
        Some((AccessFlags::REMOTE_WRITE, "IBV_ACCESS_REMOTE_WRITE"))
    } else if flags.contains(OpFlags::ATOMIC) {
        Some((AccessFlags::REMOTE_ATOMIC, "IBV_ACCESS_REMOTE_ATOMIC"))
    } else {
        None
    };
    if let Some((bit, name)) = needed {
        if !qp_access.contains(bit) {
            return Err(class_c(
                qp,
                invalid(format!(
                    "{} arrived but the QP's qp_access_flags lack {name}",
                    op.name()
                )),
            ));
        }
    }
    // Kernel check_qp_attr_access: each placement type a FLUSH asks for
    // must be allowed by the QP (else RESPST_ERR_UNSUPPORTED_OPCODE, an
    // invalid request NAK).
    if flags.contains(OpFlags::FLUSH) {
        let placement = pkt.feth.map_or(0, |f| f.placement);
        for (bit, access, name) in [
            (
                FLUSH_GLOBAL,
                AccessFlags::FLUSH_GLOBAL,
                "IBV_ACCESS_FLUSH_GLOBAL",
            ),
            (
                FLUSH_PERSISTENT,
                AccessFlags::FLUSH_PERSISTENT,
                "IBV_ACCESS_FLUSH_PERSISTENT",
            ),
        ] {
            if placement & bit != 0 && !qp_access.contains(access) {
                return Err(class_c(
                    qp,
                    invalid(format!(
                        "{} at PSN {psn} asks for placement type {placement:#x} but the QP's qp_access_flags lack {name}",
                        op.name()
                    )),
                ));
            }
        }
    }

    // --- resources (kernel check_resource) ---
    if flags.contains(OpFlags::RWR) && qp.recv.is_none() && !has_recv(qp, ctx) {
        return Err(if qp.qp_type.is_reliable() {
            Fault::Rnr
        } else {
            Fault::Drop
        });
    }
    // Kernel check_resource: RXE_READ_OR_ATOMIC_MASK | RXE_ATOMIC_WRITE_MASK
    // (not FLUSH, which nonetheless takes a responder resource below).
    if flags.intersects(OpFlags::READ | OpFlags::ATOMIC | OpFlags::ATOMIC_WRITE)
        && qp.attr.max_dest_rd_atomic == 0
    {
        return Err(invalid(format!(
            "{} arrived but the QP has max_dest_rd_atomic = 0",
            op.name()
        )));
    }

    // --- length (kernel check_length) ---
    let mtu = qp.mtu as usize;
    let plen = pkt.payload.len();
    if is_send || is_write {
        let ok = match (start, end) {
            (true, true) => plen <= mtu,
            (true, false) | (false, false) => plen == mtu,
            (false, true) => plen > 0 && plen <= mtu,
        };
        if !ok {
            return Err(class_c(
                qp,
                invalid(format!(
                    "{} at PSN {psn} carries {plen} bytes; path MTU is {mtu}",
                    op.name()
                )),
            ));
        }
    }
    if let Some(reth) = pkt.reth {
        if reth.dma_len > 1 << 31 {
            return Err(class_c(
                qp,
                invalid(format!("RETH length {} exceeds 2^31", reth.dma_len)),
            ));
        }
    }

    // --- execute ---
    if flags.contains(OpFlags::READ) {
        return read_request(qp, ctx, pkt);
    }
    if flags.contains(OpFlags::ATOMIC) {
        return atomic_request(qp, ctx, pkt);
    }
    if flags.contains(OpFlags::ATOMIC_WRITE) {
        return atomic_write_request(qp, ctx, pkt);
    }
    if flags.contains(OpFlags::FLUSH) {
        return flush_request(qp, ctx, pkt);
    }
    if is_write {
        write_data(qp, ctx, pkt, start, end)?;
    } else if is_send {
        send_data(qp, ctx, pkt, start)?;
    }

    // --- complete (kernel do_complete) ---
    qp.resp_psn = psn.next();
    qp.resp_opcode = if end { None } else { Some(op) };
    if end {
        qp.msn = (qp.msn + 1) & 0x00ff_ffff;
        if flags.contains(OpFlags::RWR) || (is_send && qp.recv.is_some()) {
            complete_recv(qp, ctx, pkt, flags)?;
        }
        qp.write = None;
    }
    // --- acknowledge ---
    if qp.qp_type.is_reliable() && pkt.bth.ack_req {
        send_ack(qp, ctx, ACK, psn);
    }
    Ok(())
}

fn send_data<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
    start: bool,
) -> Result<(), Fault> {
    if start && qp.recv.is_none() {
        qp.recv = take_recv(qp, ctx);
    }
    let pd = qp.pd;
    let Some(a) = qp.recv.as_mut() else {
        return Err(if qp.qp_type.is_reliable() {
            Fault::Rnr
        } else {
            Fault::Drop
        });
    };
    match dma::scatter(
        &mut ctx.mem,
        &ctx.keys,
        pd,
        &a.wqe.sges,
        a.offset,
        pkt.payload,
    ) {
        Ok(()) => {
            a.offset += pkt.payload.len() as u64;
            Ok(())
        }
        Err(ScatterError::TooLong) => {
            let why = format!(
                "a SEND of at least {} bytes does not fit the {}-byte receive WQE (wr_id {})",
                a.offset + pkt.payload.len() as u64,
                a.wqe.length,
                a.wqe.wr_id
            );
            if qp.qp_type.is_reliable() {
                // IBTA 9.9.3.1.2: invalid request NAK; the receive completes
                // with a local length error.
                Err(fatal(
                    NakCode::InvalidRequest,
                    WcStatus::LocLenErr,
                    AsyncEventKind::QpReqErr,
                    why,
                ))
            } else {
                Err(Fault::Drop)
            }
        }
        Err(ScatterError::Protection(m)) => {
            // Kernel: RESPST_ERR_MALFORMED_WQE, class A: remote operational
            // error NAK, LOC_QP_OP_ERR on the receive.
            Err(fatal(
                NakCode::RemoteOperationalError,
                WcStatus::LocQpOpErr,
                AsyncEventKind::QpFatal,
                format!(
                    "the receive WQE (wr_id {}) cannot take the data: {m}",
                    a.wqe.wr_id
                ),
            ))
        }
    }
}

fn write_data<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
    start: bool,
    end: bool,
) -> Result<(), Fault> {
    let plen = pkt.payload.len() as u32;
    if start {
        let Some(reth) = pkt.reth else {
            return Err(class_c(qp, invalid("WRITE FIRST/ONLY without RETH".into())));
        };
        // Kernel check_rkey: the first packet must match the RETH length.
        let mtu = qp.mtu;
        let consistent = if end {
            plen == reth.dma_len
        } else {
            reth.dma_len > mtu
        };
        if !consistent {
            return Err(class_c(
                qp,
                invalid(format!(
                    "{} carries {plen} bytes but its RETH announces {}",
                    pkt.bth.opcode.name(),
                    reth.dma_len
                )),
            ));
        }
        if reth.dma_len > 0 {
            // Check the whole range once, as the kernel does.
            ctx.keys
                .check_remote(
                    qp.pd,
                    qp.qpn,
                    reth.rkey,
                    reth.va,
                    u64::from(reth.dma_len),
                    AccessFlags::REMOTE_WRITE,
                )
                .map_err(|e| class_c(qp, access(e, "RDMA WRITE")))?;
        }
        qp.write = Some(ActiveWrite {
            rkey: reth.rkey,
            va: reth.va,
            resid: reth.dma_len,
            length: reth.dma_len,
        });
    }
    let Some(w) = qp.write else {
        return Err(class_c(
            qp,
            invalid("WRITE continuation without a WRITE in progress".into()),
        ));
    };
    if plen > w.resid || (end && plen != w.resid) {
        return Err(class_c(
            qp,
            invalid(format!(
                "WRITE payload of {plen} bytes does not match the {} bytes still due",
                w.resid
            )),
        ));
    }
    if plen > 0 {
        let r = ctx
            .keys
            .check_remote(
                qp.pd,
                qp.qpn,
                w.rkey,
                w.va,
                u64::from(plen),
                AccessFlags::REMOTE_WRITE,
            )
            .map_err(|e| class_c(qp, access(e, "RDMA WRITE")))?;
        ctx.mem.write(r.host_addr, pkt.payload).map_err(|e| {
            class_c(
                qp,
                fatal(
                    NakCode::RemoteAccessError,
                    WcStatus::RemAccessErr,
                    AsyncEventKind::QpAccessErr,
                    e.to_string(),
                ),
            )
        })?;
    }
    qp.write = Some(ActiveWrite {
        va: w.va + u64::from(plen),
        resid: w.resid - plen,
        ..w
    });
    Ok(())
}

/// Complete the receive WQE of a SEND or WRITE with immediate.
fn complete_recv<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
    flags: OpFlags,
) -> Result<(), Fault> {
    let is_write = flags.contains(OpFlags::WRITE);
    if is_write && qp.recv.is_none() {
        qp.recv = take_recv(qp, ctx);
    }
    let Some(a) = qp.recv.take() else {
        return Ok(());
    };
    let mut wc = WorkCompletion::new(
        a.wqe.wr_id,
        WcStatus::Success,
        if is_write {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        },
        qp.qpn,
    );
    wc.byte_len = if is_write {
        qp.write.map_or(0, |w| w.length)
    } else {
        a.offset as u32
    };
    wc.src_qp = qp.attr.dest_qp_num;
    if let Some(imm) = pkt.immdt {
        wc.wc_flags |= WcFlags::WITH_IMM;
        wc.imm_data = imm.imm;
    }
    if let Some(ieth) = pkt.ieth {
        // IBTA 9.4.1.1: SEND with Invalidate invalidates the rkey at the
        // responder before the completion is reported.
        if let Err(e) = ctx.keys.invalidate(ieth.rkey, qp.qpn, qp.pd) {
            qp.recv = Some(a);
            return Err(invalid(format!("SEND with invalidate: {e}")));
        }
        wc.wc_flags |= WcFlags::WITH_INV;
        wc.invalidated_rkey = ieth.rkey;
    }
    count!(ctx, qp, rdma_recvs);
    ctx.post_cq(qp.recv_cq, wc, pkt.bth.solicited);
    Ok(())
}

fn push_resource(qp: &mut Qp, r: Resource) {
    // Kernel rxe recycles a ring of max_dest_rd_atomic entries.
    while qp.resources.len() >= usize::from(qp.attr.max_dest_rd_atomic.max(1)) {
        qp.resources.pop_front();
    }
    qp.resources.push_back(r);
}

fn read_request<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
) -> Result<(), Fault> {
    let Some(reth) = pkt.reth else {
        return Err(invalid("READ request without RETH".into()));
    };
    let psn = pkt.bth.psn;
    if reth.dma_len > 0 {
        ctx.keys
            .check_remote(
                qp.pd,
                qp.qpn,
                reth.rkey,
                reth.va,
                u64::from(reth.dma_len),
                AccessFlags::REMOTE_READ,
            )
            .map_err(|e| access(e, "RDMA READ"))?;
    }
    let npsn = reth.dma_len.div_ceil(qp.mtu).max(1);
    let last_psn = psn.add(npsn - 1);
    push_resource(
        qp,
        Resource::Read {
            first_psn: psn,
            last_psn,
            va: reth.va,
            rkey: reth.rkey,
            length: reth.dma_len,
        },
    );
    qp.resp_psn = last_psn.next();
    qp.resp_opcode = None;
    qp.msn = (qp.msn + 1) & 0x00ff_ffff;
    let msn = qp.msn;
    start_read_reply(
        qp,
        ctx,
        ReadReply {
            first_psn: psn,
            start_psn: psn,
            rkey: reth.rkey,
            va: reth.va,
            len: reth.dma_len,
            sent: 0,
            msn,
        },
    );
    Ok(())
}

fn atomic_request<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
) -> Result<(), Fault> {
    let Some(a) = pkt.atomic else {
        return Err(invalid("atomic request without AtomicETH".into()));
    };
    let psn = pkt.bth.psn;
    if a.va & 7 != 0 {
        return Err(invalid(format!(
            "atomic at {:#x} is not 8-byte aligned",
            a.va
        )));
    }
    let r = ctx
        .keys
        .check_remote(qp.pd, qp.qpn, a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC)
        .map_err(|e| access(e, "atomic"))?;
    let op = if pkt.bth.opcode == Opcode::RC_COMPARE_SWAP {
        AtomicOp::CompareSwap {
            compare: a.compare,
            swap: a.swap_add,
        }
    } else {
        AtomicOp::FetchAdd { add: a.swap_add }
    };
    let orig = ctx.mem.atomic(r.host_addr, op).map_err(|e| {
        fatal(
            NakCode::RemoteAccessError,
            WcStatus::RemAccessErr,
            AsyncEventKind::QpAccessErr,
            e.to_string(),
        )
    })?;
    push_resource(qp, Resource::Atomic { psn, orig });
    qp.resp_psn = psn.next();
    qp.resp_opcode = None;
    qp.msn = (qp.msn + 1) & 0x00ff_ffff;
    send_atomic_ack(qp, ctx, psn, orig);
    Ok(())
}

/// Execute an ATOMIC WRITE (kernel check_rkey, then `atomic_write_reply`
/// and `acknowledge`): the RETH's rkey must grant REMOTE_WRITE over its
/// range, the payload must be exactly what the RETH announces, the target
/// 8-byte aligned; then the 8 bytes are stored at once and the request is
/// acknowledged with an empty RDMA_READ_RESPONSE_ONLY.
fn atomic_write_request<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
) -> Result<(), Fault> {
    let Some(reth) = pkt.reth else {
        return Err(invalid("ATOMIC_WRITE without RETH".into()));
    };
    let psn = pkt.bth.psn;
    // Kernel check_rkey: key, access and range first (RKEY_VIOLATION, a
    // remote access error)...
    let r = ctx
        .keys
        .check_remote(
            qp.pd,
            qp.qpn,
            reth.rkey,
            reth.va,
            u64::from(reth.dma_len),
            AccessFlags::REMOTE_WRITE,
        )
        .map_err(|e| access(e, "ATOMIC WRITE"))?;
    // ...then the payload against the RETH length, pad included (ERR_LENGTH,
    // an invalid request).
    let plen = pkt.payload.len();
    if plen != reth.dma_len as usize || pkt.bth.pad_count != 0 {
        return Err(invalid(format!(
            "ATOMIC_WRITE at PSN {psn} carries {plen} bytes (pad {}) but its RETH announces {}",
            pkt.bth.pad_count, reth.dma_len
        )));
    }
    // Kernel atomic_write_reply copies the payload into a u64 and stores
    // it: anything but 8 bytes would store bytes nobody sent. Refused as
    // an invalid request.
    let Ok(bytes) = <[u8; 8]>::try_from(pkt.payload) else {
        return Err(invalid(format!(
            "ATOMIC_WRITE at PSN {psn} must carry 8 bytes, not {plen}"
        )));
    };
    // Kernel: RESPST_ERR_MISALIGNED_ATOMIC, class C (invalid request). The
    // kernel tests the address the bytes land at; so do we, and the
    // address on the wire.
    if reth.va & 7 != 0 || r.host_addr & 7 != 0 {
        return Err(invalid(format!(
            "ATOMIC_WRITE at {:#x} is not 8-byte aligned",
            reth.va
        )));
    }
    ctx.mem
        .atomic_write(r.host_addr, u64::from_ne_bytes(bytes))
        .map_err(|e| {
            fatal(
                NakCode::RemoteAccessError,
                WcStatus::RemAccessErr,
                AsyncEventKind::QpAccessErr,
                e.to_string(),
            )
        })?;
    push_resource(qp, Resource::AtomicWrite { psn });
    qp.resp_psn = psn.next();
    qp.resp_opcode = None;
    qp.msn = (qp.msn + 1) & 0x00ff_ffff;
    send_read_response_ack(qp, ctx, psn);
    Ok(())
}

/// Execute a FLUSH (IBTA 1.5 Annex A19; kernel check_rkey, then
/// `process_flush` and `acknowledge`).
///
/// The rkey is looked up with the access bits of the placement types
/// asked for (`IBV_ACCESS_FLUSH_GLOBAL`, `_PERSISTENT`); selectivity
/// "range" checks the RETH's VA and length against the region,
/// selectivity "whole MR" skips that check and covers the whole region
/// (any other value is range-checked, as the kernel's `feth_sel(pkt) ==
/// IB_FLUSH_MR` test does). A failure is a remote access error NAK
/// (RESPST_ERR_RKEY_VIOLATION).
///
/// For host memory, global visibility is a memory fence (the kernel's
/// `wmb()`): every write this engine placed before the FLUSH is visible to
/// every CPU once the FLUSH is acknowledged. No memory here is
/// persistent: `IBV_ACCESS_FLUSH_PERSISTENT` is refused at registration
/// (kernel rxe accepts it only for pmem pages), so a PERSISTENT FLUSH
/// normally fails the key check; one that passes (a memory window bound
/// with that access) is refused too, as kernel `rxe_flush_pmem_iova`
/// failing is (an access error), because its data cannot be made
/// persistent. No byte of the region is read or written.
///
/// The FLUSH takes a responder resource, so that a duplicate is
/// acknowledged again without executing again (oA19-14, oA19-15), and is
/// acknowledged by an empty RDMA_READ_RESPONSE_ONLY with an ACK AETH at
/// its PSN (kernel `send_read_response_ack`).
fn flush_request<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    pkt: &PacketRepr<'_>,
) -> Result<(), Fault> {
    let (Some(feth), Some(reth)) = (pkt.feth, pkt.reth) else {
        return Err(invalid("FLUSH without FETH and RETH".into()));
    };
    let psn = pkt.bth.psn;
    let mut needed = AccessFlags::empty();
    if feth.placement & FLUSH_GLOBAL != 0 {
        needed |= AccessFlags::FLUSH_GLOBAL;
    }
    if feth.placement & FLUSH_PERSISTENT != 0 {
        needed |= AccessFlags::FLUSH_PERSISTENT;
    }
    let (va, len) = if feth.selectivity == FLUSH_MR {
        ctx.keys
            .remote_extent(reth.rkey)
            .unwrap_or((reth.va, u64::from(reth.dma_len)))
    } else {
        (reth.va, u64::from(reth.dma_len))
    };
    ctx.keys
        .check_remote(qp.pd, qp.qpn, reth.rkey, va, len, needed)
        .map_err(|e| access(e, "FLUSH"))?;
    if feth.placement & FLUSH_PERSISTENT != 0 {
        return Err(fatal(
            NakCode::RemoteAccessError,
            WcStatus::RemAccessErr,
            AsyncEventKind::QpAccessErr,
            format!(
                "FLUSH at PSN {psn} asks for persistence of rkey {:#x}, but no memory of this device is persistent",
                reth.rkey
            ),
        ));
    }
    if feth.placement & FLUSH_GLOBAL != 0 {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
    push_resource(qp, Resource::Flush { psn });
    qp.resp_psn = psn.next();
    qp.resp_opcode = None;
    qp.msn = (qp.msn + 1) & 0x00ff_ffff;
    send_read_response_ack(qp, ctx, psn);
    Ok(())
}

/// IBTA 9.7.5.1.1 (kernel `duplicate_request`): re-ACK a duplicate SEND or
/// WRITE, re-execute a duplicate READ, replay an atomic's saved result,
/// acknowledge a duplicate ATOMIC WRITE or FLUSH again without executing it.
fn duplicate<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, pkt: &PacketRepr<'_>, flags: OpFlags) {
    let psn = pkt.bth.psn;
    if flags.contains(OpFlags::SEND) || flags.contains(OpFlags::WRITE) {
        send_ack(qp, ctx, ACK, qp.resp_psn.sub(1));
        return;
    }
    let Some(res) = qp.resources.iter().rev().find(|r| r.covers(psn)).copied() else {
        // Class D: not in our resources (too old): drop.
        return;
    };
    match (res, pkt.reth) {
        (
            Resource::Read {
                first_psn,
                va,
                rkey,
                length,
                ..
            },
            Some(reth),
        ) if flags.contains(OpFlags::READ) => {
            // The retried request must be the original or a tail of it.
            let end = va + u64::from(length);
            if reth.rkey != rkey || reth.va < va || reth.va + u64::from(reth.dma_len) > end {
                return;
            }
            if reth.dma_len > 0
                && ctx
                    .keys
                    .check_remote(
                        qp.pd,
                        qp.qpn,
                        reth.rkey,
                        reth.va,
                        u64::from(reth.dma_len),
                        AccessFlags::REMOTE_READ,
                    )
                    .is_err()
            {
                return;
            }
            let msn = qp.msn;
            start_read_reply(
                qp,
                ctx,
                ReadReply {
                    first_psn,
                    start_psn: psn,
                    rkey: reth.rkey,
                    va: reth.va,
                    len: reth.dma_len,
                    sent: 0,
                    msn,
                },
            );
        }
        (Resource::Atomic { orig, .. }, _) if flags.contains(OpFlags::ATOMIC) => {
            send_atomic_ack(qp, ctx, psn, orig);
        }
        (Resource::AtomicWrite { .. }, _) if flags.contains(OpFlags::ATOMIC_WRITE) => {
            send_read_response_ack(qp, ctx, psn);
        }
        (Resource::Flush { .. }, _) if flags.contains(OpFlags::FLUSH) => {
            // Kernel process_flush with res->replay: acknowledge again,
            // do not flush again. (Kernel rxe_prepare_res leaves a FLUSH
            // resource's PSN range unset, so there find_resource rarely
            // finds it; see README's deviations.)
            send_read_response_ack(qp, ctx, psn);
        }
        _ => {}
    }
}

/// Build the 40-byte network header placed at the start of a UD receive
/// buffer (kernel `build_rdma_network_hdr`): for IPv4, 20 zero bytes then
/// the IPv4 header; for IPv6, the IPv6 header. A UDP socket hides the real
/// header, so it is reconstructed as the sender built it.
fn network_header(dg: &RxDatagram<'_>) -> [u8; 40] {
    let mut h = [0u8; 40];
    let udp_len = 8 + dg.payload.len();
    match (dg.src, dg.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let ip = &mut h[20..40];
            ip[0] = 0x45;
            let total = (20 + udp_len) as u16;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[4..6].copy_from_slice(&dg.ipv4_id.unwrap_or(0).to_be_bytes());
            ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let mut sum = 0u32;
            for c in ip.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        (s, d) => {
            h[0] = 0x60;
            h[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            h[6] = 17;
            h[7] = 64;
            let to16 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
                IpAddr::V6(v) => v.octets(),
            };
            h[8..24].copy_from_slice(&to16(s));
            h[24..40].copy_from_slice(&to16(d));
        }
    }
    h
}

/// What a UD receive completion carries in `sl` on RoCE: the packet type,
/// as ConnectX reports it (PRM: bit 3 set when the frame has a UDP header,
/// RoCE v2; bits 2..0 the L3 header, 1 IPv6, 2 IPv4), so 0xA for RoCE v2
/// over IPv4 and 0x9 over IPv6. Deliberately not kernel rxe's 0: UCX
/// (1.13 on) reads the packet type from `sl` to know whether the 40 bytes
/// in front of a UD message end with an IPv4 or an IPv6 header, and with 0
/// it compares IPv4 header bytes against its GIDs and drops every UD
/// message over IPv4 (on kernel rxe users must set
/// `UCX_UD_VERBS_ETH_DGID_CHECK=n`). RoCE has no service level to report
/// in its place.
fn roce_packet_type(dg: &RxDatagram<'_>) -> u8 {
    match (dg.src, dg.dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => 0x8 | 0x2,
        _ => 0x8 | 0x1,
    }
}

/// UD receive (kernel: check Q_Key, GRH first, then the payload).
fn ud_receive<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, pkt: &PacketRepr<'_>, dg: &RxDatagram<'_>) {
    let Some(deth) = pkt.deth else {
        count!(ctx, qp, rcvd_malformed);
        return;
    };
    if deth.qkey != qp.attr.qkey {
        // IBTA 10.2.5: Q_Key violation, silently dropped.
        count!(ctx, qp, rcvd_qkey_err);
        return;
    }
    let need = 40 + pkt.payload.len() as u64;
    let pd = qp.pd;
    // Peek first: a message that does not fit leaves the WQE for the next
    // one (kernel class D1).
    let fits = match qp.srq {
        Some(h) => ctx
            .srqs
            .get(&h)
            .and_then(|s| s.queue.front())
            .map(|w| w.length >= need),
        None => qp.rq.front().map(|w| w.length >= need),
    };
    match fits {
        None => {
            count!(ctx, qp, rcvd_dropped_msgs);
            return;
        }
        Some(false) => {
            count!(ctx, qp, rcvd_dropped_msgs);
            return;
        }
        Some(true) => {}
    }
    let Some(a) = take_recv(qp, ctx) else { return };
    let wqe: RecvWqe = a.wqe;
    let hdr = network_header(dg);
    let placed = dma::scatter(&mut ctx.mem, &ctx.keys, pd, &wqe.sges, 0, &hdr)
        .and_then(|()| dma::scatter(&mut ctx.mem, &ctx.keys, pd, &wqe.sges, 40, pkt.payload));
    if let Err(e) = placed {
        let m = match e {
            ScatterError::TooLong => "message too long".to_string(),
            ScatterError::Protection(m) => m,
        };
        let why = format!(
            "UD receive WQE (wr_id {}) cannot take the data: {m}",
            wqe.wr_id
        );
        let wc = WorkCompletion::new(wqe.wr_id, WcStatus::LocQpOpErr, WcOpcode::Recv, qp.qpn);
        ctx.post_cq(qp.recv_cq, wc, false);
        ctx.event(
            AsyncEventKind::QpFatal,
            EventObject::Qp(qp.qpn),
            why.clone(),
        );
        enter_error(qp, ctx, Some(why));
        return;
    }
    let mut wc = WorkCompletion::new(wqe.wr_id, WcStatus::Success, WcOpcode::Recv, qp.qpn);
    wc.byte_len = need as u32;
    wc.src_qp = deth.src_qpn;
    wc.wc_flags = WcFlags::GRH;
    wc.sl = roce_packet_type(dg);
    if let Some(imm) = pkt.immdt {
        wc.wc_flags |= WcFlags::WITH_IMM;
        wc.imm_data = imm.imm;
    }
    count!(ctx, qp, rdma_recvs);
    ctx.post_cq(qp.recv_cq, wc, pkt.bth.solicited);
}
