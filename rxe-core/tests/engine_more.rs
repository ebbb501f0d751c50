//! More engine behaviour: segmentation and reassembly as a property, local
//! invalidate, type 1 windows, asynchronous events, UD longer than the MTU,
//! IPv6 paths, and ICRC checking without the IPv4 ID.

use std::time::Duration;

use proptest::prelude::*;
use rxe_core::mem::Memory;
use rxe_core::sim::{node_config, ConnectOpts, LinkConfig, Network, QpEnd};
use rxe_core::{
    AccessFlags, AhAttr, AsyncEventKind, Mtu, MwBindInfo, MwType, QpState, QpType, RecvWr, SendOp,
    SendWr, Sge, SrqAttr, UdDest, WcStatus, WorkCompletion,
};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn net_ips(seed: u64, link: LinkConfig, a: &str, b: &str) -> Network {
    let mut n = Network::new(seed, link);
    n.add_node(node_config(a.parse().unwrap(), seed));
    n.add_node(node_config(b.parse().unwrap(), seed + 1));
    n
}

fn net(seed: u64) -> Network {
    net_ips(seed, LinkConfig::perfect(), "10.0.0.1", "10.0.0.2")
}

fn mr(
    n: &mut Network,
    node: usize,
    pd: rxe_core::PdHandle,
    len: usize,
    access: AccessFlags,
) -> (u64, rxe_core::mr::Mr) {
    let addr = n.node(node).mem_mut().alloc(len.max(1));
    let m = n.node(node).reg_mr(pd, addr, len as u64, access).unwrap();
    (addr, m)
}

fn settle(n: &mut Network) {
    let t = n.now() + Duration::from_secs(30);
    n.run_until(t, |_| false);
}

fn wcs(n: &mut Network, node: usize, e: &QpEnd) -> Vec<WorkCompletion> {
    n.node(node).poll_cq(e.send_cq, 1000).unwrap()
}

fn events(n: &mut Network, node: usize) -> Vec<AsyncEventKind> {
    std::iter::from_fn(|| n.node(node).poll_event())
        .map(|e| e.kind)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any message, cut into any SGE layout on both sides, over any MTU,
    /// arrives intact in the right number of packets.
    #[test]
    fn segmentation_and_reassembly(len in 0usize..20_000, mtu_i in 0usize..5, cuts in proptest::collection::vec(1usize..5000, 0..3), rcuts in proptest::collection::vec(1usize..5000, 0..3), write in any::<bool>()) {
        let mtu = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096][mtu_i];
        let mut n = net(len as u64);
        let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
        let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
        n.connect(&a, &b, &ConnectOpts { mtu, ..ConnectOpts::default() }).unwrap();
        let (src, smr) = mr(&mut n, 0, a.pd, len, AccessFlags::empty());
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
        n.node(0).mem_mut().write(src, &data).unwrap();
        let (dst, dmr) = mr(&mut n, 1, b.pd, len, ALL);
        let split = |base: u64, lkey: u32, cuts: &[usize]| {
            let mut sges = Vec::new();
            let mut off = 0usize;
            for c in cuts {
                let take = (*c).min(len - off);
                sges.push(Sge { addr: base + off as u64, length: take as u32, lkey });
                off += take;
            }
            sges.push(Sge { addr: base + off as u64, length: (len - off) as u32, lkey });
            sges
        };
        let sg = split(src, smr.lkey, &cuts);
        let op = if write {
            SendOp::RdmaWrite { remote_addr: dst, rkey: dmr.rkey }
        } else {
            n.node(1).post_recv(b.qpn, RecvWr { wr_id: 1, sg_list: split(dst, dmr.lkey, &rcuts) }).unwrap();
            SendOp::Send
        };
        let now = n.now();
        n.node(0).post_send(now, a.qpn, SendWr::new(1, op, sg)).unwrap();
        settle(&mut n);
        let w = wcs(&mut n, 0, &a);
        prop_assert_eq!(w.len(), 1);
        prop_assert_eq!(w[0].status, WcStatus::Success);
        prop_assert_eq!(n.node(1).mem_mut().slice(dst, len).unwrap(), &data[..]);
        let pkts = len.div_ceil(mtu.bytes() as usize).max(1) as u64;
        prop_assert_eq!(n.nodes()[0].counters().sent_pkts, pkts);
        prop_assert_eq!(n.nodes()[1].counters().rcvd_pkts, pkts);
    }
}

