//! RC FLUSH (IBTA 1.5 Annex A19, kernel rxe since Linux 6.2) over the
//! deterministic simulator: completion as IBV_WC_FLUSH, the bytes of the
//! request (BTH, FETH, RETH, ICRC) and of its acknowledgement (an empty
//! RDMA READ RESPONSE ONLY with AETH), the kernel's errors, registration,
//! duplicates, retransmission and loss.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{
    AccessFlags, AsyncEventKind, QpState, QpType, RxDatagram, SendOp, SendWr, Sge, Transmit,
    WcOpcode, WcStatus, WorkCompletion, FLUSH_GLOBAL, FLUSH_MR, FLUSH_PERSISTENT, FLUSH_RANGE,
};
use wire::aeth::Syndrome;
use wire::{Opcode, PacketRepr};

const A_IP: &str = "10.0.0.1";
const B_IP: &str = "10.0.0.2";

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
/// What an MR (or QP) needs to be flushed for global visibility.
const ALL: AccessFlags = RW.union(AccessFlags::FLUSH_GLOBAL);

fn net(seed: u64, link: LinkConfig) -> Network {
    let mut n = Network::new(seed, link);
    n.add_node(node_config(A_IP.parse().unwrap(), seed));
    n.add_node(node_config(B_IP.parse().unwrap(), seed ^ 0xabc));
    n
}

fn opts() -> ConnectOpts {
    ConnectOpts {
        access: ALL | AccessFlags::FLUSH_PERSISTENT,
        ..ConnectOpts::default()
    }
}

struct Buf {
    addr: u64,
    len: u64,
    lkey: u32,
    rkey: u32,
}

fn buf(n: &mut Network, e: &QpEnd, len: usize, access: AccessFlags) -> Buf {
    let eng = n.node(e.node);
    let addr = eng.mem_mut().alloc(len.max(1));
    let mr = eng.reg_mr(e.pd, addr, len as u64, access).unwrap();
    Buf {
        addr,
        len: len as u64,
        lkey: mr.lkey,
        rkey: mr.rkey,
    }
}

fn sge(b: &Buf) -> Sge {
    Sge {
        addr: b.addr,
        length: b.len as u32,
        lkey: b.lkey,
    }
}

fn settle(n: &mut Network) {
    let limit = n.now() + Duration::from_secs(30);
    n.run_until(limit, |_| false);
}

fn drain_cq(n: &mut Network, node: usize, cq: rxe_core::CqHandle) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    loop {
        let v = n.node(node).poll_cq(cq, 64).unwrap();
        if v.is_empty() {
            break;
        }
        out.extend(v);
    }
    out
}

fn drain(n: &mut Network, e: &QpEnd) -> Vec<WorkCompletion> {
    drain_cq(n, e.node, e.send_cq)
}

fn pair(n: &mut Network, o: &ConnectOpts) -> (QpEnd, QpEnd) {
    let a = n.create_endpoint(0, QpType::Rc, None, None, 64).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 64).unwrap();
    n.connect(&a, &b, o).unwrap();
    (a, b)
}

fn post(n: &mut Network, e: &QpEnd, wr: SendWr) {
    let now = n.now();
    n.node(e.node).post_send(now, e.qpn, wr).unwrap();
}

fn flush(wr_id: u64, va: u64, rkey: u32, len: u32, placement: u8, selectivity: u8) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::Flush {
            remote_addr: va,
            rkey,
            length: len,
            placement,
            selectivity,
        },
        vec![],
    )
}

fn write(wr_id: u64, src: &Buf, va: u64, rkey: u32) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::RdmaWrite {
            remote_addr: va,
            rkey,
        },
        vec![sge(src)],
    )
}

fn tap(n: &mut Network) -> Rc<RefCell<Vec<Transmit>>> {
    let seen: Rc<RefCell<Vec<Transmit>>> = Rc::default();
    let s = seen.clone();
    n.set_tap(move |_, t| s.borrow_mut().push(t.clone()));
    seen
}

/// Hand a datagram taken off the wire to `node` directly.
fn deliver(n: &mut Network, node: usize, t: &Transmit) {
    let now = n.now();
    n.node(node).handle_datagram(
        now,
        &RxDatagram {
            src: t.info.src,
            dst: t.info.dst,
            src_port: t.info.src_port,
            dst_port: t.info.dst_port,
            ipv4_id: Some(t.info.ipv4_id),
            payload: &t.payload,
            ecn: rxe_core::Ecn::NotEct,
        },
    );
}

