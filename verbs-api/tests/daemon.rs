//! Devices shared through rxe-emud: several processes (or several opens)
//! on one device, steered by QPN, and what happens when a client or the
//! daemon goes away. The daemon runs in a thread of the test; clients are
//! this process and child processes.

#[path = "../../test-support/skip.rs"]
mod skip;

use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use emulator_daemon::server::{Server, ServerConfig};
use verbs_api::{
    AccessFlags, AhAttr, AsyncEventKind, CompletionQueue, Device, Mtu, ProtectionDomain, QpAttr,
    QpAttrMask as M, QpCap, QpState, QpType, QueuePair, RecvWr, SendOp, SendWr, WcFlags, WcOpcode,
    WcStatus,
};

const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
const WAIT: Duration = Duration::from_secs(20);

struct Daemon {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Daemon {
    fn start(tag: &str, device: &str, slots: u32) -> Daemon {
        Daemon::start_for(tag, device, slots, false)
    }

    fn start_for(tag: &str, device: &str, slots: u32, any_user: bool) -> Daemon {
        let dir = std::env::temp_dir().join(format!("rxe-emu-test-{}-{tag}", std::process::id()));
        let path = dir.join("rxe-emud.sock");
        let server = Server::bind(
            ServerConfig {
                socket_path: path.clone(),
                devices: vec![device.parse().unwrap()],
                slots,
                any_user,
            },
            false,
        )
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::spawn(move || server.run(&s2).unwrap());
        Daemon {
            path,
            stop,
            thread: Some(thread),
        }
    }

    fn open(&self) -> Device {
        Device::open_daemon("rxe0", Some(&self.path)).unwrap()
    }

