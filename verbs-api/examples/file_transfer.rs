//! Transfer a file with RDMA WRITE between two devices (127.0.0.1 ->
//! 127.0.0.2) and verify its CRC-32 at the receiver. The last piece is a
//! WRITE with immediate whose immediate data is the file length: the
//! receiver learns that the transfer is complete from its receive
//! completion, as RDMA applications commonly do.
//!
//! Run: `cargo run --release -p verbs-api --example file_transfer -- FILE [--loss 0.01]`

use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags, AhAttr, Device, DeviceConfig, FaultConfig, Mtu, QpAttr, QpAttrMask as M, QpCap,
    QpState, QpType, QueuePair, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
};

fn connect(
    qp: &QueuePair,
    dev: &Device,
    peer_qpn: u32,
    peer_gid: [u8; 16],
    my_psn: u32,
    peer_psn: u32,
) -> verbs_api::Result<()> {
    let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
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
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dgid: peer_gid,
            sgid_index: dev.gid_index(),
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
        max_rd_atomic: 1,
        ..Default::default()
    };
    qp.modify(
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .filter(|a| !a.starts_with("--"))
        .ok_or("usage: file_transfer FILE [--loss P]")?;
    let loss: f64 = args
        .iter()
        .position(|a| a == "--loss")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let mut data = std::fs::read(path)?;
    let len = data.len();
    if len > u32::MAX as usize {
        return Err("files above 4 GiB are not supported by this example".into());
    }
    let sent_crc = crc32fast::hash(&data);

    let mut cfg = DeviceConfig::new("127.0.0.1".parse()?);
    if loss > 0.0 {
        cfg.fault = Some(FaultConfig {
            seed: 1,
            loss,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            ..Default::default()
        });
    }
    let tx = Device::open(cfg)?;
    let rx = Device::open(DeviceConfig::new("127.0.0.2".parse()?))?;
    let (tpd, rpd) = (tx.alloc_pd()?, rx.alloc_pd()?);
    let (tcq, rcq) = (tx.create_cq(256)?, rx.create_cq(16)?);
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let tqp = tpd.create_qp(QpType::Rc, &tcq, &tcq, None, cap, false)?;
    let rqp = rpd.create_qp(QpType::Rc, &rcq, &rcq, None, cap, false)?;
    connect(&tqp, &tx, rqp.qpn(), rx.gid(), 1, 2)?;
    connect(&rqp, &rx, tqp.qpn(), tx.gid(), 2, 1)?;

    let smr = tpd.reg_mr(&mut data, AccessFlags::empty())?;
    let mut dest = vec![0u8; len.max(1)];
    let dmr = rpd.reg_mr(
        &mut dest,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    // The receiver posts one receive: the WRITE with immediate consumes it.
    rqp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![],
    })?;

    let start = Instant::now();
    const PIECE: usize = 1 << 20;
    let pieces = len.div_ceil(PIECE).max(1);
    let mut outstanding = 0usize;
    for i in 0..pieces {
        let off = i * PIECE;
        let n = PIECE.min(len - off) as u32;
        let op = if i + 1 == pieces {
            SendOp::RdmaWriteWithImm {
                remote_addr: dmr.addr() + off as u64,
                rkey: dmr.rkey(),
                imm: len as u32,
            }
        } else {
            SendOp::RdmaWrite {
                remote_addr: dmr.addr() + off as u64,
                rkey: dmr.rkey(),
            }
        };
        while outstanding >= 64 {
            for wc in tcq.poll(16)? {
                if wc.status != WcStatus::Success {
                    return Err(format!(
                        "WRITE failed: {} ({})",
                        wc.status,
                        tqp.error_reason().unwrap_or_default()
                    )
                    .into());
                }
                outstanding -= 1;
            }
        }
        tqp.post_send(SendWr::new(i as u64, op, vec![smr.sge(off as u64, n)]))?;
        outstanding += 1;
    }
    let done = rcq.wait(1, Duration::from_secs(600))?;
    let wc = done
        .first()
        .ok_or("the receiver never saw the last WRITE")?;
    if wc.status != WcStatus::Success || wc.opcode != WcOpcode::RecvRdmaWithImm {
        return Err(format!("receiver completion {wc:?}").into());
    }
    let took = start.elapsed();
    let mut got = vec![0u8; len];
    dmr.read(0, &mut got)?;
    let recv_crc = crc32fast::hash(&got);
    println!(
        "{path}: {len} bytes in {} RDMA WRITEs, {:.3} s ({:.1} MB/s){}",
        pieces,
        took.as_secs_f64(),
        len as f64 / took.as_secs_f64() / 1e6,
        if loss > 0.0 {
            format!(", {:.1}% loss injected", loss * 100.0)
        } else {
            String::new()
        }
    );
    println!("receiver: length {} from the immediate data, CRC-32 {recv_crc:08x}; sender CRC-32 {sent_crc:08x}: {}", wc.imm_data, if recv_crc == sent_crc && wc.imm_data as usize == len { "match" } else { "MISMATCH" });
    if recv_crc != sent_crc || wc.imm_data as usize != len {
        std::process::exit(1);
    }
    Ok(())
}
