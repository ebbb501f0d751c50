//! The main job: two rxe-emu devices in one process, on 127.0.0.1 and
//! 127.0.0.2, exchange real RoCEv2 over UDP/4791 through a lossy link
//! (fault injection on the sender), and the summary says what happened.
//!
//! Run: `cargo run --release -p verbs-api --example loopback_demo [-- --loss 0.02 --mib 64]`

use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags, AhAttr, Device, DeviceConfig, FaultConfig, Mtu, QpAttr, QpAttrMask as M, QpCap,
    QpState, QpType, RecvWr, SendOp, SendWr, WcStatus,
};

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let loss: f64 = arg("--loss", 0.02);
    let mib: usize = arg("--mib", 64);
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mut cfg_a = DeviceConfig::new("127.0.0.1".parse()?);
    cfg_a.fault = Some(FaultConfig {
        seed: 7,
        loss,
        duplicate: loss / 2.0,
        reorder: loss,
        corrupt: 0.0,
        ..Default::default()
    });
    let a = Device::open(cfg_a)?;
    let b = Device::open(DeviceConfig::new("127.0.0.2".parse()?))?;
    println!("device A on 127.0.0.1:4791 (drops {:.1}% of what it sends, duplicates and reorders some), device B on 127.0.0.2:4791", loss * 100.0);

    let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    let (ca, cb) = (a.create_cq(1024)?, b.create_cq(1024)?);
    let cap = QpCap {
        max_send_wr: 256,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qa = pa.create_qp(QpType::Rc, &ca, &ca, None, cap, false)?;
    let qb = pb.create_qp(QpType::Rc, &cb, &cb, None, cap, false)?;
    // What applications exchange out of band: QPN, PSN and GID.
    for (qp, peer_qpn, peer_gid, my_psn, peer_psn) in [
        (&qa, qb.qpn(), b.gid(), 100, 200),
        (&qb, qa.qpn(), a.gid(), 200, 100),
    ] {
        qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Init),
                port_num: 1,
                qp_access_flags: all.bits(),
                ..Default::default()
            },
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )?;
        let rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(Mtu::M4096),
            dest_qp_num: peer_qpn,
            rq_psn: peer_psn,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                dgid: peer_gid,
                sgid_index: a.gid_index(), // 1: the IPv4 GID, as on kernel rxe
                is_global: true,
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        qp.modify(
            &rtr,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )?;
        let rts = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: my_psn,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            ..Default::default()
        };
        qp.modify(
            &rts,
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        )?;
    }
    println!(
        "RC QP {:#x} on A connected to QP {:#x} on B (path MTU 4096)\n",
        qa.qpn(),
        qb.qpn()
    );

    let len = mib << 20;
    let mut src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
    let expect = src.clone();
    let smr = pa.reg_mr(&mut src, all)?;
    let mut back = vec![0u8; len];
    let bmr = pa.reg_mr(&mut back, all)?;
    let mut dst = vec![0u8; len + 8];
    let dmr = pb.reg_mr(&mut dst, all)?;
    let mut rbuf = vec![0u8; 4096];
    let rmr = pb.reg_mr(&mut rbuf, all)?;

    let start = Instant::now();
    qb.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![rmr.sge(0, 4096)],
    })?;
    qa.post_send(SendWr::new(
        1,
        SendOp::SendWithImm { imm: 0x1234 },
        vec![smr.sge(0, 4096)],
    ))?;
    let chunk = 1 << 20;
    let writes = len / chunk;
    for i in 0..writes {
        let off = (i * chunk) as u64;
        qa.post_send(SendWr::new(
            10 + i as u64,
            SendOp::RdmaWrite {
                remote_addr: dmr.addr() + off,
                rkey: dmr.rkey(),
            },
            vec![smr.sge(off, chunk as u32)],
        ))?;
    }
    // READ back in 1 MiB pieces. One huge READ works too, but with the short
    // ACK timeout used here (10) it is retried while the responder is still
    // building its responses (see the README).
    for i in 0..writes {
        let off = (i * chunk) as u64;
        let read = SendOp::RdmaRead {
            remote_addr: dmr.addr() + off,
            rkey: dmr.rkey(),
        };
        qa.post_send(SendWr::new(
            100 + i as u64,
            read,
            vec![bmr.sge(off, chunk as u32)],
        ))?;
    }
    qa.post_send(SendWr::new(
        3,
        SendOp::AtomicFetchAdd {
            remote_addr: dmr.addr() + len as u64,
            rkey: dmr.rkey(),
            add: 5,
        },
        vec![bmr.sge(0, 8)],
    ))?;
    let wcs = ca.wait(2 + 2 * writes, Duration::from_secs(120))?;
    let took = start.elapsed();
    let recv = cb.wait(1, Duration::from_secs(5))?;

    let ok_all = wcs.len() == 2 + 2 * writes && wcs.iter().all(|w| w.status == WcStatus::Success);
    let verdict = if ok_all {
        "all successful"
    } else {
        "NOT all successful"
    };
    println!("A completed {} work requests (1 SEND with immediate, {writes} RDMA WRITEs and {writes} READs of 1 MiB, 1 FETCH_ADD): {verdict}", wcs.len());
    if let Some(r) = recv.first() {
        println!(
            "B received the SEND: {} bytes, immediate {:#x}, status {}",
            r.byte_len, r.imm_data, r.status
        );
    }
    let mut got = vec![0u8; len];
    bmr.read(0, &mut got)?;
    let read_ok = got[8..] == expect[8..];
    let mut orig = [0u8; 8];
    bmr.read(0, &mut orig)?;
    println!(
        "READ brought back exactly what WRITE put there: {}",
        if read_ok { "yes" } else { "NO" }
    );
    println!(
        "FETCH_ADD returned the counter's old value {} (B's counter is now 5)",
        u64::from_ne_bytes(orig)
    );
    let (ca_, cb_) = (a.counters(), b.counters());
    println!(
        "\n{:.2} s, {:.0} MB/s of RDMA WRITE + READ through the lossy link",
        took.as_secs_f64(),
        2.0 * len as f64 / took.as_secs_f64() / 1e6
    );
    println!("what the transport did about the losses:");
    println!(
        "  A sent {} packets and B {} (ACKs, READ responses)",
        ca_.sent_pkts, cb_.sent_pkts
    );
    println!(
        "  B noticed {} gaps in A's packets and sent one PSN-sequence NAK for each",
        cb_.out_of_seq_request
    );
    println!(
        "  B saw {} duplicates (re-ACKed them, or re-executed READs)",
        cb_.duplicate_request
    );
    println!(
        "  A went back to the oldest unacknowledged packet {} times; its timer fired {} times",
        ca_.completer_retry_err, ca_.retrans_timeouts
    );
    println!(
        "  ICRC errors: A {}, B {} (none expected on loopback)",
        ca_.rcvd_icrc_err, cb_.rcvd_icrc_err
    );
    if !(ok_all && read_ok) {
        std::process::exit(1);
    }
    Ok(())
}
