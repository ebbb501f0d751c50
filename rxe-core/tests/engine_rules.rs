//! Protocol rules checked on the wire: each test watches the packets the
//! engine sends and fails if the rule is broken.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{AccessFlags, QpType, SendFlags, SendOp, SendWr, Sge, WcStatus};
use wire::{Opcode, PacketRepr};

type Seen = Rc<RefCell<Vec<(u64, String, bool, u32, u8)>>>;

/// Two nodes and an RC pair; every datagram is recorded as
/// (time ns, opcode name, AckReq, PSN, source node).
fn setup(o: &ConnectOpts) -> (Network, QpEnd, QpEnd, Seen) {
    let mut n = Network::new(1, LinkConfig::perfect());
    n.add_node(node_config("10.0.0.1".parse().unwrap(), 1));
    n.add_node(node_config("10.0.0.2".parse().unwrap(), 2));
    let a = n.create_endpoint(0, QpType::Rc, None, None, 32).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 32).unwrap();
    n.connect(&a, &b, o).unwrap();
    let seen: Seen = Rc::default();
    let s = seen.clone();
    n.set_tap(move |now, t| {
        let p = PacketRepr::parse(&t.payload).unwrap();
        let from = u8::from(t.info.src.to_string() != "10.0.0.1");
        s.borrow_mut().push((
            now.as_nanos(),
            p.bth.opcode.name().to_string(),
            p.bth.ack_req,
            p.bth.psn.value(),
            from,
        ));
    });
    (n, a, b, seen)
}

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn mr(n: &mut Network, node: usize, pd: rxe_core::PdHandle, len: usize) -> (u64, rxe_core::mr::Mr) {
    let addr = n.node(node).mem_mut().alloc(len);
    let m = n.node(node).reg_mr(pd, addr, len as u64, ALL).unwrap();
    (addr, m)
}

fn settle(n: &mut Network) {
    let t = n.now() + Duration::from_secs(30);
    n.run_until(t, |_| false);
}

#[test]
fn ack_request_on_last_packet_and_every_65th() {
    // Kernel rxe_req.c: AckReq on the END packet, and when more than
    // RXE_MAX_PKT_PER_ACK (64) packets went without one.
    let o = ConnectOpts {
        mtu: rxe_core::Mtu::M256,
        ..ConnectOpts::default()
    };
    let (mut n, a, b, seen) = setup(&o);
    let (src, smr) = mr(&mut n, 0, a.pd, 256 * 200);
    let (dst, dmr) = mr(&mut n, 1, b.pd, 256 * 200);
    let now = n.now();
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst,
            rkey: dmr.rkey,
        },
        vec![Sge {
            addr: src,
            length: 256 * 200,
            lkey: smr.lkey,
        }],
    );
    n.node(0).post_send(now, a.qpn, wr).unwrap();
    settle(&mut n);
    let s = seen.borrow();
    let reqs: Vec<bool> = s.iter().filter(|x| x.4 == 0).map(|x| x.2).collect();
    assert_eq!(reqs.len(), 200);
    let with: Vec<usize> = reqs
        .iter()
        .enumerate()
        .filter(|(_, a)| **a)
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(with, vec![66, 132, 198, 200]);
    // The responder ACKs exactly those.
    let acks = s
        .iter()
        .filter(|x| x.4 == 1 && x.1 == Opcode::RC_ACKNOWLEDGE.name())
        .count();
    assert_eq!(acks, 4);
}

#[test]
fn at_most_128_unacknowledged_psns() {
    // Kernel RXE_MAX_UNACKED_PSNS: with a peer that never answers, the
    // requester stops after 128 PSNs until the timer fires.
    let o = ConnectOpts {
        mtu: rxe_core::Mtu::M256,
        timeout: 14,
        retry_cnt: 1,
        ..ConnectOpts::default()
    };
    let (mut n, a, b, seen) = setup(&o);
    n.node(1).destroy_qp(b.qpn).unwrap();
    let (src, smr) = mr(&mut n, 0, a.pd, 256 * 300);
    let now = n.now();
    n.node(0)
        .post_send(
            now,
            a.qpn,
            SendWr::new(
                1,
                SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
                vec![Sge {
                    addr: src,
                    length: 256 * 300,
                    lkey: smr.lkey,
                }],
            ),
        )
        .unwrap();
    let t = n.now() + Duration::from_millis(10);
    n.run_until(t, |_| false);
    assert_eq!(seen.borrow().len(), 128, "first burst");
    settle(&mut n);
    // One retry (retry_cnt 1) resends the same 128 PSNs, then RETRY_EXC_ERR.
    assert_eq!(seen.borrow().len(), 256);
    assert_eq!(
        n.node(0).poll_cq(a.send_cq, 4).unwrap()[0].status,
        WcStatus::RetryExcErr
    );
}

