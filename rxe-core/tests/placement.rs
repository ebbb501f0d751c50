//! What a driver needs from the engine to let a sender on the same host
//! place an RDMA WRITE ONLY's payload itself (verbs-api with
//! `local_link::place`): which packets are first transmissions
//! (`Transmit::fresh`) with no work request waiting behind them
//! (`Transmit::last_posted`), and whether a responder would execute a WRITE
//! ONLY at its next PSN right now (`Engine::write_target`).

use std::time::Duration;

use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{
    AccessFlags, QpAttr, QpAttrMask, QpState, QpType, SendOp, SendWr, Sge, Transmit, WcStatus,
};
use wire::{Opcode, PacketRepr};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn setup(opts: &ConnectOpts) -> (Network, QpEnd, QpEnd) {
    let mut n = Network::new(1, LinkConfig::perfect());
    n.add_node(node_config("10.0.0.1".parse().unwrap(), 1));
    n.add_node(node_config("10.0.0.2".parse().unwrap(), 2));
    let a = n.create_endpoint(0, QpType::Rc, None, None, 64).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 64).unwrap();
    n.connect(&a, &b, opts).unwrap();
    (n, a, b)
}

fn mr(n: &mut Network, node: usize, pd: rxe_core::PdHandle, len: usize) -> (u64, u32, u32) {
    let addr = n.node(node).mem_mut().alloc(len);
    n.node(node)
        .mem_mut()
        .write(addr, &vec![0x5a; len])
        .unwrap();
    let m = n.node(node).reg_mr(pd, addr, len as u64, ALL).unwrap();
    (addr, m.lkey, m.rkey)
}

fn write(wr_id: u64, remote: (u64, u32), local: (u64, u32), len: u32) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::RdmaWrite {
            remote_addr: remote.0,
            rkey: remote.1,
        },
        vec![Sge {
            addr: local.0,
            length: len,
            lkey: local.1,
        }],
    )
}

fn read(wr_id: u64, remote: (u64, u32), local: (u64, u32), len: u32) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::RdmaRead {
            remote_addr: remote.0,
            rkey: remote.1,
        },
        vec![Sge {
            addr: local.0,
            length: len,
            lkey: local.1,
        }],
    )
}

fn psn(t: &Transmit) -> u32 {
    PacketRepr::parse(&t.payload).unwrap().bth.psn.value()
}

#[test]
fn a_packet_is_last_posted_only_while_no_work_request_waits_behind_it() {
    let (mut n, a, b) = setup(&ConnectOpts::default());
    let (x, _, x_rkey) = mr(&mut n, 1, b.pd, 256 << 10);
    let (src, src_lkey, _) = mr(&mut n, 0, a.pd, 256 << 10);
    let now = n.now();
    // Alone: each WRITE's packets leave at its post, nothing behind.
    n.node(0)
        .post_send(now, a.qpn, write(1, (x, x_rkey), (src, src_lkey), 3000))
        .unwrap();
    let alone = n.take_transmits(0);
    assert_eq!(alone.len(), 3);
    assert!(alone.iter().all(|t| t.fresh && t.last_posted));
    n.deliver_now(1, &alone);
    let acks = n.take_transmits(1);
    assert!(acks.iter().all(|t| !t.last_posted), "responses are not");
    n.deliver_now(0, &acks);
    assert_eq!(n.node(0).poll_cq(a.send_cq, 4).unwrap().len(), 1);
    // 130 packets (path MTU 1024): 128 leave, as many as may be
    // unacknowledged; a WRITE posted then waits behind the other 2.
    let now = n.now();
    n.node(0)
        .post_send(
            now,
            a.qpn,
            write(2, (x, x_rkey), (src, src_lkey), 130 * 1024),
        )
        .unwrap();
    n.node(0)
        .post_send(now, a.qpn, write(3, (x, x_rkey), (src, src_lkey), 8))
        .unwrap();
    let window = n.take_transmits(0);
    assert_eq!(window.len(), 128);
    assert!(window.iter().all(|t| t.fresh && t.last_posted));
    n.deliver_now(1, &window);
    let acks = n.take_transmits(1);
    n.deliver_now(0, &acks);
    let rest = n.take_transmits(0);
    assert_eq!(rest.len(), 3, "the last 2 packets, then the 8-byte WRITE");
    assert!(rest.iter().all(|t| t.fresh));
    assert_eq!(
        rest.iter().map(|t| t.last_posted).collect::<Vec<_>>(),
        [false, false, true]
    );
}