    fn status(&self) -> String {
        emulator_daemon::client::request(&self.path, "STATUS").unwrap()
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
        if let Some(d) = self.path.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// `dropped_no_owner N` from a STATUS reply.
fn no_owner_drops(status: &str) -> u64 {
    status
        .split_whitespace()
        .skip_while(|w| *w != "dropped_no_owner")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {status}"))
}

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn side(dev: Device, ty: QpType) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(ty, &cq, &cq, None, cap, false).unwrap();
    Side { dev, pd, cq, qp }
}

/// Two processes of `d`'s device, an RC QP each, connected to each other
/// (ACK timeout 14, 7 retries).
fn rc_pair(d: &Daemon) -> (Side, Side) {
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    (a, b)
}

fn connect(me: &Side, peer_qpn: u32, peer_gid: [u8; 16], timeout: u8, retry: u8, rq_psn: u32) {
    connect_mtu(me, peer_qpn, peer_gid, timeout, retry, rq_psn, Mtu::M1024);
}

fn connect_mtu(
    me: &Side,
    peer_qpn: u32,
    peer_gid: [u8; 16],
    timeout: u8,
    retry: u8,
    rq_psn: u32,
    mtu: Mtu,
) {
    let peer = (peer_qpn, peer_gid, rq_psn);
    connect_qp(&me.dev, &me.qp, peer, timeout, retry, mtu);
}

/// Bring `qp` of `dev` to RTS towards `peer` (QPN, GID, its receive PSN).
fn connect_qp(
    dev: &Device,
    qp: &QueuePair,
    (peer_qpn, peer_gid, rq_psn): (u32, [u8; 16], u32),
    timeout: u8,
    retry: u8,
    mtu: Mtu,
) {
    qp.modify(
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
        path_mtu: Some(mtu),
        dest_qp_num: peer_qpn,
        rq_psn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: peer_gid,
            sgid_index: dev.gid_index(),
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        ..QpAttr::default()
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
    .unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        sq_psn: 0,
        timeout,
        retry_cnt: retry,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    qp.modify(
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

fn bin(name: &str) -> &'static str {
    match name {
        "rc" => env!("CARGO_BIN_EXE_rxe-rc-pingpong"),
        _ => env!("CARGO_BIN_EXE_rxe-ud-pingpong"),
    }
}

fn pingpong(path: &Path, kind: &str, port: &str, server: bool) -> Command {
    let mut c = Command::new(bin(kind));
    c.env("RXE_EMU_MODE", "daemon")
        .env("RXE_EMU_SOCKET", path)
        .args(["-d", "rxe0", "-p", port, "-n", "100"]);
    if !server {
        c.arg("127.0.0.1");
    }
    c
}

#[test]
fn rc_and_ud_pingpong_between_two_processes_on_one_daemon_device() {
    let d = Daemon::start("pp", "rxe0=127.0.21.1", 8);
    for (kind, port) in [("rc", "18621"), ("ud", "18622")] {
        let srv = pingpong(&d.path, kind, port, true).spawn().unwrap();
        let client = pingpong(&d.path, kind, port, false).output().unwrap();
        let srv = srv.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&client.stdout);
        assert!(
            client.status.success() && srv.status.success(),
            "{kind}: {out}\n{}",
            String::from_utf8_lossy(&client.stderr)
        );
        assert!(out.contains("100 iters in"), "{out}");
        // Both ends on the device's one address, QPNs from two slots.
        assert_eq!(out.matches("GID ::ffff:127.0.21.1").count(), 2, "{out}");
    }
    assert!(d.status().contains("slots 0/7"), "{}", d.status());
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

#[test]
fn every_rc_opcode_between_two_slots_of_one_device() {
    let d = Daemon::start("ops", "rxe0=127.0.21.2", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    assert_ne!(a.qp.qpn() >> 16, b.qp.qpn() >> 16, "one slot each");
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    const LEN: usize = 5000;
    let mut abuf = pattern(LEN, 1);
    let expect = abuf.clone();
    let amr = a.pd.reg_mr(&mut abuf, ALL).unwrap();
    let mut bbuf = vec![0u8; LEN + 16];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    // Keys come from disjoint spaces: neither can name the other's memory.
    assert_ne!(amr.rkey() >> 8, bmr.rkey() >> 8);
    let len = LEN as u32;
    let ok = |wcs: Vec<verbs_api::WorkCompletion>, op: WcOpcode| {
        assert_eq!(wcs.len(), 1, "{op:?}");
        assert_eq!((wcs[0].opcode, wcs[0].status), (op, WcStatus::Success));
        wcs[0]
    };
    // SEND with immediate.
    b.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![bmr.sge(0, len)],
    })
    .unwrap();
    a.qp.post_send(SendWr::new(
        1,
        SendOp::SendWithImm { imm: 0x1234 },
        vec![amr.sge(0, len)],
    ))
    .unwrap();
    let wc = ok(b.cq.wait(1, WAIT).unwrap(), WcOpcode::Recv);
    assert!(wc.wc_flags.contains(WcFlags::WITH_IMM) && wc.imm_data == 0x1234);
    ok(a.cq.wait(1, WAIT).unwrap(), WcOpcode::Send);
    // WRITE with immediate, into offset 16.
    b.qp.post_recv(RecvWr {
        wr_id: 2,
        sg_list: vec![],
    })
    .unwrap();
    a.qp.post_send(SendWr::new(
        2,
        SendOp::RdmaWriteWithImm {
            remote_addr: bmr.addr() + 16,
            rkey: bmr.rkey(),
            imm: 7,
        },
        vec![amr.sge(0, len)],
    ))
    .unwrap();
    ok(b.cq.wait(1, WAIT).unwrap(), WcOpcode::RecvRdmaWithImm);
    ok(a.cq.wait(1, WAIT).unwrap(), WcOpcode::RdmaWrite);
    // READ it back from B into A, over A's own data.
    let mut back = vec![0u8; LEN];
    let back_mr = a.pd.reg_mr(&mut back, ALL).unwrap();
    a.qp.post_send(SendWr::new(
        3,
        SendOp::RdmaRead {
            remote_addr: bmr.addr() + 16,
            rkey: bmr.rkey(),
        },
        vec![back_mr.sge(0, len)],
    ))
    .unwrap();
    ok(a.cq.wait(1, WAIT).unwrap(), WcOpcode::RdmaRead);
    // Atomics on B's first 8 bytes (the SEND's data).
    let first = u64::from_ne_bytes(expect[..8].try_into().unwrap());
    let mut old = [0u8; 16];
    let old_mr = a.pd.reg_mr(&mut old, ALL).unwrap();
    a.qp.post_send(SendWr::new(
        4,
        SendOp::AtomicCmpSwp {
            remote_addr: bmr.addr(),
            rkey: bmr.rkey(),
            compare: first,
            swap: 100,
        },
        vec![old_mr.sge(0, 8)],
    ))
    .unwrap();
    ok(a.cq.wait(1, WAIT).unwrap(), WcOpcode::CompSwap);
    a.qp.post_send(SendWr::new(
        5,
        SendOp::AtomicFetchAdd {
            remote_addr: bmr.addr(),
            rkey: bmr.rkey(),
            add: 5,
        },
        vec![old_mr.sge(8, 8)],
    ))
    .unwrap();
    ok(a.cq.wait(1, WAIT).unwrap(), WcOpcode::FetchAdd);
    drop((amr, bmr, back_mr, old_mr));
    assert_eq!(back, expect, "WRITE then READ round trip");
    assert_eq!(u64::from_ne_bytes(old[..8].try_into().unwrap()), first);
    assert_eq!(u64::from_ne_bytes(old[8..].try_into().unwrap()), 100);
    assert_eq!(u64::from_ne_bytes(bbuf[..8].try_into().unwrap()), 105);
}

#[test]
fn stopping_the_daemon_fails_the_device_with_device_fatal() {
    let mut d = Daemon::start("fatal", "rxe0=127.0.21.3", 4);
    let a = side(d.open(), QpType::Rc);
    d.stop();
    let start = Instant::now();
    let ev = loop {
        if let Some(e) = a.dev.poll_async_event() {
            break e;
        }
        assert!(
            start.elapsed() < WAIT,
            "no DEVICE_FATAL after the daemon stopped"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(ev.kind, AsyncEventKind::DeviceFatal);
    assert!(ev.reason.contains("rxe-emud"), "{}", ev.reason);
    assert_eq!(a.qp.state(), QpState::Err);
    let e = a.pd.create_cq_check(&a.dev);
    assert!(e.contains("rxe-emud"), "{e}");
}

#[test]
fn link_add_serves_a_new_device_and_link_delete_fails_its_users_with_device_fatal() {
    let d = Daemon::start("link", "rxe0=127.0.21.10", 4);
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    let r = ask("LINK ADD rxe1=127.0.21.11/1500");
    assert!(
        r.starts_with("OK link rxe1/1 state ACTIVE")
            && r.contains("addr 127.0.21.11 netdev_mtu 1500"),
        "{r}"
    );
    // A name or an address in use, or a bad spec, is refused and says why.
    let r = ask("LINK ADD rxe1=127.0.21.12");
    assert!(r.starts_with("ERR device rxe1 exists already"), "{r}");
    let r = ask("LINK ADD rxe2=127.0.21.11");
    assert!(
        r.contains("address 127.0.21.11 is device rxe1's already"),
        "{r}"
    );
    let r = ask("LINK ADD rxe2=netdev:no-such-if0");
    assert!(r.contains("no netdev \"no-such-if0\""), "{r}");
    let r = ask("LINK ADD rxe2");
    assert!(
        r.starts_with("ERR device \"rxe2\": expected NAME=ADDR"),
        "{r}"
    );

    // The two devices of one daemon talk to each other.
    let a = side(d.open(), QpType::Rc);
    let b = side(
        Device::open_daemon("rxe1", Some(&d.path)).unwrap(),
        QpType::Rc,
    );
    assert_eq!(b.dev.query_port().active_mtu, Mtu::M1024, "netdev MTU 1500");
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 1, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 1, 0);
    let mut src = vec![0x5au8; 100];
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 200];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    for id in 1..=2 {
        b.qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![bmr.sge(0, 200)],
        })
        .unwrap();
    }
    a.qp.post_send(SendWr::new(1, SendOp::Send, vec![amr.sge(0, 100)]))
        .unwrap();
    assert_eq!(a.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    let wc = b.cq.wait(1, WAIT).unwrap();
    assert_eq!((wc[0].status, wc[0].byte_len), (WcStatus::Success, 100));
    let show = ask("LINK SHOW");
    assert_eq!(show.lines().count(), 2, "{show}");
    assert!(
        show.lines().all(|l| l.ends_with("processes 1")),
        "each device has one process: {show}"
    );

    // Deleting rxe1 under its user: DEVICE_FATAL with the reason, the QP
    // in ERR, its posted receive flushed, new verbs refused.
    let r = ask("LINK DEL rxe1");
    assert_eq!(r, "OK link rxe1 deleted (1 processes had it open)\n");
    let start = Instant::now();
    let ev = loop {
        if let Some(e) = b.dev.poll_async_event() {
            break e;
        }
        assert!(start.elapsed() < WAIT, "no DEVICE_FATAL after link delete");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(ev.kind, AsyncEventKind::DeviceFatal);
    assert!(
        ev.reason.contains("device rxe1 was deleted"),
        "{}",
        ev.reason
    );
    assert_eq!(b.qp.state(), QpState::Err);
    let wc = b.cq.wait(1, WAIT).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::WrFlushErr));
    let e = b.pd.create_cq_check(&b.dev);
    assert!(e.contains("device rxe1 was deleted"), "{e}");
    // Gone from the daemon; rxe0 and its process are untouched.
    assert!(!d.status().contains("device rxe1"), "{}", d.status());
    let r = match Device::open_daemon("rxe1", Some(&d.path)) {
        Ok(_) => panic!("opened a deleted device"),
        Err(e) => e.to_string(),
    };
    assert!(
        r.contains("no device \"rxe1\" (this daemon has rxe0)"),
        "{r}"
    );
    assert_eq!(a.qp.state(), QpState::Rts);
    let r = ask("LINK SHOW rxe1");
    assert!(r.starts_with("ERR no device"), "{r}");
    assert!(ask("LINK SHOW").starts_with("link rxe0/1 "));
}

#[test]
fn an_any_user_daemon_serves_other_users_and_a_per_user_daemon_refuses_them() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !skip::have_root("to run a client as another user") {
        return;
    }
    const NOBODY: u32 = 65534;
    // The pingpong program where uid 65534 may run it (the build tree may
    // be private to root).
    let dir = std::env::temp_dir().join(format!("rxe-emu-anyuser-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let prog = dir.join("rxe-rc-pingpong");
    std::fs::copy(env!("CARGO_BIN_EXE_rxe-rc-pingpong"), &prog).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |d: &Daemon, uid: Option<u32>, args: &[&str]| {
        let mut c = Command::new(&prog);
        c.args(args)
            .env("RXE_EMU_SOCKET", &d.path)
            .env("RXE_EMU_MODE", "daemon")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(u) = uid {
            c.uid(u).gid(u);
        }
        c.spawn().unwrap()
    };

    // System-wide: a server as uid 65534 and a client as root share rxe0.
    let d = Daemon::start_for("anyuser", "rxe0=127.0.21.24", 4, true);
    let mode = std::fs::metadata(&d.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666, "a system-wide daemon's socket is open to all");
    let server = run(
        &d,
        Some(NOBODY),
        &["-p", "18611", "-n", "20", "-s", "512", "-c"],
    );
    let start = Instant::now();
    while !d.status().contains(&format!("uid {NOBODY}")) {
        assert!(
            start.elapsed() < WAIT,
            "uid {NOBODY} never opened rxe0: {}",
            d.status()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200)); // its TCP listen
    let client = run(
        &d,
        None,
        &["-p", "18611", "-n", "20", "-s", "512", "-c", "127.0.0.1"],
    );
    let status = d.status();
    let c = client.wait_with_output().unwrap();
    let s = server.wait_with_output().unwrap();
    let text = format!(
        "server: {}{}\nclient: {}{}",
        String::from_utf8_lossy(&s.stdout),
        String::from_utf8_lossy(&s.stderr),
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&c.stderr)
    );
    assert!(s.status.success() && c.status.success(), "{text}");
    assert!(text.contains("20 iters in"), "{text}");
    assert!(status.contains(&format!("uid {NOBODY}")), "{status}");
    drop(d);

    // Per user: the socket is root's alone; and even when the file is
    // opened up by hand, the daemon refuses another uid by its credentials.
    let d = Daemon::start_for("peruser", "rxe0=127.0.21.13", 4, false);
    let mode = std::fs::metadata(&d.path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = run(&d, Some(NOBODY), &["-p", "18612"])
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && err.contains("Permission denied"),
        "{err}"
    );
    let sockdir = d.path.parent().unwrap();
    std::fs::set_permissions(sockdir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&d.path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = run(&d, Some(NOBODY), &["-p", "18612"])
        .wait_with_output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && err.contains("this rxe-emud serves uid 0 only"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

trait CreateCheck {
    fn create_cq_check(&self, dev: &Device) -> String;
}

impl CreateCheck for ProtectionDomain {
    fn create_cq_check(&self, dev: &Device) -> String {
        match dev.create_cq(4) {
            Ok(_) => "created a CQ on a failed device".into(),
            Err(e) => e.to_string(),
        }
    }
}

/// Play the client side of ibv_rc_pingpong's address exchange.
fn exchange(port: u16, my_qpn: u32, my_gid: [u8; 16]) -> (u32, u32, [u8; 16]) {
    let start = Instant::now();
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if start.elapsed() < WAIT => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("pingpong server: {e}"),
        }
    };
    let gid: String = my_gid.iter().map(|b| format!("{b:02x}")).collect();
    let mut msg = format!("0000:{my_qpn:06x}:000000:{gid}").into_bytes();
    msg.resize(52, 0);
    s.write_all(&msg).unwrap();
    let mut m = [0u8; 52];
    s.read_exact(&mut m).unwrap();
    s.write_all(b"done\0").unwrap();
    let text = String::from_utf8_lossy(&m)
        .trim_end_matches('\0')
        .to_string();
    let parts: Vec<&str> = text.split(':').collect();
    let qpn = u32::from_str_radix(parts[1], 16).unwrap();
    let psn = u32::from_str_radix(parts[2], 16).unwrap();
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&parts[3][2 * i..2 * i + 2], 16).unwrap();
    }
    (qpn, psn, g)
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_client_frees_its_slot_and_its_peer_gets_retry_exceeded() {
    let d = Daemon::start("kill", "rxe0=127.0.21.4", 2); // one client slot
                                                         // The victim: an rc pingpong server in another process, on slot 1.
    let mut victim = pingpong(&d.path, "rc", "18623", true);
    victim.args(["-n", "1000000", "-s", "64"]);
    let victim = KillOnDrop(victim.spawn().unwrap());
    // This process reaches the device through another daemon's device on
    // another address (the one client slot is the victim's).
    let d2 = Daemon::start("kill2", "rxe0=127.0.21.5", 2);
    let me = side(d2.open(), QpType::Rc);
    let (peer_qpn, peer_psn, peer_gid) = exchange(18623, me.qp.qpn(), me.dev.gid());
    assert_eq!(peer_qpn >> 16, 1);
    // timeout 10 (4 ms), retry_cnt 6: the peer's death shows within about
    // 40 ms, and a victim that a loaded machine lets run late (its
    // progress thread must wake for each SEND) is not mistaken for dead
    // (timeout 8 with 2 retries was, under two concurrent builds).
    connect(&me, peer_qpn, peer_gid, 10, 6, peer_psn);
    let mut buf = vec![7u8; 64];
    let mr = me.pd.reg_mr(&mut buf, ALL).unwrap();
    for i in 0..4u64 {
        me.qp
            .post_recv(RecvWr {
                wr_id: 100 + i,
                sg_list: vec![mr.sge(0, 64)],
            })
            .unwrap();
    }
    me.qp
        .post_send(SendWr::new(1, SendOp::Send, vec![mr.sge(0, 64)]))
        .unwrap();
    let wcs = me.cq.wait(2, WAIT).unwrap();
    assert!(
        wcs.iter().all(|w| w.status == WcStatus::Success) && wcs.len() == 2,
        "the victim answers while alive: {wcs:?}"
    );
    drop(victim); // SIGKILL, mid-conversation
    let before = no_owner_drops(&d.status());
    me.qp
        .post_send(SendWr::new(2, SendOp::Send, vec![mr.sge(0, 64)]))
        .unwrap();
    let start = Instant::now();
    let wc = loop {
        let w = me.cq.poll(4).unwrap();
        if let Some(w) = w.into_iter().find(|w| w.wr_id == 2) {
            break w;
        }
        assert!(
            start.elapsed() < WAIT,
            "no completion for the SEND to a dead peer"
        );
    };
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    // The daemon is alive, freed the slot, and counted the datagrams that
    // arrived for the dead QP instead of delivering them.
    let status = d.status();
    assert!(status.contains("slots 0/1"), "{status}");
    assert!(no_owner_drops(&status) > before, "{status}");
    // The slot is given again; the next owner's QPNs start elsewhere, so
    // the dead QP's number names nothing there.
    let next = side(d.open(), QpType::Rc);
    assert_eq!(next.qp.qpn() >> 16, 1);
    assert_ne!(next.qp.qpn(), peer_qpn);
    let late = UdpSocket::bind("127.0.21.5:0").unwrap();
    // A well-formed SEND_ONLY for the dead QP, with a valid ICRC.
    let mut pkt = vec![0u8; 12 + 8 + 4];
    pkt[0] = 0x04; // RC SEND_ONLY
    pkt[2] = 0xff;
    pkt[3] = 0xff;
    pkt[5..8].copy_from_slice(&peer_qpn.to_be_bytes()[1..]);
    let info = wire::icrc::IpUdpInfo {
        src: "127.0.21.5".parse().unwrap(),
        dst: "127.0.21.4".parse().unwrap(),
        src_port: late.local_addr().unwrap().port(),
        dst_port: 4791,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    };
    wire::icrc::write(&info, &mut pkt);
    let bad_qp = next.dev.counters().rcvd_bad_qp;
    late.send_to(&pkt, "127.0.21.4:4791").unwrap();
    let start = Instant::now();
    while next.dev.counters().rcvd_bad_qp == bad_qp {
        let _ = next.cq.poll(1);
        assert!(
            start.elapsed() < WAIT,
            "the late packet was not counted as for no QP: {:?}",
            next.dev.counters()
        );
    }
}

/// `NAME N` from a STAT reply's device line (the first).
fn stat_value(stat: &str, name: &str) -> u64 {
    let w: Vec<&str> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    w.iter()
        .position(|x| *x == name)
        .and_then(|i| w.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {stat}"))
}

#[test]
fn a_dead_slots_inbox_closes_its_senders_fall_back_to_udp_and_find_the_next_owner() {
    // Three slots: this process and two pingpong servers in turn.
    let d = Daemon::start("inbox", "rxe0=127.0.21.8", 3);
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    let me = side(d.open(), QpType::Rc);
    let mut buf = vec![7u8; 64];
    let mr = me.pd.reg_mr(&mut buf, ALL).unwrap();
    let talk = |me: &Side, mr: &verbs_api::MemoryRegion<'_>, peer: u16| {
        let (qpn, psn, gid) = exchange(peer, me.qp.qpn(), me.dev.gid());
        // 4 ms, 6 retries: a just-started peer may take several ms for its
        // first packet (1 ms with 2 retries failed once in 20 runs).
        connect(me, qpn, gid, 10, 6, psn);
        for i in 0..4u64 {
            me.qp
                .post_recv(RecvWr {
                    wr_id: 100 + i,
                    sg_list: vec![mr.sge(0, 64)],
                })
                .unwrap();
        }
        me.qp
            .post_send(SendWr::new(1, SendOp::Send, vec![mr.sge(0, 64)]))
            .unwrap();
        let wcs = me.cq.wait(2, WAIT).unwrap();
        assert!(
            wcs.iter().all(|w| w.status == WcStatus::Success) && wcs.len() == 2,
            "{wcs:?}"
        );
        qpn
    };
    let mut victim = pingpong(&d.path, "rc", "18631", true);
    victim.args(["-n", "1000000", "-s", "64"]);
    let victim = KillOnDrop(victim.spawn().unwrap());
    let dead_qpn = talk(&me, &mr, 18631);
    // Between two processes of one device: every datagram through the
    // inboxes, none through UDP.
    // (An acknowledgement built by the last poll may still be held for
    // the next one: counted in sent_pkts, not yet handed to either path.)
    let stat = ask("STAT rxe0");
    assert!(stat_value(&stat, "sent_inbox_pkts") >= 2, "{stat}");
    assert_eq!(stat_value(&stat, "sent_udp_pkts"), 0, "{stat}");
    assert!(
        stat_value(&stat, "sent_inbox_pkts") <= stat_value(&stat, "sent_pkts"),
        "{stat}"
    );

    // The peer dies: its inbox closes, our retries go by UDP to a slot
    // nobody owns (the daemon counts them), and the SEND fails as before.
    drop(victim);
    let start = Instant::now();
    while !d.status().contains("slots 1/2") {
        assert!(start.elapsed() < WAIT, "{}", d.status());
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = no_owner_drops(&d.status());
    me.qp
        .post_send(SendWr::new(2, SendOp::Send, vec![mr.sge(0, 64)]))
        .unwrap();
    let wc = loop {
        if let Some(w) = me.cq.poll(4).unwrap().into_iter().find(|w| w.wr_id == 2) {
            break w;
        }
        assert!(
            start.elapsed() < WAIT,
            "no completion for the SEND to a dead peer"
        );
    };
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    assert!(no_owner_drops(&d.status()) > before, "{}", d.status());
    let stat = ask("STAT rxe0");
    assert!(stat_value(&stat, "sent_udp_pkts") > 0, "{stat}");

    // The next process in that slot gets a new inbox, which a new QP of
    // ours finds.
    let mut next = pingpong(&d.path, "rc", "18632", true);
    next.args(["-n", "1000000", "-s", "64"]);
    let _next = KillOnDrop(next.spawn().unwrap());
    let me2 = side(me.dev.clone(), QpType::Rc);
    let mut buf2 = vec![8u8; 64];
    let mr2 = me2.pd.reg_mr(&mut buf2, ALL).unwrap();
    let inbox_before = stat_value(&ask("STAT rxe0"), "sent_inbox_pkts");
    let qpn = talk(&me2, &mr2, 18632);
    assert_eq!(qpn >> 16, dead_qpn >> 16, "the dead peer's slot");
    let stat = ask("STAT rxe0");
    assert!(
        stat_value(&stat, "sent_inbox_pkts") >= inbox_before + 2,
        "{stat}"
    );
}

#[test]
fn stat_qp_show_and_fault_reach_every_process_of_the_device() {
    let d = Daemon::start("cli", "rxe0=127.0.21.6", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    // ACK timeout 12 (16 ms), 3 retries: the first SEND must not fail on
    // a loaded machine (1 ms and one retry did, once), and the dropped one
    // below still fails within 100 ms.
    connect(&a, b.qp.qpn(), b.dev.gid(), 12, 3, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 12, 3, 0);
    let mut buf = vec![1u8; 32];
    let amr = a.pd.reg_mr(&mut buf, ALL).unwrap();
    let mut bbuf = vec![0u8; 32];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    let send = |id: u64| {
        b.qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![bmr.sge(0, 32)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(id, SendOp::Send, vec![amr.sge(0, 32)]))
            .unwrap();
        let wc = a.cq.wait(1, WAIT).unwrap();
        let _ = b.cq.poll(4);
        wc[0].status
    };
    assert_eq!(send(1), WcStatus::Success);
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    // Counters: per process and the device total (kernel names).
    let stat = ask("STAT rxe0");
    let sent = |line: &str| -> u64 {
        let w: Vec<&str> = line.split_whitespace().collect();
        let i = w.iter().position(|x| *x == "sent_pkts").unwrap();
        w[i + 1].parse().unwrap()
    };
    let lines: Vec<&str> = stat.lines().collect();
    assert!(lines[0].starts_with("link rxe0/1 sent_pkts"), "{stat}");
    let per: u64 = lines
        .iter()
        .filter(|l| l.contains(" pid "))
        .map(|l| sent(l))
        .sum();
    assert_eq!(sent(lines[0]), per, "{stat}");
    assert_eq!(
        sent(lines[0]),
        a.dev.counters().sent_pkts + b.dev.counters().sent_pkts
    );
    // Two slots of one device: all of it through the inboxes (so the
    // FAULT below also shows that faults apply on that path). An
    // acknowledgement held for a next poll is built, not yet sent.
    assert!(stat_value(&stat, "sent_inbox_pkts") >= 1, "{stat}");
    assert!(
        stat_value(&stat, "sent_inbox_pkts") <= sent(lines[0]),
        "{stat}"
    );
    assert_eq!(stat_value(&stat, "sent_udp_pkts"), 0, "{stat}");
    // Each QP's share, under its process: the SEND's requester sent the
    // request, its responder the ACK.
    for s in [&a, &b] {
        let l = lines
            .iter()
            .find(|l| l.starts_with(&format!("    qp {:#x} type Rc ", s.qp.qpn())))
            .unwrap_or_else(|| panic!("no line for QP {:#x}: {stat}", s.qp.qpn()));
        assert_eq!(sent(l), s.qp.counters().sent_pkts, "{stat}");
        // One each, or more if a slow machine made the requester resend.
        assert!(sent(l) >= 1, "{stat}");
    }
    // QPs of both processes, with state and PSNs.
    let qps = ask("QPS rxe0");
    for qpn in [a.qp.qpn(), b.qp.qpn()] {
        let l = qps
            .lines()
            .find(|l| l.contains(&format!("qpn {qpn:#x} ")))
            .unwrap_or_else(|| panic!("QP {qpn:#x} missing: {qps}"));
        assert!(l.contains("state Rts") && l.contains("type Rc"), "{l}");
    }
    // Drop everything: the next SEND exhausts its retries.
    let f = ask("FAULT rxe0 drop=1 seed=3");
    assert!(f.contains("2 of 2 processes applied it"), "{f}");
    assert_eq!(send(2), WcStatus::RetryExcErr);
    let qps = ask("QPS rxe0");
    assert!(
        qps.lines().any(|l| l.contains("state Err")
            && l.contains("error: SEND (wr_id 2) completed with IBV_WC_RETRY_EXC_ERR")),
        "the QP in ERR says why: {qps}"
    );
    // A process that opens the device now gets the fault too; turning it
    // off reaches everyone.
    let c = side(d.open(), QpType::Rc);
    let f = ask("FAULT rxe0 drop=0 seed=3");
    assert!(f.contains("3 of 3 processes applied it"), "{f}");
    drop(c);
    let bad = ask("FAULT rxe0 drop=7");
    assert!(
        bad.contains("ERR fault: drop=7 is not a probability"),
        "{bad}"
    );
}

#[test]
fn fault_delay_holds_every_datagram_back_in_order_and_loses_none() {
    let d = Daemon::start("delay", "rxe0=127.0.21.9", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    // ACK timeout 20 (4.3 s) is far above the delayed round trip
    // (2 x 10 ms): nothing may be retransmitted.
    connect(&a, b.qp.qpn(), b.dev.gid(), 20, 1, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 1, 0);
    const N: usize = 20;
    let pattern: Vec<u8> = (0..N * 64).map(|i| (i * 7 + 3) as u8).collect();
    let mut src = pattern.clone();
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; N * 64];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    let f = ask("FAULT rxe0 delay_ns=10000000 seed=5");
    assert!(f.contains("2 of 2 processes applied it"), "{f}");
    for i in 0..N {
        b.qp.post_recv(RecvWr {
            wr_id: i as u64,
            sg_list: vec![bmr.sge(i as u64 * 64, 64)],
        })
        .unwrap();
    }
    let start = Instant::now();
    for i in 0..N {
        a.qp.post_send(SendWr::new(
            i as u64,
            SendOp::Send,
            vec![amr.sge(i as u64 * 64, 64)],
        ))
        .unwrap();
    }
    let mut done = Vec::new();
    while done.len() < N {
        let wc = a.cq.wait(1, WAIT).unwrap();
        done.extend(wc.iter().map(|w| (w.wr_id, w.status)));
    }
    // The first completion needs the SEND to get there and its ACK to come
    // back, each held 10 ms: a lower bound, never a speed check.
    assert!(
        start.elapsed() >= Duration::from_millis(20),
        "{:?}",
        start.elapsed()
    );
    let expect: Vec<(u64, WcStatus)> = (0..N as u64).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(done, expect);
    let mut got = Vec::new();
    while got.len() < N {
        got.extend(b.cq.wait(1, WAIT).unwrap().iter().map(|w| w.wr_id));
    }
    assert_eq!(got, (0..N as u64).collect::<Vec<_>>(), "in order");
    drop(bmr);
    assert_eq!(dst, pattern, "every byte arrived");
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    assert_eq!(cb.duplicate_request, 0, "{cb:?}");
    assert_eq!(ca.completer_retry_err, 0, "{ca:?}");
    assert_eq!(cb.out_of_seq_request, 0, "{cb:?}");

    // Datagrams still waiting when the delay is turned off leave at once:
    // a SEND posted under a 5 s delay completes as soon as it is off, not
    // by a retransmission 4.3 s later.
    let f = ask("FAULT rxe0 delay_ns=5000000000 seed=5");
    assert!(f.contains("2 of 2 processes applied it"), "{f}");
    let mut dst2 = vec![0u8; 64];
    let bmr2 = b.pd.reg_mr(&mut dst2, ALL).unwrap();
    b.qp.post_recv(RecvWr {
        wr_id: 100,
        sg_list: vec![bmr2.sge(0, 64)],
    })
    .unwrap();
    a.qp.post_send(SendWr::new(100, SendOp::Send, vec![amr.sge(0, 64)]))
        .unwrap();
    assert!(a.cq.poll(1).unwrap().is_empty());
    let f = ask("FAULT rxe0 seed=5");
    assert!(f.contains("2 of 2 processes applied it"), "{f}");
    let wc = a.cq.wait(1, WAIT).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (100, WcStatus::Success));
    assert_eq!(b.cq.wait(1, WAIT).unwrap()[0].wr_id, 100);
    assert_eq!(a.dev.counters().completer_retry_err, 0);
    drop(bmr2);
    assert_eq!(&dst2[..], &pattern[..64]);
}

/// Between processes of one device a sender vouches for the ICRC of what
/// it built, and its receiver then skips checking it; a datagram that
/// fault injection corrupted is never vouched for, also when it leaves
/// after the faults were turned off.
#[test]
fn a_datagram_corrupted_by_fault_injection_fails_its_receivers_icrc_check() {
    let d = Daemon::start("icrc", "rxe0=127.0.21.21", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    // ACK timeout 14 (67 ms), 7 retries: a corrupted SEND is sent again.
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    let pattern = pattern(256, 3);
    let mut src = pattern.clone();
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 512];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    let send = |id: u64, at: u64| {
        b.qp.post_recv(RecvWr {
            wr_id: id,
            sg_list: vec![bmr.sge(at, 256)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(id, SendOp::Send, vec![amr.sge(0, 256)]))
            .unwrap();
    };
    let done = |id: u64| {
        let wc = a.cq.wait(1, WAIT).unwrap();
        assert_eq!((wc[0].wr_id, wc[0].status), (id, WcStatus::Success));
        let wc = b.cq.wait(1, WAIT).unwrap();
        assert_eq!((wc[0].wr_id, wc[0].status), (id, WcStatus::Success));
    };
    send(1, 0);
    done(1);
    assert_eq!(b.dev.counters().rcvd_icrc_err, 0);
    // Every datagram corrupted and held back for 5 s; then the faults are
    // turned off and the held SEND leaves at once, corrupted: B drops it
    // and counts it, A sends it again and it arrives whole.
    let f = ask("FAULT rxe0 corrupt=1 delay_ns=5000000000 seed=9");
    assert!(f.contains("2 of 2 processes applied it"), "{f}");
    send(2, 256);
    std::thread::sleep(Duration::from_millis(20));
    let f = ask("FAULT rxe0 seed=9");
    assert!(f.contains("2 of 2 processes applied it"), "{f}");
    done(2);
    let cb = b.dev.counters();
    assert_eq!(cb.rcvd_icrc_err, 1, "{cb:?}");
    assert!(a.dev.counters().completer_retry_err >= 1);
    drop(bmr);
    assert_eq!(&dst[..256], &pattern[..]);
    assert_eq!(&dst[256..], &pattern[..]);
}

#[test]
fn trace_explains_packets_and_state_changes_and_writes_a_valid_pcap() {
    let d = Daemon::start("trace", "rxe0=127.0.21.7", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    let pcap = d.path.with_file_name("trace.pcap");
    let tracer = explained_trace(&d.path, &pcap, 4);
    // The daemon sent "TRACE on" to both processes before this STAT, on
    // the same connections: once they have answered, they are tracing.
    let _ = emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    // 300 bytes: payloads the sender's engine leaves in its MR
    // (`Engine::defer_gather`); the trace shows them all the same.
    let pattern: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut buf = pattern.clone();
    let amr = a.pd.reg_mr(&mut buf, ALL).unwrap();
    let mut bbuf = vec![0u8; 600];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    for i in 0..2 {
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![bmr.sge(300 * i, 300)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(i, SendOp::Send, vec![amr.sge(0, 300)]))
            .unwrap();
        assert_eq!(a.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
        let _ = b.cq.wait(1, WAIT).unwrap();
    }
    drop(bmr);
    assert_eq!(&bbuf[..300], &pattern[..]);
    assert_eq!(&bbuf[300..], &pattern[..]);
    let (n, out) = tracer.join().unwrap();
    assert_eq!(n, 4, "{out}");
    assert!(out.contains("Init -> Rtr (modify_qp)"), "{out}");
    assert!(out.contains("RC SEND_ONLY psn"), "{out}");
    assert!(out.contains("RC ACK → qp"), "{out}");
    let bytes = std::fs::read(&pcap).unwrap();
    let r = emulator_daemon::pcap_check::check(&bytes).unwrap();
    assert!(r.passed() && r.roce == 4, "{}", r.render());
    let sends = bytes.windows(300).filter(|w| *w == &pattern[..]).count();
    assert_eq!(sends, 2, "the SENDs' payloads in the capture");
    // An independent decoder reads the trace's pcap as the same packets.
    match Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .args(["-T", "fields", "-e", "infiniband.bth.opcode"])
        .output()
    {
        Ok(o) => {
            let ops = String::from_utf8_lossy(&o.stdout).to_string();
            let ops: Vec<&str> = ops.lines().collect();
            // SEND_ONLY (4) and ACKNOWLEDGE (17), twice each.
            assert_eq!(ops.iter().filter(|l| **l == "4").count(), 2, "{ops:?}");
            assert_eq!(ops.iter().filter(|l| **l == "17").count(), 2, "{ops:?}");
        }
        Err(_) => assert!(
            std::env::var_os("CI").is_none(),
            "tshark is not installed; CI must install it"
        ),
    }
}

/// `rxe-emu trace --explain --pcap PCAP rxe0` for `count` packets, in a
/// thread; returns once it is tracing. The thread's result is the number
/// of packets shown and what it printed.
fn explained_trace(path: &Path, pcap: &Path, count: usize) -> JoinHandle<(usize, String)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (path, pcap) = (path.to_path_buf(), pcap.to_path_buf());
    let tracer = std::thread::spawn(move || {
        let mut out = Vec::new();
        let w = wire::pcap::PcapWriter::new(std::fs::File::create(&pcap).unwrap()).unwrap();
        let opts = emulator_daemon::trace::TraceOptions {
            explain: true,
            count: Some(count),
        };
        let n = emulator_daemon::trace::run(&path, "rxe0", &opts, Some(w), &mut out, || {
            tx.send(()).unwrap()
        })
        .unwrap();
        (n, String::from_utf8(out).unwrap())
    });
    rx.recv_timeout(WAIT).unwrap();
    tracer
}

/// A burst of traffic while traced sends the daemon many trace lines at
/// once; the daemon must take them as trace, not as an overlong request
/// (it used to drop a client whose unread lines passed 4 KiB, which failed
/// its device with DEVICE_FATAL and flushed its work).
/// `rxe-emu trace rxe0` for `count` packets, in a thread; returns once it
/// is tracing. The thread's result is the number of packets it saw.
fn start_tracer(path: &Path, count: usize) -> JoinHandle<usize> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    let tracer = std::thread::spawn(move || {
        let mut out = Vec::new();
        let opts = emulator_daemon::trace::TraceOptions {
            explain: false,
            count: Some(count),
        };
        emulator_daemon::trace::run(&path, "rxe0", &opts, None, &mut out, || {
            tx.send(()).unwrap()
        })
        .unwrap()
    });
    rx.recv_timeout(WAIT).unwrap();
    tracer
}

#[test]
fn a_traced_burst_keeps_the_device_alive() {
    let d = Daemon::start("trace-burst", "rxe0=127.0.21.22", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    let tracer = start_tracer(&d.path, 400);
    let _ = emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    let mut src = vec![7u8; 64];
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 64 * 300];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    // Five bursts of 60 WRITEs (the send queue holds 64).
    for round in 0..5u64 {
        for i in round * 60..round * 60 + 60 {
            a.qp.post_send(SendWr::new(
                i,
                SendOp::RdmaWrite {
                    remote_addr: bmr.addr() + i * 64,
                    rkey: bmr.rkey(),
                },
                vec![amr.sge(0, 64)],
            ))
            .unwrap();
        }
        let wcs = a.cq.wait(60, WAIT).unwrap();
        assert!(
            wcs.iter().all(|w| w.status == WcStatus::Success),
            "{:?}",
            wcs.iter().find(|w| w.status != WcStatus::Success)
        );
    }
    assert_eq!(tracer.join().unwrap(), 400);
    // Both processes are still on the device.
    let status = emulator_daemon::client::request(&d.path, "STATUS").unwrap();
    assert!(status.contains("slots 2/"), "{status}");
    drop(bmr);
    assert!(dst.iter().all(|&x| x == 7));
}

/// A traced process reports each packet whole, in hex: a 4 KiB packet
/// makes a line of more than 8 KiB, which the daemon must take (it once
/// dropped the process for any line over 4 KiB, failing its device: MPI
/// over UCX under `rxe-emu trace` saw every QP flushed).
#[test]
fn tracing_full_size_packets_keeps_the_device_alive() {
    let d = Daemon::start("trace-big", "rxe0=127.0.21.15", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    let tracer = start_tracer(&d.path, 16);
    let _ = emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    // Path MTU 4096: packets of 4 KiB.
    connect_mtu(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0, Mtu::M4096);
    connect_mtu(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0, Mtu::M4096);
    let mut src: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 65536];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    a.qp.post_send(SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: bmr.addr(),
            rkey: bmr.rkey(),
        },
        vec![amr.sge(0, 65536)],
    ))
    .unwrap();
    let wcs = a.cq.wait(1, WAIT).unwrap();
    assert_eq!(wcs[0].status, WcStatus::Success, "{:?}", wcs[0]);
    assert_eq!(tracer.join().unwrap(), 16);
    let status = emulator_daemon::client::request(&d.path, "STATUS").unwrap();
    assert!(status.contains("slots 2/"), "{status}");
    drop(bmr);
    drop(amr);
    assert_eq!(dst, src);
}

#[test]
fn a_completion_channel_on_a_daemon_device_wakes_epoll() {
    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
    use std::os::fd::AsFd;

    let d = Daemon::start("chan", "rxe0=127.0.21.14", 8);
    let a = side(d.open(), QpType::Rc);
    let dev_b = d.open();
    let pd = dev_b.alloc_pd().unwrap();
    let chan = dev_b.create_comp_channel().unwrap();
    let cq = dev_b.create_cq_with_channel(64, &chan).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq, None, cap, false)
        .unwrap();
    let b = Side {
        dev: dev_b,
        pd,
        cq,
        qp,
    };
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    let mut rbuf = vec![0u8; 64];
    let rmr = b.pd.reg_mr(&mut rbuf, ALL).unwrap();
    let mut sbuf = vec![7u8; 64];
    let smr = a.pd.reg_mr(&mut sbuf, ALL).unwrap();
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
    epoll
        .add(chan.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 7))
        .unwrap();
    let mut events = [EpollEvent::empty(); 4];
    for round in 0..3u64 {
        b.qp.post_recv(RecvWr {
            wr_id: round,
            sg_list: vec![rmr.sge(0, 64)],
        })
        .unwrap();
        b.cq.req_notify(false).unwrap();
        assert!(b.cq.poll(1).unwrap().is_empty());
        // B now sleeps in epoll; only its device's progress thread can
        // receive A's SEND from the slot socket. Give that thread time to
        // go to sleep too, so A's SEND has to kick it.
        std::thread::sleep(Duration::from_millis(20));
        a.qp.post_send(SendWr::new(round, SendOp::Send, vec![smr.sge(0, 64)]))
            .unwrap();
        let n = epoll
            .wait(&mut events, EpollTimeout::try_from(WAIT).unwrap())
            .unwrap();
        assert_eq!(n, 1, "no completion event in round {round}");
        assert_eq!(chan.get_cq_event().unwrap(), Some(b.cq.id()));
        b.cq.ack_events(1);
        let wc = b.cq.poll(4).unwrap();
        assert_eq!(
            wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(round, WcStatus::Success)]
        );
        assert_eq!(a.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    }
    // `rxe-emu stat` says who woke whom: A's SENDs kicked B's sleeping
    // progress thread through its inbox, and each kick ended one of its
    // waits.
    let stat = emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    let kicks = stat_value(&stat, "inbox_kicks");
    assert!(kicks >= 1, "{stat}");
    assert!(stat_value(&stat, "progress_wakeups") >= kicks, "{stat}");
    stat_value(&stat, "wake_requests");
}