fn summary(v: &[WorkCompletion]) -> Vec<(u64, WcStatus, WcOpcode, u32)> {
    v.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

#[test]
fn verbs_numbers() {
    let op = SendOp::Flush {
        remote_addr: 0,
        rkey: 0,
        length: 0,
        placement: FLUSH_GLOBAL,
        selectivity: FLUSH_RANGE,
    };
    assert_eq!(op.ibv_opcode(), 14, "IBV_WR_FLUSH");
    assert_eq!(op.wc_opcode(), WcOpcode::Flush);
    assert_eq!(WcOpcode::Flush as u32, 8, "IBV_WC_FLUSH");
    assert_eq!((FLUSH_GLOBAL, FLUSH_PERSISTENT), (1, 2));
    assert_eq!((FLUSH_RANGE, FLUSH_MR), (0, 1));
    // Kernel rxe_requester: no check_init_depth for FLUSH; kernel
    // check_psn: not in WR_ATOMIC_OR_READ_MASK.
    assert!(!op.needs_rd_atomic());
    assert!(!op.is_read_or_atomic() && !op.is_atomic() && !op.carries_payload());
    assert!(op.is_single_packet());
    assert_eq!(op.name(), "FLUSH");
}

#[test]
fn range_and_whole_mr_complete_as_flush() {
    let mut n = net(1, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &opts());
    let remote = buf(&mut n, &b, 4096, ALL);
    let src = buf(&mut n, &a, 256, AccessFlags::LOCAL_WRITE);
    n.node(0).mem_mut().write(src.addr, &[0x5a; 256]).unwrap();
    post(&mut n, &a, write(1, &src, remote.addr + 512, remote.rkey));
    post(
        &mut n,
        &a,
        flush(
            2,
            remote.addr + 512,
            remote.rkey,
            256,
            FLUSH_GLOBAL,
            FLUSH_RANGE,
        ),
    );
    // Whole MR: the RETH's VA and length are not looked at.
    post(
        &mut n,
        &a,
        flush(3, 0xdead_0000, remote.rkey, 1 << 20, FLUSH_GLOBAL, FLUSH_MR),
    );
    // A zero-length range at the MR's end is inside it.
    post(
        &mut n,
        &a,
        flush(
            4,
            remote.addr + 4096,
            remote.rkey,
            0,
            FLUSH_GLOBAL,
            FLUSH_RANGE,
        ),
    );
    settle(&mut n);
    assert_eq!(
        summary(&drain(&mut n, &a)),
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite, 256),
            (2, WcStatus::Success, WcOpcode::Flush, 256),
            (3, WcStatus::Success, WcOpcode::Flush, 1 << 20),
            (4, WcStatus::Success, WcOpcode::Flush, 0),
        ]
    );
    let m = n
        .node(1)
        .mem_mut()
        .slice(remote.addr, 4096)
        .unwrap()
        .to_vec();
    assert!(m[512..768].iter().all(|&x| x == 0x5a));
    assert!(m[..512].iter().chain(&m[768..]).all(|&x| x == 0));
    assert!(drain_cq(&mut n, 1, b.recv_cq).is_empty());
    assert_eq!(n.node(0).qp_state(a.qpn), Some(QpState::Rts));
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Rts));
}