/// A list of work requests (`ibv_post_send`'s chain, `ibv_wr_complete`)
/// is queued whole before the requester runs, as kernel rxe queues one:
/// the packets of every work request but the last are built with work
/// behind them. A work request the engine refuses ends the list there:
/// those before it are posted and sent, and the error names its index.
#[test]
fn a_posted_list_is_queued_whole_before_its_packets_leave() {
    let (mut n, a, b) = setup(&ConnectOpts::default());
    let (x, _, x_rkey) = mr(&mut n, 1, b.pd, 64 << 10);
    let (src, src_lkey, _) = mr(&mut n, 0, a.pd, 64 << 10);
    let (remote, local) = ((x, x_rkey), (src, src_lkey));
    let now = n.now();
    n.node(0)
        .post_send_list(
            now,
            a.qpn,
            [write(1, remote, local, 3000), write(2, remote, local, 8)],
        )
        .unwrap();
    let sent = n.take_transmits(0);
    assert_eq!(sent.len(), 4, "3 packets (path MTU 1024), then 1");
    assert!(sent.iter().all(|t| t.fresh));
    assert_eq!(
        sent.iter().map(|t| t.last_posted).collect::<Vec<_>>(),
        [false, false, false, true]
    );
    n.deliver_now(1, &sent);
    let acks = n.take_transmits(1);
    n.deliver_now(0, &acks);
    let wcs = n.node(0).poll_cq(a.send_cq, 4).unwrap();
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));

    // The second of three has more SGEs than the QP allows.
    let mut wide = write(4, remote, local, 8);
    wide.sg_list = vec![wide.sg_list[0]; 1000];
    let now = n.now();
    let (at, err) = n
        .node(0)
        .post_send_list(
            now,
            a.qpn,
            [write(3, remote, local, 8), wide, write(5, remote, local, 8)],
        )
        .unwrap_err();
    assert_eq!(at, 1);
    assert!(err.to_string().contains("max_send_sge"), "{err}");
    let sent = n.take_transmits(0);
    assert_eq!(sent.len(), 1, "the one before it");
    assert!(sent[0].last_posted);
    n.deliver_now(1, &sent);
    let acks = n.take_transmits(1);
    n.deliver_now(0, &acks);
    let wcs = n.node(0).poll_cq(a.send_cq, 4).unwrap();
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [3]);
    assert_eq!(wcs[0].status, WcStatus::Success);
}

