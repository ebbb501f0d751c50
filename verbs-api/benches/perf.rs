//! Performance of the in-process device against the raw UDP loopback
//! ceiling of the same machine, measured in the same run with the same
//! datagram sizes. Prints figures; asserts nothing (speed is not a test).
//!
//! Run: `cargo bench -p verbs-api` (`RXE_BENCH_SECS` sets each phase's length).

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// One-way latencies of a ping-pong: half of each round trip.
struct Lat {
    rounds: Vec<Duration>,
}

impl Lat {
    fn mean(&self) -> Duration {
        let sum: Duration = self.rounds.iter().sum();
        sum / (2 * self.rounds.len() as u32).max(1)
    }

    /// The round trip at quantile `q`, halved (perftest's `t_typical` is
    /// the median).
    fn quantile(&self, q: f64) -> Duration {
        let mut v = self.rounds.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 - 1.0) * q).round() as usize;
        v.get(i).copied().unwrap_or_default() / 2
    }
}

/// Run `round` (one round trip) for [`secs`], timing each.
fn time_rounds(mut round: impl FnMut()) -> Lat {
    let mut rounds = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    let mut last = start;
    while last.duration_since(start) < secs() {
        round();
        let now = Instant::now();
        rounds.push(now - last);
        last = now;
    }
    Lat { rounds }
}

/// Raw UDP ping-pong of `size`-byte datagrams between two spinning
/// threads.
fn udp_pingpong(size: usize, a: &str, b: &str) -> Lat {
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
    let lat = time_rounds(|| {
        sa.send_to(&buf, ab).unwrap();
        while sa.recv(&mut rbuf).is_err() {}
    });
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    lat
}

