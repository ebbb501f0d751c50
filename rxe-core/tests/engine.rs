//! Engine scenarios over the deterministic simulator: every opcode, message
//! sizes, and every error path with its completion status and flush.

use std::time::Duration;

use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{
    AccessFlags, AhAttr, AsyncEventKind, Instant, Mtu, MwBindInfo, MwType, QpAttr, QpAttrMask,
    QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqAttr, UdDest, WcFlags, WcOpcode,
    WcStatus, WorkCompletion,
};

const A_IP: &str = "10.0.0.1";
const B_IP: &str = "10.0.0.2";

fn net(seed: u64, link: LinkConfig) -> Network {
    let mut n = Network::new(seed, link);
    n.add_node(node_config(A_IP.parse().unwrap(), seed));
    n.add_node(node_config(B_IP.parse().unwrap(), seed ^ 0xabc));
    n
}

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

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

fn fill(n: &mut Network, node: usize, b: &Buf, seed: u8) {
    let data: Vec<u8> = (0..b.len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    n.node(node).mem_mut().write(b.addr, &data).unwrap();
}

fn read(n: &mut Network, node: usize, addr: u64, len: u64) -> Vec<u8> {
    n.node(node)
        .mem_mut()
        .slice(addr, len as usize)
        .unwrap()
        .to_vec()
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

fn drain(n: &mut Network, e: &QpEnd) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    loop {
        let v = n.node(e.node).poll_cq(e.send_cq, 64).unwrap();
        if v.is_empty() {
            break;
        }
        out.extend(v);
    }
    out
}

fn pair(n: &mut Network, ty: QpType, o: &ConnectOpts) -> (QpEnd, QpEnd) {
    let a = n.create_endpoint(0, ty, None, None, 64).unwrap();
    let b = n.create_endpoint(1, ty, None, None, 64).unwrap();
    n.connect(&a, &b, o).unwrap();
    (a, b)
}

fn post_recv(n: &mut Network, e: &QpEnd, wr_id: u64, b: &Buf) {
    n.node(e.node)
        .post_recv(
            e.qpn,
            RecvWr {
                wr_id,
                sg_list: vec![sge(b)],
            },
        )
        .unwrap();
}

fn post(n: &mut Network, e: &QpEnd, wr: SendWr) {
    let now = n.now();
    n.node(e.node).post_send(now, e.qpn, wr).unwrap();
}

#[test]
fn rc_send_sizes_and_immediate() {
    for mtu in [Mtu::M256, Mtu::M1024, Mtu::M4096] {
        let m = mtu.bytes() as usize;
        let o = ConnectOpts {
            mtu,
            ..ConnectOpts::default()
        };
        let mut n = net(1, LinkConfig::perfect());
        let (a, b) = pair(&mut n, QpType::Rc, &o);
        for (i, size) in [0usize, 1, m - 1, m, m + 1, 3 * m + 5]
            .into_iter()
            .enumerate()
        {
            let src = buf(&mut n, 0, a.pd, size, AccessFlags::empty());
            fill(&mut n, 0, &src, i as u8);
            let dst = buf(&mut n, 1, b.pd, size + 7, AccessFlags::LOCAL_WRITE);
            post_recv(&mut n, &b, 100 + i as u64, &dst);
            let op = if i % 2 == 0 {
                SendOp::Send
            } else {
                SendOp::SendWithImm {
                    imm: 0xdead_0000 + i as u32,
                }
            };
            post(&mut n, &a, SendWr::new(i as u64, op, vec![sge(&src)]));
            settle(&mut n);
            let sc = drain(&mut n, &a);
            assert_eq!(sc.len(), 1, "mtu {m} size {size}: {sc:?}");
            assert_eq!(sc[0].status, WcStatus::Success);
            assert_eq!(sc[0].opcode, WcOpcode::Send);
            let rc = drain(&mut n, &b);
            assert_eq!(rc.len(), 1);
            assert_eq!(rc[0].wr_id, 100 + i as u64);
            assert_eq!(rc[0].status, WcStatus::Success);
            assert_eq!(rc[0].opcode, WcOpcode::Recv);
            assert_eq!(rc[0].byte_len as usize, size);
            assert_eq!(rc[0].src_qp, a.qpn);
            if i % 2 == 1 {
                assert!(rc[0].wc_flags.contains(WcFlags::WITH_IMM));
                assert_eq!(rc[0].imm_data, 0xdead_0000 + i as u32);
            }
            assert_eq!(
                read(&mut n, 1, dst.addr, size as u64),
                read(&mut n, 0, src.addr, size as u64)
            );
        }
    }
}

#[test]
fn rc_write_read_atomics_multi_sge() {
    let mut n = net(2, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let s1 = buf(&mut n, 0, a.pd, 3000, AccessFlags::LOCAL_WRITE);
    let s2 = buf(&mut n, 0, a.pd, 1500, AccessFlags::LOCAL_WRITE);
    fill(&mut n, 0, &s1, 1);
    fill(&mut n, 0, &s2, 2);
    let remote = buf(&mut n, 1, b.pd, 8192, ALL);
    // WRITE gathered from two SGEs.
    post(
        &mut n,
        &a,
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: remote.addr + 100,
                rkey: remote.rkey,
            },
            vec![sge(&s1), sge(&s2)],
        ),
    );
    // WRITE with immediate consumes a receive.
    let rbuf = buf(&mut n, 1, b.pd, 16, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 77, &rbuf);
    post(
        &mut n,
        &a,
        SendWr::new(
            2,
            SendOp::RdmaWriteWithImm {
                remote_addr: remote.addr + 5000,
                rkey: remote.rkey,
                imm: 42,
            },
            vec![sge(&s2)],
        ),
    );
    settle(&mut n);
    let mut expect = read(&mut n, 0, s1.addr, 3000);
    expect.extend(read(&mut n, 0, s2.addr, 1500));
    assert_eq!(read(&mut n, 1, remote.addr + 100, 4500), expect);
    assert_eq!(
        read(&mut n, 1, remote.addr + 5000, 1500),
        read(&mut n, 0, s2.addr, 1500)
    );
    let rc = drain(&mut n, &b);
    assert_eq!(rc.len(), 1);
    assert_eq!(rc[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(rc[0].byte_len, 1500);
    assert_eq!(rc[0].imm_data, 42);
    // READ it back into two SGEs.
    let d1 = buf(&mut n, 0, a.pd, 2000, AccessFlags::LOCAL_WRITE);
    let d2 = buf(&mut n, 0, a.pd, 2500, AccessFlags::LOCAL_WRITE);
    post(
        &mut n,
        &a,
        SendWr::new(
            3,
            SendOp::RdmaRead {
                remote_addr: remote.addr + 100,
                rkey: remote.rkey,
            },
            vec![sge(&d1), sge(&d2)],
        ),
    );
    // Atomics on an 8-byte aligned counter.
    let ctr = remote.addr + 8000;
    n.node(1)
        .mem_mut()
        .write(ctr, &10u64.to_ne_bytes())
        .unwrap();
    let r1 = buf(&mut n, 0, a.pd, 8, AccessFlags::LOCAL_WRITE);
    let r2 = buf(&mut n, 0, a.pd, 8, AccessFlags::LOCAL_WRITE);
    post(
        &mut n,
        &a,
        SendWr::new(
            4,
            SendOp::AtomicFetchAdd {
                remote_addr: ctr,
                rkey: remote.rkey,
                add: 5,
            },
            vec![sge(&r1)],
        ),
    );
    post(
        &mut n,
        &a,
        SendWr::new(
            5,
            SendOp::AtomicCmpSwp {
                remote_addr: ctr,
                rkey: remote.rkey,
                compare: 15,
                swap: 99,
            },
            vec![sge(&r2)],
        ),
    );
    settle(&mut n);
    let mut got = read(&mut n, 0, d1.addr, 2000);
    got.extend(read(&mut n, 0, d2.addr, 2500));
    assert_eq!(got, expect);
    assert_eq!(read(&mut n, 0, r1.addr, 8), 10u64.to_ne_bytes());
    assert_eq!(read(&mut n, 0, r2.addr, 8), 15u64.to_ne_bytes());
    assert_eq!(read(&mut n, 1, ctr, 8), 99u64.to_ne_bytes());
    let sc = drain(&mut n, &a);
    let ops: Vec<_> = sc.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
    assert_eq!(
        ops,
        vec![
            (1, WcOpcode::RdmaWrite, WcStatus::Success),
            (2, WcOpcode::RdmaWrite, WcStatus::Success),
            (3, WcOpcode::RdmaRead, WcStatus::Success),
            (4, WcOpcode::FetchAdd, WcStatus::Success),
            (5, WcOpcode::CompSwap, WcStatus::Success),
        ]
    );
}

#[test]
fn unsignaled_and_inline_and_fence() {
    let mut n = net(3, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let src = buf(&mut n, 0, a.pd, 64, AccessFlags::empty());
    fill(&mut n, 0, &src, 9);
    let remote = buf(&mut n, 1, b.pd, 64, ALL);
    let mut wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        },
        vec![sge(&src)],
    );
    wr.flags = SendFlags::INLINE; // unsignaled, inline
    post(&mut n, &a, wr);
    // Inline data was copied at post time: changing the buffer now has no effect.
    n.node(0).mem_mut().write(src.addr, &[0u8; 64]).unwrap();
    let dst = buf(&mut n, 0, a.pd, 64, AccessFlags::LOCAL_WRITE);
    let mut rd = SendWr::new(
        2,
        SendOp::RdmaRead {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        },
        vec![sge(&dst)],
    );
    rd.flags = SendFlags::SIGNALED | SendFlags::FENCE;
    post(&mut n, &a, rd);
    settle(&mut n);
    let sc = drain(&mut n, &a);
    assert_eq!(sc.len(), 1, "only the signalled READ completes: {sc:?}");
    assert_eq!(sc[0].wr_id, 2);
    let expect: Vec<u8> = (0..64u64)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(9))
        .collect();
    assert_eq!(read(&mut n, 0, dst.addr, 64), expect);
}

