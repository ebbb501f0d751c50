//! The completer: consumes ACKs, NAKs, READ responses and atomic
//! acknowledgements, completes send WQEs and drives retransmission and RNR
//! back-off (kernel `rxe_comp.c`).

use crate::counters::count;
use std::time::Duration;

use wire::aeth::{NakCode, Syndrome};
use wire::{OpFlags, Opcode, PacketRepr};

use crate::dma::{self, ScatterError};
use crate::engine::Ctx;
use crate::mem::Memory;
use crate::qp::{Qp, WqeState};
use crate::qp_attr::QpState;
use crate::req;
use crate::time::Instant;
use crate::wr::{SendOp, WcStatus};

/// Handle a response-type packet (ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE, READ
/// RESPONSE *) for an RC QP.
pub(crate) fn on_response<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    pkt: &PacketRepr<'_>,
) {
    if !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        count!(ctx, qp, rcvd_ignored_resp);
        return;
    }
    process(qp, ctx, now, pkt);
    // Kernel COMPST_EXIT: while PSNs are outstanding, the timer measures time
    // since the last response; otherwise it is off.
    if qp.state == QpState::Rts || qp.state == QpState::Sqd {
        qp.retrans_deadline = match (qp.has_outstanding(), qp.retrans_timeout_ns()) {
            (true, Some(t)) if qp.rnr_deadline.is_none() => Some(now + Duration::from_nanos(t)),
            _ => None,
        };
        req::run(qp, ctx, now);
    }
}

fn process<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant, pkt: &PacketRepr<'_>) {
    let psn = pkt.bth.psn;
    let flags = pkt
        .bth
        .opcode
        .info()
        .map(|i| i.flags)
        .unwrap_or(OpFlags::empty());
    loop {
        let Some(w) = qp.sq.front() else {
            count!(ctx, qp, rcvd_ignored_resp);
            return;
        };
        if !w.started {
            count!(ctx, qp, rcvd_ignored_resp);
            return;
        }
        if matches!(w.state, WqeState::Done | WqeState::Error) {
            req::complete_from_head(qp, ctx);
            if qp.state != QpState::Rts && qp.state != QpState::Sqd {
                return;
            }
            continue;
        }
        // Kernel check_psn: a response past the oldest WQE acknowledges a
        // SEND/WRITE (and an ATOMIC WRITE, which is not in the kernel's
        // WR_ATOMIC_OR_READ_MASK) implicitly, but means lost responses for
        // READ/atomics.
        if psn.is_after(w.last_psn) {
            if w.state != WqeState::Pending {
                count!(ctx, qp, rcvd_ignored_resp);
                return;
            }
            if w.wr.op.is_read_or_atomic() {
                error_retry(qp, ctx, now, false);
                return;
            }
            qp.reset_retry_counters();
            complete_head(qp, ctx);
            continue;
        }
        let d = psn.diff(qp.comp_psn);
        if d < 0 || (d > 0 && w.wr.op.is_read_or_atomic()) {
            // Old (a duplicate) or ahead of a missing READ response: ignore;
            // the timer or a NAK recovers.
            count!(ctx, qp, rcvd_ignored_resp);
            return;
        }
        check_ack(qp, ctx, now, pkt, flags);
        return;
    }
}

/// A READ response for the FLUSH at the head (kernel check_ack lets a
/// READ response through for IB_WR_FLUSH, then `do_read`): kernel rxe's
/// responder answers a FLUSH with an empty RDMA_READ_RESPONSE_ONLY
/// carrying an ACK AETH, which completes it. Data cannot be placed (a
/// FLUSH has no local buffer: kernel copy_data fails, LOC_PROT_ERR); an
/// AETH other than ACK is a bad response; an empty response without the
/// END bit only moves the completer on (COMPST_UPDATE_COMP).
fn flush_response<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, pkt: &PacketRepr<'_>, flags: OpFlags) {
    let psn = pkt.bth.psn;
    let op = pkt.bth.opcode;
    if !pkt.payload.is_empty() {
        let why = format!(
            "{} at PSN {psn} for a FLUSH carries {} bytes; a FLUSH reads nothing",
            op.name(),
            pkt.payload.len()
        );
        fail_head(qp, ctx, WcStatus::LocProtErr, why);
        return;
    }
    if let Some(a) = pkt.aeth {
        if !matches!(a.syndrome, Syndrome::Ack { .. }) {
            let why = format!(
                "{} at PSN {psn} for a FLUSH carried AETH {}",
                op.name(),
                a.syndrome
            );
            fail_head(qp, ctx, WcStatus::BadRespErr, why);
            return;
        }
    }
    qp.reset_retry_counters();
    if flags.contains(OpFlags::END) {
        complete_head(qp, ctx);
    } else {
        qp.comp_psn = psn.next();
    }
}

