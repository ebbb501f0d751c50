//! RC ATOMIC WRITE (IBTA 1.5 Annex A19, kernel rxe since Linux 6.2) over
//! the deterministic simulator: the value lands and completes as
//! IBV_WC_ATOMIC_WRITE, the kernel's errors, loss and duplication, the
//! responder's replay, and the packets' bytes.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{
    AccessFlags, AsyncEventKind, QpState, QpType, RxDatagram, SendFlags, SendOp, SendWr, Sge,
    Transmit, WcOpcode, WcStatus, WorkCompletion,
};
use wire::aeth::Syndrome;
use wire::{Opcode, PacketRepr};

const A_IP: &str = "10.0.0.1";
const B_IP: &str = "10.0.0.2";

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn net(seed: u64, link: LinkConfig) -> Network {
    let mut n = Network::new(seed, link);
    n.add_node(node_config(A_IP.parse().unwrap(), seed));
    n.add_node(node_config(B_IP.parse().unwrap(), seed ^ 0xabc));
    n
}

struct Buf {
    addr: u64,
    len: u64,
    lkey: u32,
    rkey: u32,
}

fn buf(
    n: &mut Network,
    node: usize,
    pd: rxe_core::PdHandle,
    len: usize,
    access: AccessFlags,
) -> Buf {
    let e = n.node(node);
    let addr = e.mem_mut().alloc(len.max(1));
    let mr = e.reg_mr(pd, addr, len as u64, access).unwrap();
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

fn read(n: &mut Network, node: usize, addr: u64, len: u64) -> Vec<u8> {
    n.node(node)
        .mem_mut()
        .slice(addr, len as usize)
        .unwrap()
        .to_vec()
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

/// An 8-byte local buffer holding `value` (native order, as an application
/// would store a `u64`).
fn value_buf(n: &mut Network, e: &QpEnd, value: u64) -> Buf {
    let b = buf(n, e.node, e.pd, 8, AccessFlags::empty());
    n.node(e.node)
        .mem_mut()
        .write(b.addr, &value.to_ne_bytes())
        .unwrap();
    b
}

fn atomic_write(wr_id: u64, remote_addr: u64, rkey: u32, data: &Buf) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::AtomicWrite { remote_addr, rkey },
        vec![sge(data)],
    )
}

/// Every datagram sent, in order.
fn tap(n: &mut Network) -> Rc<RefCell<Vec<Transmit>>> {
    let seen: Rc<RefCell<Vec<Transmit>>> = Rc::default();
    let s = seen.clone();
    n.set_tap(move |_, t| s.borrow_mut().push(t.clone()));
    seen
}

#[test]
fn verbs_numbers() {
    let op = SendOp::AtomicWrite {
        remote_addr: 0,
        rkey: 0,
    };
    assert_eq!(op.ibv_opcode(), 15, "IBV_WR_ATOMIC_WRITE");
    assert_eq!(op.wc_opcode(), WcOpcode::AtomicWrite);
    assert_eq!(WcOpcode::AtomicWrite as u32, 9, "IBV_WC_ATOMIC_WRITE");
    assert!(op.needs_rd_atomic());
    assert!(!op.is_read_or_atomic() && !op.is_atomic());
    assert_eq!(op.name(), "ATOMIC_WRITE");
}

#[test]
fn atomic_write_lands_and_completes() {
    let mut n = net(1, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &ConnectOpts::default());
    let remote = buf(&mut n, 1, b.pd, 64, ALL);
    n.node(1).mem_mut().write(remote.addr, &[0xee; 64]).unwrap();
    let v1 = value_buf(&mut n, &a, 0x0102_0304_0506_0708);
    post(
        &mut n,
        &a,
        atomic_write(1, remote.addr + 8, remote.rkey, &v1),
    );
    // The same through inline data, as ibv_wr_atomic_write hands it over.
    let v2 = value_buf(&mut n, &a, 0xa1b2_c3d4_e5f6_0718);
    let mut wr = atomic_write(2, remote.addr + 56, remote.rkey, &v2);
    wr.flags |= SendFlags::INLINE;
    wr.sg_list[0].lkey = 0;
    post(&mut n, &a, wr);
    settle(&mut n);
    let sc = drain(&mut n, &a);
    let got: Vec<_> = sc
        .iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::AtomicWrite, 8),
            (2, WcStatus::Success, WcOpcode::AtomicWrite, 8),
        ]
    );
    let m = read(&mut n, 1, remote.addr, 64);
    assert_eq!(&m[8..16], &0x0102_0304_0506_0708u64.to_ne_bytes());
    assert_eq!(&m[56..64], &0xa1b2_c3d4_e5f6_0718u64.to_ne_bytes());
    assert!(m[..8].iter().chain(&m[16..56]).all(|&x| x == 0xee));
    // No receive is consumed and nothing completes at the responder.
    assert!(drain_cq(&mut n, 1, b.recv_cq).is_empty());
    assert_eq!(n.node(0).qp_state(a.qpn), Some(QpState::Rts));
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Rts));
}

