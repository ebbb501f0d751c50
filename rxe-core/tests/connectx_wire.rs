//! What a ConnectX-like device sends differently from a kernel-rxe-like one
//! besides congestion control (`rxe_core::model`, `docs/connectx.md`):
//! the BTH MigReq bit of connected QPs and the UDP source port of UD
//! sends. The kernel-rxe-like device keeps both as kernel rxe has them.

use std::time::Duration;

use rxe_core::cc::{CcConfig, CcModel};
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{
    AccessFlags, AhAttr, QpType, RecvWr, SendOp, SendWr, Sge, Transmit, UdDest, WcStatus,
};

type Log = std::rc::Rc<std::cell::RefCell<Vec<Transmit>>>;

const A_IP: &str = "10.0.0.1";
const B_IP: &str = "10.0.0.2";

fn net(model: CcModel) -> (Network, Log) {
    let mut n = Network::new(3, LinkConfig::perfect());
    for (i, ip) in [A_IP, B_IP].iter().enumerate() {
        let mut c = node_config(ip.parse().unwrap(), i as u64 + 1);
        c.cc = CcConfig {
            model,
            ..CcConfig::default()
        };
        n.add_node(c);
    }
    let log: Log = Default::default();
    let l = log.clone();
    n.set_tap(move |_, t| l.borrow_mut().push(t.clone()));
    (n, log)
}

/// A buffer of `len` bytes registered on `node`: (addr, lkey, rkey).
fn mr(n: &mut Network, e: &QpEnd, len: usize) -> (u64, u32, u32) {
    let node = n.node(e.node);
    let addr = node.mem_mut().alloc(len);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let m = node.reg_mr(e.pd, addr, len as u64, access).unwrap();
    (addr, m.lkey, m.rkey)
}

fn settle(n: &mut Network) {
    let limit = n.now() + Duration::from_secs(10);
    n.run_until(limit, |_| false);
}

fn sends_ok(n: &mut Network, e: &QpEnd, count: usize) {
    let wcs = n.node(e.node).poll_cq(e.send_cq, 64).unwrap();
    assert_eq!(wcs.len(), count);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
}

/// Kernel `hash_32(val, bits)`.
fn hash_32(val: u32, bits: u32) -> u32 {
    val.wrapping_mul(0x61C8_8647) >> (32 - bits)
}

/// Kernel `rdma_get_udp_sport(0, lqpn, rqpn)`: `rdma_calc_flow_label`
/// then `rdma_flow_label_to_udp_sport`.
fn connected_port(lqpn: u32, rqpn: u32) -> u16 {
    let mut v = u64::from(lqpn) * u64::from(rqpn);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xf_ffff) as u32;
    (0xC000 | ((fl & 0x3fff) ^ (fl >> 14))) as u16
}

/// One RC WRITE of 3 packets from A to B; every packet of both directions.
fn rc_write(model: CcModel) -> (Vec<Transmit>, QpEnd, QpEnd) {
    let (mut n, log) = net(model);
    let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    let o = ConnectOpts {
        mtu: rxe_core::Mtu::M1024,
        ..ConnectOpts::default()
    };
    n.connect(&a, &b, &o).unwrap();
    let (src, lkey, _) = mr(&mut n, &a, 3000);
    let (dst, _, rkey) = mr(&mut n, &b, 3000);
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst,
            rkey,
        },
        vec![Sge {
            addr: src,
            length: 3000,
            lkey,
        }],
    );
    let now = n.now();
    n.node(0).post_send(now, a.qpn, wr).unwrap();
    settle(&mut n);
    sends_ok(&mut n, &a, 1);
    let log = log.borrow().clone();
    (log, a, b)
}

#[test]
fn connected_qps_send_migreq_only_when_connectx_like() {
    for (model, m) in [(CcModel::RxeLike, false), (CcModel::Mlx5Like, true)] {
        let (log, a, b) = rc_write(model);
        // 3 WRITE packets and at least one ACK.
        assert!(log.len() >= 4, "{model:?}: {}", log.len());
        let mut acks = 0;
        for t in &log {
            let bth = wire::bth::Packet::new_checked(&t.payload[..]).unwrap();
            assert_eq!(bth.mig_req(), m, "{model:?} opcode {:#x}", t.payload[0]);
            // The source port does not depend on the model: both kernel rxe
            // and mlx5 use rdma_get_udp_sport for a connected QP.
            let (l, r) = if t.info.src == A_IP.parse::<std::net::IpAddr>().unwrap() {
                (a.qpn, b.qpn)
            } else {
                acks += 1;
                (b.qpn, a.qpn)
            };
            assert_eq!(t.info.src_port, connected_port(l, r), "{model:?}");
            // The ICRC covers the bit: the packet is intact.
            assert!(wire::icrc::check(&t.info, &t.payload), "{model:?}");
        }
        assert!(acks >= 1);
    }
}

