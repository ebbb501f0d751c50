//! The requester: turns send WQEs into packets (kernel `rxe_req.c`), plus
//! the send-queue side of error handling and flushing.

use crate::counters::count;
use wire::aeth::AethRepr;
use wire::atomic::AtomicEthRepr;
use wire::deth::DethRepr;
use wire::feth::FethRepr;
use wire::reth::RethRepr;
use wire::Opcode;

use crate::dma;
use crate::engine::{flushed_send_wc, set_cause, Ctx};
use crate::mem::Memory;
use crate::qp::{Qp, WqeState};
use crate::qp_attr::{QpState, QpType};
use crate::time::Instant;
use crate::tx::{self, Headers, Route};
use crate::wr::{SendFlags, SendOp, WcStatus, WorkCompletion};
use crate::{AsyncEventKind, EventObject};

/// Kernel `RXE_MAX_UNACKED_PSNS`: the requester stops when this many PSNs
/// are outstanding.
pub(crate) const MAX_UNACKED_PSNS: i32 = 128;
/// Kernel `RXE_MAX_PKT_PER_ACK`: a long message asks for an ACK this often.
pub(crate) const MAX_PKT_PER_ACK: u32 = 64;

/// The opcode for one packet of a SEND or WRITE (RC numbering; UC adds 0x20).
fn data_opcode(op: &SendOp, first: bool, last: bool) -> Opcode {
    use SendOp::*;
    match (op, first, last) {
        (Send | SendWithImm { .. } | SendWithInv { .. }, true, false) => Opcode::RC_SEND_FIRST,
        (Send | SendWithImm { .. } | SendWithInv { .. }, false, false) => Opcode::RC_SEND_MIDDLE,
        (Send, false, true) => Opcode::RC_SEND_LAST,
        (Send, true, true) => Opcode::RC_SEND_ONLY,
        (SendWithImm { .. }, false, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        (SendWithImm { .. }, true, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
        (SendWithInv { .. }, false, true) => Opcode::RC_SEND_LAST_WITH_INVALIDATE,
        (SendWithInv { .. }, true, true) => Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
        (_, true, false) => Opcode::RC_RDMA_WRITE_FIRST,
        (_, false, false) => Opcode::RC_RDMA_WRITE_MIDDLE,
        (RdmaWriteWithImm { .. }, false, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        (RdmaWriteWithImm { .. }, true, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        (_, false, true) => Opcode::RC_RDMA_WRITE_LAST,
        (_, true, true) => Opcode::RC_RDMA_WRITE_ONLY,
    }
}

/// Run the requester until it has nothing more it may send now.
pub(crate) fn run<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant) {
    while qp.can_send() && qp.rnr_deadline.is_none() {
        let idx = qp.req_idx;
        let Some(w) = qp.sq.get(idx) else { break };
        match w.state {
            WqeState::Done | WqeState::Pending => {
                qp.req_idx += 1;
                continue;
            }
            WqeState::Error => break,
            WqeState::Posted | WqeState::Processing => {}
        }
        if !w.started {
            // SQD: finish what was started, start nothing new (IBTA 10.3.1 SQD).
            if qp.state == QpState::Sqd {
                break;
            }
            // IBTA 10.8.3.3 / kernel req_next_wqe: a fenced WR waits until every
            // earlier WR has completed.
            if w.wr.flags.contains(SendFlags::FENCE) && idx > 0 {
                break;
            }
            if w.wr.op.is_local() {
                exec_local(qp, ctx, idx);
                if qp.sq.get(idx).is_some_and(|w| w.state == WqeState::Error) {
                    // Reported in order when it reaches the head.
                    complete_from_head(qp, ctx);
                    break;
                }
                qp.req_idx += 1;
                complete_from_head(qp, ctx);
                continue;
            }
            if qp.qp_type.is_reliable() && w.wr.op.needs_rd_atomic() {
                if qp.attr.max_rd_atomic == 0 {
                    // Kernel rxe would wait forever here; we fail the WR instead
                    // so that the application sees why nothing happens.
                    fail_wqe(
                        qp,
                        idx,
                        WcStatus::LocQpOpErr,
                        format!(
                            "{} needs max_rd_atomic > 0, but the QP was moved to RTS with max_rd_atomic = 0",
                            w.wr.op.name()
                        ),
                    );
                    complete_from_head(qp, ctx);
                    break;
                }
                if !qp.rd_atomic_room() {
                    break;
                }
            }
        }
        if qp.qp_type.is_reliable() && qp.req_psn.diff(qp.comp_psn) >= MAX_UNACKED_PSNS {
            break;
        }
        // A ConnectX-like device sends only as fast as the QP's DCQCN
        // rate allows (crate::cc); the pacer's deadline brings it back.
        if !crate::cc::may_send(qp, ctx, now) {
            break;
        }
        let queued = ctx.out.len();
        let ok = send_one(qp, ctx, idx, now);
        crate::cc::sent(qp, ctx, queued);
        if !ok {
            complete_from_head(qp, ctx);
            break;
        }
    }
}

/// Mark a WQE as failed; it completes with `status` when it reaches the head.
fn fail_wqe(qp: &mut Qp, idx: usize, status: WcStatus, why: String) {
    if let Some(w) = qp.sq.get_mut(idx) {
        w.state = WqeState::Error;
        w.status = status;
        w.error_reason = Some(why);
    }
}

/// Execute LOCAL_INV or BIND_MW (kernel `rxe_do_local_ops`).
fn exec_local<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, idx: usize) {
    let (qpn, pd) = (qp.qpn, qp.pd);
    let Some(w) = qp.sq.get_mut(idx) else { return };
    w.started = true;
    let res = match w.wr.op {
        SendOp::LocalInv { rkey } => ctx
            .keys
            .invalidate(rkey, qpn, pd)
            .map_err(|e| (WcStatus::LocQpOpErr, format!("LOCAL_INV failed: {e}"))),
        SendOp::BindMw {
            mw_rkey,
            new_key,
            bind,
        } => {
            let ty2 = ctx
                .keys
                .mw(mw_rkey)
                .map(|m| m.mw_type == crate::mr::MwType::Type2);
            match ty2 {
                Some(true) => ctx
                    .keys
                    .bind_mw(mw_rkey, new_key, pd, Some(qpn), &bind)
                    .map(|_| ())
                    .map_err(|e| (WcStatus::MwBindErr, format!("BIND_MW failed: {}", e.0))),
                // Type 1: `ibv_bind_mw` posts it as a work request, as
                // the rxe provider does; any QP of the PD may use the window.
                Some(false) => ctx
                    .keys
                    .bind_mw(mw_rkey, new_key, pd, None, &bind)
                    .map(|_| ())
                    .map_err(|e| (WcStatus::MwBindErr, format!("BIND_MW failed: {}", e.0))),
                None => Err((
                    WcStatus::MwBindErr,
                    format!("BIND_MW failed: rkey {mw_rkey:#x} names no memory window"),
                )),
            }
        }
        _ => Ok(()),
    };
    match res {
        Ok(()) => w.state = WqeState::Done,
        Err((status, why)) => {
            w.state = WqeState::Error;
            w.status = status;
            w.error_reason = Some(why);
        }
    }
}

/// The READ request just built for WQE `idx` (if it is one) says where
/// its responses go ([`crate::Engine::hint_reads`]): the rest of the READ,
/// if it lies in one SGE of an MR the QP may write (the checks the
/// completer's `scatter` makes; anything else gets no hint, and its
/// responses are handled as ever).
fn read_dest<M: Memory>(qp: &Qp, ctx: &mut Ctx<M>, idx: usize, mtu: u32) {
    let Some(w) = qp.sq.get(idx) else { return };
    if !matches!(w.wr.op, SendOp::RdmaRead { .. }) || w.offset >= w.length {
        return;
    }
    let rest = w.length - w.offset;
    // Responses too short to be left in memory by the responder's engine
    // ([`tx::may_gather`]) are not placed: no hint, which costs the
    // request a lookup and its record 48 bytes (ib_read_lat).
    if !tx::may_gather(ctx, rest.min(mtu) as usize) {
        return;
    }
    let write = crate::AccessFlags::LOCAL_WRITE;
    let at = dma::one_range(
        &ctx.keys,
        qp.pd,
        &w.wr.sg_list,
        u64::from(w.offset),
        rest as usize,
        write,
    );
    if let (Ok(Some(host)), Some(t)) = (at, ctx.out.back_mut()) {
        t.read_dest = Some(crate::ReadDest {
            host,
            len: u64::from(rest),
            mtu,
        });
    }
}

/// Send the next packet of WQE `idx`. Returns false if the WQE failed.
fn send_one<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, idx: usize, now: Instant) -> bool {
    let mtu = if qp.qp_type == QpType::Ud {
        ctx.cfg.port_mtu.bytes()
    } else {
        qp.mtu
    };
    let qp_type = qp.qp_type;
    let (pd, qpn, src_port) = (qp.pd, qp.qpn, qp.src_port);
    let req_psn = qp.req_psn;
    let Some(w) = qp.sq.get_mut(idx) else {
        return true;
    };
    if !w.started {
        w.started = true;
        w.first_psn = req_psn;
        w.last_psn = req_psn.add(w.npsn(mtu) - 1);
    }
    let mig_req = crate::model::bth_mig_req(ctx.cfg.cc.model, qp_type, qp.attr.path_mig_state);
    let route = match (w.ud, qp.path) {
        (Some(u), _) => Route {
            src: u.src,
            dst: u.dst,
            src_port: u.src_port,
            xrc: false,
            mig_req,
        },
        (None, Some((src, dst))) => Route {
            src,
            dst,
            src_port,
            xrc: qp.qp_type.is_xrc(),
            mig_req,
        },
        (None, None) => {
            fail_wqe(
                qp,
                idx,
                WcStatus::LocQpOpErr,
                "the QP has no path (IBV_QP_AV was never set)".into(),
            );
            return false;
        }
    };
    let psn = req_psn;
    let length = w.length;
    let offset = w.offset;
    let mut h;
    let mut payload_len = 0usize;
    let mut npsn = 1u32;
    let mut last = true;
    match w.wr.op {
        SendOp::RdmaRead { remote_addr, rkey } => {
            // A READ resumed after partial responses asks only for the rest
            // (kernel req_retry + IBTA 9.7.4.1.5).
            let rest = length - offset;
            h = Headers::new(Opcode::RC_RDMA_READ_REQUEST, qp.attr.dest_qp_num, psn);
            h.reth = Some(RethRepr {
                va: remote_addr.wrapping_add(u64::from(offset)),
                rkey,
                dma_len: rest,
            });
            npsn = rest.div_ceil(mtu).max(1);
        }
        SendOp::AtomicCmpSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            h = Headers::new(Opcode::RC_COMPARE_SWAP, qp.attr.dest_qp_num, psn);
            h.atomic = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            });
        }
        SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            h = Headers::new(Opcode::RC_FETCH_ADD, qp.attr.dest_qp_num, psn);
            h.atomic = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
        }
        SendOp::AtomicWrite { remote_addr, rkey } => {
            // Kernel rxe_req.c: one RC_ATOMIC_WRITE packet, a RETH for the
            // whole 8 bytes, the 8 bytes as payload (finish_packet copies
            // `wqe->dma.atomic_wr`), AckReq as the last packet of its
            // message, never SE.
            h = Headers::new(Opcode::RC_ATOMIC_WRITE, qp.attr.dest_qp_num, psn);
            h.reth = Some(RethRepr {
                va: remote_addr,
                rkey,
                dma_len: length,
            });
            payload_len = length as usize;
        }
        SendOp::Flush {
            remote_addr,
            rkey,
            length,
            placement,
            selectivity,
        } => {
            // Kernel rxe_req.c: one RC_FLUSH packet (next_opcode_rc), FETH
            // then RETH (rkey `wr.flush.rkey`, va `wqe->iova`, length
            // `wqe->dma.resid`), no payload (finish_packet, oA19-2), AckReq
            // as the last packet of its message. A retransmission carries
            // the same RETH (kernel req_retry recomputes `wqe->iova` only
            // for READ/WRITE/atomics and so resends a FLUSH with VA 0; see
            // README's deviations).
            h = Headers::new(Opcode::RC_FLUSH, qp.attr.dest_qp_num, psn);
            h.feth = Some(FethRepr {
                placement,
                selectivity,
            });
            h.reth = Some(RethRepr {
                va: remote_addr,
                rkey,
                dma_len: length,
            });
        }
        ref op => {
            if qp_type == QpType::Ud {
                let Some(u) = w.ud else {
                    fail_wqe(
                        qp,
                        idx,
                        WcStatus::LocQpOpErr,
                        "UD send without destination".into(),
                    );
                    return false;
                };
                if length > mtu {
                    // IBTA C10-93.1.1 (kernel rxe_req.c): a UD message longer
                    // than the MTU is not sent and no error is reported.
                    w.state = WqeState::Done;
                    qp.req_psn = psn.next();
                    qp.req_idx += 1;
                    complete_from_head(qp, ctx);
                    return true;
                }
                let opcode = if matches!(op, SendOp::SendWithImm { .. }) {
                    Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                } else {
                    Opcode::UD_SEND_ONLY
                };
                h = Headers::new(opcode, u.qpn, psn);
                h.deth = Some(DethRepr {
                    qkey: u.qkey,
                    src_qpn: qpn,
                });
                payload_len = length as usize;
            } else {
                let first = offset == 0;
                payload_len = (length - offset).min(mtu) as usize;
                last = offset + payload_len as u32 >= length;
                let mut opcode = data_opcode(op, first, last);
                if qp_type == QpType::Uc {
                    opcode = Opcode(opcode.0 | 0x20);
                }
                h = Headers::new(opcode, qp.attr.dest_qp_num, psn);
                if first {
                    if let SendOp::RdmaWrite { remote_addr, rkey }
                    | SendOp::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } = *op
                    {
                        h.reth = Some(RethRepr {
                            va: remote_addr,
                            rkey,
                            dma_len: length,
                        });
                    }
                }
            }
            if last {
                match *op {
                    SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => {
                        h.immdt = Some(imm)
                    }
                    SendOp::SendWithInv { rkey } => h.ieth = Some(rkey),
                    _ => {}
                }
                // Kernel: SE on the last packet of a SEND or a WRITE with immediate.
                h.solicited = w.wr.flags.contains(SendFlags::SOLICITED)
                    && !matches!(op, SendOp::RdmaWrite { .. });
            }
        }
    }
    h.xrc_srqn = w.wr.xrc_remote_srqn;
    // AckReq: RC only (the captures show none on UC/UD), on the last packet
    // of a message and on every 65th packet in between (kernel noack_pkts).
    if qp_type.is_reliable() {
        h.ack_req = last || {
            let n = qp.noack_pkts;
            qp.noack_pkts += 1;
            n > MAX_PKT_PER_ACK
        };
        if h.ack_req {
            qp.noack_pkts = 0;
        }
    }
    let w = &qp.sq[idx];
    let sges = &w.wr.sg_list;
    let inline = w.inline.as_deref();
    let res = tx::emit(ctx, route, &h, payload_len, |ctx, buf| match inline {
        Some(data) => {
            let o = offset as usize;
            buf.copy_from_slice(&data[o..o + buf.len()]);
            Ok(None)
        }
        None => {
            let off = u64::from(offset);
            if tx::may_gather(ctx, buf.len()) {
                // One range of one MR, checked once: copied by the driver
                // if it can read it, or here.
                let none = crate::AccessFlags::empty();
                if let Some(addr) = dma::one_range(&ctx.keys, pd, sges, off, buf.len(), none)? {
                    if tx::gathers(ctx, addr, buf.len()) {
                        return Ok(Some(addr));
                    }
                    return ctx
                        .mem
                        .read(addr, buf)
                        .map(|()| None)
                        .map_err(|e| e.to_string());
                }
            }
            dma::gather(&ctx.mem, &ctx.keys, pd, sges, off, buf).map(|()| None)
        }
    });
    if res.is_ok() && ctx.hint_reads && qp_type == QpType::Rc {
        read_dest(qp, ctx, idx, mtu);
    }
    if res.is_ok() {
        qp.counters.sent_pkts += 1;
        if psn.is_after_or_eq(qp.fresh_psn) {
            let last_posted = idx + 1 == qp.sq.len();
            if let Some(t) = ctx.out.back_mut() {
                t.fresh = true;
                t.last_posted = last_posted;
            }
            qp.fresh_psn = psn.add(npsn);
        }
    }
    if let Err(e) = res {
        let why = match e {
            tx::EmitError::Fill(m) => m,
            tx::EmitError::Build(b) => {
                count!(ctx, qp, send_err);
                format!("packet could not be built: {b}")
            }
        };
        fail_wqe(qp, idx, WcStatus::LocProtErr, why);
        return false;
    }
    qp.req_psn = psn.add(npsn);
    if qp_type.is_reliable() && qp.retrans_deadline.is_none() {
        if let Some(t) = qp.retrans_timeout_ns() {
            qp.retrans_deadline = Some(now + std::time::Duration::from_nanos(t));
        }
    }
    let w = &mut qp.sq[idx];
    w.offset = offset + payload_len as u32;
    if matches!(w.wr.op, SendOp::RdmaRead { .. }) || w.wr.op.is_single_packet() {
        w.offset = length;
    }
    if !last {
        w.state = WqeState::Processing;
        return true;
    }
    qp.req_idx += 1;
    if qp_type.is_reliable() {
        w.state = WqeState::Pending;
    } else {
        // UC and UD need no acknowledgement: done once sent (kernel rxe_xmit_packet).
        w.state = WqeState::Done;
        complete_from_head(qp, ctx);
    }
    true
}