/// `NAME N` from the STAT reply's line of slot `slot` (one process).
fn slot_stat_value(stat: &str, slot: u32, name: &str) -> u64 {
    stat_value(slot_line(stat, slot), name)
}

/// `slot`'s line of a STAT reply.
fn slot_line(stat: &str, slot: u32) -> &str {
    stat.lines()
        .find(|l| l.trim_start().starts_with(&format!("slot {slot} ")))
        .unwrap_or_else(|| panic!("no slot {slot} in {stat}"))
}

#[test]
fn a_write_to_a_process_that_stopped_polling_is_placed_after_a_kick_of_its_inbox() {
    let d = Daemon::start("left", "rxe0=127.0.21.16", 8);
    let (a, b) = rc_pair(&d);
    let (a_slot, b_slot) = (a.qp.qpn() >> 16, b.qp.qpn() >> 16);
    // A: 2048 bytes to WRITE, then 64 that receive B's SEND. At path MTU
    // 1024 the WRITE is two packets: a sender places only a WRITE ONLY's
    // payload itself (see the next test), so B's device must place this.
    const W: usize = 2048;
    let mut src = vec![0u8; W + 64];
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; W];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    let stat = |path: &Path| emulator_daemon::client::request(path, "STAT rxe0").unwrap();
    // A round is clean when nothing else woke B's progress thread in it
    // (on a loaded machine B's polls may be more than its grace apart,
    // and its post then wakes the thread to look at a new timer): one
    // clean round in twenty is required (with two CPU hogs on the 2-CPU
    // VM, about one round in four was clean).
    let mut last = String::new();
    let mut rounds = Vec::new();
    for round in 1..=20u8 {
        amr.write(0, &[round; W]).unwrap();
        a.qp.post_recv(RecvWr {
            wr_id: 1,
            sg_list: vec![amr.sge(W as u64, 64)],
        })
        .unwrap();
        // B polls (an empty CQ) before, while and after the daemon asks
        // for the counters: B's progress thread, woken to answer, finds B
        // polling and keeps off the CPU, watching only for kicks and the
        // daemon (B's last poll of the previous round said it may stop).
        let poll_for = |d: Duration| {
            let t = Instant::now();
            while t.elapsed() < d {
                assert!(b.cq.poll(1).unwrap().is_empty());
            }
        };
        poll_for(Duration::from_millis(1));
        let path = d.path.clone();
        let asking = std::thread::spawn(move || stat(&path));
        while !asking.is_finished() {
            assert!(b.cq.poll(1).unwrap().is_empty());
        }
        let before = asking.join().unwrap();
        poll_for(Duration::from_millis(1));
        // B polls on until its SEND completes: its QP then has nothing
        // outstanding, so B may stop polling, and it does (it watches
        // memory, as ib_write_lat does). That poll wakes nobody (it used
        // to wake the progress thread): it asks senders to kick B's inbox
        // instead.
        b.qp.post_send(SendWr::new(2, SendOp::Send, vec![bmr.sge(0, 64)]))
            .unwrap();
        assert_eq!(b.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
        a.qp.post_send(SendWr::new(
            3,
            SendOp::RdmaWrite {
                remote_addr: bmr.addr(),
                rkey: bmr.rkey(),
            },
            vec![amr.sge(0, W as u32)],
        ))
        .unwrap();
        // Only B's progress thread can place the WRITE: B makes no call
        // that drives its device (reading the region only takes its lock).
        let start = Instant::now();
        let mut seen = [0u8; W];
        while seen != [round; W] {
            assert!(start.elapsed() < WAIT, "the WRITE was never placed");
            bmr.read(0, &mut seen).unwrap();
            std::thread::sleep(Duration::from_micros(100));
        }
        let wcs = a.cq.wait(2, WAIT).unwrap();
        assert!(
            wcs.len() == 2 && wcs.iter().all(|w| w.status == WcStatus::Success),
            "{wcs:?}"
        );
        last = stat(&d.path);
        let b_woken = slot_stat_value(&last, b_slot, "wake_requests")
            - slot_stat_value(&before, b_slot, "wake_requests");
        let a_kicked = slot_stat_value(&last, a_slot, "inbox_kicks")
            - slot_stat_value(&before, a_slot, "inbox_kicks");
        if b_woken == 0 && a_kicked > 0 {
            return;
        }
        rounds.push((b_woken, a_kicked));
    }
    panic!(
        "in no round did B's poll leave its progress thread asleep and A's WRITE kick it \
         (B's wake requests, A's kicks per round: {rounds:?})\n{last}"
    );
}