#[test]
fn post_refuses_anything_but_8_bytes() {
    let mut n = net(2, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &ConnectOpts::default());
    let remote = buf(&mut n, 1, b.pd, 64, ALL);
    let src = buf(&mut n, 0, a.pd, 16, AccessFlags::empty());
    let now = n.now();
    let wr = atomic_write(1, remote.addr, remote.rkey, &src);
    assert!(n.node(0).post_send(now, a.qpn, wr).is_err());
    assert!(drain(&mut n, &a).is_empty());
}

/// Post one ATOMIC WRITE and a SEND behind it; expect `status` for the
/// first, a flush for the SEND, both QPs in ERR and `event` at the
/// responder.
fn error_case(
    seed: u64,
    o: &ConnectOpts,
    access: AccessFlags,
    offset: u64,
    status: WcStatus,
    event: AsyncEventKind,
) {
    let mut n = net(seed, LinkConfig::perfect());
    let (a, b) = pair(&mut n, o);
    let remote = buf(&mut n, 1, b.pd, 64, access);
    let v = value_buf(&mut n, &a, u64::MAX);
    post(
        &mut n,
        &a,
        atomic_write(1, remote.addr + offset, remote.rkey, &v),
    );
    post(&mut n, &a, SendWr::new(2, SendOp::Send, vec![]));
    settle(&mut n);
    let sc = drain(&mut n, &a);
    let got: Vec<_> = sc.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (1, status, WcOpcode::AtomicWrite),
            (2, WcStatus::WrFlushErr, WcOpcode::Send)
        ]
    );
    assert_eq!(n.node(0).qp_state(a.qpn), Some(QpState::Err));
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Err));
    let ev: Vec<_> = std::iter::from_fn(|| n.node(1).poll_event())
        .map(|e| e.kind)
        .collect();
    assert!(ev.contains(&event), "{ev:?}");
    assert_eq!(
        read(&mut n, 1, remote.addr, 64),
        vec![0; 64],
        "nothing written"
    );
}

#[test]
fn unaligned_address_is_an_invalid_request() {
    // Kernel atomic_write_reply: RESPST_ERR_MISALIGNED_ATOMIC, class C:
    // NAK invalid request, IBV_WC_REM_INV_REQ_ERR.
    error_case(
        3,
        &ConnectOpts::default(),
        ALL,
        4,
        WcStatus::RemInvReqErr,
        AsyncEventKind::QpReqErr,
    );
}