/// Go back to the oldest unacknowledged PSN (kernel `req_retry`): WQEs that
/// were sent become Posted again, the first one resuming where the
/// acknowledgements stopped.
pub(crate) fn rewind(qp: &mut Qp) {
    let mtu = qp.mtu;
    let comp = qp.comp_psn;
    qp.req_psn = comp;
    qp.req_idx = 0;
    qp.noack_pkts = 0;
    qp.comp_opcode = None;
    for w in qp.sq.iter_mut() {
        match w.state {
            WqeState::Posted if !w.started => break,
            WqeState::Done | WqeState::Error => continue,
            _ => {}
        }
        let npsn = w.npsn(mtu) as i32;
        let acked = comp.diff(w.first_psn).clamp(0, npsn) as u32;
        w.offset = if w.wr.op.is_single_packet() {
            0
        } else {
            (acked * mtu).min(w.length)
        };
        w.state = WqeState::Posted;
    }
}

/// Complete WQEs at the head of the send queue that are done or failed, in
/// posting order (IBTA 10.8.5: completions are returned in order).
///
/// `rdma_sends` counts SEND WQEs completed here, with success or error,
/// as kernel rxe's completer does (`do_complete` in `rxe_comp.c`, on every
/// QP type); flushed WQEs do not count.
pub(crate) fn complete_from_head<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    while let Some(w) = qp.sq.front() {
        if matches!(w.state, WqeState::Done | WqeState::Error)
            && matches!(
                w.wr.op,
                SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }
            )
        {
            count!(ctx, qp, rdma_sends);
        }
        match w.state {
            WqeState::Done => {
                let Some(w) = qp.sq.pop_front() else { break };
                qp.req_idx = qp.req_idx.saturating_sub(1);
                if w.signaled {
                    let mut wc = WorkCompletion::new(
                        w.wr.wr_id,
                        WcStatus::Success,
                        w.wr.op.wc_opcode(),
                        qp.qpn,
                    );
                    wc.byte_len = w.length;
                    ctx.post_cq(qp.send_cq, wc, false);
                }
            }
            WqeState::Error => {
                let Some(w) = qp.sq.pop_front() else { break };
                qp.req_idx = qp.req_idx.saturating_sub(1);
                // IBTA 10.7.3.1: an error completion is generated even for an
                // unsignalled WR.
                let wc = WorkCompletion::new(w.wr.wr_id, w.status, w.wr.op.wc_opcode(), qp.qpn);
                ctx.post_cq(qp.send_cq, wc, false);
                let why = format!(
                    "{} (wr_id {}) completed with {}: {}",
                    w.wr.op.name(),
                    w.wr.wr_id,
                    w.status,
                    w.error_reason.as_deref().unwrap_or("no further detail")
                );
                if qp.qp_type.is_reliable() {
                    enter_error(qp, ctx, Some(why));
                } else {
                    // IBTA 10.3.1: on UC and UD a send-side error moves the QP
                    // to SQE; the receive side keeps working. (Kernel rxe
                    // moves it to ERR; we follow the spec.)
                    set_cause(qp, why);
                    qp.state = QpState::Sqe;
                    qp.attr.qp_state = Some(QpState::Sqe);
                    flush_send_queue(qp, ctx);
                }
                return;
            }
            _ => break,
        }
    }
    check_drained(qp, ctx);
}

