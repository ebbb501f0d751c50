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
    side_of(cfg, ty)
}

fn side_of(cfg: DeviceConfig, ty: QpType) -> Side {
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
    connect_with_timeout(me, peer, my_psn, peer_psn, rc, 10)
}

fn connect_with_timeout(me: &Side, peer: &Side, my_psn: u32, peer_psn: u32, rc: bool, timeout: u8) {
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
            sgid_index: me.dev.gid_index(),
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
        timeout,
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
        ud_ready(qp, qkey);
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
            sgid_index: a.dev.gid_index(),
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
        corrupt: 0.0,
        ..Default::default()
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

#[test]
fn completion_channel_wakes_an_epoll_loop() {
    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
    use std::os::fd::AsFd;

    let a = side("127.0.4.1", QpType::Rc, None);
    let dev_b = Device::open(DeviceConfig::new("127.0.4.2".parse().unwrap())).unwrap();
    let pd_b = dev_b.alloc_pd().unwrap();
    let chan = dev_b.create_comp_channel().unwrap();
    let cq_b = dev_b.create_cq_with_channel(64, &chan).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp_b = pd_b
        .create_qp(QpType::Rc, &cq_b, &cq_b, None, cap, false)
        .unwrap();
    let b = Side {
        dev: dev_b,
        pd: pd_b,
        cq: cq_b,
        qp: qp_b,
    };
    connect(&a, &b, 1, 2, true);
    connect(&b, &a, 2, 1, true);
    let mut rbuf = vec![0u8; 64];
    let rmr = b.pd.reg_mr(&mut rbuf, ALL).unwrap();
    let mut sbuf = vec![7u8; 64];
    let smr = a.pd.reg_mr(&mut sbuf, ALL).unwrap();

    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
    epoll
        .add(chan.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 42))
        .unwrap();
    let mut events = [EpollEvent::empty(); 4];

    for round in 0..3u64 {
        b.cq.req_notify(false).unwrap();
        assert!(b.cq.poll(1).unwrap().is_empty());
        // Nothing yet: the fd is not readable.
        assert_eq!(epoll.wait(&mut events, EpollTimeout::ZERO).unwrap(), 0);
        b.qp.post_recv(RecvWr {
            wr_id: round,
            sg_list: vec![rmr.sge(0, 64)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(round, SendOp::Send, vec![smr.sge(0, 64)]))
            .unwrap();
        let n = epoll
            .wait(
                &mut events,
                EpollTimeout::try_from(Duration::from_secs(10)).unwrap(),
            )
            .unwrap();
        assert_eq!(
            n, 1,
            "the completion channel did not wake epoll in round {round}"
        );
        assert_eq!(events[0].data(), 42);
        assert_eq!(chan.get_cq_event().unwrap(), Some(b.cq.id()));
        b.cq.ack_events(1);
        let wc = b.cq.poll(4).unwrap();
        assert_eq!(
            wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(round, WcStatus::Success)]
        );
    }
    // Not re-armed: a further completion produces no event.
    b.qp.post_recv(RecvWr {
        wr_id: 9,
        sg_list: vec![rmr.sge(0, 64)],
    })
    .unwrap();
    a.qp.post_send(SendWr::new(9, SendOp::Send, vec![smr.sge(0, 64)]))
        .unwrap();
    assert_eq!(b.cq.wait(1, WAIT).unwrap().len(), 1);
    chan.set_nonblocking(true).unwrap();
    assert_eq!(chan.get_cq_event().unwrap(), None);
}

#[test]
fn message_sizes_from_zero_to_16_mib() {
    let (a, b) = pair("127.0.5.1", "127.0.5.2", QpType::Rc, None);
    let mtu = a.dev.port_mtu().bytes() as usize;
    assert_eq!(mtu, 4096, "loopback MTU 65536 gives path MTU 4096");
    const BIG: usize = 16 << 20;
    let mut src = pattern(BIG, 5);
    let expect = src.clone();
    let smr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; BIG];
    let dmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    for (i, size) in [0usize, 1, mtu - 1, mtu, mtu + 1, BIG]
        .into_iter()
        .enumerate()
    {
        let i = i as u64;
        // SEND into a receive, then WRITE and READ of the same size.
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![dmr.sge(0, size as u32)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(i, SendOp::Send, vec![smr.sge(0, size as u32)]))
            .unwrap();
        a.qp.post_send(SendWr::new(
            100 + i,
            SendOp::RdmaWrite {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
            },
            vec![smr.sge(0, size as u32)],
        ))
        .unwrap();
        a.qp.post_send(SendWr::new(
            200 + i,
            SendOp::RdmaRead {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
            },
            vec![smr.sge(0, size as u32)],
        ))
        .unwrap();
        let sc = a.cq.wait(3, Duration::from_secs(60)).unwrap();
        assert_eq!(
            sc.iter()
                .map(|w| (w.wr_id, w.status, w.byte_len as usize))
                .collect::<Vec<_>>(),
            vec![
                (i, WcStatus::Success, size),
                (100 + i, WcStatus::Success, size),
                (200 + i, WcStatus::Success, size)
            ],
            "size {size}"
        );
        let rc = b.cq.wait(1, WAIT).unwrap();
        assert_eq!(
            (rc[0].wr_id, rc[0].status, rc[0].byte_len as usize),
            (i, WcStatus::Success, size)
        );
        let mut got = vec![0u8; size];
        dmr.read(0, &mut got).unwrap();
        assert!(got == expect[..size], "size {size}: data differs");
        let mut back = vec![0u8; size];
        smr.read(0, &mut back).unwrap();
        assert!(back == expect[..size], "size {size}: READ data differs");
    }
}