#[test]
fn rkey_without_remote_write_is_a_remote_access_error() {
    // Kernel check_rkey looks the MR up with IB_ACCESS_REMOTE_WRITE:
    // REMOTE_ATOMIC is not what an ATOMIC WRITE needs.
    error_case(
        4,
        &ConnectOpts::default(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        0,
        WcStatus::RemAccessErr,
        AsyncEventKind::QpAccessErr,
    );
}

#[test]
fn out_of_bounds_is_a_remote_access_error() {
    error_case(
        5,
        &ConnectOpts::default(),
        ALL,
        64,
        WcStatus::RemAccessErr,
        AsyncEventKind::QpAccessErr,
    );
}

#[test]
fn qp_without_remote_write_is_an_invalid_request() {
    // Kernel check_op_valid: RXE_ATOMIC_WRITE_MASK needs the QP's
    // IB_ACCESS_REMOTE_WRITE.
    let o = ConnectOpts {
        access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ..ConnectOpts::default()
    };
    error_case(
        6,
        &o,
        ALL,
        0,
        WcStatus::RemInvReqErr,
        AsyncEventKind::QpReqErr,
    );
}

#[test]
fn packet_bytes_match_kernel_rxe() {
    let mut n = net(7, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &ConnectOpts::default());
    let seen = tap(&mut n);
    let remote = buf(&mut n, 1, b.pd, 64, ALL);
    let value = 0x1122_3344_5566_7788u64;
    let v = value_buf(&mut n, &a, value);
    post(
        &mut n,
        &a,
        atomic_write(0x77, remote.addr + 16, remote.rkey, &v),
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &a)[0].status, WcStatus::Success);
    let seen = seen.borrow();
    assert_eq!(seen.len(), 2, "one request, one response");

    let req = &seen[0];
    assert!(wire::icrc::check(&req.info, &req.payload), "request ICRC");
    // BTH 12 + RETH 16 + 8 payload + ICRC 4.
    assert_eq!(req.payload.len(), 40);
    assert_eq!(req.payload[0], 0x1d, "IB_OPCODE_RC_ATOMIC_WRITE");
    let p = PacketRepr::parse(&req.payload).unwrap();
    assert_eq!(p.bth.opcode, Opcode::RC_ATOMIC_WRITE);
    assert_eq!(p.bth.dest_qpn, b.qpn);
    assert!(p.bth.ack_req);
    assert!(!p.bth.solicited);
    assert_eq!(p.bth.pad_count, 0);
    let reth = p.reth.expect("RETH");
    assert_eq!(reth.va, remote.addr + 16);
    assert_eq!(reth.rkey, remote.rkey);
    assert_eq!(reth.dma_len, 8);
    assert_eq!(p.payload, &value.to_ne_bytes()[..]);
    assert!(p.atomic.is_none() && p.aeth.is_none());

    // Kernel send_read_response_ack: RDMA_READ_RESPONSE_ONLY, no payload,
    // ACK AETH (0x1f) with the MSN, at the request's PSN.
    let resp = &seen[1];
    assert!(
        wire::icrc::check(&resp.info, &resp.payload),
        "response ICRC"
    );
    assert_eq!(resp.payload.len(), 12 + 4 + 4);
    let r = PacketRepr::parse(&resp.payload).unwrap();
    assert_eq!(r.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(r.bth.dest_qpn, a.qpn);
    assert_eq!(r.bth.psn, p.bth.psn);
    assert!(r.payload.is_empty());
    let aeth = r.aeth.expect("AETH");
    assert!(matches!(aeth.syndrome, Syndrome::Ack { .. }), "{aeth:?}");
    assert_eq!(
        resp.payload[12], 0x1f,
        "AETH syndrome: ACK, credits invalid"
    );
    assert_eq!(aeth.msn, 1);
}

#[test]
fn duplicate_is_acknowledged_again_not_written_again() {
    let mut n = net(8, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &ConnectOpts::default());
    let seen = tap(&mut n);
    let remote = buf(&mut n, 1, b.pd, 8, ALL);
    let v = value_buf(&mut n, &a, 5);
    post(&mut n, &a, atomic_write(1, remote.addr, remote.rkey, &v));
    settle(&mut n);
    let w = value_buf(&mut n, &a, 6);
    post(
        &mut n,
        &a,
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&w)],
        ),
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 2);
    assert_eq!(read(&mut n, 1, remote.addr, 8), 6u64.to_ne_bytes());

    // The ATOMIC WRITE arrives again, after the WRITE.
    let req = seen.borrow()[0].clone();
    assert_eq!(req.payload[0], 0x1d);
    let dups = n.nodes()[1].counters().duplicate_request;
    let now = n.now();
    n.node(1).handle_datagram(
        now,
        &RxDatagram {
            src: req.info.src,
            dst: req.info.dst,
            src_port: req.info.src_port,
            dst_port: req.info.dst_port,
            ipv4_id: Some(req.info.ipv4_id),
            payload: &req.payload,
            ecn: rxe_core::Ecn::NotEct,
        },
    );
    assert_eq!(n.nodes()[1].counters().duplicate_request, dups + 1);
    assert_eq!(
        read(&mut n, 1, remote.addr, 8),
        6u64.to_ne_bytes(),
        "a duplicate must not write again"
    );
    let t = n
        .node(1)
        .poll_transmit()
        .expect("the duplicate is answered");
    let r = PacketRepr::parse(&t.payload).unwrap();
    assert_eq!(r.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_eq!(r.bth.psn, PacketRepr::parse(&req.payload).unwrap().bth.psn);
    assert!(matches!(r.aeth.unwrap().syndrome, Syndrome::Ack { .. }));
    assert!(r.payload.is_empty());
    assert!(n.node(1).poll_transmit().is_none());
    // The requester takes the stale response as a duplicate: nothing new.
    settle(&mut n);
    assert!(drain(&mut n, &a).is_empty());
    assert_eq!(n.node(0).qp_state(a.qpn), Some(QpState::Rts));
}