#[test]
fn packet_bytes_match_kernel_rxe() {
    let mut n = net(2, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &opts());
    let seen = tap(&mut n);
    let remote = buf(&mut n, &b, 256, ALL);
    post(
        &mut n,
        &a,
        flush(
            9,
            remote.addr + 16,
            remote.rkey,
            200,
            FLUSH_GLOBAL,
            FLUSH_RANGE,
        ),
    );
    post(
        &mut n,
        &a,
        flush(10, remote.addr, remote.rkey, 0, FLUSH_GLOBAL, FLUSH_MR),
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 2);
    let seen = seen.borrow();
    assert_eq!(seen.len(), 4, "two requests, two responses");
    let psn0 = ConnectOpts::default().psn_a;
    for (i, (sel, va, len)) in [
        (FLUSH_RANGE, remote.addr + 16, 200u32),
        (FLUSH_MR, remote.addr, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let req = &seen[i];
        assert!(wire::icrc::check(&req.info, &req.payload), "request ICRC");
        let psn = (psn0 + i as u32) & 0x00ff_ffff;
        // BTH: opcode 0x1c, SE/M/pad/TVer 0, P_Key 0xffff, dest QPN, AckReq
        // set, PSN. FETH: placement in bits 3-0, selectivity in bits 5-4.
        // RETH: VA, rkey, DMA length. Then the ICRC; no payload.
        let mut want = vec![0x1c, 0x00, 0xff, 0xff, 0];
        want.extend_from_slice(&b.qpn.to_be_bytes()[1..]);
        want.push(0x80);
        want.extend_from_slice(&psn.to_be_bytes()[1..]);
        want.extend_from_slice(&[0, 0, 0, (sel << 4) | FLUSH_GLOBAL]);
        want.extend_from_slice(&va.to_be_bytes());
        want.extend_from_slice(&remote.rkey.to_be_bytes());
        want.extend_from_slice(&len.to_be_bytes());
        assert_eq!(req.payload.len(), 12 + 4 + 16 + 4);
        assert_eq!(&req.payload[..32], &want[..], "request {i}");
        let p = PacketRepr::parse(&req.payload).unwrap();
        assert_eq!(p.bth.opcode, Opcode::RC_FLUSH);
        assert_eq!(p.feth.unwrap().selectivity, sel);
        assert!(p.payload.is_empty());

        // Kernel send_read_response_ack: RDMA_READ_RESPONSE_ONLY (0x10),
        // no payload, ACK AETH (0x1f, MSN), at the request's PSN.
        let resp = &seen[2 + i];
        assert!(
            wire::icrc::check(&resp.info, &resp.payload),
            "response ICRC"
        );
        let mut want = vec![0x10, 0x00, 0xff, 0xff, 0];
        want.extend_from_slice(&a.qpn.to_be_bytes()[1..]);
        want.push(0x00);
        want.extend_from_slice(&psn.to_be_bytes()[1..]);
        want.push(0x1f);
        want.extend_from_slice(&(i as u32 + 1).to_be_bytes()[1..]);
        assert_eq!(resp.payload.len(), 12 + 4 + 4);
        assert_eq!(&resp.payload[..16], &want[..], "response {i}");
    }
}

/// Post one FLUSH and a SEND behind it; expect `status` for the FLUSH, a
/// flush error for the SEND, both QPs in ERR and `event` at the responder.
fn error_case(
    seed: u64,
    qp_access: AccessFlags,
    mr_access: AccessFlags,
    wr: SendWr,
    status: WcStatus,
    event: AsyncEventKind,
) {
    let mut n = net(seed, LinkConfig::perfect());
    let o = ConnectOpts {
        access: qp_access,
        ..ConnectOpts::default()
    };
    let (a, b) = pair(&mut n, &o);
    let remote = buf(&mut n, &b, 64, mr_access);
    let mut wr = wr;
    if let SendOp::Flush {
        ref mut remote_addr,
        ref mut rkey,
        ..
    } = wr.op
    {
        *remote_addr = remote_addr.wrapping_add(remote.addr);
        if *rkey == 0 {
            *rkey = remote.rkey;
        }
    }
    post(&mut n, &a, wr);
    post(&mut n, &a, SendWr::new(2, SendOp::Send, vec![]));
    settle(&mut n);
    let got: Vec<_> = drain(&mut n, &a)
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, status, WcOpcode::Flush),
            (2, WcStatus::WrFlushErr, WcOpcode::Send)
        ]
    );
    assert_eq!(n.node(0).qp_state(a.qpn), Some(QpState::Err));
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Err));
    let ev: Vec<_> = std::iter::from_fn(|| n.node(1).poll_event())
        .map(|e| e.kind)
        .collect();
    assert!(ev.contains(&event), "{ev:?}");
}

#[test]
fn mr_without_flush_global_is_a_remote_access_error() {
    // Kernel check_rkey: lookup_mr with IB_ACCESS_FLUSH_GLOBAL fails,
    // RESPST_ERR_RKEY_VIOLATION: NAK remote access error.
    error_case(
        3,
        ALL,
        RW,
        flush(1, 0, 0, 8, FLUSH_GLOBAL, FLUSH_RANGE),
        WcStatus::RemAccessErr,
        AsyncEventKind::QpAccessErr,
    );
}

