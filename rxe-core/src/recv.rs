//! The receive path: validate a datagram and route it to the responder or
//! the completer of its QP (kernel `rxe_recv.c`). Every rejected packet is
//! counted and dropped; nothing here can panic on hostile input.

use wire::{OpFlags, PacketRepr, Transport};

use crate::engine::{Engine, RxDatagram};
use crate::mem::Memory;
use crate::qp_attr::QpType;
use crate::time::Instant;

use crate::mcast::MULTICAST_QPN;

/// Returns the QPN of the QP the packet was handed to, if any.
pub(crate) fn handle<M: Memory>(
    eng: &mut Engine<M>,
    now: Instant,
    dg: &RxDatagram<'_>,
    check_icrc: bool,
) -> Option<u32> {
    let ctx = &mut eng.ctx;
    // ICRC first (kernel rxe_icrc_check), over the headers as sent; a
    // datagram the driver vouches for still needs room for one.
    let icrc_ok = match (dg.ipv4_id, dg.src) {
        _ if !check_icrc => dg.payload.len() >= wire::ICRC_LEN,
        (Some(id), _) => wire::icrc::check(&info(dg, id), dg.payload),
        (None, std::net::IpAddr::V6(_)) => wire::icrc::check(&info(dg, 0), dg.payload),
        (None, std::net::IpAddr::V4(_)) => {
            wire::icrc::solve_ipv4_id(&info(dg, 0), dg.payload).is_some()
        }
    };
    if !icrc_ok {
        ctx.counters.rcvd_icrc_err += 1;
        return None;
    }
    if wire::cnp::is_cnp(dg.payload) {
        return crate::cc::on_cnp(eng, now, dg);
    }
    let pkt = match PacketRepr::parse(dg.payload) {
        Ok(p) => p,
        Err(_) => {
            ctx.counters.rcvd_malformed += 1;
            return None;
        }
    };
    let bth = pkt.bth;
    // FLUSH and ATOMIC WRITE are opcodes kernel rxe learnt in 6.2; a
    // 6.1-like device does not know them (RxeRelease::has_flush_and_atomic_write).
    if !ctx.cfg.release.has_flush_and_atomic_write()
        && matches!(
            bth.opcode,
            wire::Opcode::RC_FLUSH | wire::Opcode::RC_ATOMIC_WRITE
        )
    {
        ctx.counters.rcvd_malformed += 1;
        return None;
    }
    // P_Key: the table has only the default key; accept full or limited
    // membership of it (kernel pkey_match_default).
    if bth.pkey & 0x7fff != 0x7fff {
        ctx.counters.rcvd_bad_path += 1;
        return None;
    }
    let qpn = bth.dest_qpn;
    if qpn == MULTICAST_QPN {
        deliver_multicast(eng, &pkt, dg);
        return None;
    }
    if qpn == 0 {
        ctx.counters.rcvd_bad_qp += 1;
        return None;
    }
    let Some(qp) = eng.qps.get_mut(&qpn) else {
        ctx.counters.rcvd_bad_qp += 1;
        return None;
    };
    let transport_ok = matches!(
        (bth.opcode.transport(), qp.qp_type),
        (Transport::Rc, QpType::Rc)
            | (Transport::Uc, QpType::Uc)
            | (Transport::Ud, QpType::Ud)
            | (Transport::Xrc, QpType::XrcSend | QpType::XrcRecv)
    );
    // An XRC initiator takes only responses, a target only requests.
    let is_req = bth
        .opcode
        .info()
        .is_some_and(|i| i.flags.contains(OpFlags::REQ));
    let xrc_role_ok = match qp.qp_type {
        QpType::XrcSend => !is_req,
        QpType::XrcRecv => is_req,
        _ => true,
    };
    if !transport_ok || !xrc_role_ok || !qp.can_receive() {
        ctx.counters.rcvd_bad_qp += 1;
        return None;
    }
    // Connected QPs accept packets only from their peer (kernel check_addr).
    if qp.qp_type != QpType::Ud {
        match qp.path {
            Some((local, remote)) if remote == dg.src && local == dg.dst => {}
            _ => {
                ctx.counters.rcvd_bad_path += 1;
                return None;
            }
        }
    }
    // Counted only now, as kernel rxe_rcv counts RXE_CNT_RCVD_PKTS after
    // hdr_check (P_Key, QPN, QP type and state, peer address) and the
    // ICRC: a packet to a QP in ERR, or to no QP, is not "received".
    ctx.counters.rcvd_pkts += 1;
    qp.counters.rcvd_pkts += 1;
    if dg.ecn == wire::Ecn::Ce && ctx.cfg.cc.model == crate::cc::CcModel::Mlx5Like {
        crate::cc::notification_point(qp, ctx, now, &pkt, dg);
    }
    if is_req && (qp.read_reply.is_some() || !qp.deferred.is_empty()) {
        // Requests wait until the READ reply under way is sent.
        crate::resp::defer_request(qp, ctx, dg);
    } else if is_req {
        crate::resp::on_request(qp, ctx, &pkt, dg);
    } else if qp.qp_type == QpType::Rc {
        crate::comp::on_response(qp, ctx, now, &pkt);
    } else if qp.qp_type == QpType::XrcSend {
        // The completer knows RC's opcodes; XRC responses are their twins.
        let mut rc = pkt.clone();
        rc.bth.opcode = pkt.bth.opcode.xrc_to_rc().unwrap_or(pkt.bth.opcode);
        crate::comp::on_response(qp, ctx, now, &rc);
    } else {
        ctx.counters.rcvd_bad_qp += 1;
        qp.counters.rcvd_bad_qp += 1;
    }
    Some(qpn)
}

/// A datagram for QPN 0xFFFFFF: a copy to each QP attached to the group
/// its IP destination names (kernel `rxe_rcv_mcast_pkt`). Only UD SENDs
/// may be multicast (IBTA 10.5.2.3); a group with no member here, or a
/// member that cannot take it, drops it and counts.
fn deliver_multicast<M: Memory>(eng: &mut Engine<M>, pkt: &PacketRepr<'_>, dg: &RxDatagram<'_>) {
    let gid = crate::engine::ip_to_gid(dg.dst);
    let members = eng.mcast.members(&gid).to_vec();
    if pkt.bth.opcode.transport() != Transport::Ud {
        eng.ctx.counters.rcvd_bad_qp += 1;
        return;
    }
    // Kernel rxe_rcv counts a multicast datagram once, after hdr_check and
    // before rxe_rcv_mcast_pkt looks for the group.
    eng.ctx.counters.rcvd_pkts += 1;
    if members.is_empty() {
        eng.ctx.counters.rcvd_bad_qp += 1;
        return;
    }
    for qpn in members {
        let ctx = &mut eng.ctx;
        let Some(qp) = eng.qps.get_mut(&qpn) else {
            continue;
        };
        if qp.qp_type != QpType::Ud || !qp.can_receive() {
            ctx.counters.rcvd_bad_qp += 1;
            qp.counters.rcvd_bad_qp += 1;
            continue;
        }
        qp.counters.rcvd_pkts += 1;
        crate::resp::on_request(qp, ctx, pkt, dg);
        eng.reindex(qpn);
    }
}

fn info(dg: &RxDatagram<'_>, id: u16) -> wire::icrc::IpUdpInfo {
    wire::icrc::IpUdpInfo {
        src: dg.src,
        dst: dg.dst,
        src_port: dg.src_port,
        dst_port: dg.dst_port,
        ipv4_id: id,
        ipv4_flags_frag: 0x4000,
    }
}