#[test]
fn a_thousand_qps_at_once() {
    let da = Device::open(DeviceConfig::new("127.0.6.1".parse().unwrap())).unwrap();
    let db = Device::open(DeviceConfig::new("127.0.6.2".parse().unwrap())).unwrap();
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (da.create_cq(8192).unwrap(), db.create_cq(8192).unwrap());
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut abuf = pattern(1000 * 64, 1);
    let expect = abuf.clone();
    let amr = pa.reg_mr(&mut abuf, ALL).unwrap();
    let mut bbuf = vec![0u8; 1000 * 64];
    let bmr = pb.reg_mr(&mut bbuf, ALL).unwrap();
    let mut qps = Vec::new();
    for i in 0..1000u32 {
        let qa = pa
            .create_qp(QpType::Rc, &ca, &ca, None, cap, false)
            .unwrap();
        let qb = pb
            .create_qp(QpType::Rc, &cb, &cb, None, cap, false)
            .unwrap();
        let sa = Side {
            dev: da.clone(),
            pd: da.alloc_pd().unwrap(),
            cq: da.create_cq(1).unwrap(),
            qp: qa,
        };
        let sb = Side {
            dev: db.clone(),
            pd: db.alloc_pd().unwrap(),
            cq: db.create_cq(1).unwrap(),
            qp: qb,
        };
        connect(&sa, &sb, i * 1000, i * 7, true);
        connect(&sb, &sa, i * 7, i * 1000, true);
        qps.push((sa, sb));
    }
    for (i, (sa, sb)) in qps.iter().enumerate() {
        let off = i as u64 * 64;
        sb.qp
            .post_recv(RecvWr {
                wr_id: i as u64,
                sg_list: vec![bmr.sge(off, 64)],
            })
            .unwrap();
        sa.qp
            .post_send(SendWr::new(i as u64, SendOp::Send, vec![amr.sge(off, 64)]))
            .unwrap();
    }
    assert_eq!(
        ca.wait(1000, Duration::from_secs(60))
            .unwrap()
            .iter()
            .filter(|w| w.status == WcStatus::Success)
            .count(),
        1000
    );
    let rc = cb.wait(1000, Duration::from_secs(60)).unwrap();
    assert_eq!(rc.len(), 1000);
    let mut qpns: Vec<u32> = rc.iter().map(|w| w.qp_num).collect();
    qpns.sort_unstable();
    qpns.dedup();
    assert_eq!(qpns.len(), 1000, "every QP received its message");
    let mut got = vec![0u8; 1000 * 64];
    bmr.read(0, &mut got).unwrap();
    assert!(got == expect);
}