/// Mark the head WQE acknowledged and complete it (kernel `complete_ack`).
fn complete_head<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>) {
    if let Some(w) = qp.sq.front_mut() {
        let next = w.last_psn.next();
        if next.is_after(qp.comp_psn) {
            qp.comp_psn = next;
        }
        w.state = WqeState::Done;
        qp.comp_opcode = None;
    }
    req::complete_from_head(qp, ctx);
}

fn fail_head<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, status: WcStatus, why: String) {
    if let Some(w) = qp.sq.front_mut() {
        w.state = WqeState::Error;
        w.status = status;
        w.error_reason = Some(why);
    }
    req::complete_from_head(qp, ctx);
}

fn check_ack<M: Memory>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    pkt: &PacketRepr<'_>,
    flags: OpFlags,
) {
    let psn = pkt.bth.psn;
    let op = pkt.bth.opcode;
    let syndrome = pkt.aeth.map(|a| a.syndrome);
    let Some(w) = qp.sq.front() else { return };
    let is_read = matches!(w.wr.op, SendOp::RdmaRead { .. });
    let is_atomic = w.wr.op.is_atomic();
    let is_atomic_write = matches!(w.wr.op, SendOp::AtomicWrite { .. });

    if flags.contains(OpFlags::READ) && !flags.contains(OpFlags::REQ) {
        // A READ response.
        if matches!(w.wr.op, SendOp::Flush { .. }) {
            flush_response(qp, ctx, pkt, flags);
            return;
        }
        if is_atomic_write && pkt.aeth.is_some() {
            // Kernel check_ack: the responder answers an ATOMIC WRITE with a
            // READ response (RDMA_READ_RESPONSE_ONLY, no payload); one with
            // an AETH that acknowledges is taken like an ACK of a WRITE
            // (COMPST_WRITE_SEND).
            if !matches!(syndrome, Some(Syndrome::Ack { .. })) {
                fail_head(
                    qp,
                    ctx,
                    WcStatus::BadRespErr,
                    format!(
                        "{} at PSN {psn} for an ATOMIC_WRITE carried AETH {}",
                        op.name(),
                        pkt.aeth.map(|a| a.syndrome.to_string()).unwrap_or_default()
                    ),
                );
                return;
            }
            let complete = w.state == WqeState::Pending && psn == w.last_psn;
            qp.reset_retry_counters();
            if complete {
                complete_head(qp, ctx);
            } else {
                qp.comp_psn = psn.next();
            }
            return;
        }
        if !is_read {
            // Kernel check_ack: a READ response for anything else is fatal.
            fail_head(
                qp,
                ctx,
                WcStatus::FatalErr,
                format!(
                    "received {} at PSN {psn} but the oldest WR is {}",
                    op.name(),
                    w.wr.op.name()
                ),
            );
            return;
        }
        if let Some(s) = syndrome {
            if !matches!(s, Syndrome::Ack { .. }) {
                fail_head(
                    qp,
                    ctx,
                    WcStatus::BadRespErr,
                    format!("{} carried AETH {s}", op.name()),
                );
                return;
            }
        }
        let mtu = qp.mtu;
        let k = psn.diff(w.first_psn) as u32;
        let offset = k.saturating_mul(mtu);
        let remaining = w.length.saturating_sub(offset);
        let (first, last) = (flags.contains(OpFlags::START), flags.contains(OpFlags::END));
        // The response sequence is determined by the PSN: FIRST/ONLY at the
        // READ's first PSN, MIDDLE/LAST after (a resumed READ is answered with
        // MIDDLE/LAST, kernel read_reply).
        let seq_ok = (first == (k == 0)) && (last == (remaining <= mtu));
        let expected_len = if last { remaining } else { mtu };
        if !seq_ok || pkt.payload.len() as u32 != expected_len {
            fail_head(
                qp,
                ctx,
                WcStatus::BadRespErr,
                format!(
                    "{} at PSN {psn} with {} bytes does not fit a READ of {} bytes at offset {offset} (path MTU {mtu})",
                    op.name(),
                    pkt.payload.len(),
                    w.length
                ),
            );
            return;
        }
        let pd = qp.pd;
        let sges = &w.wr.sg_list;
        match dma::scatter(
            &mut ctx.mem,
            &ctx.keys,
            pd,
            sges,
            u64::from(offset),
            pkt.payload,
        ) {
            Ok(()) => {}
            Err(ScatterError::TooLong) => {
                fail_head(
                    qp,
                    ctx,
                    WcStatus::LocLenErr,
                    "READ response does not fit the local SGEs".into(),
                );
                return;
            }
            Err(ScatterError::Protection(m)) => {
                fail_head(
                    qp,
                    ctx,
                    WcStatus::LocProtErr,
                    format!("READ response could not be placed: {m}"),
                );
                return;
            }
        }
        qp.reset_retry_counters();
        qp.comp_opcode = Some(op);
        qp.comp_psn = psn.next();
        if last {
            complete_head(qp, ctx);
        }
        return;
    }

    if op == Opcode::RC_ATOMIC_ACKNOWLEDGE {
        if !is_atomic || !matches!(syndrome, Some(Syndrome::Ack { .. })) {
            fail_head(
                qp,
                ctx,
                WcStatus::BadRespErr,
                format!(
                    "unexpected ATOMIC_ACKNOWLEDGE at PSN {psn} for {}",
                    w.wr.op.name()
                ),
            );
            return;
        }
        let orig = pkt.atomic_ack.map(|a| a.orig).unwrap_or(0);
        let pd = qp.pd;
        let sges = &w.wr.sg_list;
        if let Err(e) = dma::scatter(&mut ctx.mem, &ctx.keys, pd, sges, 0, &orig.to_ne_bytes()) {
            let m = match e {
                ScatterError::TooLong => "the local buffer is shorter than 8 bytes".to_string(),
                ScatterError::Protection(m) => m,
            };
            fail_head(
                qp,
                ctx,
                WcStatus::LocProtErr,
                format!("atomic result could not be placed: {m}"),
            );
            return;
        }
        qp.reset_retry_counters();
        complete_head(qp, ctx);
        return;
    }

    if op != Opcode::RC_ACKNOWLEDGE {
        count!(ctx, qp, rcvd_ignored_resp);
        return;
    }
    match syndrome {
        Some(Syndrome::Ack { .. }) => {
            if is_read || is_atomic {
                // A plain ACK inside a READ/atomic's PSNs answers nothing.
                // (One for an ATOMIC WRITE acknowledges it, as in the
                // kernel's check_ack.)
                count!(ctx, qp, rcvd_ignored_resp);
                return;
            }
            let complete = w.state == WqeState::Pending && psn == w.last_psn;
            qp.reset_retry_counters();
            if complete {
                complete_head(qp, ctx);
            } else {
                qp.comp_psn = psn.next();
            }
        }
        Some(Syndrome::RnrNak { timer }) => {
            count!(ctx, qp, rcvd_rnr_err);
            if psn.is_after(qp.comp_psn) {
                qp.comp_psn = psn;
            }
            if qp.rnr_retry == 0 {
                count!(ctx, qp, retry_rnr_exceeded_err);
                let why = format!(
                    "the responder answered PSN {psn} with RNR NAK (no receive WQE posted) more times than rnr_retry = {} allows",
                    qp.attr.rnr_retry
                );
                fail_head(qp, ctx, WcStatus::RnrRetryExcErr, why);
                return;
            }
            if qp.rnr_retry != 7 {
                qp.rnr_retry -= 1;
            }
            let wait_ns = wire::aeth::rnr_timer_ns(timer);
            ctx.note(|| {
                format!(
                    "QP {:#x}: RNR NAK for psn {psn}: the responder has no receive posted; resending in {:.2} ms (timer code {timer}), {}",
                    qp.qpn,
                    wait_ns as f64 / 1e6,
                    retries_left(qp.rnr_retry, "RNR retries")
                )
            });
            // Wait the timer the responder asked for, then go back to PSN
            // (kernel rnr_nak_timer -> req_retry).
            qp.rnr_deadline = Some(now + Duration::from_nanos(wait_ns));
            qp.retrans_deadline = None;
        }
        Some(Syndrome::Nak(code)) => match code {
            NakCode::PsnSequenceError => {
                if psn.is_after(qp.comp_psn) {
                    count!(ctx, qp, rcvd_seq_err);
                    qp.comp_psn = psn;
                }
                error_retry(qp, ctx, now, false);
            }
            NakCode::InvalidRequest => fail_head(
                qp,
                ctx,
                WcStatus::RemInvReqErr,
                format!("the responder NAKed PSN {psn} as an invalid request (unsupported opcode, bad length or misaligned atomic)"),
            ),
            NakCode::RemoteAccessError => fail_head(
                qp,
                ctx,
                WcStatus::RemAccessErr,
                format!("the responder NAKed PSN {psn} with a remote access error (bad rkey, out-of-bounds address or missing access flag)"),
            ),
            NakCode::RemoteOperationalError => fail_head(
                qp,
                ctx,
                WcStatus::RemOpErr,
                format!("the responder NAKed PSN {psn} with a remote operational error (it could not place the data)"),
            ),
            other => fail_head(qp, ctx, WcStatus::RemOpErr, format!("the responder sent unexpected NAK {other:?} for PSN {psn}")),
        },
        Some(s @ Syndrome::Reserved(_)) => {
            fail_head(qp, ctx, WcStatus::BadRespErr, format!("ACK with reserved syndrome {s}"))
        }
        None => fail_head(qp, ctx, WcStatus::BadRespErr, "ACK without AETH".into()),
    }
}