#[test]
fn only_a_request_packets_first_transmission_is_fresh() {
    let opts = ConnectOpts {
        psn_a: 0xff_fffe, // across the PSN wrap
        ..ConnectOpts::default()
    };
    let (mut n, a, b) = setup(&opts);
    let (x, _, x_rkey) = mr(&mut n, 1, b.pd, 4096);
    let (src, src_lkey, _) = mr(&mut n, 0, a.pd, 4096);
    let now = n.now();
    n.node(0)
        .post_send(now, a.qpn, write(1, (x, x_rkey), (src, src_lkey), 64))
        .unwrap();
    n.node(0)
        .post_send(now, a.qpn, write(2, (x, x_rkey), (src, src_lkey), 3000))
        .unwrap();
    let first = n.take_transmits(0);
    assert_eq!(first.len(), 4, "a WRITE ONLY and a 3-packet WRITE");
    assert!(first.iter().all(|t| t.fresh), "first transmissions");
    assert_eq!(
        first.iter().map(psn).collect::<Vec<_>>(),
        [0xff_fffe, 0xff_ffff, 0, 1]
    );
    // Nothing was delivered: the retransmission timer resends them all.
    let due = n.node(0).poll_timeout().expect("a retransmission timer");
    n.node(0).handle_timeout(due);
    let again = n.take_transmits(0);
    assert_eq!(
        again.iter().map(psn).collect::<Vec<_>>(),
        [0xff_fffe, 0xff_ffff, 0, 1]
    );
    assert!(
        again.iter().all(|t| !t.fresh && !t.last_posted),
        "retransmissions are not fresh"
    );
    // Delivered now; the ACK comes back; the responder's ACK is not fresh.
    n.deliver_now(1, &again);
    let acks = n.take_transmits(1);
    assert!(!acks.is_empty() && acks.iter().all(|t| !t.fresh));
    n.deliver_now(0, &acks);
    let wcs = n.node(0).poll_cq(a.send_cq, 4).unwrap();
    assert!(wcs.len() == 2 && wcs.iter().all(|w| w.status == WcStatus::Success));
    // The next WRITE is a first transmission again, at the next PSN.
    let now = n.now() + Duration::from_millis(1);
    n.node(0)
        .post_send(now, a.qpn, write(3, (x, x_rkey), (src, src_lkey), 8))
        .unwrap();
    let next = n.take_transmits(0);
    assert_eq!(next.len(), 1);
    assert!(next[0].fresh);
    assert_eq!(psn(&next[0]), 2);
}

#[test]
fn a_responder_is_a_write_target_only_when_a_write_only_would_run_at_once() {
    let opts = ConnectOpts {
        psn_a: 0,
        ..ConnectOpts::default()
    };
    let (mut n, a, b) = setup(&opts);
    let (x, _, x_rkey) = mr(&mut n, 1, b.pd, 16 * 1024);
    let (src, src_lkey, _) = mr(&mut n, 0, a.pd, 16 * 1024);
    let target = |n: &mut Network| n.node(1).write_target(b.qpn).map(|(pd, p)| (pd, p.value()));
    assert_eq!(
        target(&mut n),
        Some((b.pd, 0)),
        "connected, nothing received"
    );
    assert_eq!(n.node(1).write_target(0x7777), None, "no such QP");

    // The first packet of a 3-packet WRITE: a message is in progress.
    let now = n.now();
    n.node(0)
        .post_send(now, a.qpn, write(1, (x, x_rkey), (src, src_lkey), 3000))
        .unwrap();
    let pkts = n.take_transmits(0);
    assert_eq!(pkts.len(), 3);
    n.deliver_now(1, &pkts[..1]);
    assert_eq!(target(&mut n), None, "WRITE FIRST received, LAST not");
    n.deliver_now(1, &pkts[1..]);
    assert_eq!(target(&mut n), Some((b.pd, 3)), "the WRITE is complete");
    let ack = n.take_transmits(1);
    n.deliver_now(0, &ack);

    // A READ whose reply is not out yet: a later WRITE would wait for it.
    let (dst, dst_lkey, _) = mr(&mut n, 0, a.pd, 16 * 1024);
    let wr = read(2, (x, x_rkey), (dst, dst_lkey), 16 * 1024);
    let now = n.now();
    n.node(0).post_send(now, a.qpn, wr).unwrap();
    let req = n.take_transmits(0);
    n.deliver_now(1, &req);
    assert_eq!(target(&mut n), None, "a READ reply is under way");
    let responses = n.take_transmits(1);
    assert!(responses.iter().all(|t| {
        let op = PacketRepr::parse(&t.payload).unwrap().bth.opcode;
        op.name().starts_with("RC_RDMA_READ_RESPONSE") || op == Opcode::RC_ACKNOWLEDGE
    }));
    assert_eq!(
        target(&mut n),
        Some((b.pd, 19)),
        "the reply (16 PSNs) is out"
    );

    // A QP that does not allow remote writes, and one in ERR.
    let attr = QpAttr {
        qp_access_flags: AccessFlags::REMOTE_READ.bits(),
        ..QpAttr::default()
    };
    let now = n.now();
    n.node(1)
        .modify_qp(now, b.qpn, &attr, QpAttrMask::ACCESS_FLAGS)
        .unwrap();
    assert_eq!(target(&mut n), None, "no remote write");
    let attr = QpAttr {
        qp_access_flags: ALL.bits(),
        ..QpAttr::default()
    };
    n.node(1)
        .modify_qp(now, b.qpn, &attr, QpAttrMask::ACCESS_FLAGS)
        .unwrap();
    assert_eq!(target(&mut n), Some((b.pd, 19)));
    let errors = n.node(1).qp_errors();
    let attr = QpAttr {
        qp_state: Some(QpState::Err),
        ..QpAttr::default()
    };
    n.node(1)
        .modify_qp(now, b.qpn, &attr, QpAttrMask::STATE)
        .unwrap();
    assert_eq!(target(&mut n), None, "in ERR");
    assert_eq!(n.node(1).qp_errors(), errors + 1);
}