#[test]
fn retry_exceeded_when_the_peer_vanishes_with_nobody_polling() {
    // The progress thread alone must fire the retransmission timer: nobody
    // polls until the end. timeout 12 = 16.8 ms, retry_cnt 3: the error
    // comes after 4 expiries (67 ms). The upper bound is 30x that, far below
    // what a thread that sleeps through timers (1 s naps) would take.
    let a = side("127.0.7.1", QpType::Rc, None);
    let b = side("127.0.7.2", QpType::Rc, None);
    connect(&a, &b, 1, 2, true);
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        timeout: 12,
        retry_cnt: 3,
        ..QpAttr::default()
    };
    // Re-enter RTS is not allowed to change timeout; set it on the way up
    // instead by reconnecting from RESET.
    a.qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Reset),
            ..QpAttr::default()
        },
        M::STATE,
    )
    .unwrap();
    a.qp.modify(
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
        path_mtu: Some(Mtu::M1024),
        dest_qp_num: b.qp.qpn(),
        rq_psn: 2,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: b.dev.gid(),
            sgid_index: a.dev.gid_index(),
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    a.qp.modify(
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    a.qp.modify(
        &QpAttr {
            sq_psn: 1,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..rts
        },
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
    drop(b); // the peer vanishes: its device closes, nothing answers
    let mut buf = vec![0u8; 64];
    let mr = a.pd.reg_mr(&mut buf, ALL).unwrap();
    let start = std::time::Instant::now();
    a.qp.post_send(SendWr::new(1, SendOp::Send, vec![mr.sge(0, 64)]))
        .unwrap();
    a.qp.post_send(SendWr::new(2, SendOp::Send, vec![mr.sge(0, 64)]))
        .unwrap();
    // Do not poll (polling drives progress); wait for the error state.
    while a.qp.state() != QpState::Err && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let took = start.elapsed();
    let per = Duration::from_nanos(4096 << 12);
    assert!(
        took >= per * 4,
        "gave up after {took:?}, before 4 timeouts of {per:?}"
    );
    assert!(
        took < Duration::from_secs(2),
        "timer expiries were missed: {took:?}"
    );
    let wc = a.cq.poll(4).unwrap();
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(
        a.qp.error_reason().unwrap().contains("retry_cnt = 3"),
        "{:?}",
        a.qp.error_reason()
    );
}

#[test]
fn gid_table_is_laid_out_like_kernel_rxe() {
    let d = Device::open(DeviceConfig::new("127.0.8.1".parse().unwrap())).unwrap();
    let t = d.gid_table();
    assert_eq!(t.len(), 2);
    assert_eq!(
        &t[0][..8],
        &[0xfe, 0x80, 0, 0, 0, 0, 0, 0],
        "index 0: IPv6 link-local"
    );
    assert_eq!(
        t[1],
        "127.0.8.1"
            .parse::<std::net::Ipv4Addr>()
            .unwrap()
            .to_ipv6_mapped()
            .octets(),
        "index 1: IPv4-mapped"
    );
    assert_eq!(d.gid_index(), 1);
    assert_eq!(d.gid(), t[1]);
    assert_eq!(d.port_mtu(), Mtu::M4096);
    assert_eq!(d.query_device().vendor_id, 0xffffff);
    // The link-local GID stands for the device's IPv4 address (programs
    // that pick GID index 0, as pyverbs does, reach the device through it),
    // so an address vector from it to an IPv4 peer works...
    assert_eq!(
        rxe_core::gid_to_ip(t[0]),
        "127.0.8.1".parse::<std::net::IpAddr>().unwrap()
    );
    let pd = d.alloc_pd().unwrap();
    let av = |dgid: [u8; 16]| AhAttr {
        dgid,
        sgid_index: 0,
        is_global: true,
        port_num: 1,
        ..AhAttr::default()
    };
    pd.create_ah(&av(t[1])).unwrap();
    pd.create_ah(&av(t[0])).unwrap();
    // ...while one to a real IPv6 address is refused with a message, not
    // silently misrouted.
    let v6: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
    let err = pd
        .create_ah(&av(v6.octets()))
        .err()
        .expect("mixed IP versions must be refused");
    assert!(err.to_string().contains("different IP versions"), "{err}");
    // Kernel rxe's MTU rule for a 1500-byte netdev.
    let mut cfg = DeviceConfig::new("127.0.8.2".parse().unwrap());
    cfg.netdev_mtu = 1500;
    assert_eq!(Device::open(cfg).unwrap().port_mtu(), Mtu::M1024);
}

#[test]
fn async_events_arrive_on_the_event_fd_with_a_reason() {
    let (a, b) = pair("127.0.13.1", "127.0.13.2", QpType::Rc, None);
    let mut buf = vec![1u8; 64];
    let mr = a.pd.reg_mr(&mut buf, ALL).unwrap();
    // A WRITE with a bad rkey: B's responder raises QP_ACCESS_ERR and goes to ERR.
    a.qp.post_send(SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: 0x1000,
            rkey: 0xdead_beef,
        },
        vec![mr.sge(0, 64)],
    ))
    .unwrap();
    let wc = a.cq.wait(1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::RemAccessErr);
    let fd = b.dev.async_fd();
    assert!(fd >= 0);
    let ev = b
        .dev
        .get_async_event(Some(Duration::from_secs(10)))
        .expect("no async event");
    assert_eq!(ev.kind, verbs_api::AsyncEventKind::QpAccessErr);
    assert!(ev.reason.contains("RDMA WRITE"), "{}", ev.reason);
    assert_eq!(b.qp.state(), QpState::Err);
    assert!(b.dev.poll_async_event().is_none());
}