#[test]
fn range_outside_the_mr_is_a_remote_access_error() {
    error_case(
        4,
        ALL,
        ALL,
        flush(1, 60, 0, 8, FLUSH_GLOBAL, FLUSH_RANGE),
        WcStatus::RemAccessErr,
        AsyncEventKind::QpAccessErr,
    );
}

#[test]
fn unknown_rkey_is_a_remote_access_error() {
    error_case(
        5,
        ALL,
        ALL,
        flush(1, 0, 0x00ab_cd42, 8, FLUSH_GLOBAL, FLUSH_MR),
        WcStatus::RemAccessErr,
        AsyncEventKind::QpAccessErr,
    );
}

#[test]
fn qp_without_flush_global_is_an_invalid_request() {
    // Kernel check_qp_attr_access: RESPST_ERR_UNSUPPORTED_OPCODE, class C:
    // NAK invalid request.
    error_case(
        6,
        RW,
        ALL,
        flush(1, 0, 0, 8, FLUSH_GLOBAL, FLUSH_RANGE),
        WcStatus::RemInvReqErr,
        AsyncEventKind::QpReqErr,
    );
}

#[test]
fn persistent_is_refused() {
    // The QP allows it, but no MR can grant it (registration refuses it):
    // the rkey lookup fails, a remote access error.
    error_case(
        7,
        ALL | AccessFlags::FLUSH_PERSISTENT,
        ALL,
        flush(1, 0, 0, 8, FLUSH_PERSISTENT, FLUSH_RANGE),
        WcStatus::RemAccessErr,
        AsyncEventKind::QpAccessErr,
    );
    // The QP does not allow it: invalid request.
    error_case(
        8,
        ALL,
        ALL,
        flush(1, 0, 0, 8, FLUSH_GLOBAL | FLUSH_PERSISTENT, FLUSH_MR),
        WcStatus::RemInvReqErr,
        AsyncEventKind::QpReqErr,
    );
}

#[test]
fn reth_length_over_2_pow_31_is_an_invalid_request() {
    // Kernel rxe_resp_check_length (IBA C9-94), before the rkey.
    error_case(
        9,
        ALL,
        ALL,
        flush(1, 0, 0, (1 << 31) + 1, FLUSH_GLOBAL, FLUSH_MR),
        WcStatus::RemInvReqErr,
        AsyncEventKind::QpReqErr,
    );
}

#[test]
fn registration_refuses_persistent_accepts_global() {
    let mut n = net(10, LinkConfig::perfect());
    let (a, _b) = pair(&mut n, &opts());
    let e = n.node(0);
    let addr = e.mem_mut().alloc(64);
    let err = e
        .reg_mr(a.pd, addr, 64, ALL | AccessFlags::FLUSH_PERSISTENT)
        .unwrap_err();
    assert_eq!(
        err.errno(),
        22,
        "EINVAL, as kernel rxe_mr_fill_pages_from_sgt"
    );
    let mr = e.reg_mr(a.pd, addr, 64, ALL).unwrap();
    assert!(mr.access.contains(AccessFlags::FLUSH_GLOBAL));
    let err = e
        .rereg_mr(mr.lkey, None, None, Some(AccessFlags::FLUSH_PERSISTENT))
        .unwrap_err();
    assert_eq!(err.errno(), 22);
}

#[test]
fn does_not_wait_for_rd_atomic_credits() {
    let o = ConnectOpts {
        max_rd_atomic: 1,
        ..opts()
    };
    let mut n = net(11, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &o);
    let seen = tap(&mut n);
    let remote = buf(&mut n, &b, 64, ALL);
    for i in 0..3 {
        post(
            &mut n,
            &a,
            flush(i, remote.addr, remote.rkey, 64, FLUSH_GLOBAL, FLUSH_RANGE),
        );
    }
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 3);
    let ops: Vec<u8> = seen.borrow().iter().map(|t| t.payload[0]).collect();
    assert_eq!(ops, [0x1c, 0x1c, 0x1c, 0x10, 0x10, 0x10]);
}

