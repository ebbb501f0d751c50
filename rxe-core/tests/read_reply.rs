//! READ replies are built lazily, one response per `poll_transmit`, as
//! kernel rxe's `read_reply` does. These tests feed the responder several
//! requests before draining its output, which a real driver does whenever
//! datagrams arrive faster than it sends, and check what lazy building must
//! not break: request order (a later WRITE cannot change what an earlier
//! READ returns, and no later ACK overtakes the READ's responses), and
//! memory safety when the MR goes away in the middle of a reply.

use std::time::Duration;

use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{AccessFlags, QpState, QpType, SendOp, SendWr, Sge, Transmit, WcOpcode, WcStatus};
use wire::{Opcode, PacketRepr};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn setup() -> (Network, QpEnd, QpEnd) {
    let mut n = Network::new(1, LinkConfig::perfect());
    n.add_node(node_config("10.0.0.1".parse().unwrap(), 1));
    n.add_node(node_config("10.0.0.2".parse().unwrap(), 2));
    let a = n.create_endpoint(0, QpType::Rc, None, None, 64).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 64).unwrap();
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    (n, a, b)
}

fn mr(
    n: &mut Network,
    node: usize,
    pd: rxe_core::PdHandle,
    fill: u8,
    len: usize,
) -> (u64, u32, u32) {
    let addr = n.node(node).mem_mut().alloc(len);
    n.node(node)
        .mem_mut()
        .write(addr, &vec![fill; len])
        .unwrap();
    let m = n.node(node).reg_mr(pd, addr, len as u64, ALL).unwrap();
    (addr, m.lkey, m.rkey)
}

fn opcode(t: &Transmit) -> Opcode {
    PacketRepr::parse(&t.payload).unwrap().bth.opcode
}

const LEN: usize = 16 * 1024; // 16 READ responses at MTU 1024

#[test]
fn a_later_write_waits_for_the_read_reply_before_it() {
    let (mut n, a, b) = setup();
    let (x, _, x_rkey) = mr(&mut n, 1, b.pd, 0xaa, LEN);
    let (dst, dst_lkey, _) = mr(&mut n, 0, a.pd, 0, LEN);
    let (src, src_lkey, _) = mr(&mut n, 0, a.pd, 0x55, LEN);
    let now = n.now();
    // READ x, then overwrite x: no fence, so both go out at once.
    let read = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: x,
            rkey: x_rkey,
        },
        vec![Sge {
            addr: dst,
            length: LEN as u32,
            lkey: dst_lkey,
        }],
    );
    let write = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: x,
            rkey: x_rkey,
        },
        vec![Sge {
            addr: src,
            length: LEN as u32,
            lkey: src_lkey,
        }],
    );
    n.node(0).post_send(now, a.qpn, read).unwrap();
    n.node(0).post_send(now, a.qpn, write).unwrap();
    let requests = n.take_transmits(0);
    assert_eq!(requests.len(), 1 + 16, "READ request and 16 WRITE packets");
    // The responder receives all of them before it sends anything.
    n.deliver_now(1, &requests);
    let out = n.take_transmits(1);
    let ops: Vec<Opcode> = out.iter().map(opcode).collect();
    assert_eq!(ops.len(), 17, "16 READ responses and one ACK: {ops:?}");
    assert_eq!(ops[0], Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    assert!(ops[1..15]
        .iter()
        .all(|o| *o == Opcode::RC_RDMA_READ_RESPONSE_MIDDLE));
    assert_eq!(ops[15], Opcode::RC_RDMA_READ_RESPONSE_LAST);
    assert_eq!(
        ops[16],
        Opcode::RC_ACKNOWLEDGE,
        "the WRITE's ACK comes last"
    );
    // The READ saw x before the WRITE; x holds the WRITE afterwards.
    let mut got = vec![0u8; LEN];
    n.deliver_now(0, &out);
    n.node(0).mem_mut().read(dst, &mut got).unwrap();
    assert!(got.iter().all(|&v| v == 0xaa), "READ returned later data");
    n.node(1).mem_mut().read(x, &mut got).unwrap();
    assert!(got.iter().all(|&v| v == 0x55));
    let wcs = n.node(0).poll_cq(a.send_cq, 8).unwrap();
    let st: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
    assert_eq!(
        st,
        vec![
            (1, WcOpcode::RdmaRead, WcStatus::Success),
            (2, WcOpcode::RdmaWrite, WcStatus::Success)
        ]
    );
}

#[test]
fn the_first_response_is_built_before_the_rest() {
    let (mut n, a, b) = setup();
    let (x, _, x_rkey) = mr(&mut n, 1, b.pd, 0x11, LEN);
    let (dst, dst_lkey, _) = mr(&mut n, 0, a.pd, 0, LEN);
    let now = n.now();
    let read = SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: x,
            rkey: x_rkey,
        },
        vec![Sge {
            addr: dst,
            length: LEN as u32,
            lkey: dst_lkey,
        }],
    );
    n.node(0).post_send(now, a.qpn, read).unwrap();
    let req = n.take_transmits(0);
    n.deliver_now(1, &req);
    // Nothing is built ahead of the driver's demand.
    assert_eq!(n.node(1).pending_transmits(), 0);
    assert!(n.node(1).has_transmit());
    let first = n.node(1).poll_transmit().unwrap();
    assert_eq!(opcode(&first), Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    assert_eq!(n.node(1).pending_transmits(), 0);
    assert_eq!(n.take_transmits(1).len(), 15);
    assert!(!n.node(1).has_transmit());
}

#[test]
fn deregistering_the_mr_mid_reply_stops_it_with_an_access_error() {
    let (mut n, a, b) = setup();
    let (x, x_lkey, x_rkey) = mr(&mut n, 1, b.pd, 0x22, LEN);
    let (dst, dst_lkey, _) = mr(&mut n, 0, a.pd, 0, LEN);
    let now = n.now();
    let read = SendWr::new(
        9,
        SendOp::RdmaRead {
            remote_addr: x,
            rkey: x_rkey,
        },
        vec![Sge {
            addr: dst,
            length: LEN as u32,
            lkey: dst_lkey,
        }],
    );
    n.node(0).post_send(now, a.qpn, read).unwrap();
    let req = n.take_transmits(0);
    n.deliver_now(1, &req);
    let mut out: Vec<Transmit> = (0..3).map(|_| n.node(1).poll_transmit().unwrap()).collect();
    // The application deregisters the MR (and may free its memory).
    n.node(1).dereg_mr(x_lkey).unwrap();
    out.extend(n.take_transmits(1));
    let ops: Vec<Opcode> = out.iter().map(opcode).collect();
    assert_eq!(
        ops,
        vec![
            Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            Opcode::RC_ACKNOWLEDGE,
        ],
        "three responses, then a NAK instead of the fourth"
    );
    let nak = PacketRepr::parse(&out[3].payload).unwrap();
    assert_eq!(
        nak.bth.psn,
        PacketRepr::parse(&out[0].payload).unwrap().bth.psn.add(3)
    );
    assert_eq!(n.node(1).qp_state(b.qpn).unwrap(), QpState::Err);
    n.deliver_now(0, &out);
    let t = n.now() + Duration::from_secs(1);
    n.run_until(t, |_| false);
    let wcs = n.node(0).poll_cq(a.send_cq, 8).unwrap();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::RemAccessErr));
}