#[test]
fn query_qp_and_srq_attributes() {
    let (a, b) = pair("127.0.14.1", "127.0.14.2", QpType::Rc, None);
    let (attr, cap) = a.qp.query().unwrap();
    assert_eq!(attr.qp_state, Some(QpState::Rts));
    assert_eq!(attr.dest_qp_num, b.qp.qpn());
    assert_eq!(attr.path_mtu, Some(Mtu::M4096));
    assert_eq!((attr.timeout, attr.retry_cnt, attr.rnr_retry), (10, 7, 7));
    assert_eq!(cap.max_send_wr, 512);
    let srq =
        b.pd.create_srq(SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let mut buf = vec![0u8; 64];
    let mr = b.pd.reg_mr(&mut buf, ALL).unwrap();
    for i in 0..4 {
        srq.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![mr.sge(0, 64)],
        })
        .unwrap();
    }
    assert_eq!(srq.query().unwrap().1, 4);
    assert!(srq.set_limit(9).is_err(), "a limit above max_wr is refused");
    srq.set_limit(4).unwrap();
    assert_eq!(srq.query().unwrap().0.srq_limit, 4);
}

#[test]
fn ipv6_device_rc_and_ud_through_itself() {
    // Two QPs of one device on ::1 talk to each other over UDP/4791.
    let dev = Device::open(DeviceConfig::new("::1".parse().unwrap())).unwrap();
    assert_eq!(dev.gid(), std::net::Ipv6Addr::LOCALHOST.octets());
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mk = |ty| Side {
        dev: dev.clone(),
        pd: dev.alloc_pd().unwrap(),
        cq: dev.create_cq(64).unwrap(),
        qp: pd.create_qp(ty, &cq, &cq, None, cap, false).unwrap(),
    };
    let (a, b) = (mk(QpType::Rc), mk(QpType::Rc));
    connect(&a, &b, 5, 6, true);
    connect(&b, &a, 6, 5, true);
    let mut src = pattern(10_000, 3);
    let expect = src.clone();
    let smr = pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 10_000];
    let dmr = pd.reg_mr(&mut dst, ALL).unwrap();
    a.qp.post_send(SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dmr.addr(),
            rkey: dmr.rkey(),
        },
        vec![smr.sge(0, 10_000)],
    ))
    .unwrap();
    let wc = cq.wait(1, WAIT).unwrap();
    assert_eq!(
        wc.first().map(|w| w.status),
        Some(WcStatus::Success),
        "{:?}",
        dev.counters()
    );
    let mut got = vec![0u8; 10_000];
    dmr.read(0, &mut got).unwrap();
    assert!(got == expect);
    // UD over IPv6: the 40-byte GRH is the IPv6 header.
    let ua = pd
        .create_qp(QpType::Ud, &cq, &cq, None, cap, false)
        .unwrap();
    let ub = pd
        .create_qp(QpType::Ud, &cq, &cq, None, cap, false)
        .unwrap();
    for qp in [&ua, &ub] {
        qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Init),
                port_num: 1,
                qkey: 9,
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
    ub.post_recv(RecvWr {
        wr_id: 7,
        sg_list: vec![dmr.sge(0, 1040)],
    })
    .unwrap();
    let ah = pd
        .create_ah(&AhAttr {
            dgid: dev.gid(),
            sgid_index: dev.gid_index(),
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        })
        .unwrap();
    let mut wr = SendWr::new(2, SendOp::Send, vec![smr.sge(0, 1000)]);
    wr.ud = Some(UdDest {
        ah: ah.handle(),
        remote_qpn: ub.qpn(),
        remote_qkey: 9,
    });
    ua.post_send(wr).unwrap();
    let wcs = cq.wait(2, WAIT).unwrap();
    let recv = wcs.iter().find(|w| w.wr_id == 7).expect("UD receive");
    assert_eq!((recv.status, recv.byte_len), (WcStatus::Success, 1040));
    let mut grh = [0u8; 40];
    dmr.read(0, &mut grh).unwrap();
    assert_eq!(grh[0] >> 4, 6, "IPv6 header in the GRH");
    assert_eq!(&grh[8..24], &std::net::Ipv6Addr::LOCALHOST.octets());
    assert_eq!(dev.counters().rcvd_icrc_err, 0);
}

