//! Performance of the in-process device against the raw UDP loopback
//! ceiling of the same machine, measured in the same run with the same
//! datagram sizes. Prints figures; asserts nothing (speed is not a test).
//!
//! Run: `cargo bench -p verbs-api` (`RXE_BENCH_SECS` sets each phase's length).

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags, AhAttr, CompletionQueue, Device, DeviceConfig, Mtu, ProtectionDomain, QpAttr,
    QpAttrMask as M, QpCap, QpState, QpType, QueuePair, RecvWr, SendOp, SendWr,
};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn secs() -> Duration {
    Duration::from_secs_f64(
        std::env::var("RXE_BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3.0),
    )
}

/// Raw UDP: one thread sends `size`-byte datagrams as fast as it can, the
/// receiver counts what arrives. Returns (bytes/s, datagrams/s) received.
fn udp_stream(size: usize, a: &str, b: &str) -> (f64, f64) {
    let rx = UdpSocket::bind((b, 0)).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let to = rx.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let a = a.to_string();
    let tx = std::thread::spawn(move || {
        let s = UdpSocket::bind((a.as_str(), 0)).unwrap();
        let buf = vec![0u8; size];
        while !s2.load(Ordering::Relaxed) {
            let _ = s.send_to(&buf, to);
        }
    });
    let mut buf = vec![0u8; 65536];
    let (mut bytes, mut n) = (0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < secs() {
        if let Ok(k) = rx.recv(&mut buf) {
            bytes += k as u64;
            n += 1;
        }
    }
    let t = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    tx.join().unwrap();
    (bytes as f64 / t, n as f64 / t)
}

/// Raw UDP ping-pong of `size`-byte datagrams between two spinning
/// threads; returns the mean one-way latency.
fn udp_pingpong(size: usize, a: &str, b: &str) -> Duration {
    let sa = UdpSocket::bind((a, 0)).unwrap();
    let sb = UdpSocket::bind((b, 0)).unwrap();
    sa.set_nonblocking(true).unwrap();
    sb.set_nonblocking(true).unwrap();
    let (aa, ab) = (sa.local_addr().unwrap(), sb.local_addr().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !s2.load(Ordering::Relaxed) {
            if let Ok(k) = sb.recv(&mut buf) {
                let _ = sb.send_to(&buf[..k], aa);
            }
        }
    });
    let buf = vec![0u8; size];
    let mut rbuf = [0u8; 2048];
    let mut rounds = 0u64;
    let start = Instant::now();
    while start.elapsed() < secs() {
        sa.send_to(&buf, ab).unwrap();
        loop {
            if sa.recv(&mut rbuf).is_ok() {
                break;
            }
        }
        rounds += 1;
    }
    let t = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    t / (2 * rounds as u32).max(1)
}

struct End {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn end(ip: &str) -> End {
    let dev = Device::open(DeviceConfig::new(ip.parse().unwrap())).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let cap = QpCap {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq, None, cap, false)
        .unwrap();
    End { dev, pd, cq, qp }
}

fn connect(me: &End, peer: &End) {
    me.qp
        .modify(
            &QpAttr {
                qp_state: Some(QpState::Init),
                port_num: 1,
                qp_access_flags: ALL.bits(),
                ..Default::default()
            },
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .unwrap();
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::M4096),
        dest_qp_num: peer.qp.qpn(),
        rq_psn: 0,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: peer.dev.gid(),
            sgid_index: me.dev.gid_index(),
            is_global: true,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    me.qp
        .modify(
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
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: 0,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..Default::default()
    };
    me.qp
        .modify(
            &rts,
            M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
}

/// RDMA WRITE of `size`-byte messages, `depth` outstanding; bytes/s and
/// messages/s completed.
fn rdma_write(a: &End, b: &End, size: usize, depth: usize) -> (f64, f64) {
    let mut src = vec![1u8; size];
    let smr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; size];
    let dmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    let wr = |i: u64| {
        SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: dmr.addr(),
                rkey: dmr.rkey(),
            },
            vec![smr.sge(0, size as u32)],
        )
    };
    let mut posted = 0u64;
    let mut done = 0u64;
    for _ in 0..depth {
        a.qp.post_send(wr(posted)).unwrap();
        posted += 1;
    }
    let start = Instant::now();
    while start.elapsed() < secs() {
        let n = a.cq.poll(64).unwrap().len() as u64;
        done += n;
        for _ in 0..n {
            a.qp.post_send(wr(posted)).unwrap();
            posted += 1;
        }
    }
    let t = start.elapsed().as_secs_f64();
    let rest =
        a.cq.wait((posted - done) as usize, Duration::from_secs(30))
            .unwrap();
    assert_eq!(rest.len() as u64, posted - done);
    (done as f64 * size as f64 / t, done as f64 / t)
}