struct End {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn end(ip: &str) -> End {
    end_on(Device::open(DeviceConfig::new(ip.parse().unwrap())).unwrap())
}

fn end_on(dev: Device) -> End {
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

fn connect(me: &End, peer_qpn: u32, peer_gid: [u8; 16]) {
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
        dest_qp_num: peer_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: peer_gid,
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

/// RDMA WRITE of `size`-byte messages into `(addr, rkey)` at the peer,
/// `depth` outstanding; bytes/s and messages/s completed.
fn rdma_write(a: &End, remote: (u64, u32), size: usize, depth: usize) -> (f64, f64) {
    let mut src = vec![1u8; size];
    let smr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let wr = |i: u64| {
        SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: remote.0,
                rkey: remote.1,
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

/// The echo side of the ping-pong: every receive answers with a send,
/// until `stop`.
fn echo(b: &End, stop: &AtomicBool) {
    let mut bbuf = vec![0u8; 8];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    let recv = || RecvWr {
        wr_id: 0,
        sg_list: vec![bmr.sge(0, 8)],
    };
    b.qp.post_recv(recv()).unwrap();
    while !stop.load(Ordering::Relaxed) {
        for w in b.cq.poll(16).unwrap() {
            if w.opcode == verbs_api::WcOpcode::Recv {
                b.qp.post_recv(recv()).unwrap();
                b.qp.post_send(SendWr::new(1, SendOp::Send, vec![bmr.sge(0, 8)]))
                    .unwrap();
            }
        }
    }
}

/// RC SEND ping-pong of 8 bytes against a running [`echo`].
fn rdma_pingpong(a: &End) -> Lat {
    let mut abuf = vec![0u8; 8];
    let amr = a.pd.reg_mr(&mut abuf, ALL).unwrap();
    let recv = || RecvWr {
        wr_id: 0,
        sg_list: vec![amr.sge(0, 8)],
    };
    a.qp.post_recv(recv()).unwrap();
    time_rounds(|| {
        a.qp.post_send(SendWr::new(1, SendOp::Send, vec![amr.sge(0, 8)]))
            .unwrap();
        'wait: loop {
            for w in a.cq.poll(16).unwrap() {
                if w.opcode == verbs_api::WcOpcode::Recv {
                    a.qp.post_recv(recv()).unwrap();
                    break 'wait;
                }
            }
        }
    })
}

/// The far end of the benchmark: it owns the WRITE target and, on
/// request, runs [`echo`]. In this process (a thread) or in a child
/// process on the same daemon device.
struct Peer {
    qpn: u32,
    gid: [u8; 16],
    mr: (u64, u32),
    send: Box<dyn FnMut(&str)>,
    wait: Box<dyn FnMut()>,
}

/// The peer's side: wait for commands (`ECHO`, `IDLE`, end of input).
fn serve_commands(b: End, commands: impl Iterator<Item = String> + Send + 'static) {
    let stop_echo = Arc::new(AtomicBool::new(true));
    let echo_req = Arc::new(AtomicBool::new(false));
    let quit = Arc::new(AtomicBool::new(false));
    let (s, e, q) = (stop_echo.clone(), echo_req.clone(), quit.clone());
    std::thread::spawn(move || {
        for c in commands {
            match c.trim() {
                "ECHO" => {
                    s.store(false, Ordering::SeqCst);
                    e.store(true, Ordering::SeqCst);
                }
                _ => s.store(true, Ordering::SeqCst),
            }
        }
        q.store(true, Ordering::SeqCst);
        s.store(true, Ordering::SeqCst);
    });
    while !quit.load(Ordering::SeqCst) {
        if echo_req.swap(false, Ordering::SeqCst) {
            echo(&b, &stop_echo);
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn leak_mr(e: &End, len: usize) -> (u64, u32) {
    let buf: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    let mr = e.pd.reg_mr(buf, ALL).unwrap();
    let r = (mr.addr(), mr.rkey());
    std::mem::forget(mr); // the benchmark's target lives until exit
    r
}

fn hex(g: &[u8; 16]) -> String {
    g.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 16] {
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    g
}

/// A peer thread with its own in-process device on `ip`.
fn local_peer(ip: &str, a: &End) -> Peer {
    let b = end(ip);
    let mr = leak_mr(&b, 64 << 10);
    connect(&b, a.qp.qpn(), a.dev.gid());
    let (qpn, gid) = (b.qp.qpn(), b.dev.gid());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let handle = std::thread::spawn(move || serve_commands(b, rx.into_iter()));
    let mut tx = Some(tx);
    let mut handle = Some(handle);
    Peer {
        qpn,
        gid,
        mr,
        send: Box::new(move |c: &str| {
            if c == "QUIT" {
                tx = None;
            } else if let Some(t) = &tx {
                t.send(c.to_string()).unwrap();
            }
        }),
        wait: Box::new(move || {
            if let Some(h) = handle.take() {
                h.join().unwrap();
            }
        }),
    }
}

/// A peer in a child process (this program again), on the daemon device
/// at `socket`.
fn child_peer(socket: &std::path::Path, a: &End) -> Peer {
    use std::io::{BufRead, BufReader, Write};
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env("RXE_BENCH_CHILD", socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w.first(), Some(&"READY"), "child said {line:?}");
    let (qpn, gid) = (w[1].parse().unwrap(), unhex(w[2]));
    let mr = (w[3].parse().unwrap(), w[4].parse().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{} {}", a.qp.qpn(), hex(&a.dev.gid())).unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "CONNECTED");
    let mut stdin = Some(stdin);
    Peer {
        qpn,
        gid,
        mr,
        send: Box::new(move |c: &str| {
            if c == "QUIT" {
                stdin = None;
            } else if let Some(s) = stdin.as_mut() {
                writeln!(s, "{c}").unwrap();
            }
        }),
        wait: Box::new(move || {
            let _ = child.wait();
        }),
    }
}

/// Child process: the peer of `child_peer`.
fn child_main(socket: &str) {
    use std::io::{BufRead, Write};
    let b = end_on(Device::open_daemon("rxe0", Some(std::path::Path::new(socket))).unwrap());
    let mr = leak_mr(&b, 64 << 10);
    println!(
        "READY {} {} {} {}",
        b.qp.qpn(),
        hex(&b.dev.gid()),
        mr.0,
        mr.1
    );
    std::io::stdout().flush().unwrap();
    let mut lines = std::io::stdin().lock().lines();
    let peer = lines.next().unwrap().unwrap();
    let w: Vec<&str> = peer.split_whitespace().collect();
    connect(&b, w[0].parse().unwrap(), unhex(w[1]));
    println!("CONNECTED");
    std::io::stdout().flush().unwrap();
    drop(lines);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::stdin().lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    serve_commands(b, rx.into_iter());
}

/// The three figures against their ceilings, for one pair of ends.
fn phases(title: &str, a: &End, peer: &mut Peer, ip_a: &str, ip_b: &str) -> [f64; 6] {
    let only = std::env::var("RXE_BENCH_ONLY").unwrap_or_default();
    let run = |phase: &str| only.is_empty() || only == phase;
    let mut r = [f64::NAN; 6];
    println!("{title}");
    // 64 KiB WRITEs travel as 16 datagrams of 12 + 4096 + 4 bytes.
    if run("bw") {
        let (ceil, _) = udp_stream(4112, ip_a, ip_b);
        let (bw, _) = rdma_write(a, peer.mr, 64 << 10, 16);
        println!("  RC WRITE 64 KiB, depth 16: {:8.1} MB/s | UDP ceiling (4112-B datagrams) {:8.1} MB/s | ratio {:.2}", bw / 1e6, ceil / 1e6, bw / ceil);
        r[0] = bw;
        r[1] = ceil;
    }
    // An 8-byte SEND_ONLY is 12 + 8 + 4 = 24 bytes of UDP payload.
    if run("lat") {
        let ceil = udp_pingpong(24, ip_a, ip_b);
        (peer.send)("ECHO");
        std::thread::sleep(Duration::from_millis(20));
        let lat = rdma_pingpong(a);
        (peer.send)("IDLE");
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "  RC SEND 8 B latency:       {:8.2} us   | UDP ping-pong (24 B) {:8.2} us   | ratio {:.2}",
            us(lat.mean()),
            us(ceil.mean()),
            ratio(lat.mean(), ceil.mean())
        );
        println!(
            "    median (t_typical):      {:8.2} us   |                      {:8.2} us   | ratio {:.2}",
            us(lat.quantile(0.5)),
            us(ceil.quantile(0.5)),
            ratio(lat.quantile(0.5), ceil.quantile(0.5))
        );
        println!(
            "    99th percentile:         {:8.2} us   |                      {:8.2} us   | ratio {:.2}",
            us(lat.quantile(0.99)),
            us(ceil.quantile(0.99)),
            ratio(lat.quantile(0.99), ceil.quantile(0.99))
        );
        r[2] = lat.mean().as_secs_f64();
        r[3] = ceil.mean().as_secs_f64();
    }
    // 8-byte WRITE_ONLY: 12 + 16 + 8 + 4 = 40 bytes.
    if run("rate") {
        let (_, ceil) = udp_stream(40, ip_a, ip_b);
        let (_, rate) = rdma_write(a, peer.mr, 8, 128);
        println!(
            "  RC WRITE 8 B message rate: {:8.0} /s   | UDP datagrams (40 B) {:8.0} /s   | ratio {:.2}",
            rate,
            ceil,
            rate / ceil
        );
        r[4] = rate;
        r[5] = ceil;
    }
    let c = a.dev.counters();
    println!("  requester counters: sent_pkts {} rcvd_pkts {} completer_retry_err {} retrans_timeouts {}\n", c.sent_pkts, c.rcvd_pkts, c.completer_retry_err, c.retrans_timeouts);
    (peer.send)("QUIT");
    (peer.wait)();
    r
}

fn main() {
    // `cargo bench` passes --bench: accept and ignore flags.
    if let Ok(sock) = std::env::var("RXE_BENCH_CHILD") {
        return child_main(&sock);
    }
    println!(
        "rxe-emu over UDP loopback, {:?} per phase, path MTU 4096, on {} cores; each ceiling is raw UDP\nbetween two sockets on the same addresses with the same datagram sizes, measured in the same run.\n",
        secs(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mode = std::env::var("RXE_BENCH_MODE").unwrap_or_default();
    if mode.is_empty() || mode == "inprocess" {
        let a = end("127.0.9.1");
        let mut peer = local_peer("127.0.9.2", &a);
        connect(&a, peer.qpn, peer.gid);
        phases(
            "In-process devices (two threads, 127.0.9.1 and 127.0.9.2):",
            &a,
            &mut peer,
            "127.0.9.1",
            "127.0.9.2",
        );
    }
    if mode.is_empty() || mode == "daemon" {
        let dir = std::env::temp_dir().join(format!("rxe-emu-bench-{}", std::process::id()));
        let server = emulator_daemon::server::Server::bind(
            emulator_daemon::server::ServerConfig {
                socket_path: dir.join("rxe-emud.sock"),
                devices: vec!["rxe0=127.0.9.5".parse().unwrap()],
                slots: 8,
                any_user: false,
            },
            false,
        )
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let daemon = std::thread::spawn(move || server.run(&s2).unwrap());
        let a = end_on(Device::open_daemon("rxe0", Some(&dir.join("rxe-emud.sock"))).unwrap());
        let mut peer = child_peer(&dir.join("rxe-emud.sock"), &a);
        connect(&a, peer.qpn, peer.gid);
        phases(
            "One rxe-emud device (127.0.9.5), two processes:",
            &a,
            &mut peer,
            "127.0.9.5",
            "127.0.9.5",
        );
        stop.store(true, Ordering::SeqCst);
        daemon.join().unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