#[test]
fn one_large_read() {
    // A single 32 MiB READ: 8192 responses, built one at a time as the
    // device sends them. With the ACK timeout of these tests (10, 4.2 ms)
    // a slow machine may still time out and retry; the READ must complete
    // byte-exact either way.
    let (a, b) = pair("127.0.15.1", "127.0.15.2", QpType::Rc, None);
    const LEN: usize = 32 << 20;
    let mut src = pattern(LEN, 4);
    let expect = src.clone();
    let smr = b.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; LEN];
    let dmr = a.pd.reg_mr(&mut dst, ALL).unwrap();
    a.qp.post_send(SendWr::new(
        1,
        SendOp::RdmaRead {
            remote_addr: smr.addr(),
            rkey: smr.rkey(),
        },
        vec![dmr.sge(0, LEN as u32)],
    ))
    .unwrap();
    let wc = a.cq.wait(1, Duration::from_secs(120)).unwrap();
    assert_eq!(wc.first().map(|w| w.status), Some(WcStatus::Success));
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    eprintln!(
        "32 MiB READ: responder sent {} packets, requester retried {} times\n{ca:?}\n{cb:?}",
        cb.sent_pkts, ca.retrans_timeouts
    );
    drop(dmr);
    assert!(dst == expect);
}

/// A poll that produces a receive completion holds the ACK back so the
/// application sees its completion first; the ACK must still leave when the
/// application then stops calling into the device, before the requester's
/// retransmission timer (here about a second) would have recovered it.
#[test]
fn ack_held_by_a_poll_leaves_when_the_application_stops_polling() {
    let a = side("127.0.14.1", QpType::Rc, None);
    let b = side("127.0.14.2", QpType::Rc, None);
    // timeout 18: 4.096 us * 2^18 = 1.07 s before A would retransmit.
    connect_with_timeout(&a, &b, 5, 9, true, 18);
    connect_with_timeout(&b, &a, 9, 5, true, 18);
    let mut abuf = pattern(64, 3);
    let amr = a.pd.reg_mr(&mut abuf, ALL).unwrap();
    let mut bbuf = vec![0u8; 64];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    for round in 0..3u64 {
        b.qp.post_recv(RecvWr {
            wr_id: round,
            sg_list: vec![bmr.sge(0, 64)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(round, SendOp::Send, vec![amr.sge(0, 64)]))
            .unwrap();
        // B polls until its completion, then never touches the device again
        // this round; only its progress thread can send the held ACK.
        let wc = b.cq.wait(1, WAIT).unwrap();
        assert_eq!(wc.len(), 1);
        assert_eq!(wc[0].status, WcStatus::Success);
        let wc = a.cq.wait(1, WAIT).unwrap();
        assert_eq!(wc.len(), 1, "no send completion: {:?}", a.dev.counters());
        assert_eq!(wc[0].status, WcStatus::Success);
    }
    let c = a.dev.counters();
    assert_eq!(
        c.retrans_timeouts, 0,
        "the held ACKs were not sent until A retransmitted: {c:?}"
    );
    assert_eq!(b.dev.counters().duplicate_request, 0);
}

#[test]
fn device_list_open_by_name_and_query_port() {
    let mut cfg = DeviceConfig::new("127.0.16.1".parse().unwrap());
    cfg.name = "rxe-list-test".into();
    let dev = Device::open(cfg).unwrap();
    let found = Device::by_name("rxe-list-test").expect("listed while open");
    assert_eq!(found.addr(), dev.addr());
    assert!(verbs_api::device_list()
        .iter()
        .any(|d| d.name() == "rxe-list-test"));
    let port = dev.query_port();
    assert!(port.active && port.link_layer_ethernet);
    assert_eq!(port.active_mtu, Mtu::M4096); // loopback: netdev MTU 65536
    assert_eq!(port.max_mtu, Mtu::M4096);
    assert_eq!(
        (port.gid_tbl_len, port.pkey_tbl_len, port.lid),
        (1024, 1, 0)
    );
    drop(found);
    drop(dev);
    assert!(
        Device::by_name("rxe-list-test").is_none(),
        "gone once dropped"
    );
}

/// INIT -> RTR -> RTS for a UD QP with Q_Key `qkey`.
fn ud_ready(qp: &QueuePair, qkey: u32) {
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

/// UD multicast over real sockets: a SEND to a group reaches every QP
/// attached to it, on the sender's device and on another one, each QP
/// consuming its own receive WQE, with the group as the GRH destination;
/// a QP that left gets nothing more.
#[test]
fn ud_multicast_over_udp() {
    let group_ip = std::net::Ipv4Addr::new(239, 77, 5, 1);
    let group = group_ip.to_ipv6_mapped().octets();
    let a = side("127.0.5.1", QpType::Ud, None);
    let dev_b = Device::open(DeviceConfig::new("127.0.5.2".parse().unwrap())).unwrap();
    let pd_b = dev_b.alloc_pd().unwrap();
    let cq_b = dev_b.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let a2 =
        a.pd.create_qp(QpType::Ud, &a.cq, &a.cq, None, cap, false)
            .unwrap();
    let b: Vec<QueuePair> = (0..3)
        .map(|_| {
            pd_b.create_qp(QpType::Ud, &cq_b, &cq_b, None, cap, false)
                .unwrap()
        })
        .collect();
    for qp in [&a.qp, &a2, &b[0], &b[1], &b[2]] {
        ud_ready(qp, 0x4242);
    }
    // Only UD QPs, only multicast GIDs.
    let rc = pd_b
        .create_qp(QpType::Rc, &cq_b, &cq_b, None, cap, false)
        .unwrap();
    assert!(rc.attach_mcast(group, 0).is_err());
    assert!(b[0].attach_mcast(dev_b.gid(), 0).is_err());
    for qp in [&a2, &b[0], &b[1]] {
        qp.attach_mcast(group, 0).unwrap();
    }
    assert_eq!(b[0].mcast_groups(), vec![group]);

    let mut rbuf = vec![0u8; 8 * 1100];
    let rmr_b = pd_b.reg_mr(&mut rbuf, ALL).unwrap();
    let mut abuf = vec![0u8; 8 * 1100];
    let rmr_a = a.pd.reg_mr(&mut abuf, ALL).unwrap();
    for i in 0..4u64 {
        for (k, qp) in b.iter().enumerate() {
            qp.post_recv(RecvWr {
                wr_id: k as u64 * 100 + i,
                sg_list: vec![rmr_b.sge(0, 1100)],
            })
            .unwrap();
        }
        a2.post_recv(RecvWr {
            wr_id: 900 + i,
            sg_list: vec![rmr_a.sge(i * 1100, 1100)],
        })
        .unwrap();
    }
    let mut sbuf = pattern(1000, 9);
    let smr = a.pd.reg_mr(&mut sbuf, ALL).unwrap();
    let ah =
        a.pd.create_ah(&AhAttr {
            dgid: group,
            sgid_index: a.dev.gid_index(),
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        })
        .unwrap();
    let send = |id: u64| {
        let mut wr = SendWr::new(
            id,
            SendOp::SendWithImm { imm: id as u32 },
            vec![smr.sge(0, 1000)],
        );
        wr.ud = Some(UdDest {
            ah: ah.handle(),
            remote_qpn: 0x00ff_ffff,
            remote_qkey: 0x4242,
        });
        a.qp.post_send(wr).unwrap();
    };
    for id in 0..2 {
        send(id);
    }
    // a's send CQ is also a2's receive CQ: 2 sends + 2 receives.
    let wa = a.cq.wait(4, WAIT).unwrap();
    let wb = cq_b.wait(4, WAIT).unwrap();
    assert!(
        wa.iter().chain(&wb).all(|w| w.status == WcStatus::Success),
        "{wa:?} {wb:?}"
    );
    let recvs_a: Vec<_> = wa.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
    assert_eq!(recvs_a.len(), 2, "a2, on the sender's device, gets each");
    for (k, qp) in b.iter().enumerate().take(2) {
        let got: Vec<_> = wb.iter().filter(|w| w.qp_num == qp.qpn()).collect();
        assert_eq!(got.len(), 2, "QP {k} gets each message once");
        for w in got {
            assert_eq!(w.byte_len, 1040);
            assert_eq!(w.src_qp, a.qp.qpn());
            assert!(w.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
        }
    }
    drop(rmr_a);
    assert_eq!(
        &abuf[36..40],
        &group_ip.octets(),
        "GRH destination: the group"
    );
    assert_eq!(&abuf[40..1040], &pattern(1000, 9)[..]);
    assert_eq!(&abuf[1100 + 40..1100 + 1040], &pattern(1000, 9)[..]);

    // b[1] leaves; b[0] is dropped while attached (it leaves with it).
    b[1].detach_mcast(group, 0).unwrap();
    assert!(b[1].detach_mcast(group, 0).is_err(), "no longer attached");
    let mut b = b;
    drop(b.remove(0));
    send(7);
    assert_eq!(a.cq.wait(2, WAIT).unwrap().len(), 2, "send + a2's copy");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        cq_b.poll(16).unwrap().is_empty(),
        "nobody on b is in the group"
    );
    // One copy per datagram reached device b (its group socket), fanned out
    // to its members; after they left, its socket closed and saw nothing.
    assert_eq!(dev_b.counters().rcvd_pkts, 2);
}

/// XRC over real sockets: an XRC_SEND QP on one device reaches XRC SRQs of
/// another device's XRC domain through one XRC_RECV QP.
#[test]
fn xrc_over_udp() {
    let a = side("127.0.6.1", QpType::XrcSend, None);
    let dev_b = Device::open(DeviceConfig::new("127.0.6.2".parse().unwrap())).unwrap();
    let pd_b = dev_b.alloc_pd().unwrap();
    let cq_b = dev_b.create_cq(64).unwrap();
    let xrcd = dev_b.alloc_xrcd().unwrap();
    let srq = pd_b
        .create_xrc_srq(
            &xrcd,
            &cq_b,
            SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let tgt = xrcd.create_recv_qp().unwrap();
    let b = Side {
        dev: dev_b,
        pd: pd_b,
        cq: cq_b,
        qp: tgt,
    };
    // Each half takes only the attributes kernel qp_state_table lists for it.
    for (me, peer, sq, rq, ty) in [
        (&a, &b, 100, 200, QpType::XrcSend),
        (&b, &a, 200, 100, QpType::XrcRecv),
    ] {
        let req = |f, to| {
            rxe_core::qp_attr::transition_masks(ty, f, to)
                .unwrap()
                .required
        };
        let attr = QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qp_access_flags: ALL.bits(),
            path_mtu: Some(Mtu::M1024),
            dest_qp_num: peer.qp.qpn(),
            rq_psn: rq,
            sq_psn: sq,
            max_dest_rd_atomic: 4,
            max_rd_atomic: 4,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            ah_attr: AhAttr {
                dgid: peer.dev.gid(),
                sgid_index: me.dev.gid_index(),
                is_global: true,
                port_num: 1,
                hop_limit: 64,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        for (from, to) in [
            (QpState::Reset, QpState::Init),
            (QpState::Init, QpState::Rtr),
            (QpState::Rtr, QpState::Rts),
        ] {
            let a2 = QpAttr {
                qp_state: Some(to),
                ..attr
            };
            me.qp.modify(&a2, M::STATE | req(from, to)).unwrap();
        }
    }
    let mut rbuf = vec![0u8; 4096];
    let rmr = b.pd.reg_mr(&mut rbuf, ALL).unwrap();
    srq.post_recv(RecvWr {
        wr_id: 9,
        sg_list: vec![rmr.sge(0, 4096)],
    })
    .unwrap();
    let mut sbuf = pattern(3000, 4);
    let smr = a.pd.reg_mr(&mut sbuf, ALL).unwrap();
    let mut wr = SendWr::new(1, SendOp::SendWithImm { imm: 77 }, vec![smr.sge(0, 3000)]);
    wr.xrc_remote_srqn = Some(srq.srq_num().unwrap());
    a.qp.post_send(wr).unwrap();
    let wa = a.cq.wait(1, WAIT).unwrap();
    assert_eq!(wa[0].status, WcStatus::Success, "{wa:?}");
    let wb = b.cq.wait(1, WAIT).unwrap();
    assert_eq!(
        (wb[0].wr_id, wb[0].byte_len, wb[0].qp_num),
        (9, 3000, b.qp.qpn())
    );
    drop(rmr);
    assert_eq!(&rbuf[..3000], &pattern(3000, 4)[..]);
}

/// In-process devices choose their congestion behaviour in
/// `DeviceConfig::cc` (`RXE_EMU_LIKE=mlx5` for `open_device`): two
/// ConnectX-like ones, the sender's datagrams marked CE on their way out,
/// talk by UDP; the receiver reads the marks (IP_RECVTOS) and answers with
/// CNPs, which the sender handles.
#[test]
fn in_process_connectx_like_devices_see_ce_marks_and_exchange_cnps() {
    let mlx5 = |ip: &str, ce: f64| {
        let mut cfg = DeviceConfig::new(ip.parse().unwrap());
        cfg.cc.model = verbs_api::CcModel::Mlx5Like;
        cfg.fault = (ce > 0.0).then(|| FaultConfig {
            ce,
            seed: 3,
            ..Default::default()
        });
        side_of(cfg, QpType::Rc)
    };
    let a = mlx5("127.0.25.20", 1.0);
    let b = mlx5("127.0.25.21", 0.0);
    assert_eq!(a.dev.cc_config().model, verbs_api::CcModel::Mlx5Like);
    connect(&a, &b, 5, 9, true);
    connect(&b, &a, 9, 5, true);
    let mut src = pattern(2048, 4);
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 2048];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    for i in 0..10 {
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![bmr.sge(0, 2048)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(i, SendOp::Send, vec![amr.sge(0, 2048)]))
            .unwrap();
        assert_eq!(a.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
        assert_eq!(b.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    }
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    // Path MTU 4096 on loopback: one packet per SEND, each marked.
    assert!(cb.np_ecn_marked_roce_packets >= 10, "{cb:?}");
    assert!(cb.np_cnp_sent >= 1, "{cb:?}");
    assert!(ca.rp_cnp_handled >= 1, "{ca:?}");
    assert!(a.qp.cc_state().unwrap().reacting);
    // B's own packets were not marked: it sent no data, drew no CNP.
    assert_eq!(ca.np_ecn_marked_roce_packets, 0, "{ca:?}");
    assert!(!b.qp.cc_state().unwrap().reacting);
    assert!(b.dev.set_cc_param("rpg_gd", 40).is_err());
    b.dev.set_cc_param("rpg_gd", 9).unwrap();
    assert_eq!(b.dev.cc_config().params.rpg_gd, 9);
}