#[test]
fn local_invalidate_of_a_type2_window_and_of_a_user_mr() {
    let mut n = net(1);
    let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    let (addr, region) = mr(&mut n, 1, b.pd, 4096, ALL | AccessFlags::MW_BIND);
    let mw = n.node(1).alloc_mw(b.pd, MwType::Type2).unwrap();
    let bind = MwBindInfo {
        mr_lkey: region.lkey,
        addr,
        length: 4096,
        access: AccessFlags::REMOTE_READ,
    };
    let now = n.now();
    n.node(1)
        .post_send(
            now,
            b.qpn,
            SendWr::new(
                1,
                SendOp::BindMw {
                    mw_rkey: mw,
                    new_key: 7,
                    bind,
                },
                vec![],
            ),
        )
        .unwrap();
    let key = (mw & !0xff) | 7;
    n.node(1)
        .post_send(
            now,
            b.qpn,
            SendWr::new(2, SendOp::LocalInv { rkey: key }, vec![]),
        )
        .unwrap();
    settle(&mut n);
    let w = wcs(&mut n, 1, &b);
    assert_eq!(
        w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(
        n.node(1).mw(key).unwrap().state,
        rxe_core::mr::MwState::Invalid
    );
    // A user MR is not a fast-registration MR: invalidating it fails (kernel rxe too).
    let now = n.now();
    n.node(1)
        .post_send(
            now,
            b.qpn,
            SendWr::new(3, SendOp::LocalInv { rkey: region.rkey }, vec![]),
        )
        .unwrap();
    settle(&mut n);
    let w = wcs(&mut n, 1, &b);
    assert_eq!(w[0].status, WcStatus::LocQpOpErr);
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Err));
    assert!(n
        .node(1)
        .qp_error_reason(b.qpn)
        .unwrap()
        .contains("user MR"));
}

#[test]
fn type1_window_grants_remote_access_to_any_qp_of_the_pd() {
    let mut n = net(2);
    let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    let (addr, region) = mr(&mut n, 1, b.pd, 4096, ALL | AccessFlags::MW_BIND);
    let mw = n.node(1).alloc_mw(b.pd, MwType::Type1).unwrap();
    let bind = MwBindInfo {
        mr_lkey: region.lkey,
        addr: addr + 100,
        length: 50,
        access: AccessFlags::REMOTE_READ,
    };
    let key = n.node(1).bind_mw_type1(b.qpn, mw, &bind).unwrap();
    n.node(1).mem_mut().write(addr + 100, &[9u8; 50]).unwrap();
    let (dst, dmr) = mr(&mut n, 0, a.pd, 64, AccessFlags::LOCAL_WRITE);
    let now = n.now();
    n.node(0)
        .post_send(
            now,
            a.qpn,
            SendWr::new(
                1,
                SendOp::RdmaRead {
                    remote_addr: addr + 100,
                    rkey: key,
                },
                vec![Sge {
                    addr: dst,
                    length: 50,
                    lkey: dmr.lkey,
                }],
            ),
        )
        .unwrap();
    settle(&mut n);
    assert_eq!(wcs(&mut n, 0, &a)[0].status, WcStatus::Success);
    assert_eq!(n.node(0).mem_mut().slice(dst, 50).unwrap(), &[9u8; 50]);
    // One byte past the window: remote access error.
    let now = n.now();
    n.node(0)
        .post_send(
            now,
            a.qpn,
            SendWr::new(
                2,
                SendOp::RdmaRead {
                    remote_addr: addr + 101,
                    rkey: key,
                },
                vec![Sge {
                    addr: dst,
                    length: 50,
                    lkey: dmr.lkey,
                }],
            ),
        )
        .unwrap();
    settle(&mut n);
    assert_eq!(wcs(&mut n, 0, &a)[0].status, WcStatus::RemAccessErr);
    // A bound MR cannot be deregistered.
    assert!(n.node(1).dereg_mr(region.lkey).is_err());
}