/// RC SEND ping-pong of 8 bytes between two threads; mean one-way latency.
fn rdma_pingpong(a: &End, b: &End) -> Duration {
    let mut abuf = vec![0u8; 8];
    let amr = a.pd.reg_mr(&mut abuf, ALL).unwrap();
    let mut bbuf = vec![0u8; 8];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    let rounds = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            // Echo side: every receive answers with a send.
            b.qp.post_recv(RecvWr {
                wr_id: 0,
                sg_list: vec![bmr.sge(0, 8)],
            })
            .unwrap();
            while !stop.load(Ordering::Relaxed) {
                for w in b.cq.poll(16).unwrap() {
                    if w.opcode == verbs_api::WcOpcode::Recv {
                        b.qp.post_recv(RecvWr {
                            wr_id: 0,
                            sg_list: vec![bmr.sge(0, 8)],
                        })
                        .unwrap();
                        b.qp.post_send(SendWr::new(1, SendOp::Send, vec![bmr.sge(0, 8)]))
                            .unwrap();
                    }
                }
            }
        });
        a.qp.post_recv(RecvWr {
            wr_id: 0,
            sg_list: vec![amr.sge(0, 8)],
        })
        .unwrap();
        while start.elapsed() < secs() {
            a.qp.post_send(SendWr::new(1, SendOp::Send, vec![amr.sge(0, 8)]))
                .unwrap();
            'wait: loop {
                for w in a.cq.poll(16).unwrap() {
                    if w.opcode == verbs_api::WcOpcode::Recv {
                        a.qp.post_recv(RecvWr {
                            wr_id: 0,
                            sg_list: vec![amr.sge(0, 8)],
                        })
                        .unwrap();
                        break 'wait;
                    }
                }
            }
            rounds.fetch_add(1, Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
    });
    start.elapsed() / (2 * rounds.load(Ordering::Relaxed) as u32).max(1)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test` runs benches with no
    // arguments in test mode only if asked, so accept and ignore flags.
    let a = end("127.0.9.1");
    let b = end("127.0.9.2");
    connect(&a, &b);
    connect(&b, &a);
    println!(
        "rxe-emu in-process device over UDP loopback, {} per phase, path MTU 4096",
        format_args!("{:?}", secs())
    );
    println!("(2 cores; the ceiling is raw UDP between two sockets on the same addresses, same datagram sizes)\n");

    // `RXE_BENCH_ONLY=bw|lat|rate` runs one phase (for profiling).
    let only = std::env::var("RXE_BENCH_ONLY").unwrap_or_default();
    let run = |phase: &str| only.is_empty() || only == phase;

    // 64 KiB WRITEs travel as 16 datagrams of 12 + 4096 + 4 bytes.
    if run("bw") {
        let (ceil_bw, _) = udp_stream(4112, "127.0.9.1", "127.0.9.2");
        let (bw, _) = rdma_write(&a, &b, 64 << 10, 16);
        println!("RC WRITE 64 KiB, depth 16: {:8.1} MB/s | UDP ceiling (4112-B datagrams) {:8.1} MB/s | ratio {:.2}", bw / 1e6, ceil_bw / 1e6, bw / ceil_bw);
    }

    // An 8-byte SEND_ONLY is 12 + 8 + 4 = 24 bytes of UDP payload.
    if run("lat") {
        let ceil_lat = udp_pingpong(24, "127.0.9.1", "127.0.9.2");
        let lat = rdma_pingpong(&a, &b);
        println!(
        "RC SEND 8 B latency:       {:8.2} us   | UDP ping-pong (24 B) {:8.2} us   | ratio {:.2}",
        lat.as_secs_f64() * 1e6,
        ceil_lat.as_secs_f64() * 1e6,
        lat.as_secs_f64() / ceil_lat.as_secs_f64()
    );
    }
    // 8-byte WRITE_ONLY: 12 + 16 + 8 + 4 = 40 bytes.
    if run("rate") {
        let (_, ceil_rate) = udp_stream(40, "127.0.9.1", "127.0.9.2");
        let (_, rate) = rdma_write(&a, &b, 8, 128);
        println!(
        "RC WRITE 8 B message rate: {:8.0} /s   | UDP datagrams (40 B) {:8.0} /s   | ratio {:.2}",
        rate,
        ceil_rate,
        rate / ceil_rate
    );
    }
    let c = a.dev.counters();
    println!("\nrequester counters: sent_pkts {} rcvd_pkts {} completer_retry_err {} retrans_timeouts {}", c.sent_pkts, c.rcvd_pkts, c.completer_retry_err, c.retrans_timeouts);
}