#[test]
fn duplicate_is_acknowledged_again_not_executed_again() {
    let mut n = net(12, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &opts());
    let seen = tap(&mut n);
    let remote = buf(&mut n, &b, 64, ALL);
    post(
        &mut n,
        &a,
        flush(1, remote.addr, remote.rkey, 64, FLUSH_GLOBAL, FLUSH_RANGE),
    );
    let src = buf(&mut n, &a, 8, AccessFlags::LOCAL_WRITE);
    post(&mut n, &a, write(2, &src, remote.addr, remote.rkey));
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 2);
    let req = seen.borrow()[0].clone();
    assert_eq!(req.payload[0], 0x1c);
    let dups = n.nodes()[1].counters().duplicate_request;
    deliver(&mut n, 1, &req);
    assert_eq!(n.nodes()[1].counters().duplicate_request, dups + 1);
    let t = n
        .node(1)
        .poll_transmit()
        .expect("the duplicate is answered");
    let r = PacketRepr::parse(&t.payload).unwrap();
    assert_eq!(r.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(r.bth.psn, PacketRepr::parse(&req.payload).unwrap().bth.psn);
    let aeth = r.aeth.unwrap();
    assert!(matches!(aeth.syndrome, Syndrome::Ack { .. }));
    assert_eq!(aeth.msn, 2, "the current MSN: not executed again");
    assert!(r.payload.is_empty());
    assert!(n.node(1).poll_transmit().is_none());
    settle(&mut n);
    assert!(drain(&mut n, &a).is_empty());
    assert_eq!(n.node(0).qp_state(a.qpn), Some(QpState::Rts));
}

#[test]
fn lost_request_is_retransmitted_with_the_same_reth() {
    let mut n = net(13, LinkConfig::perfect());
    let o = ConnectOpts {
        timeout: 8,
        ..opts()
    };
    let (a, b) = pair(&mut n, &o);
    let remote = buf(&mut n, &b, 64, ALL);
    post(
        &mut n,
        &a,
        flush(
            1,
            remote.addr + 8,
            remote.rkey,
            32,
            FLUSH_GLOBAL,
            FLUSH_RANGE,
        ),
    );
    let lost = n.node(0).poll_transmit().expect("the FLUSH");
    assert_eq!(lost.payload[0], 0x1c);
    let seen = tap(&mut n);
    settle(&mut n);
    assert_eq!(
        summary(&drain(&mut n, &a)),
        vec![(1, WcStatus::Success, WcOpcode::Flush, 32)]
    );
    let again = seen.borrow()[0].clone();
    assert_eq!(again.payload, lost.payload, "same PSN, FETH and RETH");
    assert_eq!(n.nodes()[0].counters().duplicate_request, 0);
}

#[test]
fn lost_response_is_answered_from_the_resource() {
    let mut n = net(14, LinkConfig::perfect());
    let o = ConnectOpts {
        timeout: 8,
        ..opts()
    };
    let (a, b) = pair(&mut n, &o);
    let remote = buf(&mut n, &b, 64, ALL);
    post(
        &mut n,
        &a,
        flush(1, remote.addr, remote.rkey, 64, FLUSH_GLOBAL, FLUSH_RANGE),
    );
    let req = n.node(0).poll_transmit().unwrap();
    deliver(&mut n, 1, &req);
    let lost = n.node(1).poll_transmit().expect("the acknowledgement");
    assert_eq!(lost.payload[0], 0x10);
    let dups = n.nodes()[1].counters().duplicate_request;
    settle(&mut n);
    assert_eq!(
        summary(&drain(&mut n, &a)),
        vec![(1, WcStatus::Success, WcOpcode::Flush, 64)]
    );
    assert_eq!(n.nodes()[1].counters().duplicate_request, dups + 1);
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Rts));
}

#[test]
fn a_later_ack_completes_a_flush_whose_response_was_lost() {
    // Kernel check_psn: FLUSH is not in WR_ATOMIC_OR_READ_MASK, so an ACK
    // past its PSN acknowledges it (as for a WRITE), without a retry.
    let mut n = net(15, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &opts());
    let remote = buf(&mut n, &b, 64, ALL);
    let src = buf(&mut n, &a, 8, AccessFlags::LOCAL_WRITE);
    post(
        &mut n,
        &a,
        flush(1, remote.addr, remote.rkey, 64, FLUSH_GLOBAL, FLUSH_MR),
    );
    post(&mut n, &a, write(2, &src, remote.addr, remote.rkey));
    let r1 = n.node(0).poll_transmit().unwrap();
    let r2 = n.node(0).poll_transmit().unwrap();
    deliver(&mut n, 1, &r1);
    deliver(&mut n, 1, &r2);
    let _lost = n.node(1).poll_transmit().unwrap();
    let ack = n.node(1).poll_transmit().unwrap();
    assert_eq!(ack.payload[0], 0x11, "ACKNOWLEDGE of the WRITE");
    deliver(&mut n, 0, &ack);
    assert_eq!(
        summary(&drain(&mut n, &a)),
        vec![
            (1, WcStatus::Success, WcOpcode::Flush, 64),
            (2, WcStatus::Success, WcOpcode::RdmaWrite, 8),
        ]
    );
}