#[test]
fn a_write_only_to_another_slot_of_the_device_is_placed_by_its_sender() {
    let d = Daemon::start("place", "rxe0=127.0.21.17", 8);
    let (a, b) = rc_pair(&d);
    let (a_slot, b_slot) = (a.qp.qpn() >> 16, b.qp.qpn() >> 16);
    let pattern = pattern(4096, 9);
    let mut src = pattern.clone();
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 4096];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    let placed = |stat: &str| slot_stat_value(stat, a_slot, "placed_writes");
    let base = bmr.addr();
    let write = |id: u64, at: u64, len: u32, rkey: u32| {
        a.qp.post_send(SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: base + at,
                rkey,
            },
            vec![amr.sge(at, len)],
        ))
        .unwrap();
        let wc = a.cq.wait(1, WAIT).unwrap();
        assert_eq!(wc[0].wr_id, id);
        wc[0].status
    };
    // One WRITE at a time, each acknowledged before the next: B's
    // responder has published its next PSN before A sees the ACK, so each
    // WRITE ONLY is placed by A (the counter says so), and checked and
    // acknowledged by B's engine, which does not copy it again.
    let before = ask("STAT rxe0");
    for i in 0..16u64 {
        assert_eq!(write(i, i * 64, 64, bmr.rkey()), WcStatus::Success);
    }
    // Two packets (path MTU 1024): not a WRITE ONLY, B places it.
    assert_eq!(write(16, 1024, 2048, bmr.rkey()), WcStatus::Success);
    let after = ask("STAT rxe0");
    assert_eq!(placed(&after) - placed(&before), 16, "{after}");
    assert_eq!(slot_stat_value(&after, b_slot, "placed_refused"), 0);
    let mut got = vec![0u8; 4096];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(&got[..1024], &pattern[..1024]);
    assert_eq!(&got[1024..3072], &pattern[1024..3072]);

    // Under fault injection a packet may be dropped, duplicated or held
    // back after it left: nothing is placed.
    assert!(ask("FAULT rxe0 delay_ns=1000 seed=1").contains("2 of 2 processes applied it"));
    assert_eq!(write(20, 3072, 64, bmr.rkey()), WcStatus::Success);
    assert!(ask("FAULT rxe0 seed=1").contains("2 of 2 processes applied it"));
    let faulted = ask("STAT rxe0");
    assert_eq!(placed(&faulted), placed(&after), "{faulted}");
    assert_eq!(write(21, 3136, 64, bmr.rkey()), WcStatus::Success);
    assert_eq!(placed(&ask("STAT rxe0")), placed(&after) + 1);

    // B deregisters its MR: A's next WRITE with that key fails at B's
    // responder and nothing is written into what was B's MR.
    let rkey = bmr.rkey();
    drop(bmr);
    let untouched = dst.clone();
    assert_eq!(write(30, 0, 64, rkey), WcStatus::RemAccessErr);
    assert_eq!(dst, untouched);
    assert_eq!(placed(&ask("STAT rxe0")), placed(&after) + 1);
}