#[test]
fn reads_in_flight_never_exceed_max_rd_atomic() {
    let o = ConnectOpts {
        max_rd_atomic: 3,
        ..ConnectOpts::default()
    };
    let (mut n, a, b, seen) = setup(&o);
    let (src, smr) = mr(&mut n, 0, a.pd, 4096 * 10);
    let (dst, dmr) = mr(&mut n, 1, b.pd, 4096);
    let now = n.now();
    for i in 0..10u64 {
        let wr = if i % 2 == 0 {
            SendWr::new(
                i,
                SendOp::RdmaRead {
                    remote_addr: dst,
                    rkey: dmr.rkey,
                },
                vec![Sge {
                    addr: src + i * 4096,
                    length: 2000,
                    lkey: smr.lkey,
                }],
            )
        } else {
            SendWr::new(
                i,
                SendOp::AtomicFetchAdd {
                    remote_addr: dst,
                    rkey: dmr.rkey,
                    add: 1,
                },
                vec![Sge {
                    addr: src + i * 4096,
                    length: 8,
                    lkey: smr.lkey,
                }],
            )
        };
        n.node(0).post_send(now, a.qpn, wr).unwrap();
    }
    settle(&mut n);
    // Walk the wire: requests add one, the last response of each removes one.
    let mut in_flight = 0i32;
    let mut max = 0;
    for (_, op, _, _, from) in seen.borrow().iter() {
        if *from == 0
            && (op == Opcode::RC_RDMA_READ_REQUEST.name() || op == Opcode::RC_FETCH_ADD.name())
        {
            in_flight += 1;
            max = max.max(in_flight);
        }
        if *from == 1
            && (op == Opcode::RC_RDMA_READ_RESPONSE_LAST.name()
                || op == Opcode::RC_ATOMIC_ACKNOWLEDGE.name())
        {
            in_flight -= 1;
        }
    }
    assert_eq!(max, 3);
    assert_eq!(n.node(0).poll_cq(a.send_cq, 20).unwrap().len(), 10);
}

#[test]
fn a_fenced_wr_starts_only_after_earlier_ones_complete() {
    let (mut n, a, b, seen) = setup(&ConnectOpts::default());
    let (src, smr) = mr(&mut n, 0, a.pd, 8192);
    let (dst, dmr) = mr(&mut n, 1, b.pd, 8192);
    let now = n.now();
    let rd = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: dst,
            rkey: dmr.rkey,
        },
        vec![Sge {
            addr: src,
            length: 4096,
            lkey: smr.lkey,
        }],
    );
    n.node(0).post_send(now, a.qpn, rd).unwrap();
    let mut wr = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: dst + 4096,
            rkey: dmr.rkey,
        },
        vec![Sge {
            addr: src + 4096,
            length: 100,
            lkey: smr.lkey,
        }],
    );
    wr.flags |= SendFlags::FENCE;
    n.node(0).post_send(now, a.qpn, wr).unwrap();
    settle(&mut n);
    let s = seen.borrow();
    let last_resp = s
        .iter()
        .position(|x| x.1 == Opcode::RC_RDMA_READ_RESPONSE_LAST.name())
        .unwrap();
    let write = s
        .iter()
        .position(|x| x.1 == Opcode::RC_RDMA_WRITE_ONLY.name())
        .unwrap();
    assert!(
        write > last_resp,
        "the fenced WRITE went out before the READ completed: {s:?}"
    );
}

#[test]
fn timeout_zero_means_no_retransmission_timer() {
    // IBTA: a local ACK timeout of 0 is infinite (kernel: no timer).
    let o = ConnectOpts {
        timeout: 0,
        ..ConnectOpts::default()
    };
    let (mut n, a, b, seen) = setup(&o);
    n.node(1).destroy_qp(b.qpn).unwrap();
    let (src, smr) = mr(&mut n, 0, a.pd, 64);
    let now = n.now();
    n.node(0)
        .post_send(
            now,
            a.qpn,
            SendWr::new(
                1,
                SendOp::Send,
                vec![Sge {
                    addr: src,
                    length: 64,
                    lkey: smr.lkey,
                }],
            ),
        )
        .unwrap();
    settle(&mut n);
    assert_eq!(seen.borrow().len(), 1);
    assert_eq!(n.node(0).poll_timeout(), None);
    assert!(n.node(0).poll_cq(a.send_cq, 4).unwrap().is_empty());
}

#[test]
fn rnr_backoff_follows_the_timer_table() {
    // min_rnr_timer 18 = 5.12 ms: retries are spaced by exactly that.
    let o = ConnectOpts {
        min_rnr_timer: 18,
        rnr_retry: 3,
        ..ConnectOpts::default()
    };
    let (mut n, a, _b, seen) = setup(&o);
    let (src, smr) = mr(&mut n, 0, a.pd, 64);
    let now = n.now();
    n.node(0)
        .post_send(
            now,
            a.qpn,
            SendWr::new(
                1,
                SendOp::Send,
                vec![Sge {
                    addr: src,
                    length: 64,
                    lkey: smr.lkey,
                }],
            ),
        )
        .unwrap();
    settle(&mut n);
    let s = seen.borrow();
    let sends: Vec<u64> = s.iter().filter(|x| x.4 == 0).map(|x| x.0).collect();
    let naks: Vec<u64> = s.iter().filter(|x| x.4 == 1).map(|x| x.0).collect();
    assert_eq!(sends.len(), 4);
    for (nak, next) in naks.iter().zip(&sends[1..]) {
        // NAK sent at `nak`, arrives 10 µs later; the retry follows 5.12 ms after.
        assert_eq!(next - nak, 10_000 + 5_120_000);
    }
    assert_eq!(
        n.node(0).poll_cq(a.send_cq, 4).unwrap()[0].status,
        WcStatus::RnrRetryExcErr
    );
}