/// Kernel COMPST_ERROR_RETRY: go back N if the retry budget allows.
fn error_retry<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant, timeout: bool) {
    let Some(w) = qp.sq.front() else { return };
    if !w.started {
        return;
    }
    // One retry per NAK burst; a timeout always retries.
    if qp.started_retry && !timeout {
        return;
    }
    if qp.retry_cnt == 0 {
        count!(ctx, qp, retry_exceeded_err);
        let why = format!(
            "no valid response for PSN {} after {} retransmission(s) (retry_cnt = {}, timeout = {} -> {:.3} ms each)",
            qp.comp_psn,
            qp.attr.retry_cnt,
            qp.attr.retry_cnt,
            qp.attr.timeout,
            qp.retrans_timeout_ns().unwrap_or(0) as f64 / 1e6
        );
        fail_head(qp, ctx, WcStatus::RetryExcErr, why);
        return;
    }
    if qp.retry_cnt != 7 {
        qp.retry_cnt -= 1;
    }
    if qp.has_outstanding() {
        ctx.note(|| {
            let cause = if timeout {
                format!(
                    "no ACK for psn {} within {:.3} ms (timeout {})",
                    qp.comp_psn,
                    qp.retrans_timeout_ns().unwrap_or(0) as f64 / 1e6,
                    qp.attr.timeout
                )
            } else {
                format!(
                    "NAK (PSN sequence error) at psn {}: the responder missed packets",
                    qp.comp_psn
                )
            };
            format!(
                "QP {:#x}: {cause}; resending from psn {}, {}",
                qp.qpn,
                qp.comp_psn,
                retries_left(qp.retry_cnt, "retries")
            )
        });
        count!(ctx, qp, completer_retry_err);
        qp.started_retry = true;
        req::rewind(qp);
        qp.retrans_deadline = None;
        req::run(qp, ctx, now);
    }
}

/// "3 retries left", or that a count of 7 retries forever (IBTA 9.7.5.2.8).
fn retries_left(n: u8, what: &str) -> String {
    match n {
        7 => format!("{what} without limit (7 = forever)"),
        n => format!("{n} {what} left"),
    }
}

/// A deadline of this QP passed.
pub(crate) fn on_timeout<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant) {
    if qp.rnr_deadline.is_some_and(|d| d <= now) {
        qp.rnr_deadline = None;
        if matches!(qp.state, QpState::Rts | QpState::Sqd) {
            req::rewind(qp);
            req::run(qp, ctx, now);
        }
    }
    if qp.retrans_deadline.is_some_and(|d| d <= now) {
        qp.retrans_deadline = None;
        if matches!(qp.state, QpState::Rts | QpState::Sqd) && qp.has_outstanding() {
            count!(ctx, qp, retrans_timeouts);
            error_retry(qp, ctx, now, true);
            if qp.retrans_deadline.is_none()
                && qp.has_outstanding()
                && matches!(qp.state, QpState::Rts | QpState::Sqd)
            {
                if let Some(t) = qp.retrans_timeout_ns() {
                    qp.retrans_deadline = Some(now + Duration::from_nanos(t));
                }
            }
        }
    }
}