/// After an error, the failed WR completes with its status and everything
/// else, queued or posted later, with WR_FLUSH_ERR in order on both queues.
fn assert_flushed_after(n: &mut Network, e: &QpEnd, first: WcStatus, wr_ids: &[u64]) {
    let sc = drain(n, e);
    assert!(!sc.is_empty(), "no completions");
    assert_eq!(sc[0].status, first, "{sc:?}");
    let rest: Vec<_> = sc[1..].iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<_> = wr_ids.iter().map(|&i| (i, WcStatus::WrFlushErr)).collect();
    assert_eq!(rest, want);
    assert_eq!(n.node(e.node).qp_state(e.qpn), Some(QpState::Err));
    assert!(n.node(e.node).qp_error_reason(e.qpn).is_some());
    // Posting after the error flushes at once.
    let now = n.now();
    n.node(e.node)
        .post_send(now, e.qpn, SendWr::new(999, SendOp::Send, vec![]))
        .unwrap();
    let late = drain(n, e);
    assert_eq!(
        late.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(999, WcStatus::WrFlushErr)]
    );
}

#[test]
fn loc_prot_err_on_bad_lkey_then_flush() {
    let mut n = net(4, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let src = buf(&mut n, 0, a.pd, 100, AccessFlags::empty());
    let rb = buf(&mut n, 1, b.pd, 100, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 1, &rb);
    let mut bad = sge(&src);
    bad.lkey ^= 0x55;
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![bad]));
    post(&mut n, &a, SendWr::new(2, SendOp::Send, vec![sge(&src)]));
    post(&mut n, &a, SendWr::new(3, SendOp::Send, vec![sge(&src)]));
    settle(&mut n);
    assert_flushed_after(&mut n, &a, WcStatus::LocProtErr, &[2, 3]);
}

fn rem_access_case(seed: u64, mutate: impl Fn(&Buf) -> (u64, u32), access: AccessFlags) {
    let mut n = net(seed, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let src = buf(&mut n, 0, a.pd, 100, AccessFlags::empty());
    let remote = buf(&mut n, 1, b.pd, 100, access);
    let rb = buf(&mut n, 1, b.pd, 100, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 50, &rb);
    let (va, rkey) = mutate(&remote);
    post(
        &mut n,
        &a,
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: va,
                rkey,
            },
            vec![sge(&src)],
        ),
    );
    post(&mut n, &a, SendWr::new(2, SendOp::Send, vec![sge(&src)]));
    settle(&mut n);
    assert_flushed_after(&mut n, &a, WcStatus::RemAccessErr, &[2]);
    // The responder went to ERR too (class C) and flushed its receive.
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Err));
    let rc = drain(&mut n, &b);
    assert_eq!(
        rc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(50, WcStatus::WrFlushErr)]
    );
    let ev: Vec<_> = std::iter::from_fn(|| n.node(1).poll_event())
        .map(|e| e.kind)
        .collect();
    assert!(ev.contains(&AsyncEventKind::QpAccessErr), "{ev:?}");
}

#[test]
fn rem_access_err_bad_rkey() {
    rem_access_case(5, |r| (r.addr, r.rkey ^ 0x3), ALL);
}

/// A 4-packet WRITE with a bad rkey: the first packet gets the access NAK
/// and puts the responder in ERR; the other three reach a QP that takes
/// nothing. Kernel rxe counts `rcvd_pkts` only for packets that pass
/// hdr_check (QP type and state included), so the responder counts 1
/// received packet and 3 dropped (`rcvd_bad_qp`); found against kernel
/// rxe by conformance-tests' p-bad-rkey (kernel 1, rxe-emu 4 before).
#[test]
fn packets_to_a_qp_in_err_are_not_counted_as_received() {
    let mut n = net(9, LinkConfig::perfect());
    let o = ConnectOpts {
        mtu: Mtu::M1024,
        ..ConnectOpts::default()
    };
    let (a, b) = pair(&mut n, QpType::Rc, &o);
    let src = buf(&mut n, 0, a.pd, 4096, AccessFlags::empty());
    let remote = buf(&mut n, 1, b.pd, 4096, ALL);
    post(
        &mut n,
        &a,
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey ^ 0x5a00,
            },
            vec![sge(&src)],
        ),
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &a)[0].status, WcStatus::RemAccessErr);
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Err));
    let c = n.node(1).counters();
    assert_eq!(c.rcvd_pkts, 1, "only the WRITE_FIRST reached a live QP");
    assert_eq!(c.rcvd_bad_qp, 3);
    assert_eq!(n.node(0).counters().sent_pkts, 4);
}

/// `rdma_sends` counts completed SEND WQEs on the requester, `rdma_recvs`
/// completed receive WQEs on the responder, one per message whatever its
/// packet count: what kernel rxe 6.1 shows for the same workload
/// (conformance-tests' p-send: kernel requester 11 per 11 messages;
/// rxe-emu counted every SEND packet on the responder before).
#[test]
fn rdma_sends_counts_send_wqes_on_the_requester() {
    let mut n = net(10, LinkConfig::perfect());
    let o = ConnectOpts {
        mtu: Mtu::M1024,
        ..ConnectOpts::default()
    };
    let (a, b) = pair(&mut n, QpType::Rc, &o);
    let src = buf(&mut n, 0, a.pd, 4096, AccessFlags::empty());
    let remote = buf(&mut n, 1, b.pd, 4096, ALL);
    for k in 0..2 {
        let rb = buf(&mut n, 1, b.pd, 4096, AccessFlags::LOCAL_WRITE);
        post_recv(&mut n, &b, k, &rb);
        post(&mut n, &a, SendWr::new(k, SendOp::Send, vec![sge(&src)]));
    }
    post(
        &mut n,
        &a,
        SendWr::new(
            9,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&src)],
        ),
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 3);
    let (req, resp) = (n.node(0).counters().clone(), n.node(1).counters().clone());
    assert_eq!((req.rdma_sends, req.rdma_recvs), (2, 0));
    assert_eq!((resp.rdma_sends, resp.rdma_recvs), (0, 2));
    assert_eq!(resp.rcvd_pkts, 12, "3 messages of 4 packets");
}

#[test]
fn rem_access_err_out_of_bounds() {
    rem_access_case(6, |r| (r.addr + 50, r.rkey), ALL);
}

#[test]
fn rem_access_err_missing_flag() {
    rem_access_case(
        7,
        |r| (r.addr, r.rkey),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    );
}

#[test]
fn rnr_retry_exceeded_when_peer_never_posts() {
    let mut n = net(8, LinkConfig::perfect());
    let o = ConnectOpts {
        rnr_retry: 3,
        min_rnr_timer: 1,
        ..ConnectOpts::default()
    };
    let (a, _b) = pair(&mut n, QpType::Rc, &o);
    let src = buf(&mut n, 0, a.pd, 10, AccessFlags::empty());
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![sge(&src)]));
    post(&mut n, &a, SendWr::new(2, SendOp::Send, vec![sge(&src)]));
    settle(&mut n);
    assert_eq!(
        n.node(0).counters().rcvd_rnr_err,
        4,
        "initial try + 3 retries"
    );
    assert_eq!(n.node(1).counters().send_rnr_err, 4);
    assert_eq!(n.node(0).counters().retry_rnr_exceeded_err, 1);
    assert_flushed_after(&mut n, &a, WcStatus::RnrRetryExcErr, &[2]);
}