#[test]
fn a_qp_that_fails_by_itself_is_counted_in_qp_errors() {
    let opts = ConnectOpts {
        timeout: 1,
        retry_cnt: 0,
        ..ConnectOpts::default()
    };
    let (mut n, a, _b) = setup(&opts);
    let (src, src_lkey, _) = mr(&mut n, 0, a.pd, 64);
    let before = n.node(0).qp_errors();
    let now = n.now();
    n.node(0)
        .post_send(now, a.qpn, write(1, (0x1000, 0x1234), (src, src_lkey), 64))
        .unwrap();
    // The packets are never delivered: the retry count runs out.
    let _ = n.take_transmits(0);
    for _ in 0..4 {
        if let Some(due) = n.node(0).poll_timeout() {
            n.node(0).handle_timeout(due);
            let _ = n.take_transmits(0);
        }
    }
    let wcs = n.node(0).poll_cq(a.send_cq, 4).unwrap();
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr, "{wcs:?}");
    assert_eq!(n.node(0).qp_errors(), before + 1);
}

/// A READ request says where its responses go (`Transmit::read_dest`)
/// when the driver asks (`Engine::hint_reads`), for a driver whose peers
/// on the host write those responses' payloads themselves: only for the
/// rest of the READ in one SGE of an MR with local write access (what the
/// completer's scatter checks), and only for responses long enough for
/// the responder's engine to leave in memory (256 bytes).
#[test]
fn a_read_request_says_where_its_responses_go_when_asked() {
    let (mut n, a, b) = setup(&ConnectOpts::default());
    let (x, _, x_rkey) = mr(&mut n, 1, b.pd, 16 * 1024);
    let (dst, dst_lkey, _) = mr(&mut n, 0, a.pd, 16 * 1024);
    let ro = n.node(0).mem_mut().alloc(4096);
    let ro_lkey = n
        .node(0)
        .reg_mr(a.pd, ro, 4096, AccessFlags::REMOTE_READ)
        .unwrap()
        .lkey;
    // The READ's request as built, then its responses delivered and its
    // completion taken (the ICRC the driver writes, as a driver would).
    let read = |n: &mut Network, id: u64, sges: Vec<Sge>| {
        let now = n.now();
        let wr = SendWr::new(
            id,
            SendOp::RdmaRead {
                remote_addr: x,
                rkey: x_rkey,
            },
            sges,
        );
        n.node(0).post_send(now, a.qpn, wr).unwrap();
        let mut req = n.take_transmits(0);
        assert_eq!(req.len(), 1);
        let dest = req[0].read_dest;
        for t in &mut req {
            t.write_icrc();
        }
        n.deliver_now(1, &req);
        let resp = n.take_transmits(1);
        n.deliver_now(0, &resp);
        let wc = n.node(0).poll_cq(a.send_cq, 4).unwrap();
        assert_eq!(wc.len(), 1);
        (dest, wc[0].status)
    };
    let sge = |addr: u64, length: u32, lkey: u32| Sge { addr, length, lkey };
    let one = |at: u64, len: u32| vec![sge(dst + at, len, dst_lkey)];
    // Not asked: nothing.
    assert_eq!(read(&mut n, 1, one(100, 4000)), (None, WcStatus::Success));
    n.node(0).defer_icrc(true);
    n.node(0).defer_gather(true);
    n.node(0).hint_reads(true);
    let dest = |host: u64, len: u64| {
        Some(rxe_core::ReadDest {
            host,
            len,
            mtu: 1024,
        })
    };
    assert_eq!(
        read(&mut n, 2, one(100, 4000)),
        (dest(dst + 100, 4000), WcStatus::Success)
    );
    // A single response of 300 bytes is left in memory; of 100, not.
    assert_eq!(
        read(&mut n, 3, one(0, 300)),
        (dest(dst, 300), WcStatus::Success)
    );
    assert_eq!(read(&mut n, 4, one(0, 100)), (None, WcStatus::Success));
    // Two SGEs: only if the whole READ lies in one of them.
    let two = vec![sge(dst, 2000, dst_lkey), sge(dst + 8192, 2000, dst_lkey)];
    assert_eq!(read(&mut n, 5, two), (None, WcStatus::Success));
    let first_only = vec![sge(dst, 2000, dst_lkey), sge(dst + 8192, 0, dst_lkey)];
    assert_eq!(
        read(&mut n, 6, first_only),
        (dest(dst, 2000), WcStatus::Success)
    );
    // No local write access: no hint, and the READ fails at its first
    // response, as ever.
    assert_eq!(
        read(&mut n, 7, vec![sge(ro, 2000, ro_lkey)]),
        (None, WcStatus::LocProtErr)
    );
}

