//! Two or more devices in one process on loopback addresses, moving real
//! RoCEv2 datagrams over UDP/4791. Each test uses its own 127.0.x.y
//! addresses so tests can run in parallel.

use std::time::Duration;

use verbs_api::{
    AccessFlags, AhAttr, CompletionQueue, Device, DeviceConfig, FaultConfig, Mtu, ProtectionDomain,
    QpAttr, QpAttrMask as M, QpCap, QpState, QpType, QueuePair, RecvWr, SendOp, SendWr, SrqAttr,
    UdDest, WcFlags, WcOpcode, WcStatus,
};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const WAIT: Duration = Duration::from_secs(20);

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn side(ip: &str, ty: QpType, fault: Option<FaultConfig>) -> Side {
    let mut cfg = DeviceConfig::new(ip.parse().unwrap());
    cfg.fault = fault;
    let dev = Device::open(cfg).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let cap = QpCap {
        max_send_wr: 512,
        max_recv_wr: 512,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(ty, &cq, &cq, None, cap, false).unwrap();
    Side { dev, pd, cq, qp }
}

/// RESET -> INIT -> RTR -> RTS, as an application does after exchanging
/// QPN, PSN and GID out of band.
fn connect(me: &Side, peer: &Side, my_psn: u32, peer_psn: u32, rc: bool) {
    me.qp
        .modify(
            &QpAttr {
                qp_state: Some(QpState::Init),
                port_num: 1,
                qp_access_flags: ALL.bits(),
                ..QpAttr::default()
            },
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .unwrap();
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::M4096),
        dest_qp_num: peer.qp.qpn(),
        rq_psn: peer_psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dgid: peer.dev.gid(),
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let mut m = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    if rc {
        m |= M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    }
    me.qp.modify(&rtr, m).unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: my_psn,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..QpAttr::default()
    };
    let mut m = M::STATE | M::SQ_PSN;
    if rc {
        m |= M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    }
    me.qp.modify(&rts, m).unwrap();
}

fn pair(a_ip: &str, b_ip: &str, ty: QpType, fault: Option<FaultConfig>) -> (Side, Side) {
    let a = side(a_ip, ty, fault);
    let b = side(b_ip, ty, None);
    connect(&a, &b, 0x00ff_fff0, 77, ty == QpType::Rc);
    connect(&b, &a, 77, 0x00ff_fff0, ty == QpType::Rc);
    (a, b)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 11) as u8)
        })
        .collect()
}

#[test]
fn every_rc_opcode_over_udp() {
    let (a, b) = pair("127.0.1.1", "127.0.1.2", QpType::Rc, None);
    let mut abuf = pattern(3 * 4096 + 100, 1);
    let expect = abuf.clone();
    let amr = a.pd.reg_mr(&mut abuf, ALL).unwrap();
    let mut bbuf = vec![0u8; 4 * 4096 + 100];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    let len = expect.len() as u32;
    // SEND with immediate into a posted receive.
    b.qp.post_recv(RecvWr {
        wr_id: 7,
        sg_list: vec![bmr.sge(0, len)],
    })
    .unwrap();
    a.qp.post_send(SendWr::new(
        1,
        SendOp::SendWithImm { imm: 0xabcd },
        vec![amr.sge(0, len)],
    ))
    .unwrap();
    let rc = b.cq.wait(1, WAIT).unwrap();
    assert_eq!(
        rc.len(),
        1,
        "no receive completion; counters {:?}",
        b.dev.counters()
    );
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].byte_len, rc[0].imm_data),
        (7, WcStatus::Success, len, 0xabcd)
    );
    let mut got = vec![0u8; len as usize];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(got, expect);
    // WRITE with immediate, READ back, atomics.
    b.qp.post_recv(RecvWr {
        wr_id: 8,
        sg_list: vec![],
    })
    .unwrap();
    a.qp.post_send(SendWr::new(
        2,
        SendOp::RdmaWriteWithImm {
            remote_addr: bmr.addr() + 50,
            rkey: bmr.rkey(),
            imm: 5,
        },
        vec![amr.sge(0, len)],
    ))
    .unwrap();
    let mut back = vec![0u8; len as usize + 16];
    let backmr = a.pd.reg_mr(&mut back, ALL).unwrap();
    a.qp.post_send(SendWr::new(
        3,
        SendOp::RdmaRead {
            remote_addr: bmr.addr() + 50,
            rkey: bmr.rkey(),
        },
        vec![backmr.sge(0, len)],
    ))
    .unwrap();
    bmr.write(4 * 4096 + 8, &41u64.to_ne_bytes()).unwrap();
    let ctr = bmr.addr() + 4 * 4096 + 8;
    a.qp.post_send(SendWr::new(
        4,
        SendOp::AtomicFetchAdd {
            remote_addr: ctr,
            rkey: bmr.rkey(),
            add: 1,
        },
        vec![backmr.sge(u64::from(len), 8)],
    ))
    .unwrap();
    a.qp.post_send(SendWr::new(
        5,
        SendOp::AtomicCmpSwp {
            remote_addr: ctr,
            rkey: bmr.rkey(),
            compare: 42,
            swap: 7,
        },
        vec![backmr.sge(u64::from(len) + 8, 8)],
    ))
    .unwrap();
    let sc = a.cq.wait(5, WAIT).unwrap();
    let v: Vec<_> = sc.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
    assert_eq!(
        v,
        vec![
            (1, WcOpcode::Send, WcStatus::Success),
            (2, WcOpcode::RdmaWrite, WcStatus::Success),
            (3, WcOpcode::RdmaRead, WcStatus::Success),
            (4, WcOpcode::FetchAdd, WcStatus::Success),
            (5, WcOpcode::CompSwap, WcStatus::Success),
        ]
    );
    let mut got = vec![0u8; len as usize + 16];
    backmr.read(0, &mut got).unwrap();
    assert_eq!(&got[..len as usize], &expect[..]);
    assert_eq!(&got[len as usize..len as usize + 8], &41u64.to_ne_bytes());
    assert_eq!(&got[len as usize + 8..], &42u64.to_ne_bytes());
    let rc = b.cq.wait(1, WAIT).unwrap();
    assert_eq!(
        (rc[0].opcode, rc[0].imm_data, rc[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, 5, len)
    );
    let mut w = [0u8; 8];
    bmr.read(4 * 4096 + 8, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 7);
    assert_eq!(
        a.dev.counters().rcvd_icrc_err + b.dev.counters().rcvd_icrc_err,
        0
    );
}