#[test]
fn rnr_then_success_when_receive_posted_late() {
    let mut n = net(9, LinkConfig::perfect());
    let o = ConnectOpts {
        rnr_retry: 7,
        min_rnr_timer: 14,
        ..ConnectOpts::default()
    }; // 1.28 ms
    let (a, b) = pair(&mut n, QpType::Rc, &o);
    let src = buf(&mut n, 0, a.pd, 2000, AccessFlags::empty());
    fill(&mut n, 0, &src, 3);
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![sge(&src)]));
    // Let it be refused a few times (rnr_retry 7 = forever).
    let t = n.now() + Duration::from_millis(10);
    n.run_until(t, |_| false);
    let rnrs = n.node(0).counters().rcvd_rnr_err;
    assert!(rnrs >= 5, "expected repeated RNR NAKs, got {rnrs}");
    // The back-off follows the timer: no more than 10 ms / 1.28 ms + 1 tries.
    assert!(rnrs <= 9, "RNR back-off too short: {rnrs} NAKs in 10 ms");
    let rb = buf(&mut n, 1, b.pd, 2000, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 5, &rb);
    settle(&mut n);
    let sc = drain(&mut n, &a);
    assert_eq!(
        sc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(
        read(&mut n, 1, rb.addr, 2000),
        read(&mut n, 0, src.addr, 2000)
    );
}

#[test]
fn retry_exceeded_when_peer_vanishes() {
    let mut n = net(10, LinkConfig::perfect());
    let o = ConnectOpts {
        retry_cnt: 3,
        timeout: 12,
        ..ConnectOpts::default()
    }; // 16.8 ms
    let (a, b) = pair(&mut n, QpType::Rc, &o);
    n.node(1).destroy_qp(b.qpn).unwrap();
    let src = buf(&mut n, 0, a.pd, 10, AccessFlags::empty());
    let start = n.now();
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![sge(&src)]));
    post(
        &mut n,
        &a,
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: 0,
                rkey: 0,
            },
            vec![sge(&src)],
        ),
    );
    let limit = start + Duration::from_secs(5);
    n.run_until(limit, |n| n.node(0).cq_len(a.send_cq) > 0);
    let took = n.now() - start;
    // 1 try + 3 retries, each waiting 4.096 µs × 2^12.
    let per = Duration::from_nanos(4096 << 12);
    assert!(
        took >= per * 4 && took <= per * 4 + Duration::from_millis(1),
        "took {took:?}"
    );
    assert_eq!(n.node(0).counters().retry_exceeded_err, 1);
    assert_flushed_after(&mut n, &a, WcStatus::RetryExcErr, &[2]);
}

#[test]
fn modify_qp_wrong_mask_names_the_attribute() {
    let mut n = net(11, LinkConfig::perfect());
    let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let now = n.now();
    let e = n.node(0);
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        port_num: 1,
        ..QpAttr::default()
    };
    let err = e
        .modify_qp(
            now,
            a.qpn,
            &init,
            QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX,
        )
        .unwrap_err();
    assert_eq!(err.errno(), 22);
    assert!(err.to_string().contains("IBV_QP_ACCESS_FLAGS"), "{err}");
    let err = e
        .modify_qp(
            now,
            a.qpn,
            &QpAttr {
                qp_state: Some(QpState::Rts),
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("RESET") && err.to_string().contains("RTS"),
        "{err}"
    );
    assert_eq!(e.qp_state(a.qpn), Some(QpState::Reset));
}

#[test]
fn local_len_err_on_small_receive() {
    let mut n = net(12, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let src = buf(&mut n, 0, a.pd, 100, AccessFlags::empty());
    let small = buf(&mut n, 1, b.pd, 50, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 1, &small);
    post_recv(&mut n, &b, 2, &small);
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![sge(&src)]));
    settle(&mut n);
    assert_flushed_after(&mut n, &a, WcStatus::RemInvReqErr, &[]);
    let rc = drain(&mut n, &b);
    assert_eq!(
        rc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn uc_send_and_write() {
    let mut n = net(13, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Uc, &ConnectOpts::default());
    let src = buf(&mut n, 0, a.pd, 5000, AccessFlags::empty());
    fill(&mut n, 0, &src, 4);
    let rb = buf(&mut n, 1, b.pd, 5000, AccessFlags::LOCAL_WRITE);
    let remote = buf(&mut n, 1, b.pd, 5000, ALL);
    post_recv(&mut n, &b, 1, &rb);
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![sge(&src)]));
    post(
        &mut n,
        &a,
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&src)],
        ),
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 2);
    assert_eq!(drain(&mut n, &b).len(), 1);
    let s = read(&mut n, 0, src.addr, 5000);
    assert_eq!(read(&mut n, 1, rb.addr, 5000), s);
    assert_eq!(read(&mut n, 1, remote.addr, 5000), s);
    // READ is not a UC operation.
    let now = n.now();
    let err = n
        .node(0)
        .post_send(
            now,
            a.qpn,
            SendWr::new(
                3,
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: 0,
                },
                vec![],
            ),
        )
        .unwrap_err();
    assert!(err.to_string().contains("UC"), "{err}");
}

#[test]
fn ud_send_with_grh() {
    let mut n = net(14, LinkConfig::perfect());
    let a = n.create_endpoint(0, QpType::Ud, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Ud, None, None, 8).unwrap();
    n.activate_ud(&a, 0x1111, 5).unwrap();
    n.activate_ud(&b, 0x2222, 9).unwrap();
    let src = buf(&mut n, 0, a.pd, 200, AccessFlags::empty());
    fill(&mut n, 0, &src, 5);
    let rb = buf(&mut n, 1, b.pd, 240, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 1, &rb);
    let gid_b = {
        let ip: std::net::Ipv4Addr = B_IP.parse().unwrap();
        ip.to_ipv6_mapped().octets()
    };
    let ah = n
        .node(0)
        .create_ah(
            a.pd,
            &AhAttr {
                dgid: gid_b,
                is_global: true,
                port_num: 1,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let mut wr = SendWr::new(1, SendOp::SendWithImm { imm: 7 }, vec![sge(&src)]);
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: b.qpn,
        remote_qkey: 0x2222,
    });
    post(&mut n, &a, wr.clone());
    // Wrong Q_Key: dropped silently.
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: b.qpn,
        remote_qkey: 0x3333,
    });
    post(&mut n, &a, wr);
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 2);
    let rc = drain(&mut n, &b);
    assert_eq!(rc.len(), 1);
    assert_eq!(rc[0].byte_len, 240);
    assert_eq!(rc[0].src_qp, a.qpn);
    assert!(rc[0].wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    // The packet type, as ConnectX reports it in `sl` (RoCE v2 over IPv4):
    // UCX reads it to find the destination address in the 40 bytes.
    assert_eq!(rc[0].sl, 0xA);
    let grh = read(&mut n, 1, rb.addr, 40);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20], 0x45, "IPv4 header in the second half of the GRH");
    assert_eq!(&grh[32..36], &[10, 0, 0, 1]);
    // The destination address ends the 40 bytes (what UCX compares with
    // its own address).
    assert_eq!(&grh[36..40], &[10, 0, 0, 2]);
    assert_eq!(
        read(&mut n, 1, rb.addr + 40, 200),
        read(&mut n, 0, src.addr, 200)
    );
    assert_eq!(n.node(1).counters().rcvd_qkey_err, 1);
}

/// Over IPv6 the 40 bytes are the IPv6 header and `sl` says so (0x9).
#[test]
fn ud_over_ipv6_reports_the_ipv6_packet_type() {
    let mut n = Network::new(41, LinkConfig::perfect());
    n.add_node(node_config("fd00::1".parse().unwrap(), 41));
    n.add_node(node_config("fd00::2".parse().unwrap(), 42));
    let a = n.create_endpoint(0, QpType::Ud, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Ud, None, None, 8).unwrap();
    n.activate_ud(&a, 0x1111, 5).unwrap();
    n.activate_ud(&b, 0x2222, 9).unwrap();
    let src = buf(&mut n, 0, a.pd, 16, AccessFlags::empty());
    let rb = buf(&mut n, 1, b.pd, 56, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 1, &rb);
    let dgid: std::net::Ipv6Addr = "fd00::2".parse().unwrap();
    let ah = n
        .node(0)
        .create_ah(
            a.pd,
            &AhAttr {
                dgid: dgid.octets(),
                is_global: true,
                port_num: 1,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let mut wr = SendWr::new(1, SendOp::Send, vec![sge(&src)]);
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: b.qpn,
        remote_qkey: 0x2222,
    });
    post(&mut n, &a, wr);
    settle(&mut n);
    let rc = drain(&mut n, &b);
    assert_eq!(rc.len(), 1);
    assert_eq!(rc[0].sl, 0x9);
    let grh = read(&mut n, 1, rb.addr, 40);
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(&grh[24..40], &dgid.octets());
}

