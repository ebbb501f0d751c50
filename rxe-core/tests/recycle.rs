//! A driver may hand sent packets' buffers back (`Engine::recycle`); the
//! engine then builds later packets in them without clearing them first.
//! Every byte of such a packet must still be written: the same traffic
//! gives the same bytes on the wire whether its buffers were recycled full
//! of garbage or freshly allocated.

use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{AccessFlags, RecvWr, SendFlags, SendOp, SendWr, Sge};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn setup() -> (Network, QpEnd, QpEnd) {
    let mut n = Network::new(1, LinkConfig::perfect());
    n.add_node(node_config("10.0.0.1".parse().unwrap(), 1));
    n.add_node(node_config("10.0.0.2".parse().unwrap(), 2));
    let a = n
        .create_endpoint(0, rxe_core::QpType::Rc, None, None, 64)
        .unwrap();
    let b = n
        .create_endpoint(1, rxe_core::QpType::Rc, None, None, 64)
        .unwrap();
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    (n, a, b)
}

fn mr(
    n: &mut Network,
    node: usize,
    pd: rxe_core::PdHandle,
    len: usize,
    fill: u8,
) -> (u64, u32, u32) {
    let addr = n.node(node).mem_mut().alloc(len);
    let bytes: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
    n.node(node).mem_mut().write(addr, &bytes).unwrap();
    let m = n.node(node).reg_mr(pd, addr, len as u64, ALL).unwrap();
    (addr, m.lkey, m.rkey)
}

/// Every packet both nodes send for a mix of requests (one- and
/// multi-packet WRITEs, an inline SEND, a SEND, a READ with a multi-packet
/// reply, an atomic), with the acknowledgements and responses. With
/// `garbage`, each node is first given buffers full of 0xee of both sizes,
/// and each packet's buffer is handed back (overwritten with 0xee) once
/// delivered. With `defer`, the nodes leave the ICRC to the driver
/// (`Engine::defer_icrc`), which writes it before delivering; with
/// `gather` as well, payloads of one MR range (`Engine::defer_gather`),
/// which it copies in first (`Engine::fill_gathered`). Returns the
/// packets and how many payloads were left to the driver.
fn traffic(garbage: bool, defer: bool) -> Vec<Vec<u8>> {
    traffic_with(garbage, defer, false).0
}

fn traffic_with(garbage: bool, defer: bool, gather: bool) -> (Vec<Vec<u8>>, usize) {
    let (mut n, a, b) = setup();
    for node in 0..2 {
        n.node(node).defer_icrc(defer);
        n.node(node).defer_gather(gather);
        n.node(node).mem_mut().set_direct(gather);
    }
    let mut gathered = 0;
    let (src, src_lkey, _) = mr(&mut n, 0, a.pd, 8192, 1);
    let (dst, dst_lkey, dst_rkey) = mr(&mut n, 1, b.pd, 8192, 100);
    if garbage {
        for node in 0..2 {
            for len in [20, 64, 300, 1100, 5000] {
                n.node(node).recycle(vec![0xee; len]);
            }
        }
    }
    for i in 0..2 {
        n.node(1)
            .post_recv(
                b.qpn,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![Sge {
                        addr: dst + 4096,
                        length: 4096,
                        lkey: dst_lkey,
                    }],
                },
            )
            .unwrap();
    }
    let sge = |off: u64, len: u32| Sge {
        addr: src + off,
        length: len,
        lkey: src_lkey,
    };
    let write = |id: u64, len| {
        let op = SendOp::RdmaWrite {
            remote_addr: dst + id * 8,
            rkey: dst_rkey,
        };
        SendWr::new(id, op, vec![sge(id, len)])
    };
    let mut inline = SendWr::new(3, SendOp::Send, vec![sge(3, 40)]);
    inline.flags |= SendFlags::INLINE;
    let wrs = vec![
        write(1, 7),
        write(2, 2500),
        inline,
        SendWr::new(4, SendOp::Send, vec![sge(5, 1500)]),
        SendWr::new(
            5,
            SendOp::RdmaRead {
                remote_addr: dst + 3,
                rkey: dst_rkey,
            },
            vec![sge(4096, 3000)],
        ),
        SendWr::new(
            6,
            SendOp::AtomicFetchAdd {
                remote_addr: dst + 64,
                rkey: dst_rkey,
                add: 5,
            },
            vec![sge(8000, 8)],
        ),
    ];
    let mut wire = Vec::new();
    for wr in wrs {
        let now = n.now();
        n.node(0).post_send(now, a.qpn, wr).unwrap();
        // Until both sides are quiet: requests to node 1, its answers back.
        loop {
            let mut moved = false;
            for (from, to) in [(0, 1), (1, 0)] {
                let mut ts = n.take_transmits(from);
                moved |= !ts.is_empty();
                for t in &mut ts {
                    if let Some(g) = t.gathered {
                        assert!(gather && g.len >= 256, "{g:?}");
                        // Left out indeed: the buffer's old bytes (0xee,
                        // or a new buffer's zeros), where the MR holds a
                        // sequence of every byte value.
                        let left = &t.payload[g.at..g.at + g.len];
                        assert!(left.iter().all(|&b| b == 0xee || b == 0), "{g:?}");
                        n.node(from).fill_gathered(t).unwrap();
                        assert!(t.gathered.is_none());
                        gathered += 1;
                    }
                    assert_eq!(t.icrc, !defer);
                    if defer {
                        assert_eq!(t.payload[t.payload.len() - 4..], [0; 4]);
                        t.write_icrc();
                        assert!(t.icrc);
                    }
                }
                n.deliver_now(to, &ts);
                for t in ts {
                    wire.push(t.payload.clone());
                    if garbage {
                        let mut buf = t.payload;
                        buf.fill(0xee);
                        n.node(from).recycle(buf);
                    }
                }
            }
            if !moved {
                break;
            }
        }
    }
    (wire, gathered)
}

#[test]
fn packets_built_in_recycled_buffers_are_the_same_bytes() {
    let fresh = traffic(false, false);
    let recycled = traffic(true, false);
    assert!(
        fresh.len() >= 12,
        "the traffic ran: {} packets",
        fresh.len()
    );
    assert_eq!(fresh.len(), recycled.len());
    for (i, (f, r)) in fresh.iter().zip(&recycled).enumerate() {
        assert_eq!(f, r, "packet {i}");
    }
}

#[test]
fn packets_whose_icrc_the_driver_writes_are_the_same_bytes() {
    let whole = traffic(false, false);
    for garbage in [false, true] {
        let deferred = traffic(garbage, true);
        assert_eq!(whole.len(), deferred.len());
        for (i, (w, d)) in whole.iter().zip(&deferred).enumerate() {
            assert_eq!(w, d, "packet {i}");
        }
    }
}

#[test]
fn packets_whose_payload_the_driver_copies_in_are_the_same_bytes() {
    let whole = traffic(false, false);
    for garbage in [false, true] {
        let (gathered, left) = traffic_with(garbage, true, true);
        // The packets of the 2500-byte WRITE, the 1500-byte SEND and the
        // READ reply that carry 256 bytes or more; not the inline SEND,
        // the 7-byte WRITE, the atomic or the ACKs.
        assert!(left >= 3, "payloads left to the driver: {left}");
        assert_eq!(whole.len(), gathered.len());
        for (i, (w, d)) in whole.iter().zip(&gathered).enumerate() {
            assert_eq!(w, d, "packet {i}");
        }
    }
    // Not without a deferred ICRC (it covers the payload).
    assert_eq!(traffic_with(false, false, true).1, 0);
}