/// A sender places only packets of the last work request posted
/// (`Transmit::last_posted`; in a stream, the receiver's copies then run
/// beside the sender's work), and a list posted at once
/// (`QueuePair::post_send_list`, `ibv_post_send`'s chain) is queued whole
/// before its packets leave. A WRITE ONLY posted alone is placed by A; at
/// the head of a list, with another WRITE behind it, it is not: B's
/// engine writes it. (The WRITE behind it could be placed only if B took
/// the first one before A pushed the second: at most 1 per list.)
#[test]
fn a_sender_places_no_write_that_has_work_posted_behind_it() {
    let d = Daemon::start("lastposted", "rxe0=127.0.21.27", 8);
    let (a, b) = rc_pair(&d);
    let a_slot = a.qp.qpn() >> 16;
    let want = pattern(4096, 3);
    let mut src = want.clone();
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 4096];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    let placed = || {
        let s = emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
        slot_stat_value(&s, a_slot, "placed_writes")
    };
    let write = |id: u64, at: u64| {
        SendWr::new(
            id,
            SendOp::RdmaWrite {
                remote_addr: bmr.addr() + at,
                rkey: bmr.rkey(),
            },
            vec![amr.sge(at, 64)],
        )
    };
    let mut rounds = Vec::new();
    for r in 0..8u64 {
        let at = r * 192;
        let before = placed();
        a.qp.post_send(write(3 * r, at)).unwrap();
        let wc = a.cq.wait(1, WAIT).unwrap();
        assert_eq!(wc[0].status, WcStatus::Success);
        let alone = placed() - before;
        let before = placed();
        a.qp.post_send_list([write(3 * r + 1, at + 64), write(3 * r + 2, at + 128)])
            .unwrap();
        let wcs = a.cq.wait(2, WAIT).unwrap();
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            [
                (3 * r + 1, WcStatus::Success),
                (3 * r + 2, WcStatus::Success)
            ]
        );
        rounds.push((alone, placed() - before));
    }
    let mut got = vec![0u8; 8 * 192];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(got, want[..8 * 192]);
    // (alone, listed) per round.
    assert!(rounds.iter().any(|&(alone, _)| alone == 1), "{rounds:?}");
    assert!(rounds.iter().all(|&(_, listed)| listed <= 1), "{rounds:?}");
    assert!(rounds.iter().any(|&(_, listed)| listed == 0), "{rounds:?}");
}

/// A connected QP that goes to RTR with a QP of another process of its
/// device opens that process's inbox then (`Inner::warm_path`, which also
/// faults in the rings' first pages), not at its first message: each
/// side's `peer_inboxes` counts it before anything is sent, and the
/// messages that follow go through it and open nothing more.
#[test]
fn rtr_with_a_qp_of_another_process_opens_its_inbox_before_the_first_message() {
    let d = Daemon::start("warm", "rxe0=127.0.21.26", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    let (a_slot, b_slot) = (a.qp.qpn() >> 16, b.qp.qpn() >> 16);
    let stat = || emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    let inboxes = |s: &str| {
        (
            slot_stat_value(s, a_slot, "peer_inboxes"),
            slot_stat_value(s, b_slot, "peer_inboxes"),
        )
    };
    let s = stat();
    assert_eq!(inboxes(&s), (0, 0), "{s}");
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0);
    let s = stat();
    assert_eq!(inboxes(&s), (1, 0), "{s}");
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    let s = stat();
    assert_eq!(inboxes(&s), (1, 1), "{s}");
    send_each(&a, &b, 3);
    send_each(&b, &a, 3);
    let s = stat();
    assert_eq!(inboxes(&s), (1, 1), "{s}");
    for slot in [a_slot, b_slot] {
        assert!(slot_stat_value(&s, slot, "sent_inbox_pkts") >= 6, "{s}");
        assert_eq!(slot_stat_value(&s, slot, "sent_udp_pkts"), 0, "{s}");
        // How it writes placements is each process's word, not summed.
        let line = slot_line(&s, slot);
        assert!(
            ["proc_mem", "process_vm_writev", "timing", "shared_memory"]
                .iter()
                .any(|w| line.contains(&format!(" placed_via {w}"))),
            "{s}"
        );
    }
    assert!(!s.lines().next().unwrap().contains("placed_via"), "{s}");
}

/// B has a receive posted (so no poll tells its device it may stop
/// polling) and polls an empty CQ long enough for its progress thread to
/// look only every 16-20 ms; then it stops, without arming the CQ, and A
/// sends to it `pause` later. Returns A's kicks of B's inbox per round.
fn kicks_of_a_process_that_stopped_polling(tag: &str, ip: &str, pause: Duration) -> Vec<u64> {
    let d = Daemon::start(tag, &format!("rxe0={ip}"), 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    // A retransmits only after about a second (timeout 18): a kick that
    // came with a retransmission would hide a missing later kick.
    connect(&a, b.qp.qpn(), b.dev.gid(), 18, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 18, 7, 0);
    let a_slot = a.qp.qpn() >> 16;
    let mut src = vec![5u8; 64];
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 64];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    let stat = || emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    let mut rounds = Vec::new();
    for round in 0..3 {
        b.qp.post_recv(RecvWr {
            wr_id: round,
            sg_list: vec![bmr.sge(0, 64)],
        })
        .unwrap();
        // The counters are read while B polls (the daemon's question
        // wakes B's progress thread, which then finds B polling and goes
        // back to its long look-again interval).
        let poll_for = |d: Duration| {
            let t = Instant::now();
            while t.elapsed() < d {
                assert!(b.cq.poll(1).unwrap().is_empty());
            }
        };
        poll_for(Duration::from_millis(40));
        let path = d.path.clone();
        let asking = std::thread::spawn(move || {
            emulator_daemon::client::request(&path, "STAT rxe0").unwrap()
        });
        while !asking.is_finished() {
            assert!(b.cq.poll(1).unwrap().is_empty());
        }
        let before = asking.join().unwrap();
        poll_for(Duration::from_millis(1));
        std::thread::sleep(pause);
        a.qp.post_send(SendWr::new(round, SendOp::Send, vec![amr.sge(0, 64)]))
            .unwrap();
        let wcs = a.cq.wait(1, WAIT).unwrap();
        assert_eq!(wcs[0].status, WcStatus::Success);
        let kicks = slot_stat_value(&stat(), a_slot, "inbox_kicks")
            - slot_stat_value(&before, a_slot, "inbox_kicks");
        let got = b.cq.wait(1, WAIT).unwrap();
        assert_eq!(got[0].status, WcStatus::Success);
        rounds.push(kicks);
    }
    rounds
}