#[test]
fn srq_shared_by_two_qps_with_limit_event() {
    let mut n = net(15, LinkConfig::perfect());
    let pd_b = n.node(1).alloc_pd().unwrap();
    let srq = n
        .node(1)
        .create_srq(
            pd_b,
            SrqAttr {
                max_wr: 16,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .unwrap();
    let a1 = n.create_endpoint(0, QpType::Rc, None, None, 16).unwrap();
    let a2 = n.create_endpoint(0, QpType::Rc, None, None, 16).unwrap();
    let b1 = n
        .create_endpoint(1, QpType::Rc, Some(pd_b), Some(srq), 16)
        .unwrap();
    let b2 = n
        .create_endpoint(1, QpType::Rc, Some(pd_b), Some(srq), 16)
        .unwrap();
    n.connect(&a1, &b1, &ConnectOpts::default()).unwrap();
    n.connect(&a2, &b2, &ConnectOpts::default()).unwrap();
    let bufs: Vec<Buf> = (0..6)
        .map(|_| buf(&mut n, 1, pd_b, 64, AccessFlags::LOCAL_WRITE))
        .collect();
    for (i, b) in bufs.iter().enumerate() {
        n.node(1)
            .post_srq_recv(
                srq,
                RecvWr {
                    wr_id: i as u64,
                    sg_list: vec![sge(b)],
                },
            )
            .unwrap();
    }
    n.node(1).modify_srq_limit(srq, 3).unwrap();
    let s1 = buf(&mut n, 0, a1.pd, 64, AccessFlags::empty());
    let s2 = buf(&mut n, 0, a2.pd, 64, AccessFlags::empty());
    for i in 0..2 {
        post(&mut n, &a1, SendWr::new(i, SendOp::Send, vec![sge(&s1)]));
        post(
            &mut n,
            &a2,
            SendWr::new(10 + i, SendOp::Send, vec![sge(&s2)]),
        );
    }
    settle(&mut n);
    let mut got: Vec<u64> = drain(&mut n, &b1)
        .iter()
        .chain(drain(&mut n, &b2).iter())
        .map(|w| w.wr_id)
        .collect();
    got.sort();
    assert_eq!(got, vec![0, 1, 2, 3]);
    let ev: Vec<_> = std::iter::from_fn(|| n.node(1).poll_event())
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        ev.iter()
            .filter(|k| **k == AsyncEventKind::SrqLimitReached)
            .count(),
        1,
        "{ev:?}"
    );
    assert_eq!(n.node(1).query_srq(srq).unwrap().1, 2);
}

#[test]
fn cq_overflow_raises_cq_err_and_poll_reports_it() {
    let mut n = net(16, LinkConfig::perfect());
    let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    let cq_small = a.send_cq; // 8 * 4 = 32 entries
    let src = buf(&mut n, 0, a.pd, 8, AccessFlags::empty());
    let remote = buf(&mut n, 1, b.pd, 8, ALL);
    for round in 0..5u64 {
        for i in 0..8 {
            post(
                &mut n,
                &a,
                SendWr::new(
                    round * 8 + i,
                    SendOp::RdmaWrite {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                    },
                    vec![sge(&src)],
                ),
            );
        }
        settle(&mut n);
    }
    assert!(n.node(0).counters().cq_overflow > 0);
    let ev: Vec<_> = std::iter::from_fn(|| n.node(0).poll_event())
        .map(|e| e.kind)
        .collect();
    assert!(ev.contains(&AsyncEventKind::CqErr), "{ev:?}");
    let got = n.node(0).poll_cq(cq_small, 1000).unwrap();
    assert_eq!(got.len(), 32);
    assert!(n.node(0).poll_cq(cq_small, 1).is_err());
}

#[test]
fn memory_window_type2_bind_write_and_send_with_invalidate() {
    let mut n = net(17, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let region = buf(&mut n, 1, b.pd, 4096, ALL | AccessFlags::MW_BIND);
    let mw = n.node(1).alloc_mw(b.pd, MwType::Type2).unwrap();
    let bind = MwBindInfo {
        mr_lkey: region.lkey,
        addr: region.addr + 1024,
        length: 512,
        access: AccessFlags::REMOTE_WRITE,
    };
    post(
        &mut n,
        &b,
        SendWr::new(
            1,
            SendOp::BindMw {
                mw_rkey: mw,
                new_key: 0x5a,
                bind,
            },
            vec![],
        ),
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &b)[0].status, WcStatus::Success);
    let key = (mw & !0xff) | 0x5a;
    let src = buf(&mut n, 0, a.pd, 512, AccessFlags::empty());
    fill(&mut n, 0, &src, 8);
    post(
        &mut n,
        &a,
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: region.addr + 1024,
                rkey: key,
            },
            vec![sge(&src)],
        ),
    );
    // Send with invalidate revokes the window.
    let rb = buf(&mut n, 1, b.pd, 16, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 9, &rb);
    post(
        &mut n,
        &a,
        SendWr::new(2, SendOp::SendWithInv { rkey: key }, vec![]),
    );
    settle(&mut n);
    assert_eq!(
        read(&mut n, 1, region.addr + 1024, 512),
        read(&mut n, 0, src.addr, 512)
    );
    let rc = drain(&mut n, &b);
    assert_eq!(rc.len(), 1);
    assert!(rc[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(rc[0].invalidated_rkey, key);
    // Now the window is gone: the next WRITE fails with REM_ACCESS_ERR.
    post(
        &mut n,
        &a,
        SendWr::new(
            3,
            SendOp::RdmaWrite {
                remote_addr: region.addr + 1024,
                rkey: key,
            },
            vec![sge(&src)],
        ),
    );
    settle(&mut n);
    let sc = drain(&mut n, &a);
    assert_eq!(
        sc.iter().map(|w| w.status).collect::<Vec<_>>(),
        vec![WcStatus::Success, WcStatus::Success, WcStatus::RemAccessErr]
    );
    // The application frees the window by what ibv_alloc_mw returned, the
    // rkey with the old key byte (as pyverbs' test_mw_type2 does).
    assert_ne!(key, mw);
    n.node(1).dealloc_mw(mw).unwrap();
    assert!(n.node(1).dealloc_mw(mw).is_err(), "freed twice");
}

#[test]
fn link_local_gid_of_an_ipv4_address_routes_to_that_address() {
    use std::net::{IpAddr, Ipv4Addr};
    let v4 = IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3));
    let ll = rxe_core::derived_link_local(v4);
    assert_eq!(ll.to_string(), "fe80::aff:fe01:203");
    assert_eq!(rxe_core::gid_to_ip(ll.octets()), v4);
    // IPv4-mapped and other IPv6 GIDs are what they say.
    assert_eq!(rxe_core::gid_to_ip(rxe_core::ip_to_gid(v4)), v4);
    let real_ll: std::net::Ipv6Addr = "fe80::5054:ff:fe12:3456".parse().unwrap();
    assert_eq!(rxe_core::gid_to_ip(real_ll.octets()), IpAddr::V6(real_ll));
    // The IPv6 form is marked apart, so it never reads as IPv4.
    let v6: IpAddr = "fd00::1:a01:203".parse().unwrap();
    let ll6 = rxe_core::derived_link_local(v6);
    assert!(rxe_core::gid_to_ip(ll6.octets()).is_ipv6());
}