#[test]
fn counts_against_max_rd_atomic() {
    let o = ConnectOpts {
        max_rd_atomic: 1,
        ..ConnectOpts::default()
    };
    let mut n = net(9, LinkConfig::perfect());
    let (a, b) = pair(&mut n, &o);
    let seen = tap(&mut n);
    let remote = buf(&mut n, 1, b.pd, 32, ALL);
    for i in 0..3u64 {
        let v = value_buf(&mut n, &a, i + 1);
        post(
            &mut n,
            &a,
            atomic_write(i, remote.addr + 8 * i, remote.rkey, &v),
        );
    }
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 3);
    // With one responder resource, each request waits for the response to
    // the one before it.
    let ops: Vec<u8> = seen.borrow().iter().map(|t| t.payload[0]).collect();
    assert_eq!(ops, [0x1d, 0x10, 0x1d, 0x10, 0x1d, 0x10]);
}

#[test]
fn lossy_link_completes_once_and_holds_the_value() {
    for seed in 0..8u64 {
        let link = LinkConfig {
            loss: 0.15,
            duplicate: 0.15,
            reorder: 0.1,
            corrupt: 0.02,
            ..LinkConfig::perfect()
        };
        let mut n = net(100 + seed, link);
        let (a, b) = pair(&mut n, &ConnectOpts::default());
        let remote = buf(&mut n, 1, b.pd, 8 * 16, ALL);
        // Each slot gets two ATOMIC WRITEs, then an RDMA WRITE: a late
        // duplicate executed again would leave an older value behind.
        let mut wr_id = 0u64;
        let mut want = Vec::new();
        for slot in 0..16u64 {
            for k in 0..2u64 {
                let v = value_buf(&mut n, &a, (slot << 32) | (k + 1));
                post(
                    &mut n,
                    &a,
                    atomic_write(wr_id, remote.addr + 8 * slot, remote.rkey, &v),
                );
                wr_id += 1;
            }
            let last = (slot << 32) | 0xffff;
            let w = value_buf(&mut n, &a, last);
            post(
                &mut n,
                &a,
                SendWr::new(
                    wr_id,
                    SendOp::RdmaWrite {
                        remote_addr: remote.addr + 8 * slot,
                        rkey: remote.rkey,
                    },
                    vec![sge(&w)],
                ),
            );
            wr_id += 1;
            want.extend_from_slice(&last.to_ne_bytes());
        }
        let limit = n.now() + Duration::from_secs(120);
        assert!(n.run_until(limit, |n| n.node(0).cq_len(a.send_cq) == wr_id as usize));
        settle(&mut n); // duplicates and retries still in flight arrive
        let sc = drain(&mut n, &a);
        let ids: Vec<u64> = sc.iter().map(|w| w.wr_id).collect();
        assert_eq!(
            ids,
            (0..wr_id).collect::<Vec<_>>(),
            "seed {seed}: exactly once, in order"
        );
        assert!(
            sc.iter().all(|w| w.status == WcStatus::Success),
            "seed {seed}: {sc:?}"
        );
        for w in &sc {
            let want_op = if w.wr_id % 3 == 2 {
                WcOpcode::RdmaWrite
            } else {
                WcOpcode::AtomicWrite
            };
            assert_eq!(w.opcode, want_op);
        }
        assert_eq!(read(&mut n, 1, remote.addr, 8 * 16), want, "seed {seed}");
        assert!(n.stats().lost > 0 && n.stats().duplicated > 0);
    }
}