#[test]
fn a_sender_kicks_a_process_whose_application_stopped_polling_with_work_outstanding() {
    // Each SEND kicks B: its progress thread either sleeps (it found B no
    // longer polling) or, still away for its long look-again interval,
    // is kicked because B's last poll is older than POLL_STALE. Without
    // that rule the latter SENDs drew no kick and waited for the thread's
    // next look, up to MAX_SPIN_WAIT later (2 of 3 rounds in one run).
    let rounds =
        kicks_of_a_process_that_stopped_polling("stale", "127.0.21.19", Duration::from_millis(3));
    assert!(
        rounds.iter().all(|&k| k > 0),
        "SENDs to B, which had stopped polling, that kicked it (per round): {rounds:?}"
    );
}

#[test]
fn a_sender_kicks_later_a_process_whose_application_stopped_polling_just_after_its_last_poll() {
    // A sends right after B's last poll: no kick then. A, waiting for the
    // acknowledgement, kicks B once B's last poll is older than
    // POLL_STALE (`LocalLink::rekick`), as one thread driving two devices
    // (rdma-core's tests) needs. Without it, no round kicked. On a loaded
    // machine (the whole suite in parallel on 2 CPUs) B's progress thread
    // may look on its own first, A being off its CPU for B's 20 ms look
    // interval: one round kicked of three is enough.
    let rounds = kicks_of_a_process_that_stopped_polling("rekick", "127.0.21.20", Duration::ZERO);
    assert!(
        rounds.iter().any(|&k| k > 0),
        "SENDs to B that kicked it later (per round): {rounds:?}"
    );
}

#[test]
fn posts_of_an_application_that_is_active_do_not_wake_its_progress_thread() {
    let d = Daemon::start("tick", "rxe0=127.0.21.18", 8);
    let (a, b) = rc_pair(&d);
    let b_slot = b.qp.qpn() >> 16;
    let mut src = vec![7u8; 64];
    let bmr = b.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 64];
    let amr = a.pd.reg_mr(&mut dst, ALL).unwrap();
    let stat = || emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    let write = || {
        b.qp.post_send(SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: amr.addr(),
                rkey: amr.rkey(),
            },
            vec![bmr.sge(0, 64)],
        ))
        .unwrap();
        // Polled, not waited for on a channel: B's application stays
        // active, and its last poll says it may stop polling.
        let start = Instant::now();
        loop {
            let wc = b.cq.poll(1).unwrap();
            if let Some(w) = wc.first() {
                assert_eq!(w.status, WcStatus::Success);
                break;
            }
            assert!(start.elapsed() < WAIT);
        }
    };
    let wakes = || slot_stat_value(&stat(), b_slot, "wake_requests");
    let mut last = Instant::now();
    write();
    let mut before = wakes();
    // Each post arms a retransmission timer (67 ms) while B's progress
    // thread sleeps (B not polling: the STAT and the pause between posts
    // wake it and let it find B in no poll); it sleeps at most APP_TICK
    // (10 ms) after B's last post, so no post that follows the one before
    // within that needs to wake it (without APP_TICK, 11-22 of 40 did). A
    // post after a longer gap (the test thread preempted on a loaded
    // machine) finds the thread in a long sleep and may wake it: such
    // posts are not counted, and the loop goes on until 40 posts came
    // within 8 ms of the one before (on this 2-CPU VM with six spinning
    // shells: 0 wakes, 29-153 posts not counted).
    let (mut tight, mut loose, mut woken) = (0, 0, 0);
    while tight < 40 {
        assert!(
            tight + loose < 1000,
            "only {tight} of {} posts came within 8 ms of the one before: too loaded to tell",
            tight + loose
        );
        std::thread::sleep(Duration::from_millis(2));
        let now = Instant::now();
        let close = now - last < Duration::from_millis(8);
        last = now;
        write();
        let after = wakes();
        if close {
            tight += 1;
            woken += after - before;
        } else {
            loose += 1;
        }
        before = after;
    }
    assert!(
        woken < 3,
        "{woken} wake requests in {tight} posts within 8 ms of the one before"
    );
}

#[test]
fn a_daemon_that_serves_other_users_lets_no_process_place_into_another() {
    // Another user's process could write the placement tables of the
    // device's inboxes, and steer a sender's write: no placement at all.
    let d = Daemon::start_for("anyplace", "rxe0=127.0.21.23", 8, true);
    let (a, b) = rc_pair(&d);
    let mut src = vec![5u8; 64];
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 64];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    for i in 0..4 {
        a.qp.post_send(SendWr::new(
            i,
            SendOp::RdmaWrite {
                remote_addr: bmr.addr(),
                rkey: bmr.rkey(),
            },
            vec![amr.sge(0, 64)],
        ))
        .unwrap();
        assert_eq!(a.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    }
    let stat = emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    assert_eq!(stat_value(&stat, "placed_writes"), 0, "{stat}");
    assert_eq!(stat_value(&stat, "sent_inbox_pkts"), 8, "{stat}");
    let mut got = [0u8; 64];
    bmr.read(0, &mut got).unwrap();
    assert_eq!(got, [5u8; 64]);
}

/// The IPv4-mapped GID of `ip`.
fn gid_of(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// `n` SENDs of 1 KiB from `a` to `b`, one at a time; every one succeeds.
fn send_each(a: &Side, b: &Side, n: u64) {
    let mut src = vec![3u8; 1024];
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; 1024];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    for i in 0..n {
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sg_list: vec![bmr.sge(0, 1024)],
        })
        .unwrap();
        a.qp.post_send(SendWr::new(i, SendOp::Send, vec![amr.sge(0, 1024)]))
            .unwrap();
        assert_eq!(a.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
        assert_eq!(b.cq.wait(1, WAIT).unwrap()[0].status, WcStatus::Success);
    }
}