#[test]
fn sqd_drains_then_raises_sq_drained() {
    let mut n = net(18, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let src = buf(&mut n, 0, a.pd, 10_000, AccessFlags::empty());
    let remote = buf(&mut n, 1, b.pd, 10_000, ALL);
    post(
        &mut n,
        &a,
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&src)],
        ),
    );
    let now = n.now();
    n.node(0)
        .modify_qp(
            now,
            a.qpn,
            &QpAttr {
                qp_state: Some(QpState::Sqd),
                en_sqd_async_notify: true,
                ..QpAttr::default()
            },
            QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY,
        )
        .unwrap();
    // While WR 1 drains, only ERR may be entered (kernel rxe_qp_chk_attr).
    let back = n.node(0).modify_qp(
        now,
        a.qpn,
        &QpAttr {
            qp_state: Some(QpState::Rts),
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    );
    let msg = back.expect_err("SQD -> RTS while draining").to_string();
    assert!(msg.contains("drain"), "{msg}");
    assert_eq!(n.node(0).qp_state(a.qpn), Some(QpState::Sqd));
    post(
        &mut n,
        &a,
        SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&src)],
        ),
    );
    settle(&mut n);
    let ev: Vec<_> = std::iter::from_fn(|| n.node(0).poll_event())
        .map(|e| e.kind)
        .collect();
    assert!(ev.contains(&AsyncEventKind::SqDrained), "{ev:?}");
    assert_eq!(
        drain(&mut n, &a)
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>(),
        vec![1],
        "WR 2 waits in SQD"
    );
    let now = n.now();
    n.node(0)
        .modify_qp(
            now,
            a.qpn,
            &QpAttr {
                qp_state: Some(QpState::Rts),
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    settle(&mut n);
    assert_eq!(
        drain(&mut n, &a)
            .iter()
            .map(|w| w.wr_id)
            .collect::<Vec<_>>(),
        vec![2]
    );
}

#[test]
fn completion_notification_fires_once_per_arm() {
    let mut n = net(19, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let src = buf(&mut n, 0, a.pd, 8, AccessFlags::empty());
    let rb = buf(&mut n, 1, b.pd, 8, AccessFlags::LOCAL_WRITE);
    n.node(1).req_notify_cq(b.recv_cq, true).unwrap();
    post_recv(&mut n, &b, 1, &rb);
    post_recv(&mut n, &b, 2, &rb);
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![sge(&src)]));
    settle(&mut n);
    assert_eq!(
        n.node(1).poll_cq_notification(),
        None,
        "unsolicited send must not wake a solicited-only arm"
    );
    let mut wr = SendWr::new(2, SendOp::Send, vec![sge(&src)]);
    wr.flags |= SendFlags::SOLICITED;
    post(&mut n, &a, wr);
    settle(&mut n);
    assert_eq!(n.node(1).poll_cq_notification(), Some(b.recv_cq));
    assert_eq!(n.node(1).poll_cq_notification(), None);
}

#[test]
fn psn_wraps_around() {
    let mut n = net(20, LinkConfig::perfect());
    let o = ConnectOpts {
        psn_a: 0x00ff_fffe,
        psn_b: 0x00ff_ffff,
        mtu: Mtu::M256,
        ..ConnectOpts::default()
    };
    let (a, b) = pair(&mut n, QpType::Rc, &o);
    let src = buf(&mut n, 0, a.pd, 2000, AccessFlags::empty());
    fill(&mut n, 0, &src, 1);
    let remote = buf(&mut n, 1, b.pd, 2000, ALL);
    let back = buf(&mut n, 0, a.pd, 2000, AccessFlags::LOCAL_WRITE);
    post(
        &mut n,
        &a,
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&src)],
        ),
    );
    post(
        &mut n,
        &a,
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&back)],
        ),
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 2);
    assert_eq!(
        read(&mut n, 0, back.addr, 2000),
        read(&mut n, 0, src.addr, 2000)
    );
    let (attr, _) = n.node(0).query_qp(a.qpn).unwrap();
    assert_eq!(attr.sq_psn, (0x00ff_fffe + 8 + 8) & 0xff_ffff);
}

#[test]
fn lossy_link_rc_recovers_byte_exact() {
    let link = LinkConfig {
        loss: 0.05,
        duplicate: 0.03,
        reorder: 0.05,
        corrupt: 0.02,
        ..LinkConfig::perfect()
    };
    let mut n = net(21, link);
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    let src = buf(&mut n, 0, a.pd, 1 << 20, AccessFlags::empty());
    fill(&mut n, 0, &src, 77);
    let remote = buf(&mut n, 1, b.pd, 1 << 20, ALL);
    let back = buf(&mut n, 0, a.pd, 1 << 20, AccessFlags::LOCAL_WRITE);
    post(
        &mut n,
        &a,
        SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&src)],
        ),
    );
    post(
        &mut n,
        &a,
        SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            vec![sge(&back)],
        ),
    );
    let limit = n.now() + Duration::from_secs(120);
    assert!(n.run_until(limit, |n| n.node(0).cq_len(a.send_cq) == 2));
    let sc = drain(&mut n, &a);
    assert!(sc.iter().all(|w| w.status == WcStatus::Success), "{sc:?}");
    settle(&mut n); // let corrupted datagrams still in flight arrive
    assert_eq!(
        read(&mut n, 1, remote.addr, 1 << 20),
        read(&mut n, 0, src.addr, 1 << 20)
    );
    assert_eq!(
        read(&mut n, 0, back.addr, 1 << 20),
        read(&mut n, 0, src.addr, 1 << 20)
    );
    let st = n.stats().clone();
    assert!(
        st.lost > 0 && st.corrupted > 0 && st.duplicated > 0,
        "{st:?}"
    );
    let icrc = n.nodes()[0].counters().rcvd_icrc_err + n.nodes()[1].counters().rcvd_icrc_err;
    assert_eq!(
        icrc, st.corrupted,
        "every corrupted datagram is caught by the ICRC"
    );
    let _ = Instant::ZERO;
}

/// What `rxe-emu trace` shows of a requester's recovery: each RNR NAK with
/// its wait and the RNR retries left, each timeout with the retries left,
/// and the final move to ERR with its reason.
#[test]
fn traced_recovery_says_what_happens_next_and_how_many_retries_are_left() {
    let mut n = net(10, LinkConfig::perfect());
    let o = ConnectOpts {
        rnr_retry: 2,
        min_rnr_timer: 12,
        ..ConnectOpts::default()
    };
    let (a, _b) = pair(&mut n, QpType::Rc, &o);
    n.node(0).set_tracing(true);
    let src = buf(&mut n, 0, a.pd, 10, AccessFlags::empty());
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![sge(&src)]));
    settle(&mut n);
    let notes: Vec<String> = std::iter::from_fn(|| n.node(0).poll_note()).collect();
    let rnr: Vec<&String> = notes
        .iter()
        .filter(|l| l.contains("RNR NAK for psn"))
        .collect();
    assert_eq!(rnr.len(), 2, "{notes:#?}");
    assert!(
        rnr[0].contains(
            "no receive posted; resending in 0.64 ms (timer code 12), 1 RNR retries left"
        ),
        "{notes:#?}"
    );
    assert!(rnr[1].contains("0 RNR retries left"), "{notes:#?}");
    assert!(
        notes.iter().any(|l| l
            .contains("-> ERR: SEND (wr_id 1) completed with IBV_WC_RNR_RETRY_EXC_ERR")
            && l.contains("more times than rnr_retry = 2 allows")),
        "{notes:#?}"
    );

    // A peer that vanished: every timeout says so, then RETRY_EXC_ERR.
    let mut n = net(
        11,
        LinkConfig {
            loss: 1.0,
            ..LinkConfig::perfect()
        },
    );
    let o = ConnectOpts {
        retry_cnt: 2,
        timeout: 10,
        ..ConnectOpts::default()
    };
    let (a, b) = pair(&mut n, QpType::Rc, &o);
    let rb = buf(&mut n, 1, b.pd, 10, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 9, &rb);
    n.node(0).set_tracing(true);
    let src = buf(&mut n, 0, a.pd, 10, AccessFlags::empty());
    post(&mut n, &a, SendWr::new(1, SendOp::Send, vec![sge(&src)]));
    settle(&mut n);
    let notes: Vec<String> = std::iter::from_fn(|| n.node(0).poll_note()).collect();
    let timeouts: Vec<&String> = notes
        .iter()
        .filter(|l| l.contains("no ACK for psn"))
        .collect();
    assert_eq!(timeouts.len(), 2, "{notes:#?}");
    assert!(
        timeouts[0].contains("within 4.194 ms (timeout 10); resending from psn")
            && timeouts[0].ends_with("1 retries left"),
        "{notes:#?}"
    );
    assert!(timeouts[1].ends_with("0 retries left"), "{notes:#?}");
    assert!(
        notes.iter().any(|l| l
            .contains("-> ERR: SEND (wr_id 1) completed with IBV_WC_RETRY_EXC_ERR")
            && l.contains("no valid response for PSN")),
        "{notes:#?}"
    );
}