/// QP A (UD) sends once through each of two AHs to QP B: one AH without a
/// flow label, one with `0x12345`. Returns (A's QPN, the two AH handles,
/// the two source ports, in posting order).
fn ud_ports(model: CcModel) -> (u32, [u32; 2], [u16; 2]) {
    let (mut n, log) = net(model);
    let a = n.create_endpoint(0, QpType::Ud, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Ud, None, None, 8).unwrap();
    n.activate_ud(&a, 0x11, 0).unwrap();
    n.activate_ud(&b, 0x22, 0).unwrap();
    let (src, lkey, _) = mr(&mut n, &a, 64);
    let (rbuf, rlkey, _) = mr(&mut n, &b, 2 * 104);
    for i in 0..2u64 {
        let sge = Sge {
            addr: rbuf + i * 104,
            length: 104,
            lkey: rlkey,
        };
        let wr = RecvWr {
            wr_id: i,
            sg_list: vec![sge],
        };
        n.node(1).post_recv(b.qpn, wr).unwrap();
    }
    let dgid = B_IP
        .parse::<std::net::Ipv4Addr>()
        .unwrap()
        .to_ipv6_mapped()
        .octets();
    let mut ahs = [0u32; 2];
    for (i, fl) in [0u32, 0x12345].into_iter().enumerate() {
        let attr = AhAttr {
            dgid,
            flow_label: fl,
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        };
        let ah = n.node(0).create_ah(a.pd, &attr).unwrap();
        ahs[i] = ah.0;
        let mut wr = SendWr::new(
            i as u64,
            SendOp::Send,
            vec![Sge {
                addr: src,
                length: 64,
                lkey,
            }],
        );
        wr.ud = Some(UdDest {
            ah,
            remote_qpn: b.qpn,
            remote_qkey: 0x22,
        });
        let now = n.now();
        n.node(0).post_send(now, a.qpn, wr).unwrap();
    }
    settle(&mut n);
    sends_ok(&mut n, &a, 2);
    let got = n.node(1).poll_cq(b.recv_cq, 8).unwrap();
    assert_eq!(got.len(), 2, "both datagrams arrive");
    let log = log.borrow();
    assert_eq!(log.len(), 2);
    for t in log.iter() {
        let bth = wire::bth::Packet::new_checked(&t.payload[..]).unwrap();
        assert!(!bth.mig_req(), "UD keeps MigReq 0 on both models");
        assert!(wire::icrc::check(&t.info, &t.payload));
    }
    (a.qpn, ahs, [log[0].info.src_port, log[1].info.src_port])
}

#[test]
fn ud_source_port_is_the_qps_on_rxe_and_the_ahs_on_connectx() {
    // Kernel rxe (rxe_qp.c): 0xC000 + (hash_32(qpn, 14) & 0x3fff), for
    // every datagram of the QP whatever its AH.
    let (qpn, _, ports) = ud_ports(CcModel::RxeLike);
    let qp_port = (0xC000 | (hash_32(qpn, 14) & 0x3fff)) as u16;
    assert_eq!(ports, [qp_port, qp_port]);

    // ConnectX (rdma-core mlx5_ah_set_udp_sport): the AH's port. Without a
    // flow label rdma-core draws it at random; we take 0xC000 |
    // hash_32(handle, 14). With flow label 0x12345: low 14 bits 0x2345 XOR
    // top 6 bits 0x04 = 0x2341, so 0xE341.
    let (_, ahs, ports) = ud_ports(CcModel::Mlx5Like);
    assert_eq!(ports[0], (0xC000 | hash_32(ahs[0], 14)) as u16);
    assert_eq!(ports[1], 0xE341);
    assert_ne!(ports[0], qp_port);
}
