//! `ibv_rc_pingpong` over rxe-emu: the same TCP exchange (a 52-byte
//! `LID:QPN:PSN:GID` message on port 18515, then `done`), the same QP
//! attributes and the same ping-pong of SENDs, so it can face rdma-core's
//! own `ibv_rc_pingpong` (over kernel rxe or another rxe-emu).
//!
//! Server: `rxe-rc-pingpong --ip 127.0.0.1`
//! Client: `rxe-rc-pingpong --ip 127.0.0.2 127.0.0.1`
//! Options as ibv_rc_pingpong: -p port, -s size, -n iters, -r rx_depth,
//! -m mtu, -g gid_index (default: the device's address GID), -c (check
//! every received message). `--uc` makes it `ibv_uc_pingpong`: a UC QP,
//! the same exchange, and no RTS timers or retry counts.

#[path = "common/pingpong.rs"]
mod pingpong;

use std::time::{Duration, Instant};

use pingpong::{
    check_buf, die, exchange, mark_buf, open, parse_args, print_dest, random_psn, report, Dest,
};
use verbs_api::{
    AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, RecvWr, SendFlags,
    SendOp, SendWr, WcStatus,
};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

fn main() {
    let a = parse_args(4096);
    let mtu = match a.mtu {
        256 => Mtu::M256,
        512 => Mtu::M512,
        1024 => Mtu::M1024,
        2048 => Mtu::M2048,
        4096 => Mtu::M4096,
        m => die(format!("MTU {m} is not an IB MTU (256..4096)")),
    };
    let dev = open(&a);
    let gidx = a.gidx.unwrap_or(dev.gid_index());
    let table = dev.gid_table();
    let my_gid = *table.get(gidx as usize).unwrap_or_else(|| {
        die(format!(
            "GID index {gidx} is outside the table ({} entries)",
            table.len()
        ))
    });
    let pd = dev.alloc_pd().unwrap_or_else(|e| die(e));
    let cq = dev.create_cq(a.rx_depth + 1).unwrap_or_else(|e| die(e));
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: a.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp_type = if a.uc { QpType::Uc } else { QpType::Rc };
    let qp = pd
        .create_qp(qp_type, &cq, &cq, None, cap, false)
        .unwrap_or_else(|e| die(e));
    let mut buf = vec![0x7bu8; a.size.max(1)];
    let mr = pd
        .reg_mr(&mut buf, AccessFlags::LOCAL_WRITE)
        .unwrap_or_else(|e| die(e));
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            ..Default::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap_or_else(|e| die(e));
    let post_recvs = |n: u32| -> u32 {
        for k in 0..n {
            if qp
                .post_recv(RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: vec![mr.sge(0, a.size as u32)],
                })
                .is_err()
            {
                return k;
            }
        }
        n
    };
    let mut routs = post_recvs(a.rx_depth);
    let my = Dest {
        lid: 0,
        qpn: qp.qpn(),
        psn: random_psn(),
        gid: my_gid,
    };
    print_dest("local", &my);
    let connect = |rem: &Dest| {
        let rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: Some(mtu),
            dest_qp_num: rem.qpn,
            rq_psn: rem.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: AhAttr {
                dgid: rem.gid,
                sgid_index: gidx,
                is_global: true,
                hop_limit: 1,
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        // ibv_uc_pingpong sets no responder resources nor RNR timer.
        let rtr_mask = if a.uc {
            M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
        } else {
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER
        };
        qp.modify(&rtr, rtr_mask)
            .unwrap_or_else(|e| die(format!("Failed to modify QP to RTR: {e}")));
        let rts = QpAttr {
            qp_state: Some(QpState::Rts),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: my.psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let rts_mask = if a.uc {
            M::STATE | M::SQ_PSN
        } else {
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
        };
        qp.modify(&rts, rts_mask)
            .unwrap_or_else(|e| die(format!("Failed to modify QP to RTS: {e}")));
    };
    let rem = exchange(&a, &my, connect);
    print_dest("remote", &rem);

    let post_send = || {
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send, vec![mr.sge(0, a.size as u32)]);
        wr.flags = SendFlags::SIGNALED;
        qp.post_send(wr)
            .unwrap_or_else(|e| die(format!("Couldn't post send: {e}")));
    };
    let mut pending = RECV_WRID;
    let mut msg = vec![0u8; a.size];
    if a.server.is_some() {
        if a.chk {
            mark_buf(&mut msg);
            mr.write(0, &msg).unwrap_or_else(|e| die(e));
        }
        post_send();
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    while rcnt < a.iters || scnt < a.iters {
        for wc in cq.poll(2).unwrap_or_else(|e| die(e)) {
            if wc.status != WcStatus::Success {
                die(format!(
                    "Failed status {} for wr_id {}: {}",
                    wc.status,
                    wc.wr_id,
                    qp.error_reason().unwrap_or_default()
                ));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if a.chk {
                        mr.read(0, &mut msg).unwrap_or_else(|e| die(e));
                        check_buf(&msg)
                            .unwrap_or_else(|e| die(format!("receive {}: {e}", rcnt + 1)));
                    }
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recvs(a.rx_depth - routs);
                    }
                    rcnt += 1;
                }
                id => die(format!("Completion for unknown wr_id {id}")),
            }
            pending &= !wc.wr_id;
            if scnt < a.iters && pending == 0 {
                post_send();
                pending = RECV_WRID | SEND_WRID;
            }
        }
        if start.elapsed() > Duration::from_secs(60) {
            die(format!("timed out after {rcnt} receives and {scnt} sends"));
        }
    }
    report(a.size, a.iters, start);
    if a.chk {
        println!("{rcnt} received messages checked");
    }
}