/// Each QP keeps its share of the device's counters: over a link that
/// loses, duplicates and reorders, the QPs' counters add up to the
/// device's, and each QP's are its own.
#[test]
fn per_qp_counters_add_up_to_the_device_counters() {
    let mut n = net(
        12,
        LinkConfig {
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
            ..LinkConfig::perfect()
        },
    );
    let o = ConnectOpts {
        timeout: 10,
        ..ConnectOpts::default()
    };
    let pairs: Vec<(QpEnd, QpEnd)> = (0..3).map(|_| pair(&mut n, QpType::Rc, &o)).collect();
    for (i, (a, b)) in pairs.iter().enumerate() {
        let src = buf(&mut n, 0, a.pd, 3000, AccessFlags::empty());
        fill(&mut n, 0, &src, i as u8);
        // Pair i sends i + 1 times as many messages as pair 0.
        for k in 0..20 * (i as u64 + 1) {
            let rb = buf(&mut n, 1, b.pd, 3000, AccessFlags::LOCAL_WRITE);
            post_recv(&mut n, b, k, &rb);
            post(&mut n, a, SendWr::new(k, SendOp::Send, vec![sge(&src)]));
            settle(&mut n);
        }
        assert!(drain(&mut n, a)
            .iter()
            .all(|w| w.status == WcStatus::Success));
    }
    for node in 0..2 {
        let dev = n.node(node).counters().clone();
        let qps = n.node(node).qp_summaries();
        assert_eq!(qps.len(), 3);
        let sum =
            |f: fn(&rxe_core::Counters) -> u64| qps.iter().map(|q| f(&q.counters)).sum::<u64>();
        assert_eq!(sum(|c| c.sent_pkts), dev.sent_pkts, "node {node}");
        assert_eq!(
            sum(|c| c.rcvd_pkts),
            dev.rcvd_pkts,
            "node {node}: every parsed packet reached a QP"
        );
        assert_eq!(sum(|c| c.duplicate_request), dev.duplicate_request);
        assert_eq!(sum(|c| c.out_of_seq_request), dev.out_of_seq_request);
        assert_eq!(sum(|c| c.rcvd_seq_err), dev.rcvd_seq_err);
        assert_eq!(sum(|c| c.completer_retry_err), dev.completer_retry_err);
        assert_eq!(sum(|c| c.retrans_timeouts), dev.retrans_timeouts);
        assert_eq!(sum(|c| c.rdma_recvs), dev.rdma_recvs);
        assert_eq!(sum(|c| c.rcvd_ignored_resp), dev.rcvd_ignored_resp);
        // A QP's traffic is its own: more messages, more packets.
        let sent: Vec<u64> = qps.iter().map(|q| q.counters.sent_pkts).collect();
        assert!(
            sent[0] < sent[1] && sent[1] < sent[2],
            "node {node}: {sent:?}"
        );
    }
    // The faults showed up, so the sums above compared something.
    let (a, b) = (n.node(0).counters().clone(), n.node(1).counters().clone());
    assert!(
        a.completer_retry_err > 0 && b.duplicate_request > 0,
        "{a:?} {b:?}"
    );
    assert_eq!(b.rdma_recvs, 20 + 40 + 60);
}

/// IBTA 10.5.2.3 / kernel rxe_rcv_mcast_pkt: a UD SEND to QPN 0xFFFFFF and
/// a group's address reaches every QP attached to the group (on every
/// node, the sender's included), each consuming its own receive WQE; a
/// member with another Q_Key drops its copy; detached QPs get nothing.
#[test]
fn ud_multicast_reaches_every_attached_qp_once() {
    let mut n = net(77, LinkConfig::perfect());
    let group: [u8; 16] = std::net::Ipv4Addr::new(239, 1, 2, 3)
        .to_ipv6_mapped()
        .octets();
    let a = n.create_endpoint(0, QpType::Ud, None, None, 8).unwrap();
    let a2 = n.create_endpoint(0, QpType::Ud, None, None, 8).unwrap();
    let b1 = n.create_endpoint(1, QpType::Ud, None, None, 8).unwrap();
    let b2 = n.create_endpoint(1, QpType::Ud, None, None, 8).unwrap();
    let b3 = n.create_endpoint(1, QpType::Ud, None, None, 8).unwrap();
    for (e, qkey) in [(&a, 7), (&a2, 7), (&b1, 7), (&b2, 7), (&b3, 8)] {
        n.activate_ud(e, qkey, 1).unwrap();
    }
    // Only UD QPs join, only multicast GIDs name groups.
    let rc = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    let err = n.node(1).attach_mcast(rc.qpn, group).unwrap_err();
    assert!(err.to_string().contains("only UD"), "{err}");
    let unicast = std::net::Ipv4Addr::new(10, 0, 0, 2)
        .to_ipv6_mapped()
        .octets();
    assert!(n.node(1).attach_mcast(b1.qpn, unicast).is_err());
    assert!(n.node(0).attach_mcast(a2.qpn, group).unwrap(), "new group");
    assert!(n.node(1).attach_mcast(b1.qpn, group).unwrap(), "new group");
    assert!(!n.node(1).attach_mcast(b2.qpn, group).unwrap());
    assert!(
        !n.node(1).attach_mcast(b2.qpn, group).unwrap(),
        "twice: no-op"
    );
    assert!(!n.node(1).attach_mcast(b3.qpn, group).unwrap());

    let src = buf(&mut n, 0, a.pd, 100, AccessFlags::empty());
    fill(&mut n, 0, &src, 9);
    let rbs: Vec<(QpEnd, Buf)> = [a2, b1, b2, b3]
        .into_iter()
        .map(|e| {
            let b = buf(&mut n, e.node, e.pd, 140, AccessFlags::LOCAL_WRITE);
            post_recv(&mut n, &e, 1, &b);
            let b2 = buf(&mut n, e.node, e.pd, 140, AccessFlags::LOCAL_WRITE);
            post_recv(&mut n, &e, 2, &b2);
            (e, b)
        })
        .collect();
    let ah = n
        .node(0)
        .create_ah(
            a.pd,
            &AhAttr {
                dgid: group,
                is_global: true,
                port_num: 1,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let mut wr = SendWr::new(1, SendOp::SendWithImm { imm: 0x55 }, vec![sge(&src)]);
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: rxe_core::mcast::MULTICAST_QPN,
        remote_qkey: 7,
    });
    post(&mut n, &a, wr.clone());
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 1, "the send completes once");
    for (e, b) in &rbs {
        let wcs = drain(&mut n, e);
        if e.qpn == rbs[3].0.qpn {
            assert!(wcs.is_empty(), "Q_Key 8 member drops it");
            continue;
        }
        assert_eq!(wcs.len(), 1, "QP {:#x} gets one copy", e.qpn);
        assert_eq!(wcs[0].wr_id, 1);
        assert_eq!(wcs[0].byte_len, 140);
        assert_eq!(wcs[0].src_qp, a.qpn);
        assert_eq!(wcs[0].imm_data, 0x55);
        let grh = read(&mut n, e.node, b.addr, 40);
        assert_eq!(&grh[36..40], &[239, 1, 2, 3], "GRH destination: the group");
        assert_eq!(
            read(&mut n, e.node, b.addr + 40, 100),
            read(&mut n, 0, src.addr, 100)
        );
    }
    assert_eq!(n.node(1).counters().rcvd_qkey_err, 1);

    // Detached: b2 gets nothing more; destroying an attached QP is EBUSY.
    n.node(1).detach_mcast(b2.qpn, group).unwrap();
    assert!(
        n.node(1).detach_mcast(b2.qpn, group).is_err(),
        "not attached"
    );
    post(&mut n, &a, wr);
    settle(&mut n);
    assert_eq!(drain(&mut n, &rbs[1].0).len(), 1, "b1: second copy");
    assert!(drain(&mut n, &rbs[2].0).is_empty(), "b2 left the group");
    assert_eq!(drain(&mut n, &rbs[0].0).len(), 1, "a2 on the sender's node");
    let busy = n.node(1).destroy_qp(b1.qpn).unwrap_err();
    assert!(busy.to_string().contains("multicast"), "{busy}");
    assert_eq!(busy.errno(), 16);
    assert_eq!(n.node(1).detach_all_mcast(b1.qpn), Vec::<[u8; 16]>::new());
    assert_eq!(
        n.node(1).detach_all_mcast(b3.qpn),
        vec![group],
        "last one out"
    );
    n.node(1).destroy_qp(b1.qpn).unwrap();
    assert!(n.node(1).mcast_groups().is_empty());
}

