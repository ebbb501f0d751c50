//! `ibv_ud_pingpong` over rxe-emu: the same TCP exchange as rdma-core's
//! program, Q_Key 0x11111111, receive buffers with room for the 40-byte
//! GRH, and the same ping-pong of UD SENDs.
//!
//! Server: `rxe-ud-pingpong --ip 127.0.0.1`
//! Client: `rxe-ud-pingpong --ip 127.0.0.2 127.0.0.1`
//!
//! `-c` checks every received message (after its 40-byte GRH room).

#[path = "common/pingpong.rs"]
mod pingpong;

use std::time::{Duration, Instant};

use pingpong::{
    check_buf, die, exchange, mark_buf, open, parse_args, print_dest, random_psn, report, Dest,
};
use verbs_api::{
    AccessFlags, AhAttr, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, RecvWr, SendFlags,
    SendOp, SendWr, UdDest, WcStatus,
};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// The Q_Key ibv_ud_pingpong uses.
const QKEY: u32 = 0x1111_1111;
const GRH: usize = 40;

fn main() {
    let a = parse_args(2048);
    if a.uc {
        die("--uc is an option of rxe-rc-pingpong");
    }
    let dev = open(&a);
    if a.size > dev.port_mtu().bytes() as usize {
        die(format!(
            "Requested size larger than port MTU ({})",
            dev.port_mtu().bytes()
        ));
    }
    let gidx = a.gidx.unwrap_or(dev.gid_index());
    let table = dev.gid_table();
    let my_gid = *table
        .get(gidx as usize)
        .unwrap_or_else(|| die(format!("GID index {gidx} is outside the table")));
    let pd = dev.alloc_pd().unwrap_or_else(|e| die(e));
    let cq = dev.create_cq(a.rx_depth + 1).unwrap_or_else(|e| die(e));
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: a.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(QpType::Ud, &cq, &cq, None, cap, false)
        .unwrap_or_else(|e| die(e));
    let mut buf = vec![0x7bu8; a.size + GRH];
    let mr = pd
        .reg_mr(&mut buf, AccessFlags::LOCAL_WRITE)
        .unwrap_or_else(|e| die(e));
    let psn = random_psn();
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            qkey: QKEY,
            ..Default::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )
    .unwrap_or_else(|e| die(format!("Failed to modify QP to INIT: {e}")));
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Rtr),
            ..Default::default()
        },
        M::STATE,
    )
    .unwrap_or_else(|e| die(format!("Failed to modify QP to RTR: {e}")));
    qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: psn,
            ..Default::default()
        },
        M::STATE | M::SQ_PSN,
    )
    .unwrap_or_else(|e| die(format!("Failed to modify QP to RTS: {e}")));
    let post_recvs = |n: u32| -> u32 {
        for k in 0..n {
            if qp
                .post_recv(RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: vec![mr.sge(0, (a.size + GRH) as u32)],
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
        psn,
        gid: my_gid,
    };
    print_dest("local", &my);
    let rem = exchange(&a, &my, |_| {});
    print_dest("remote", &rem);
    let ah = pd
        .create_ah(&AhAttr {
            dgid: rem.gid,
            sgid_index: gidx,
            is_global: true,
            hop_limit: 1,
            port_num: 1,
            ..Default::default()
        })
        .unwrap_or_else(|e| die(format!("Failed to create AH: {e}")));
    let post_send = || {
        let mut wr = SendWr::new(
            SEND_WRID,
            SendOp::Send,
            vec![mr.sge(GRH as u64, a.size as u32)],
        );
        wr.flags = SendFlags::SIGNALED;
        wr.ud = Some(UdDest {
            ah: ah.handle(),
            remote_qpn: rem.qpn,
            remote_qkey: QKEY,
        });
        qp.post_send(wr)
            .unwrap_or_else(|e| die(format!("Couldn't post send: {e}")));
    };
    let mut pending = RECV_WRID;
    let mut msg = vec![0u8; a.size];
    if a.server.is_some() {
        if a.chk {
            mark_buf(&mut msg);
            mr.write(GRH as u64, &msg).unwrap_or_else(|e| die(e));
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
                    "Failed status {} for wr_id {}",
                    wc.status, wc.wr_id
                ));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if a.chk {
                        mr.read(GRH as u64, &mut msg).unwrap_or_else(|e| die(e));
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
            // UD is unreliable: a lost datagram stops a ping-pong (as with
            // ibv_ud_pingpong); say so instead of hanging.
            die(format!(
                "timed out after {rcnt} receives and {scnt} sends (a datagram was lost?)"
            ));
        }
    }
    report(a.size, a.iters, start);
    if a.chk {
        println!("{rcnt} received messages checked");
    }
}
