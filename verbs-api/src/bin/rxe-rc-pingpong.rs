//! `ibv_rc_pingpong` over rxe-emu: the same TCP exchange (a 52-byte
//! `LID:QPN:PSN:GID` message on port 18515, then `done`), the same QP
//! attributes and the same ping-pong of SENDs, so it can face rdma-core's
//! own `ibv_rc_pingpong` (over kernel rxe or another rxe-emu).
//!
//! Server: `rxe-rc-pingpong --ip 127.0.0.1`
//! Client: `rxe-rc-pingpong --ip 127.0.0.2 127.0.0.1`
//! Options as ibv_rc_pingpong: -p port, -s size, -n iters, -r rx_depth,
//! -m mtu, -g gid_index (default: the device's address GID).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::exit;
use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags, AhAttr, Device, DeviceConfig, Mtu, QpAttr, QpAttrMask as M, QpCap, QpState,
    QpType, RecvWr, SendFlags, SendOp, SendWr, WcStatus,
};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
const MSG_LEN: usize = 52;

struct Dest {
    lid: u16,
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
}

fn to_msg(d: &Dest) -> [u8; MSG_LEN] {
    let gid: String = d.gid.iter().map(|b| format!("{b:02x}")).collect();
    let s = format!("{:04x}:{:06x}:{:06x}:{}", d.lid, d.qpn, d.psn, gid);
    let mut m = [0u8; MSG_LEN];
    m[..s.len()].copy_from_slice(s.as_bytes());
    m
}

fn from_msg(m: &[u8]) -> Option<Dest> {
    let s = std::str::from_utf8(m).ok()?.trim_end_matches('\0');
    let mut it = s.split(':');
    let lid = u16::from_str_radix(it.next()?, 16).ok()?;
    let qpn = u32::from_str_radix(it.next()?, 16).ok()?;
    let psn = u32::from_str_radix(it.next()?, 16).ok()?;
    let g = it.next()?;
    if g.len() != 32 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(g.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Dest { lid, qpn, psn, gid })
}

fn fmt_gid(g: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*g).to_string()
}

fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("{msg}");
    exit(1);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut port = 18515u16;
    let mut size = 4096usize;
    let mut iters = 1000u32;
    let mut rx_depth = 500u32;
    let mut mtu = Mtu::M1024;
    let mut gidx: Option<u8> = None;
    let mut ip: Option<String> = None;
    let mut server: Option<String> = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let val = |i: usize| {
            args.get(i + 1)
                .cloned()
                .unwrap_or_else(|| die(format!("{a} needs a value")))
        };
        match a {
            "-p" | "--port" => port = val(i).parse().unwrap_or_else(|_| die("bad port")),
            "-s" | "--size" => size = val(i).parse().unwrap_or_else(|_| die("bad size")),
            "-n" | "--iters" => iters = val(i).parse().unwrap_or_else(|_| die("bad iters")),
            "-r" | "--rx-depth" => {
                rx_depth = val(i).parse().unwrap_or_else(|_| die("bad rx-depth"))
            }
            "-m" | "--mtu" => {
                mtu = match val(i).as_str() {
                    "256" => Mtu::M256,
                    "512" => Mtu::M512,
                    "1024" => Mtu::M1024,
                    "2048" => Mtu::M2048,
                    "4096" => Mtu::M4096,
                    m => die(format!("MTU {m} is not an IB MTU (256..4096)")),
                }
            }
            "-g" | "--gid-idx" => {
                gidx = Some(val(i).parse().unwrap_or_else(|_| die("bad gid index")))
            }
            "--ip" => ip = Some(val(i)),
            "-d" | "--ib-dev" | "-i" | "--ib-port" | "-l" | "--sl" => {}
            s if !s.starts_with('-') => server = Some(s.to_string()),
            s => die(format!("unknown option {s}")),
        }
        i += if a.starts_with('-') { 2 } else { 1 };
    }
    let ip = ip.unwrap_or_else(|| {
        if server.is_some() {
            "127.0.0.2".into()
        } else {
            "127.0.0.1".into()
        }
    });
    let dev = Device::open(DeviceConfig::new(
        ip.parse()
            .unwrap_or_else(|_| die(format!("bad address {ip}"))),
    ))
    .unwrap_or_else(|e| die(e));
    let gidx = gidx.unwrap_or(dev.gid_index());
    let table = dev.gid_table();
    let my_gid = *table.get(gidx as usize).unwrap_or_else(|| {
        die(format!(
            "GID index {gidx} is outside the table ({} entries)",
            table.len()
        ))
    });
    let pd = dev.alloc_pd().unwrap_or_else(|e| die(e));
    let cq = dev.create_cq(rx_depth + 1).unwrap_or_else(|e| die(e));
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq, None, cap, false)
        .unwrap_or_else(|e| die(e));
    let mut buf = vec![0x7bu8; size.max(1)];
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
                    sg_list: vec![mr.sge(0, size as u32)],
                })
                .is_err()
            {
                return k;
            }
        }
        n
    };
    let mut routs = post_recvs(rx_depth);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let my = Dest {
        lid: 0,
        qpn: qp.qpn(),
        psn: (rxe_core::sim::Rng::new(seed).next_u64() & 0xff_ffff) as u32,
        gid: my_gid,
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        my.lid,
        my.qpn,
        my.psn,
        fmt_gid(&my.gid)
    );

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
        qp.modify(
            &rtr,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )
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
        qp.modify(
            &rts,
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        )
        .unwrap_or_else(|e| die(format!("Failed to modify QP to RTS: {e}")));
    };
    let rem = match &server {
        Some(host) => {
            // Retry for a while: the server may not be listening yet.
            let start = Instant::now();
            let mut s = loop {
                match TcpStream::connect((host.as_str(), port)) {
                    Ok(s) => break s,
                    Err(e) if start.elapsed() > Duration::from_secs(10) => {
                        die(format!("Couldn't connect to {host}:{port}: {e}"))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            s.write_all(&to_msg(&my)).unwrap_or_else(|e| die(e));
            let mut m = [0u8; MSG_LEN];
            s.read_exact(&mut m)
                .unwrap_or_else(|e| die(format!("Couldn't read remote address: {e}")));
            s.write_all(b"done\0").unwrap_or_else(|e| die(e));
            let rem = from_msg(&m).unwrap_or_else(|| die("Couldn't parse remote address"));
            connect(&rem);
            rem
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", port))
                .unwrap_or_else(|e| die(format!("Couldn't listen to port {port}: {e}")));
            let (mut s, _) = l.accept().unwrap_or_else(|e| die(e));
            let mut m = [0u8; MSG_LEN];
            s.read_exact(&mut m)
                .unwrap_or_else(|e| die(format!("Couldn't read remote address: {e}")));
            let rem = from_msg(&m).unwrap_or_else(|| die("Couldn't parse remote address"));
            connect(&rem);
            s.write_all(&to_msg(&my)).unwrap_or_else(|e| die(e));
            let mut done = [0u8; 5];
            s.read_exact(&mut done)
                .unwrap_or_else(|e| die(format!("Couldn't read \"done\": {e}")));
            rem
        }
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.lid,
        rem.qpn,
        rem.psn,
        fmt_gid(&rem.gid)
    );

    let post_send = || {
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send, vec![mr.sge(0, size as u32)]);
        wr.flags = SendFlags::SIGNALED;
        qp.post_send(wr)
            .unwrap_or_else(|e| die(format!("Couldn't post send: {e}")));
    };
    let mut pending = RECV_WRID;
    if server.is_some() {
        post_send();
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    while rcnt < iters || scnt < iters {
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
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recvs(rx_depth - routs);
                    }
                    rcnt += 1;
                }
                id => die(format!("Completion for unknown wr_id {id}")),
            }
            pending &= !wc.wr_id;
            if scnt < iters && pending == 0 {
                post_send();
                pending = RECV_WRID | SEND_WRID;
            }
        }
        if start.elapsed() > Duration::from_secs(60) {
            die(format!("timed out after {rcnt} receives and {scnt} sends"));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = size as f64 * f64::from(iters) * 2.0;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        secs,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{iters} iters in {secs:.2} seconds = {:.2} usec/iter",
        secs * 1e6 / f64::from(iters)
    );
}