/// Two devices of one daemon (so every datagram between them goes by UDP
/// through the host's stack, with its IP TOS), `like` each; a QP on each,
/// connected; `rxe-emu fault rxe0 --ce 100%`; 20 SENDs from rxe0 to rxe1.
/// Returns the daemon, both sides and rxe1's STAT after the SENDs.
fn ce_marked_sends(tag: &str, ips: [[u8; 4]; 2], like: &str) -> (Daemon, Side, Side, String) {
    let ip = |i: [u8; 4]| format!("{}.{}.{}.{}", i[0], i[1], i[2], i[3]);
    let d = Daemon::start(tag, &format!("rxe0={}{like}", ip(ips[0])), 4);
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    let added = ask(&format!("LINK ADD rxe1={}{like}", ip(ips[1])));
    assert!(added.starts_with("OK link rxe1/1"), "{added}");
    let a = side(d.open(), QpType::Rc);
    let b = side(
        Device::open_daemon("rxe1", Some(&d.path)).unwrap(),
        QpType::Rc,
    );
    assert_eq!(b.dev.gid(), gid_of(ips[1]));
    connect(&a, b.qp.qpn(), b.dev.gid(), 14, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    if like.contains("mlx5") {
        // No rate increase during the test (the timer's period is 1 s, the
        // byte counter is off), so what DCQCN cut stays cut.
        let f = ask("CC SET rxe0 rpg_time_reset=1000000 rpg_byte_reset=0");
        assert!(f.contains("1 of 1 processes applied it"), "{f}");
    }
    let f = ask("FAULT rxe0 ce=1 seed=4");
    assert!(f.contains("1 of 1 processes applied it"), "{f}");
    send_each(&a, &b, 20);
    let stat = ask("STAT rxe1");
    (d, a, b, stat)
}

#[test]
fn a_connectx_like_device_answers_ce_marks_with_cnps_and_dcqcn_slows_the_sender() {
    let line = 100_000 * 1_000_000u64; // the default line rate, bit/s
    let (d, a, b, stat1) = ce_marked_sends("cnp", [[127, 0, 25, 1], [127, 0, 25, 2]], ",like=mlx5");
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    let show = ask("LINK SHOW");
    assert!(show.lines().all(|l| l.contains(" like mlx5 ")), "{show}");
    // Every SEND left ECT(0), was marked CE on the way, and arrived so by
    // UDP (IP_RECVTOS): the receiver counted each and answered with CNPs
    // (at most one per 4 µs per QP), which the sender handled.
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    assert!(cb.np_ecn_marked_roce_packets >= 20, "{cb:?}");
    assert!(cb.np_cnp_sent >= 1, "{cb:?}");
    assert!(
        ca.rp_cnp_handled >= 1 && ca.rp_cnp_handled <= cb.np_cnp_sent,
        "{ca:?} {cb:?}"
    );
    assert_eq!(ca.rp_cnp_ignored, 0, "{ca:?}");
    // The same numbers through `rxe-emu stat` (the daemon asks the
    // processes), and fault injection says what it marked.
    assert_eq!(
        stat_value(&stat1, "np_ecn_marked_roce_packets"),
        cb.np_ecn_marked_roce_packets
            .min(stat_value(&stat1, "np_ecn_marked_roce_packets")),
        "{stat1}"
    );
    assert!(stat_value(&stat1, "np_cnp_sent") >= 1, "{stat1}");
    let stat0 = ask("STAT rxe0");
    assert!(stat_value(&stat0, "rp_cnp_handled") >= 1, "{stat0}");
    assert!(stat_value(&stat0, "fault_ce_marked") >= 20, "{stat0}");
    // DCQCN cut the sender's rate: the first CNP leaves it at the line
    // rate, each later one cuts it at the next decrease check (by α/2;
    // α decays between the sparse CNPs of one SEND at a time, so the cuts
    // are small), and with the increase timer and byte counter off
    // nothing raises it again.
    let cc = a.qp.cc_state().unwrap();
    assert!(cc.reacting, "{cc:?}");
    assert!(cc.current_rate_bps < line, "{cc:?}");
    assert_eq!(cc.target_rate_bps, line, "{cc:?}");
    assert_eq!((cc.timer_stage, cc.byte_stage), (0, 0), "{cc:?}");
    // `rxe-emu qp show` shows it too, for a ConnectX-like device.
    let qps = ask("QPS rxe0");
    let l = qps
        .lines()
        .find(|l| l.contains(&format!("qpn {:#x} ", a.qp.qpn())))
        .unwrap_or_else(|| panic!("{qps}"));
    let rate: f64 = l
        .split_whitespace()
        .skip_while(|w| *w != "rate_mbps")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no rate_mbps in {l}"));
    assert!(rate < 100_000.0, "{l}");
    assert!(
        l.contains("dcqcn reacting") && l.contains("target_mbps "),
        "{l}"
    );
    // The receiver sent CNPs but was never marked itself: it is not paced.
    assert!(!b.qp.cc_state().unwrap().reacting);
}

#[test]
fn a_kernel_rxe_like_device_ignores_the_same_marking() {
    let (d, a, b, stat1) = ce_marked_sends("nocnp", [[127, 0, 25, 3], [127, 0, 25, 4]], "");
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    // Its packets leave Not-ECT, so `--ce` marks none (a switch marks only
    // ECN-capable packets): no CE, no CNP, no change of rate.
    let (ca, cb) = (a.dev.counters(), b.dev.counters());
    for c in [&ca, &cb] {
        assert_eq!(
            (
                c.np_ecn_marked_roce_packets,
                c.np_cnp_sent,
                c.rp_cnp_handled,
                c.rp_cnp_ignored
            ),
            (0, 0, 0, 0),
            "{c:?}"
        );
    }
    assert_eq!(stat_value(&stat1, "np_cnp_sent"), 0, "{stat1}");
    assert_eq!(stat_value(&ask("STAT rxe0"), "fault_ce_marked"), 0);
    let cc = a.qp.cc_state().unwrap();
    assert!(!cc.reacting && cc.paced_until.is_none(), "{cc:?}");
    // No DCQCN columns in `qp show`, and nothing to set.
    let qps = ask("QPS rxe0");
    assert!(!qps.contains("rate_mbps"), "{qps}");
    assert!(ask("LINK SHOW rxe0").contains(" like rxe "));
    let refused = ask("CC SET rxe0 rpg_ai_rate=10");
    assert!(
        refused.starts_with("ERR device rxe0 is kernel-rxe-like"),
        "{refused}"
    );
}

#[test]
fn cc_set_reaches_every_process_and_later_ones_and_refuses_nonsense() {
    let d = Daemon::start("ccset", "rxe0=127.0.25.5,like=mlx5", 8);
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    let (a, b) = (d.open(), d.open());
    for dev in [&a, &b] {
        assert_eq!(dev.cc_config().model, verbs_api::CcModel::Mlx5Like);
        assert_eq!(dev.cc_config().params, verbs_api::CcParams::default());
    }
    let show = ask("CC SHOW rxe0");
    assert!(show.starts_with("link rxe0/1 like mlx5"), "{show}");
    for spec in verbs_api::CcParams::specs() {
        let l = show
            .lines()
            .find(|l| l.split_whitespace().next() == Some(spec.name))
            .unwrap_or_else(|| panic!("{} missing: {show}", spec.name));
        assert!(l.contains(spec.what), "{l}");
    }
    let f = ask("CC SET rxe0 rpg_ai_rate=10 min_time_between_cnps=8");
    assert!(f.contains("2 of 2 processes applied it"), "{f}");
    assert!(f.contains("min_time_between_cnps=8 rpg_ai_rate=10"), "{f}");
    for dev in [&a, &b] {
        let p = dev.cc_config().params;
        assert_eq!((p.rpg_ai_rate, p.min_time_between_cnps), (10, 8));
    }
    // A process that opens the device later gets them with its slot.
    let c = d.open();
    assert_eq!(c.cc_config().params.rpg_ai_rate, 10);
    let show = ask("CC SHOW rxe0");
    let l = show
        .lines()
        .find(|l| l.starts_with("rpg_ai_rate "))
        .unwrap();
    assert!(l.contains(" 10 ") && l.ends_with("(set)"), "{l}");
    // Refused, and nothing of a refused request is applied.
    for (bad, why) in [
        (
            "bogus=1",
            "no congestion-control parameter is called \"bogus\"",
        ),
        ("rpg_ai_rate=20 rpg_gd=99", "rpg_gd = 99 is outside 0..=31"),
        ("rpg_ai_rate=x", "not a whole number"),
        ("rpg_ai_rate", "is not NAME=VALUE"),
        ("", "cc set needs NAME=VALUE"),
        (
            "line_rate_mbps=1000 rpg_min_rate=2000",
            "rpg_min_rate = 2000 is outside 1..=1000",
        ),
    ] {
        let r = ask(&format!("CC SET rxe0 {bad}"));
        assert!(r.starts_with("ERR ") && r.contains(why), "{bad}: {r}");
    }
    assert!(ask("CC SET rxe9 rpg_ai_rate=1").contains("ERR no device \"rxe9\""));
    for dev in [&a, &b, &c] {
        assert_eq!(dev.cc_config().params.rpg_ai_rate, 10);
        assert_eq!(dev.cc_config().params.line_rate_mbps, 100_000);
    }
    // Back to the default, everywhere.
    let f = ask("CC SET rxe0 rpg_ai_rate=default min_time_between_cnps=default");
    assert!(
        f.contains("all defaults (3 of 3 processes applied it"),
        "{f}"
    );
    for dev in [&a, &b, &c] {
        assert_eq!(dev.cc_config().params, verbs_api::CcParams::default());
    }
}

/// One datagram a QP of `dev` sends to a plain UDP socket on `peer`:4791
/// (an RC SEND to a QP nobody has), with the TOS byte its IP header had;
/// its ICRC is checked over the addresses it came with.
fn first_datagram_tos(d: &Daemon, dev: &str, peer: [u8; 4]) -> (Vec<u8>, u8) {
    use nix::sys::socket::{
        recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrIn,
    };
    let ip = std::net::Ipv4Addr::from(peer);
    let sock = UdpSocket::bind((ip, 4791)).unwrap();
    setsockopt(&sock, sockopt::IpRecvTos, &true).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let me = side(Device::open_daemon(dev, Some(&d.path)).unwrap(), QpType::Rc);
    // The device's fault reaches a new process on its control connection
    // after the slot; once it answered a later STAT, it has it.
    let _ = emulator_daemon::client::request(&d.path, &format!("STAT {dev}")).unwrap();
    connect(&me, 0x123, gid_of(peer), 14, 0, 0);
    let mut buf = vec![9u8; 64];
    let mr = me.pd.reg_mr(&mut buf, ALL).unwrap();
    me.qp
        .post_send(SendWr::new(1, SendOp::Send, vec![mr.sge(0, 64)]))
        .unwrap();
    let mut data = vec![0u8; 2048];
    let mut iov = [std::io::IoSliceMut::new(&mut data)];
    let mut cmsg = nix::cmsg_space!(u8);
    let m = recvmsg::<SockaddrIn>(
        std::os::fd::AsRawFd::as_raw_fd(&sock),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    )
    .unwrap();
    let tos = m
        .cmsgs()
        .unwrap()
        .find_map(|c| match c {
            ControlMessageOwned::Ipv4Tos(t) => Some(t),
            _ => None,
        })
        .expect("IP_RECVTOS gives the TOS of every datagram");
    let (n, from) = (m.bytes, m.address.unwrap());
    drop(mr);
    let p = data[..n].to_vec();
    let info = wire::icrc::IpUdpInfo {
        src: me.dev.addr(),
        dst: ip.into(),
        src_port: from.port(),
        dst_port: 4791,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    };
    assert!(
        wire::icrc::check(&info, &p),
        "the ICRC holds whatever the TOS"
    );
    (p, tos)
}

#[test]
fn the_tos_is_on_the_udp_datagram_ect0_or_ce_on_a_connectx_like_device_0_on_a_kernel_rxe_like_one()
{
    let d = Daemon::start("tos", "rxe0=127.0.25.6,like=mlx5", 4);
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    assert!(ask("LINK ADD rxe1=127.0.25.7").starts_with("OK"));
    let (p, tos) = first_datagram_tos(&d, "rxe0", [127, 0, 25, 8]);
    assert_eq!(p[0], 0x04, "an RC SEND_ONLY");
    assert_eq!(tos, 0b10, "DSCP 0, ECT(0)");
    // Marked by fault injection: CE (the ICRC masks the TOS byte).
    assert!(ask("FAULT rxe0 ce=1 seed=1").contains("fault on rxe0"));
    let (_, tos) = first_datagram_tos(&d, "rxe0", [127, 0, 25, 8]);
    assert_eq!(tos, 0b11, "CE");
    // Kernel-rxe-like: TOS 0 with the same fault on (it marks only ECT).
    assert!(ask("FAULT rxe1 ce=1 seed=1").contains("fault on rxe1"));
    let (p, tos) = first_datagram_tos(&d, "rxe1", [127, 0, 25, 9]);
    assert_eq!(p[0], 0x04, "an RC SEND_ONLY");
    assert_eq!(tos, 0, "Not-ECT, DSCP 0: what kernel rxe sends");
}

#[test]
fn trace_explains_ce_marks_and_cnps_and_its_pcap_carries_the_tos() {
    let d = Daemon::start("cctrace", "rxe0=127.0.25.10,like=mlx5", 8);
    let (a, b) = rc_pair(&d);
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    assert!(ask("FAULT rxe0 ce=1 seed=9").contains("2 of 2 processes applied it"));
    let pcap = d.path.with_file_name("cc.pcap");
    let tracer = explained_trace(&d.path, &pcap, 3);
    // Once both processes answered a STAT, they are tracing.
    let _ = ask("STAT rxe0");
    // One SEND (marked CE on its way out of A), its CNP and its ACK:
    // between two processes of the device, by the same-host path.
    send_each(&a, &b, 1);
    let (n, out) = tracer.join().unwrap();
    assert_eq!(n, 3, "{out}");
    assert!(
        out.contains("marked CE (congestion experienced)") && out.contains("answers with a CNP"),
        "{out}"
    );
    assert!(out.contains("CNP from 127.0.25.10 to QP"), "{out}");
    // Both processes mark: the ACK too, which draws no CNP.
    assert!(
        out.contains("an acknowledgement, so the receiver sends no CNP for it"),
        "{out}"
    );
    let r = emulator_daemon::pcap_check::check(&std::fs::read(&pcap).unwrap()).unwrap();
    assert!(r.passed() && r.roce == 3, "{}", r.render());
    assert_eq!(r.opcodes.get("CNP"), Some(&1), "{}", r.render());
    // Not-ECT (the CNP), ECT(1), ECT(0), CE (the SEND and the ACK).
    assert_eq!(r.ecn, [1, 0, 0, 2], "{}", r.render());
    assert_eq!(r.ce_data, 1, "{}", r.render());
}

#[test]
fn a_fault_queue_delays_by_its_backlog_and_marks_by_depth() {
    let d = Daemon::start("ccqueue", "rxe0=127.0.25.11,like=mlx5", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    // ACK timeout 18 (1.07 s) is far above what the queue holds back.
    connect(&a, b.qp.qpn(), b.dev.gid(), 18, 7, 0);
    connect(&b, a.qp.qpn(), a.dev.gid(), 18, 7, 0);
    let ask = |q: &str| emulator_daemon::client::request(&d.path, q).unwrap();
    // 10 Mb/s (1250 bytes per ms), marking from 4 KB, every ECT datagram
    // above 16 KB; a 1 MB buffer.
    let f = ask("FAULT rxe0 queue=10:4000:16000:1:1000000 seed=2");
    assert!(f.contains("2 of 2 processes applied it"), "{f}");
    const LEN: usize = 64 << 10;
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 13 + 1) as u8).collect();
    let mut src = pattern.clone();
    let amr = a.pd.reg_mr(&mut src, ALL).unwrap();
    let mut dst = vec![0u8; LEN];
    let bmr = b.pd.reg_mr(&mut dst, ALL).unwrap();
    let start = Instant::now();
    // 64 packets of 1 KiB at once: 67 KB on the wire queue in A's link.
    a.qp.post_send(SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: bmr.addr(),
            rkey: bmr.rkey(),
        },
        vec![amr.sge(0, LEN as u32)],
    ))
    .unwrap();
    let wc = a.cq.wait(1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    // The last packet waited for the 66 KB ahead of it at 10 Mb/s (a
    // lower bound: the queue's own delay, never a speed check).
    assert!(
        start.elapsed() >= Duration::from_millis(50),
        "{:?}",
        start.elapsed()
    );
    drop(bmr);
    assert_eq!(dst, pattern, "every byte arrived, in order");
    let stat = ask("STAT rxe0");
    // Packets that found more than 16 KB queued were all marked, and the
    // receiver counted each mark (the buffer was never full).
    let marked = stat_value(&stat, "fault_ce_marked");
    assert!(marked >= 40, "{stat}");
    assert_eq!(stat_value(&stat, "fault_queue_dropped"), 0, "{stat}");
    assert_eq!(b.dev.counters().np_ecn_marked_roce_packets, marked);
    assert!(b.dev.counters().np_cnp_sent >= 1);
    assert_eq!(a.dev.counters().completer_retry_err, 0);
    // A bad queue is refused by every process.
    let bad = ask("FAULT rxe0 queue=10:9000:8000:1:100000");
    assert!(
        bad.contains("ERR fault: queue Kmin 9000 bytes is above Kmax"),
        "{bad}"
    );
}