/// XRC (IBTA Annex A14) over a lossy link: an XRC_SEND QP on node A
/// reaches XRC SRQs of node B's XRC domain through one XRC_RECV QP. Each
/// request names its SRQ, whose PD guards RDMA and whose CQ takes the
/// receives; on the wire every request is an XRC opcode with an XRCETH.
#[test]
fn xrc_send_write_read_atomic_through_xrc_srqs() {
    use std::sync::{Arc, Mutex};
    let mut n = net(
        91,
        LinkConfig {
            loss: 0.2,
            ..LinkConfig::perfect()
        },
    );
    type Seen = Arc<Mutex<Vec<(u8, Option<u32>)>>>;
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    n.set_tap(move |_, t| {
        if let Ok(p) = wire::PacketRepr::parse(&t.payload) {
            s2.lock()
                .unwrap()
                .push((p.bth.opcode.0, p.xrceth.map(|x| x.srqn)));
        }
    });
    // Node B: an XRC domain, two XRC SRQs (PDs pd1, pd2; CQs), a target QP.
    let b = n.node(1);
    let xrcd = b.alloc_xrcd().unwrap();
    let (pd1, pd2) = (b.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cq1, cq2) = (b.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let attr = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq1 = b.create_xrc_srq(pd1, xrcd, cq1, attr).unwrap();
    let srq2 = b.create_xrc_srq(pd2, xrcd, cq2, attr).unwrap();
    let plain = b.create_srq(pd1, attr).unwrap();
    let (n1, n2) = (b.srq_num(srq1).unwrap(), b.srq_num(srq2).unwrap());
    assert!(b.srq_num(plain).is_err(), "only XRC SRQs have numbers");
    let tgt = b.create_xrc_recv_qp(xrcd).unwrap();
    assert!(
        b.post_recv(
            tgt,
            RecvWr {
                wr_id: 0,
                sg_list: vec![]
            }
        )
        .is_err(),
        "XRC receives go to the SRQ"
    );
    assert!(matches!(
        b.dealloc_xrcd(xrcd),
        Err(rxe_core::Error::Busy(_))
    ));
    // Node A: an initiator (send only).
    let ini = n.create_endpoint(0, QpType::XrcSend, None, None, 16);
    let ini = match ini {
        Ok(e) => e,
        Err(e) => panic!("create XRC_SEND: {e}"),
    };
    let tgt_end = QpEnd {
        node: 1,
        qpn: tgt,
        pd: pd1,
        send_cq: cq1,
        recv_cq: cq1,
    };
    n.connect(&ini, &tgt_end, &ConnectOpts::default()).unwrap();

    // SEND with immediate to SRQ 2: its receive, its CQ.
    let r2 = buf(&mut n, 1, pd2, 600, AccessFlags::LOCAL_WRITE);
    n.node(1)
        .post_srq_recv(
            srq2,
            RecvWr {
                wr_id: 22,
                sg_list: vec![sge(&r2)],
            },
        )
        .unwrap();
    let src = buf(&mut n, 0, ini.pd, 3000, AccessFlags::LOCAL_WRITE);
    fill(&mut n, 0, &src, 7);
    let mut wr = SendWr::new(
        1,
        SendOp::SendWithImm { imm: 0xabc },
        vec![Sge {
            addr: src.addr,
            length: 600,
            lkey: src.lkey,
        }],
    );
    wr.xrc_remote_srqn = Some(n2);
    post(&mut n, &ini, wr);
    // WRITE (3 packets) and READ into pd1's memory through SRQ 1.
    let remote = buf(&mut n, 1, pd1, 4096, ALL);
    let mut wr = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: remote.addr + 8,
            rkey: remote.rkey,
        },
        vec![sge(&src)],
    );
    wr.xrc_remote_srqn = Some(n1);
    post(&mut n, &ini, wr);
    let back = buf(&mut n, 0, ini.pd, 3000, AccessFlags::LOCAL_WRITE);
    let mut wr = SendWr::new(
        3,
        SendOp::RdmaRead {
            remote_addr: remote.addr + 8,
            rkey: remote.rkey,
        },
        vec![sge(&back)],
    );
    wr.xrc_remote_srqn = Some(n1);
    post(&mut n, &ini, wr);
    let old = buf(&mut n, 0, ini.pd, 8, AccessFlags::LOCAL_WRITE);
    let mut wr = SendWr::new(
        4,
        SendOp::AtomicFetchAdd {
            remote_addr: remote.addr + 4000,
            rkey: remote.rkey,
            add: 5,
        },
        vec![sge(&old)],
    );
    wr.xrc_remote_srqn = Some(n1);
    post(&mut n, &ini, wr);
    settle(&mut n);
    let wcs = drain(&mut n, &ini);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [1, 2, 3, 4].map(|i| (i, WcStatus::Success))
    );
    let rc = n.node(1).poll_cq(cq2, 8).unwrap();
    assert_eq!(rc.len(), 1);
    assert_eq!((rc[0].wr_id, rc[0].byte_len, rc[0].qp_num), (22, 600, tgt));
    assert_eq!(rc[0].imm_data, 0xabc);
    assert!(n.node(1).poll_cq(cq1, 8).unwrap().is_empty());
    assert_eq!(
        read(&mut n, 1, r2.addr, 600),
        read(&mut n, 0, src.addr, 600)
    );
    assert_eq!(
        read(&mut n, 1, remote.addr + 8, 3000),
        read(&mut n, 0, src.addr, 3000)
    );
    assert_eq!(
        read(&mut n, 0, back.addr, 3000),
        read(&mut n, 0, src.addr, 3000)
    );
    assert_eq!(read(&mut n, 1, remote.addr + 4000, 8), 5u64.to_ne_bytes());
    // The wire: XRC opcodes only; requests carry the SRQ they name.
    {
        let seen = seen.lock().unwrap();
        assert!(seen.iter().all(|(op, _)| op >> 5 == 0b101), "{seen:?}");
        assert!(
            seen.contains(&(0xa5, Some(n2))),
            "SEND_ONLY_WITH_IMM to SRQ 2"
        );
        assert!(seen.contains(&(0xa6, Some(n1))), "WRITE_FIRST to SRQ 1");
        assert!(seen.contains(&(0xac, Some(n1))), "READ_REQUEST");
        assert!(seen.contains(&(0xb4, Some(n1))), "FETCH_ADD");
        assert!(
            seen.iter().any(|(op, x)| *op == 0xb1 && x.is_none()),
            "ACKs"
        );
        assert!(
            seen.iter().any(|(op, x)| *op == 0xb2 && x.is_none()),
            "atomic ACK"
        );
    }
    assert!(n.stats().lost > 0, "the link lost packets");

    // SRQ 2's PD does not own pd1's MR: an access error, as its rkey's PD
    // differs from the PD of the SRQ the request names.
    let mut wr = SendWr::new(
        5,
        SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        },
        vec![sge(&old)],
    );
    wr.xrc_remote_srqn = Some(n2);
    post(&mut n, &ini, wr);
    settle(&mut n);
    let w = drain(&mut n, &ini);
    assert_eq!(w[0].status, WcStatus::RemAccessErr, "{w:?}");
}

/// A request naming an SRQ that is not an XRC SRQ of the target's domain
/// is NAKed as invalid; a WR without a remote SRQ number is refused at
/// post time; destroy order is enforced.
#[test]
fn xrc_bad_srq_number_and_object_rules() {
    let mut n = net(92, LinkConfig::perfect());
    let b = n.node(1);
    let xrcd = b.alloc_xrcd().unwrap();
    let other = b.alloc_xrcd().unwrap();
    let pd = b.alloc_pd().unwrap();
    let cq = b.create_cq(8).unwrap();
    let attr = SrqAttr {
        max_wr: 4,
        max_sge: 1,
        srq_limit: 0,
    };
    let foreign = b.create_xrc_srq(pd, other, cq, attr).unwrap();
    let foreign_num = b.srq_num(foreign).unwrap();
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
    n.connect(&ini, &tgt_end, &ConnectOpts::default()).unwrap();
    let src = buf(&mut n, 0, ini.pd, 16, AccessFlags::LOCAL_WRITE);
    let now = n.now();
    let err = n
        .node(0)
        .post_send(now, ini.qpn, SendWr::new(1, SendOp::Send, vec![sge(&src)]))
        .unwrap_err();
    assert!(err.to_string().contains("remote XRC SRQ"), "{err}");
    let mut wr = SendWr::new(2, SendOp::Send, vec![sge(&src)]);
    wr.xrc_remote_srqn = Some(foreign_num);
    post(&mut n, &ini, wr);
    settle(&mut n);
    let w = drain(&mut n, &ini);
    assert_eq!(w[0].status, WcStatus::RemInvReqErr, "{w:?}");
    assert_eq!(n.node(1).qp_state(tgt), Some(QpState::Err));
    assert!(n
        .node(1)
        .qp_error_reason(tgt)
        .unwrap()
        .contains("XRC domain"));
    // Objects: the XRCD outlives its SRQs and target QPs.
    let b = n.node(1);
    assert!(b.dealloc_xrcd(other).is_err());
    b.destroy_srq(foreign).unwrap();
    b.dealloc_xrcd(other).unwrap();
    assert!(b.dealloc_xrcd(xrcd).is_err());
    b.destroy_qp(tgt).unwrap();
    b.dealloc_xrcd(xrcd).unwrap();
    assert!(b.create_xrc_recv_qp(xrcd).is_err(), "closed");
}