/// Flush every WR of the send queue with WR_FLUSH_ERR, in order.
pub(crate) fn flush_send_queue<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    while let Some(w) = qp.sq.pop_front() {
        let wc = flushed_send_wc(qp, &w);
        ctx.post_cq(qp.send_cq, wc, false);
    }
    qp.req_idx = 0;
    qp.retrans_deadline = None;
    qp.rnr_deadline = None;
}

/// Move the QP to ERR: record why, stop the timers, flush both queues
/// (IBTA 10.3.1, 11.4.2.1).
pub(crate) fn enter_error<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, why: Option<String>) {
    let flushed = qp.sq.len() + qp.rq.len();
    if let Some(w) = why {
        ctx.note(|| {
            format!(
                "QP {:#x} {:?} -> ERR: {w}; {flushed} WRs flushed",
                qp.qpn, qp.state
            )
        });
        set_cause(qp, w);
    }
    qp.state = QpState::Err;
    qp.attr.qp_state = Some(QpState::Err);
    ctx.qp_errors += 1;
    qp.sq_draining = false;
    // The responder stops: no more READ responses, no waiting requests.
    qp.read_reply = None;
    qp.deferred.clear();
    flush_send_queue(qp, ctx);
    crate::resp::flush_recv_queue(qp, ctx);
    if qp.srq.is_some() {
        // IBTA 11.6.3: the QP will take no more WQEs from the SRQ.
        ctx.event(
            AsyncEventKind::QpLastWqeReached,
            EventObject::Qp(qp.qpn),
            format!(
                "QP {:#x} entered the error state and will take no more receives from its SRQ",
                qp.qpn
            ),
        );
    }
}

/// SQD: raise SQ_DRAINED once no message is in flight (kernel raises it
/// whether or not `en_sqd_async_notify` was set; so do we).
pub(crate) fn check_drained<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    if qp.state != QpState::Sqd || !qp.sq_draining {
        return;
    }
    let busy = qp.sq.iter().any(|w| {
        w.started
            && matches!(
                w.state,
                WqeState::Processing | WqeState::Pending | WqeState::Posted
            )
    });
    if !busy && !qp.has_outstanding() {
        qp.sq_draining = false;
        ctx.event(
            AsyncEventKind::SqDrained,
            EventObject::Qp(qp.qpn),
            format!(
                "QP {:#x}: every message started before SQD is acknowledged",
                qp.qpn
            ),
        );
    }
}

/// An AETH for an ACK or NAK carrying the current MSN.
pub(crate) fn aeth(syndrome: wire::aeth::Syndrome, msn: u32) -> AethRepr {
    AethRepr {
        syndrome,
        msn: msn & 0x00ff_ffff,
    }
}