#[test]
fn a_completion_made_after_an_idle_poll_is_found_by_the_next_poll() {
    // An idle poll lets the next polls of that CQ skip the engine lock
    // while nobody has locked it since. A completion the engine makes on
    // its own, with nothing in the inbox (a WR flushed by a QP in ERR),
    // must still be found: every lock of the engine ends the shortcut.
    let d = Daemon::start("idlepoll", "rxe0=127.0.21.25", 8);
    let a = side(d.open(), QpType::Rc);
    connect(&a, a.qp.qpn(), a.dev.gid(), 14, 7, 0);
    a.qp.modify(
        &QpAttr {
            qp_state: Some(QpState::Err),
            ..QpAttr::default()
        },
        verbs_api::QpAttrMask::STATE,
    )
    .unwrap();
    for _ in 0..1000 {
        assert!(a.cq.poll(1).unwrap().is_empty());
    }
    let poster = {
        let qp = &a.qp;
        std::thread::scope(|s| {
            s.spawn(|| qp.post_send(SendWr::new(9, SendOp::Send, vec![])))
                .join()
                .unwrap()
        })
    };
    poster.unwrap();
    let wcs = a.cq.poll(1).unwrap();
    assert_eq!(wcs.len(), 1, "the flushed WR, at the first poll after it");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (9, WcStatus::WrFlushErr));
}

#[test]
fn a_timer_of_another_qp_fires_on_time_after_the_application_stops_polling() {
    // B's progress thread leaves the engine's timers to B's application
    // while it polls (it fires them in its polls). B's last poll says it
    // may stop polling (its SEND completed) while a WRITE on another QP
    // still waits for an acknowledgement that never comes: the thread is
    // to watch that QP's retransmission timer from then on, not only at
    // its next look at whether B still polls (200 ms later).
    let d = Daemon::start("lefttimer", "rxe0=127.0.21.28", 8);
    let (a, b) = rc_pair(&d);
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let cq2 = b.dev.create_cq(16).unwrap();
    let qp2 =
        b.pd.create_qp(QpType::Rc, &cq2, &cq2, None, cap, false)
            .unwrap();
    // Towards a QP number nobody has: no acknowledgement, and no retry
    // (retry_cnt 0) after its timeout, 4.096 µs * 2^14 = 67 ms.
    let nobody = (a.qp.qpn() + 7, a.dev.gid(), 0);
    connect_qp(&b.dev, &qp2, nobody, 14, 0, Mtu::M1024);
    let mut abuf = vec![0u8; 64];
    let amr = a.pd.reg_mr(&mut abuf, ALL).unwrap();
    let mut bbuf = vec![7u8; 64];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    a.qp.post_recv(RecvWr {
        wr_id: 1,
        sg_list: vec![amr.sge(0, 64)],
    })
    .unwrap();
    let posted = Instant::now();
    qp2.post_send(SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: amr.addr(),
            rkey: amr.rkey(),
        },
        vec![bmr.sge(0, 64)],
    ))
    .unwrap();
    // B polls its first CQ for 20 ms (its progress thread keeps off), then
    // sends and polls until the SEND completes: that QP has nothing
    // outstanding, so B may stop polling, and it does.
    while posted.elapsed() < Duration::from_millis(20) {
        assert!(b.cq.poll(1).unwrap().is_empty());
    }
    b.qp.post_send(SendWr::new(3, SendOp::Send, vec![bmr.sge(0, 64)]))
        .unwrap();
    let wc = loop {
        if let Some(wc) = b.cq.poll(1).unwrap().pop() {
            break wc;
        }
        assert!(posted.elapsed() < WAIT, "B's SEND never completed");
    };
    assert_eq!(wc.status, WcStatus::Success);
    let stopped = posted.elapsed();
    if stopped > Duration::from_millis(60) {
        // Too loaded to tell: B's polls may have fired the timer.
        eprintln!("B polled until {stopped:?} after the WRITE's post: not judged");
        return;
    }
    // The timer is due 67 ms after the post: the QP is in error well
    // before the thread's next look. Judged without a call that drives
    // B's device (reading a QP's state only takes its lock).
    std::thread::sleep(Duration::from_millis(150).saturating_sub(posted.elapsed()));
    assert_eq!(
        qp2.state(),
        QpState::Err,
        "the WRITE's retransmission timer did not fire within 150 ms of its post \
         (B stopped polling {stopped:?} after it)"
    );
    let wc = cq2.wait(1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::RetryExcErr, "{wc:?}");
    assert!(a.cq.wait(1, WAIT).unwrap()[0].status == WcStatus::Success);
}

#[test]
fn an_application_that_keeps_polling_is_not_looked_at_by_its_progress_thread() {
    // While B's application polls, B's progress thread keeps off its CPU
    // and looks whether it still polls only once it may have stopped: its
    // look timer is pushed on by the polls. Looks at fixed times came
    // every 200 ms (six in the 1.2 s below), each a context switch on the
    // CPU the application spins on.
    let d = Daemon::start("looks", "rxe0=127.0.21.29", 8);
    let (a, b) = rc_pair(&d);
    send_each(&b, &a, 1);
    let b_slot = b.qp.qpn() >> 16;
    let stat = || emulator_daemon::client::request(&d.path, "STAT rxe0").unwrap();
    let looks = || slot_stat_value(&stat(), b_slot, "progress_looks");
    // B polls an empty CQ: it waits for a completion, so it polls on.
    let poll_for = |span: Duration| {
        let start = Instant::now();
        while start.elapsed() < span {
            assert!(b.cq.poll(1).unwrap().is_empty());
        }
    };
    poll_for(Duration::from_millis(50));
    let before = looks();
    poll_for(Duration::from_millis(1200));
    // Once B stops polling, its thread looks within 200 ms of the last
    // poll and finds it gone. Nothing may wake the thread before (no STAT
    // here: one taken at the stop had the thread find B gone without a
    // look). A thread that the STAT above sent off the CPU's way returns
    // to keeping off within 1 s, while B polls.
    std::thread::sleep(Duration::from_millis(600));
    let looked = looks() - before;
    // That look, and one more for each time B's polls stopped for 100 ms
    // or more (the test thread preempted that long on a loaded machine);
    // looks at fixed times made seven.
    assert!(
        (1..=3).contains(&looked),
        "{looked} looks at B's progress in 1.2 s of polling and 600 ms after"
    );
}

/// Two QPs of `dev`'s process connected to each other.
fn loopback_pair(dev: &Device) -> (Side, Side) {
    let x = side(dev.clone(), QpType::Rc);
    let y = side(dev.clone(), QpType::Rc);
    connect(&x, y.qp.qpn(), dev.gid(), 14, 7, 0);
    connect(&y, x.qp.qpn(), dev.gid(), 14, 7, 0);
    (x, y)
}

/// Post a 64-byte WRITE from `from` (its MR `src`) into `to`, an MR of
/// the QP it is connected to.
fn post_write(from: &Side, src: &verbs_api::MemoryRegion<'_>, to: &verbs_api::MemoryRegion<'_>) {
    from.qp
        .post_send(SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: to.addr(),
                rkey: to.rkey(),
            },
            vec![src.sge(0, 64)],
        ))
        .unwrap();
}

#[test]
fn a_kick_owed_by_an_application_that_stops_polling_goes_when_due() {
    // B's application takes a completion that leaves its QP nothing to
    // do, so kicks to it wait LEFT_GRACE after that poll, while another of
    // its QPs (b) waits for A's ACK of a WRITE. A's application, polling,
    // takes that WRITE and answers it (a kick it owes B, not yet due),
    // then takes a completion that leaves its own QP idle and stops
    // polling. Nobody but A's progress thread can send that kick then:
    // B's ACK arrives within LEFT_GRACE, not at B's retransmission timer
    // (67 ms after the WRITE's post) nor at either thread's look.
    let d = Daemon::start("owed", "rxe0=127.0.21.31", 8);
    let (a, b) = rc_pair(&d);
    let (a2, a3) = loopback_pair(&a.dev);
    let (b2, b3) = loopback_pair(&b.dev);
    let mut bufs: Vec<Vec<u8>> = (0..6).map(|i| vec![i as u8; 64]).collect();
    let [ab, a2b, a3b, bb, b2b, b3b] = &mut bufs[..] else {
        unreachable!()
    };
    let amr = a.pd.reg_mr(ab, ALL).unwrap();
    let a2mr = a2.pd.reg_mr(a2b, ALL).unwrap();
    let a3mr = a3.pd.reg_mr(a3b, ALL).unwrap();
    let bmr = b.pd.reg_mr(bb, ALL).unwrap();
    let b2mr = b2.pd.reg_mr(b2b, ALL).unwrap();
    let b3mr = b3.pd.reg_mr(b3b, ALL).unwrap();
    let poll_until_one = |s: &Side| loop {
        if let Some(wc) = s.cq.poll(1).unwrap().pop() {
            assert_eq!(wc.status, WcStatus::Success);
            break;
        }
    };
    // Warm both processes' paths, then A's application polls: what B
    // sends it now draws no kick (A takes it at its next poll).
    post_write(&b2, &b2mr, &b3mr);
    poll_until_one(&b2);
    post_write(&a2, &a2mr, &a3mr);
    poll_until_one(&a2);
    assert!(a.cq.poll(1).unwrap().is_empty());
    let posted = Instant::now();
    post_write(&b, &bmr, &amr);
    let acks = b.qp.counters().rcvd_pkts;
    // B: a completion that leaves b2 idle; B may stop polling, and does.
    post_write(&b2, &b2mr, &b3mr);
    poll_until_one(&b2);
    // A: its poll takes B's WRITE and answers it; then a completion that
    // leaves a2 idle, and A stops polling.
    post_write(&a2, &a2mr, &a3mr);
    poll_until_one(&a2);
    let stopped = posted.elapsed();
    if stopped > Duration::from_millis(10) {
        eprintln!("A stopped polling {stopped:?} after B's WRITE: not judged");
        return;
    }
    // Judged without a call that drives either device (a QP's counters
    // only take its lock).
    std::thread::sleep(Duration::from_millis(50).saturating_sub(posted.elapsed()));
    assert!(
        b.qp.counters().rcvd_pkts > acks,
        "B took no ACK of its WRITE within 50 ms of its post (A stopped polling {stopped:?} after it)"
    );
    assert!(b.cq.wait(1, WAIT).unwrap()[0].status == WcStatus::Success);
}

#[test]
fn a_timer_of_an_application_that_stops_polling_without_a_completion_fires_at_the_look() {
    // B posts a WRITE that is never acknowledged (to a QP number nobody
    // has, no retry after 67 ms) and polls its CQ, empty: it waits for a
    // completion. Then it stops polling without one. Its progress thread,
    // which leaves the engine's timers to a polling application, finds it
    // gone at its look (at most 200 ms after B's last poll) and fires the
    // timer: the QP goes to error, and its completion says why.
    let d = Daemon::start("silent", "rxe0=127.0.21.30", 8);
    let a = side(d.open(), QpType::Rc);
    let b = side(d.open(), QpType::Rc);
    // Towards a QP number nobody has, on A's slot (A's process is alive:
    // its inbox takes the WRITE and its engine drops it).
    connect(&b, a.qp.qpn() + 7, a.dev.gid(), 14, 0, 0);
    let mut abuf = vec![0u8; 64];
    let amr = a.pd.reg_mr(&mut abuf, ALL).unwrap();
    let mut bbuf = vec![7u8; 64];
    let bmr = b.pd.reg_mr(&mut bbuf, ALL).unwrap();
    b.qp.post_send(SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: amr.addr(),
            rkey: amr.rkey(),
        },
        vec![bmr.sge(0, 64)],
    ))
    .unwrap();
    let posted = Instant::now();
    while posted.elapsed() < Duration::from_millis(20) {
        assert!(b.cq.poll(1).unwrap().is_empty());
    }
    let stopped = Instant::now();
    // Judged without a call that drives B's device (reading a QP's state
    // only takes its lock).
    while b.qp.state() != QpState::Err {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "B's WRITE was never timed out after B stopped polling"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let late = stopped.elapsed();
    eprintln!("B's QP in error {late:?} after B's last poll");
    let wc = b.cq.wait(1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::RetryExcErr, "{wc:?}");
}