/// A responder takes a request as new only at the PSN it expects next
/// (`Engine::takes_new_request`, which keeps a peer from placing the
/// responses to a READ asked again): not a duplicate, not another QP.
#[test]
fn a_request_is_new_only_at_the_psn_its_responder_expects() {
    let opts = ConnectOpts {
        psn_a: 0,
        ..ConnectOpts::default()
    };
    let (mut n, a, b) = setup(&opts);
    let (x, _, x_rkey) = mr(&mut n, 1, b.pd, 16 * 1024);
    let (dst, dst_lkey, _) = mr(&mut n, 0, a.pd, 16 * 1024);
    assert_eq!(n.node(1).takes_new_request(b.qpn, 0), Some(a.qpn));
    assert_eq!(n.node(1).takes_new_request(b.qpn, 1), None);
    assert_eq!(n.node(1).takes_new_request(0x7777, 0), None, "no such QP");
    // A READ of 3 packets' worth at PSN 0: the next new request is at 3,
    // and PSN 0 asked again is a duplicate.
    let now = n.now();
    let wr = read(1, (x, x_rkey), (dst, dst_lkey), 3000);
    n.node(0).post_send(now, a.qpn, wr).unwrap();
    let req = n.take_transmits(0);
    n.deliver_now(1, &req);
    assert_eq!(n.node(1).takes_new_request(b.qpn, 0), None, "a duplicate");
    assert_eq!(n.node(1).takes_new_request(b.qpn, 3), Some(a.qpn));
    let resp = n.take_transmits(1);
    n.deliver_now(0, &resp);
    assert_eq!(
        n.node(0).poll_cq(a.send_cq, 4).unwrap()[0].status,
        WcStatus::Success
    );
    // A responder in ERR takes nothing.
    let now = n.now();
    let attr = QpAttr {
        qp_state: Some(QpState::Err),
        ..QpAttr::default()
    };
    n.node(1)
        .modify_qp(now, b.qpn, &attr, QpAttrMask::STATE)
        .unwrap();
    assert_eq!(n.node(1).takes_new_request(b.qpn, 3), None, "in ERR");
}