#[test]
fn xrc_has_no_flush() {
    let mut n = net(16, LinkConfig::perfect());
    let b = n.node(1);
    let xrcd = b.alloc_xrcd().unwrap();
    let pd = b.alloc_pd().unwrap();
    let cq = b.create_cq(8).unwrap();
    let attr = rxe_core::SrqAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = b.create_xrc_srq(pd, xrcd, cq, attr).unwrap();
    let srqn = b.srq_num(srq).unwrap();
    let tgt = b.create_xrc_recv_qp(xrcd).unwrap();
    let ini = n
        .create_endpoint(0, QpType::XrcSend, None, None, 4)
        .unwrap();
    let tgt_end = QpEnd {
        node: 1,
        qpn: tgt,
        pd,
        send_cq: cq,
        recv_cq: cq,
    };
    n.connect(&ini, &tgt_end, &opts()).unwrap();
    let now = n.now();
    // An XRC QP in RTS takes a SEND, but not a FLUSH (no XRC opcode).
    let mut ok = SendWr::new(1, SendOp::Send, vec![]);
    ok.xrc_remote_srqn = Some(srqn);
    n.node(0).post_send(now, ini.qpn, ok).unwrap();
    let mut wr = flush(2, 0, 1, 8, FLUSH_GLOBAL, FLUSH_RANGE);
    wr.xrc_remote_srqn = Some(srqn);
    let err = n.node(0).post_send(now, ini.qpn, wr).unwrap_err();
    assert!(err.to_string().contains("FLUSH"), "{err}");
}

#[test]
fn lossy_link_completes_every_flush_once_in_order() {
    for seed in 0..8u64 {
        let link = LinkConfig {
            loss: 0.15,
            duplicate: 0.15,
            reorder: 0.1,
            corrupt: 0.02,
            ..LinkConfig::perfect()
        };
        let mut n = net(200 + seed, link);
        let (a, b) = pair(&mut n, &opts());
        let remote = buf(&mut n, &b, 64 * 16, ALL);
        let mut want = Vec::new();
        let mut wr_id = 0u64;
        for slot in 0..16u64 {
            let src = buf(&mut n, &a, 64, AccessFlags::LOCAL_WRITE);
            n.node(0)
                .mem_mut()
                .write(src.addr, &[slot as u8 + 1; 64])
                .unwrap();
            post(
                &mut n,
                &a,
                write(wr_id, &src, remote.addr + 64 * slot, remote.rkey),
            );
            wr_id += 1;
            let sel = if slot % 2 == 0 { FLUSH_RANGE } else { FLUSH_MR };
            post(
                &mut n,
                &a,
                flush(
                    wr_id,
                    remote.addr + 64 * slot,
                    remote.rkey,
                    64,
                    FLUSH_GLOBAL,
                    sel,
                ),
            );
            wr_id += 1;
            want.extend_from_slice(&[slot as u8 + 1; 64]);
        }
        let limit = n.now() + Duration::from_secs(120);
        assert!(n.run_until(limit, |n| n.node(0).cq_len(a.send_cq) == wr_id as usize));
        settle(&mut n);
        let sc = drain(&mut n, &a);
        let ids: Vec<u64> = sc.iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, (0..wr_id).collect::<Vec<_>>(), "seed {seed}");
        for w in &sc {
            assert_eq!(w.status, WcStatus::Success, "seed {seed}: {w:?}");
            let op = if w.wr_id % 2 == 0 {
                WcOpcode::RdmaWrite
            } else {
                WcOpcode::Flush
            };
            assert_eq!(w.opcode, op);
        }
        let m = n
            .node(1)
            .mem_mut()
            .slice(remote.addr, 64 * 16)
            .unwrap()
            .to_vec();
        assert_eq!(m, want, "seed {seed}");
        assert!(n.stats().lost > 0 && n.stats().duplicated > 0);
    }
}
