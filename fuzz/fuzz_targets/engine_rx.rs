//! Hostile packets into a live RC QP pair that is in the middle of a
//! transfer. The input's first byte chooses whether to aim at the live QP
//! and whether to give the packet a valid ICRC (so that it reaches the
//! transport logic); the rest is the packet. After it, the network runs on:
//! the engines must never panic, and memory outside registered MRs must
//! never change.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network};
use rxe_core::{AccessFlags, QpType, RecvWr, RxDatagram, SendOp, SendWr, Sge};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut n = Network::new(1, LinkConfig::perfect());
    let a_ip = "10.0.0.1".parse().unwrap();
    let b_ip = "10.0.0.2".parse().unwrap();
    n.add_node(node_config(a_ip, 1));
    n.add_node(node_config(b_ip, 2));
    let a = n.create_endpoint(0, QpType::Rc, None, None, 16).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 16).unwrap();
    n.connect(&a, &b, &ConnectOpts { psn_a: 100, psn_b: 200, ..ConnectOpts::default() }).unwrap();
    // Registered memory on B, with guard regions around it that no MR covers.
    let guard_lo = n.node(1).mem_mut().alloc(4096);
    let region = n.node(1).mem_mut().alloc(8192);
    let guard_hi = n.node(1).mem_mut().alloc(4096);
    for g in [guard_lo, guard_hi] {
        n.node(1).mem_mut().write(g, &[0xAA; 4096]).unwrap();
    }
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    let mr = n.node(1).reg_mr(b.pd, region, 8192, all).unwrap();
    n.node(1).post_recv(b.qpn, RecvWr { wr_id: 1, sg_list: vec![Sge { addr: region, length: 4096, lkey: mr.lkey }] }).unwrap();
    let src = n.node(0).mem_mut().alloc(3000);
    let amr = n.node(0).reg_mr(a.pd, src, 3000, AccessFlags::LOCAL_WRITE).unwrap();
    let now = n.now();
    n.node(0).post_send(now, a.qpn, SendWr::new(1, SendOp::Send, vec![Sge { addr: src, length: 3000, lkey: amr.lkey }])).unwrap();
    // Let part of the transfer happen.
    n.step();
    n.step();

    let mut pkt = rest.to_vec();
    if mode & 1 != 0 && pkt.len() >= 8 {
        // Aim at the live QP (B) or at A's QP.
        let qpn = if mode & 4 != 0 { a.qpn } else { b.qpn };
        pkt[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    }
    let (src_ip, dst_ip, dst_node) = if mode & 4 != 0 { (b_ip, a_ip, 0) } else { (a_ip, b_ip, 1) };
    let info = wire::icrc::IpUdpInfo { src: src_ip, dst: dst_ip, src_port: 49152, dst_port: 4791, ipv4_id: 0, ipv4_flags_frag: 0x4000 };
    if mode & 2 != 0 {
        pkt.extend_from_slice(&[0; 4]);
        wire::icrc::write(&info, &mut pkt);
    }
    let dg = RxDatagram { src: src_ip, dst: dst_ip, src_port: 49152, dst_port: 4791, ipv4_id: if mode & 8 != 0 { None } else { Some(0) }, payload: &pkt, ecn: rxe_core::Ecn::NotEct };
    let now = n.now();
    n.node(dst_node).handle_datagram(now, &dg);
    let limit = n.now() + Duration::from_secs(10);
    n.run_until(limit, |_| false);
    for g in [guard_lo, guard_hi] {
        assert_eq!(n.node(1).mem_mut().slice(g, 4096).unwrap(), &[0xAA; 4096][..], "memory outside MRs changed");
    }
});