#[test]
fn comm_est_and_qp_req_err_events() {
    let mut n = net(3);
    let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    // B's QP stays in RTR: its first packet raises COMM_EST.
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    let now = n.now();
    n.node(1)
        .modify_qp(
            now,
            b.qpn,
            &rxe_core::QpAttr {
                qp_state: Some(QpState::Err),
                ..Default::default()
            },
            rxe_core::QpAttrMask::STATE,
        )
        .unwrap();
    n.node(1)
        .modify_qp(
            now,
            b.qpn,
            &rxe_core::QpAttr {
                qp_state: Some(QpState::Reset),
                ..Default::default()
            },
            rxe_core::QpAttrMask::STATE,
        )
        .unwrap();
    let b2 = QpEnd { ..b };
    // Re-connect B only up to RTR by hand.
    let o = ConnectOpts::default();
    let gid_a = "10.0.0.1"
        .parse::<std::net::Ipv4Addr>()
        .unwrap()
        .to_ipv6_mapped()
        .octets();
    let e = n.node(1);
    use rxe_core::QpAttrMask as M;
    e.modify_qp(
        now,
        b2.qpn,
        &rxe_core::QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE.bits(),
            ..Default::default()
        },
        M::STATE | M::PORT | M::PKEY_INDEX | M::ACCESS_FLAGS,
    )
    .unwrap();
    e.modify_qp(
        now,
        b2.qpn,
        &rxe_core::QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(o.mtu),
            dest_qp_num: a.qpn,
            rq_psn: o.psn_a,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
            ah_attr: AhAttr {
                dgid: gid_a,
                is_global: true,
                port_num: 1,
                ..AhAttr::default()
            },
            ..Default::default()
        },
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    let (src, smr) = mr(&mut n, 0, a.pd, 8, AccessFlags::empty());
    // No REMOTE_WRITE on B's QP: a WRITE is an invalid request (kernel check_op_valid).
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
                    length: 8,
                    lkey: smr.lkey,
                }],
            ),
        )
        .unwrap();
    settle(&mut n);
    assert_eq!(wcs(&mut n, 0, &a)[0].status, WcStatus::RemInvReqErr);
    let ev = events(&mut n, 1);
    assert_eq!(
        ev,
        vec![AsyncEventKind::CommEst, AsyncEventKind::QpReqErr],
        "{ev:?}"
    );
    assert_eq!(n.node(1).qp_state(b.qpn), Some(QpState::Err));
}