#[test]
fn ud_with_grh_and_srq_over_udp() {
    let a = side("127.0.2.1", QpType::Ud, None);
    let dev_b = Device::open(DeviceConfig::new("127.0.2.2".parse().unwrap())).unwrap();
    let pd_b = dev_b.alloc_pd().unwrap();
    let cq_b = dev_b.create_cq(64).unwrap();
    let srq = pd_b
        .create_srq(SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp_b = pd_b
        .create_qp(QpType::Ud, &cq_b, &cq_b, Some(&srq), cap, false)
        .unwrap();
    for (qp, qkey) in [(&a.qp, 0x1111u32), (&qp_b, 0x2222)] {
        qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Init),
                port_num: 1,
                qkey,
                ..QpAttr::default()
            },
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
        )
        .unwrap();
        qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                ..QpAttr::default()
            },
            M::STATE,
        )
        .unwrap();
        qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Rts),
                sq_psn: 1,
                ..QpAttr::default()
            },
            M::STATE | M::SQ_PSN,
        )
        .unwrap();
    }
    let mut rbuf = vec![0u8; 4 * 1100];
    let rmr = pd_b.reg_mr(&mut rbuf, ALL).unwrap();
    for i in 0..4u64 {
        srq.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![rmr.sge(i * 1100, 1100)],
        })
        .unwrap();
    }
    let mut sbuf = pattern(1000, 3);
    let smr = a.pd.reg_mr(&mut sbuf, ALL).unwrap();
    let ah =
        a.pd.create_ah(&AhAttr {
            dgid: dev_b.gid(),
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        })
        .unwrap();
    for i in 0..3 {
        let mut wr = SendWr::new(i, SendOp::Send, vec![smr.sge(0, 1000)]);
        wr.ud = Some(UdDest {
            ah: ah.handle(),
            remote_qpn: qp_b.qpn(),
            remote_qkey: 0x2222,
        });
        a.qp.post_send(wr).unwrap();
    }
    let rc = cq_b.wait(3, WAIT).unwrap();
    assert_eq!(rc.len(), 3);
    for w in &rc {
        assert_eq!(
            (w.status, w.byte_len, w.src_qp),
            (WcStatus::Success, 1040, a.qp.qpn())
        );
        assert!(w.wc_flags.contains(WcFlags::GRH));
        let mut grh = [0u8; 40];
        rmr.read(w.wr_id * 1100, &mut grh).unwrap();
        assert_eq!(&grh[32..36], &[127, 0, 2, 1], "source address in the GRH");
        let mut data = vec![0u8; 1000];
        rmr.read(w.wr_id * 1100 + 40, &mut data).unwrap();
        assert_eq!(data, pattern(1000, 3));
    }
}

#[test]
fn write_stream_survives_loss_duplication_and_reordering() {
    let fault = FaultConfig {
        seed: 42,
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.05,
    };
    let (a, b) = pair("127.0.3.1", "127.0.3.2", QpType::Rc, Some(fault));
    const LEN: usize = 64 << 20;
    let mut src = pattern(LEN, 9);
    let expect = src.clone();
    let smr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; LEN];
    let dmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    const CHUNK: u32 = 1 << 20;
    for i in 0..(LEN as u32 / CHUNK) {
        let off = u64::from(i * CHUNK);
        a.qp.post_send(SendWr::new(
            u64::from(i),
            SendOp::RdmaWrite {
                remote_addr: dmr.addr() + off,
                rkey: dmr.rkey(),
            },
            vec![smr.sge(off, CHUNK)],
        ))
        .unwrap();
    }
    let wcs =
        a.cq.wait(LEN / CHUNK as usize, Duration::from_secs(300))
            .unwrap();
    assert_eq!(
        wcs.len(),
        LEN / CHUNK as usize,
        "counters {:?}",
        a.dev.counters()
    );
    assert!(
        wcs.iter().all(|w| w.status == WcStatus::Success),
        "{:?}",
        wcs.iter().find(|w| w.status != WcStatus::Success)
    );
    drop(dmr);
    assert!(dst == expect, "64 MiB arrived corrupted");
    let c = a.dev.counters();
    assert!(
        c.completer_retry_err > 0,
        "the fault injection never forced a retransmission: {c:?}"
    );
}