/// Feed node `node` one datagram from `src` to `dst`, with a valid ICRC.
fn inject(n: &mut Network, node: usize, src: &str, dst: &str, repr: &wire::PacketRepr<'_>) {
    let info = wire::icrc::IpUdpInfo {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        src_port: 50000,
        dst_port: wire::ROCEV2_UDP_PORT,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    };
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf).unwrap();
    wire::icrc::write(&info, &mut buf);
    let now = n.now();
    n.node(node).handle_datagram(
        now,
        &rxe_core::RxDatagram {
            src: info.src,
            dst: info.dst,
            src_port: info.src_port,
            dst_port: info.dst_port,
            ipv4_id: Some(0),
            payload: &buf,
            ecn: rxe_core::Ecn::NotEct,
        },
    );
}

/// A packet with only a BTH (and the given extras) for `dest_qpn`.
fn bare_packet(op: wire::Opcode, dest_qpn: u32) -> wire::PacketRepr<'static> {
    wire::PacketRepr {
        bth: wire::bth::BthRepr {
            opcode: op,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_req: false,
            psn: wire::Psn::new(0),
        },
        rdeth: None,
        deth: None,
        xrceth: None,
        reth: None,
        feth: None,
        atomic: None,
        aeth: None,
        atomic_ack: None,
        immdt: None,
        ieth: None,
        payload: &[],
    }
}

/// Receive-path rules of XRC and multicast: an XRC initiator takes only
/// responses and a target only requests; QPN 0xFFFFFF takes only UD
/// SENDs, and a group datagram counts once as received even with no
/// member here. Each refusal is counted and changes nothing.
#[test]
fn wrong_role_or_transport_datagrams_are_counted_and_dropped() {
    let mut n = net(93, LinkConfig::perfect());
    let b = n.node(1);
    let xrcd = b.alloc_xrcd().unwrap();
    let pd = b.alloc_pd().unwrap();
    let cq = b.create_cq(8).unwrap();
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
    n.connect(&ini, &tgt_end, &ConnectOpts::default()).unwrap();
    let bad = |n: &mut Network, node: usize| n.nodes()[node].counters().rcvd_bad_qp;

    // A request to the initiator.
    let mut req = bare_packet(wire::Opcode::XRC_SEND_ONLY, ini.qpn);
    req.xrceth = Some(wire::xrceth::XrcEthRepr { srqn: 1 });
    let before = bad(&mut n, 0);
    inject(&mut n, 0, B_IP, A_IP, &req);
    assert_eq!(bad(&mut n, 0), before + 1);
    assert!(n.node(0).poll_transmit().is_none(), "no answer");
    assert_eq!(n.node(0).qp_state(ini.qpn), Some(QpState::Rts));

    // A response to the target.
    let mut ack = bare_packet(wire::Opcode::XRC_ACKNOWLEDGE, tgt);
    ack.aeth = Some(wire::aeth::AethRepr {
        syndrome: wire::aeth::Syndrome::from_raw(0x1f),
        msn: 0,
    });
    let before = bad(&mut n, 1);
    inject(&mut n, 1, A_IP, B_IP, &ack);
    assert_eq!(bad(&mut n, 1), before + 1);
    assert!(n.node(1).poll_transmit().is_none());
    assert_eq!(n.node(1).qp_state(tgt), Some(QpState::Rts));

    // Multicast: an RC SEND to QPN 0xFFFFFF, then a UD SEND to a group
    // nobody here joined.
    let group = "239.1.1.1";
    let rc = bare_packet(wire::Opcode::RC_SEND_ONLY, rxe_core::mcast::MULTICAST_QPN);
    let (before, pkts) = (bad(&mut n, 1), n.nodes()[1].counters().rcvd_pkts);
    inject(&mut n, 1, A_IP, group, &rc);
    assert_eq!(bad(&mut n, 1), before + 1);
    assert_eq!(n.nodes()[1].counters().rcvd_pkts, pkts, "not a UD packet");
    let mut ud = bare_packet(wire::Opcode::UD_SEND_ONLY, rxe_core::mcast::MULTICAST_QPN);
    ud.deth = Some(wire::deth::DethRepr {
        qkey: 7,
        src_qpn: 0x11,
    });
    inject(&mut n, 1, A_IP, group, &ud);
    assert_eq!(bad(&mut n, 1), before + 2, "no member of the group");
    assert_eq!(n.nodes()[1].counters().rcvd_pkts, pkts + 1, "counted once");
}

/// `qp_awaits_completions`: send WRs not yet completed or receive WRs
/// posted (what a driver reads to guess whether the application keeps
/// polling after a completion).
#[test]
fn qp_awaits_completions_follows_the_queues() {
    let mut n = net(7, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    assert!(!n.node(0).qp_awaits_completions(a.qpn));
    assert!(!n.node(1).qp_awaits_completions(b.qpn));
    assert!(!n.node(0).qp_awaits_completions(0xdead));
    let src = buf(&mut n, 0, a.pd, 64, AccessFlags::empty());
    let dst = buf(&mut n, 1, b.pd, 64, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 1, &dst);
    assert!(
        n.node(1).qp_awaits_completions(b.qpn),
        "a receive is posted"
    );
    let mut wr = SendWr::new(2, SendOp::Send, vec![sge(&src)]);
    wr.flags |= SendFlags::SIGNALED;
    post(&mut n, &a, wr);
    assert!(
        n.node(0).qp_awaits_completions(a.qpn),
        "a SEND is outstanding"
    );
    settle(&mut n);
    assert_eq!(drain(&mut n, &a).len(), 1);
    assert_eq!(drain(&mut n, &b).len(), 1);
    assert!(
        !n.node(0).qp_awaits_completions(a.qpn),
        "the SEND completed"
    );
    assert!(
        !n.node(1).qp_awaits_completions(b.qpn),
        "the receive was used"
    );
}

/// `handle_intact_datagram` takes the driver's word for the ICRC and
/// checks everything else; `handle_datagram` checks the ICRC too.
#[test]
fn an_intact_datagram_skips_only_the_icrc_check() {
    let mut n = net(77, LinkConfig::perfect());
    let repr = bare_packet(wire::Opcode::RC_SEND_ONLY, 0x12_3456);
    let mut buf = vec![0u8; repr.buffer_len()];
    repr.emit(&mut buf).unwrap();
    // The ICRC's place holds zeros: wrong for any packet.
    fn dg(payload: &[u8]) -> rxe_core::RxDatagram<'_> {
        rxe_core::RxDatagram {
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            src_port: 50000,
            dst_port: wire::ROCEV2_UDP_PORT,
            ipv4_id: None,
            payload,
            ecn: rxe_core::Ecn::NotEct,
        }
    }
    let now = n.now();
    n.node(1).handle_datagram(now, &dg(&buf));
    let c = n.nodes()[1].counters();
    assert_eq!((c.rcvd_icrc_err, c.rcvd_bad_qp), (1, 0));
    // Vouched for: dropped by the next check (no such QP).
    n.node(1).handle_intact_datagram(now, &dg(&buf));
    let c = n.nodes()[1].counters();
    assert_eq!((c.rcvd_icrc_err, c.rcvd_bad_qp), (1, 1));
    // Too short to hold an ICRC: not a datagram, vouched for or not.
    n.node(1).handle_intact_datagram(now, &dg(&buf[..3]));
    let c = n.nodes()[1].counters();
    assert_eq!((c.rcvd_icrc_err, c.rcvd_bad_qp), (2, 1));
}

/// `has_output` is what a driver may skip a flush by: false when nothing
/// is to be taken, true while a datagram waits for `poll_transmit` or an
/// event for `poll_event`, false again once they are taken.
#[test]
fn has_output_says_whether_a_driver_has_anything_to_take() {
    let mut n = net(1, LinkConfig::perfect());
    let (a, b) = pair(&mut n, QpType::Rc, &ConnectOpts::default());
    settle(&mut n);
    for node in [0, 1] {
        while n.node(node).poll_event().is_some() {}
        assert!(!n.node(node).has_output(), "node {node} after connecting");
    }
    let src = buf(&mut n, 0, a.pd, 64, AccessFlags::empty());
    let dst = buf(&mut n, 1, b.pd, 64, AccessFlags::LOCAL_WRITE);
    post_recv(&mut n, &b, 1, &dst);
    assert!(!n.node(1).has_output(), "a receive posted sends nothing");
    post(&mut n, &a, SendWr::new(2, SendOp::Send, vec![sge(&src)]));
    assert!(n.node(0).has_output(), "the SEND waits to be sent");
    assert!(n.node(0).poll_transmit().is_some());
    assert!(!n.node(0).has_output(), "the SEND was taken");
    n.node(1).fail_device("test");
    assert!(n.node(1).has_output(), "DEVICE_FATAL waits for poll_event");
    while n.node(1).poll_event().is_some() {}
    while n.node(1).poll_transmit().is_some() {}
    assert!(!n.node(1).has_output(), "everything was taken");
}