#[test]
fn last_wqe_reached_for_srq_qp_entering_error() {
    let mut n = net(4);
    let pd = n.node(1).alloc_pd().unwrap();
    let srq = n
        .node(1)
        .create_srq(
            pd,
            SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let b = n
        .create_endpoint(1, QpType::Rc, Some(pd), Some(srq), 4)
        .unwrap();
    let a = n.create_endpoint(0, QpType::Rc, None, None, 4).unwrap();
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    let (buf, m) = mr(&mut n, 1, pd, 64, AccessFlags::LOCAL_WRITE);
    n.node(1)
        .post_srq_recv(
            srq,
            RecvWr {
                wr_id: 1,
                sg_list: vec![Sge {
                    addr: buf,
                    length: 64,
                    lkey: m.lkey,
                }],
            },
        )
        .unwrap();
    let now = n.now();
    n.node(1)
        .modify_qp(
            now,
            b.qpn,
            &rxe_core::QpAttr {
                qp_state: Some(QpState::Err),
                ..Default::default()
            },
            rxe_core::QpAttrMask::STATE,
        )
        .unwrap();
    assert_eq!(events(&mut n, 1), vec![AsyncEventKind::QpLastWqeReached]);
    // The SRQ keeps its WQE for other QPs.
    assert_eq!(n.node(1).query_srq(srq).unwrap().1, 1);
    assert!(n.node(1).poll_cq(b.recv_cq, 10).unwrap().is_empty());
}

#[test]
fn ud_longer_than_mtu_is_not_sent_and_not_an_error() {
    let mut n = net(5);
    let a = n.create_endpoint(0, QpType::Ud, None, None, 4).unwrap();
    let b = n.create_endpoint(1, QpType::Ud, None, None, 4).unwrap();
    n.activate_ud(&a, 1, 0).unwrap();
    n.activate_ud(&b, 1, 0).unwrap();
    let (src, smr) = mr(&mut n, 0, a.pd, 5000, AccessFlags::empty());
    let gid = "10.0.0.2"
        .parse::<std::net::Ipv4Addr>()
        .unwrap()
        .to_ipv6_mapped()
        .octets();
    let ah = n
        .node(0)
        .create_ah(
            a.pd,
            &AhAttr {
                dgid: gid,
                is_global: true,
                port_num: 1,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let mut wr = SendWr::new(
        1,
        SendOp::Send,
        vec![Sge {
            addr: src,
            length: 4097,
            lkey: smr.lkey,
        }],
    );
    wr.ud = Some(UdDest {
        ah,
        remote_qpn: b.qpn,
        remote_qkey: 1,
    });
    let now = n.now();
    n.node(0).post_send(now, a.qpn, wr).unwrap();
    settle(&mut n);
    // IBTA C10-93.1.1: no packet, no error.
    assert_eq!(wcs(&mut n, 0, &a)[0].status, WcStatus::Success);
    assert_eq!(n.nodes()[0].counters().sent_pkts, 0);
}

#[test]
fn ipv6_paths_and_hidden_ipv4_ids() {
    for (x, y, hide) in [
        ("fd00::1", "fd00::2", false),
        ("10.9.0.1", "10.9.0.2", true),
    ] {
        let link = LinkConfig {
            loss: 0.05,
            corrupt: 0.05,
            hide_ipv4_id: hide,
            ..LinkConfig::perfect()
        };
        let mut n = net_ips(6, link, x, y);
        let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
        let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
        n.connect(&a, &b, &ConnectOpts::default()).unwrap();
        let (src, smr) = mr(&mut n, 0, a.pd, 100_000, AccessFlags::empty());
        let data: Vec<u8> = (0..100_000).map(|i| (i % 251) as u8).collect();
        n.node(0).mem_mut().write(src, &data).unwrap();
        let (dst, dmr) = mr(&mut n, 1, b.pd, 100_000, ALL);
        let now = n.now();
        n.node(0)
            .post_send(
                now,
                a.qpn,
                SendWr::new(
                    1,
                    SendOp::RdmaWrite {
                        remote_addr: dst,
                        rkey: dmr.rkey,
                    },
                    vec![Sge {
                        addr: src,
                        length: 100_000,
                        lkey: smr.lkey,
                    }],
                ),
            )
            .unwrap();
        settle(&mut n);
        assert_eq!(wcs(&mut n, 0, &a)[0].status, WcStatus::Success, "{x}");
        assert_eq!(n.node(1).mem_mut().slice(dst, 100_000).unwrap(), &data[..]);
        let caught: u64 = n.nodes().iter().map(|e| e.counters().rcvd_icrc_err).sum();
        assert_eq!(
            caught,
            n.stats().corrupted,
            "{x}: every corrupted datagram is caught"
        );
        assert!(n.stats().corrupted > 0);
    }
}

/// RDMA WRITE `len` bytes from `src` (lkey `lkey`) on node 0 to `dst`.
fn write_to(n: &mut Network, a: &QpEnd, id: u64, src: (u64, u32), dst: u64, rkey: u32) -> WcStatus {
    let now = n.now();
    let op = SendOp::RdmaWrite {
        remote_addr: dst,
        rkey,
    };
    let sg = vec![Sge {
        addr: src.0,
        length: 64,
        lkey: src.1,
    }];
    n.node(0)
        .post_send(now, a.qpn, SendWr::new(id, op, sg))
        .unwrap();
    settle(n);
    let w = wcs(n, 0, a);
    assert_eq!(w.len(), 1, "{w:?}");
    w[0].status
}

#[test]
fn rereg_mr_changes_access_pd_and_translation_in_place() {
    let mut n = net(41);
    let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    let (saddr, smr) = mr(&mut n, 0, a.pd, 64, AccessFlags::LOCAL_WRITE);
    n.node(0).mem_mut().write(saddr, &[0xab; 64]).unwrap();
    let src = (saddr, smr.lkey);
    let (daddr, dmr) = mr(&mut n, 1, b.pd, 64, ALL);
    assert_eq!(
        write_to(&mut n, &a, 1, src, daddr, dmr.rkey),
        WcStatus::Success
    );

    // Access: without remote write the same rkey is refused.
    let m = n
        .node(1)
        .rereg_mr(dmr.lkey, None, None, Some(AccessFlags::LOCAL_WRITE))
        .unwrap();
    assert_eq!((m.lkey, m.rkey), (dmr.lkey, dmr.rkey), "keys are kept");
    assert_eq!(
        write_to(&mut n, &a, 2, src, daddr, dmr.rkey),
        WcStatus::RemAccessErr
    );
    // An invalid combination changes nothing.
    assert!(n
        .node(1)
        .rereg_mr(dmr.lkey, None, None, Some(AccessFlags::REMOTE_WRITE))
        .is_err());
    assert_eq!(
        n.node(1).mr(dmr.lkey).unwrap().access,
        AccessFlags::LOCAL_WRITE
    );

    // PD: a fresh pair; the MR moves to the new responder's PD and serves it.
    let a2 = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let b2 = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    n.connect(&a2, &b2, &ConnectOpts::default()).unwrap();
    n.node(0)
        .rereg_mr(smr.lkey, Some(a2.pd), None, None)
        .unwrap();
    n.node(1)
        .rereg_mr(dmr.lkey, Some(b2.pd), None, Some(ALL))
        .unwrap();
    n.node(1).mem_mut().write(daddr, &[0; 64]).unwrap();
    assert_eq!(
        write_to(&mut n, &a2, 3, src, daddr, dmr.rkey),
        WcStatus::Success
    );
    assert_eq!(
        n.node(1).mem_mut().slice(daddr, 64).unwrap(),
        &[0xab; 64][..]
    );

    // Translation: the keys now name other memory; the old range is gone.
    let naddr = n.node(1).mem_mut().alloc(64);
    n.node(1)
        .rereg_mr(dmr.lkey, None, Some((naddr, 64, None)), None)
        .unwrap();
    assert_eq!(
        write_to(&mut n, &a2, 4, src, naddr, dmr.rkey),
        WcStatus::Success
    );
    assert_eq!(
        n.node(1).mem_mut().slice(naddr, 64).unwrap(),
        &[0xab; 64][..]
    );
    assert_eq!(
        write_to(&mut n, &a2, 5, src, daddr, dmr.rkey),
        WcStatus::RemAccessErr
    );
    assert!(n.node(1).rereg_mr(0xdead_beef, None, None, None).is_err());
}

#[test]
fn reset_discards_the_qps_completions_still_in_its_cq() {
    let mut n = net(42);
    let a = n.create_endpoint(0, QpType::Rc, None, None, 8).unwrap();
    let b = n.create_endpoint(1, QpType::Rc, None, None, 8).unwrap();
    n.connect(&a, &b, &ConnectOpts::default()).unwrap();
    let (saddr, smr) = mr(&mut n, 0, a.pd, 64, AccessFlags::LOCAL_WRITE);
    let now = n.now();
    let op = SendOp::RdmaWrite {
        remote_addr: 0x1000,
        rkey: 0x1234_5600,
    };
    let sg = vec![Sge {
        addr: saddr,
        length: 64,
        lkey: smr.lkey,
    }];
    n.node(0)
        .post_send(now, a.qpn, SendWr::new(1, op, sg.clone()))
        .unwrap();
    n.node(0)
        .post_send(now, a.qpn, SendWr::new(2, SendOp::Send, sg))
        .unwrap();
    settle(&mut n);
    assert_eq!(n.node(0).qp_state(a.qpn), Some(QpState::Err));
    // The error and the flush wait in the CQ; RESET drops them (as ConnectX does).
    let now = n.now();
    n.node(0)
        .modify_qp(
            now,
            a.qpn,
            &rxe_core::QpAttr {
                qp_state: Some(QpState::Reset),
                ..Default::default()
            },
            rxe_core::QpAttrMask::STATE,
        )
        .unwrap();
    assert!(wcs(&mut n, 0, &a).is_empty());
}
