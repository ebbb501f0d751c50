//! The connection manager of a running daemon, through the protocol
//! librdmacm uses: event channels are real sockets, and the CM MADs go
//! over UDP/4791 to QP1 of the device (here: two "processes" on one
//! device, and one on a second device).

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use emulator_daemon::cm_client::{recv_event, CmConnection};
use emulator_daemon::cmproto::{event, CmEvent, ConnParam, Request};
use emulator_daemon::server::{Server, ServerConfig};

struct Daemon {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Daemon {
    fn start(tag: &str, devices: &[&str]) -> Daemon {
        let dir = std::env::temp_dir().join(format!("rxe-emud-cm-{}-{tag}", std::process::id()));
        let cfg = ServerConfig {
            socket_path: dir.join("rxe-emud.sock"),
            devices: devices.iter().map(|d| d.parse().unwrap()).collect(),
            slots: 4,
            any_user: false,
        };
        let path = cfg.socket_path.clone();
        let server = Server::bind(cfg, false).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        Daemon {
            path,
            stop,
            thread: Some(std::thread::spawn(move || server.run(&s2).unwrap())),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        if let Some(d) = self.path.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// One "process": a command connection and one channel.
struct Proc {
    cm: CmConnection,
    chan: u64,
    fd: OwnedFd,
}

impl Proc {
    fn new(d: &Daemon) -> Proc {
        let cm = CmConnection::connect(&d.path).unwrap();
        let (chan, fd) = cm.channel().unwrap();
        // Never wait for ever in a test.
        let tv = nix::sys::time::TimeVal::new(20, 0);
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &tv).unwrap();
        Proc { cm, chan, fd }
    }

    fn id(&self, ps: u16) -> u64 {
        let f = self
            .cm
            .request(&Request::Create {
                chan: self.chan,
                ps,
                qp_type: 2,
            })
            .unwrap();
        f.u64("id").unwrap()
    }

    fn ok(&self, r: Request) {
        self.cm.request(&r).unwrap_or_else(|e| panic!("{r:?}: {e}"));
    }

    fn event(&self) -> CmEvent {
        recv_event(self.fd.as_fd()).expect("an event within 20 s")
    }
}

fn param(qpn: u32, pd: &[u8]) -> ConnParam {
    ConnParam {
        private_data: pd.to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        qp_num: qpn,
        psn: 0xabc,
        ..ConnParam::default()
    }
}

fn resolve(p: &Proc, id: u64, dst: &str, port: u16) {
    p.ok(Request::ResolveAddr {
        id,
        src: None,
        dst: (dst.parse().unwrap(), port),
        timeout_ms: 2000,
    });
    let e = p.event();
    assert_eq!(
        (e.id, e.event, e.status),
        (id, event::ADDR_RESOLVED, 0),
        "{e:?}"
    );
    p.ok(Request::ResolveRoute {
        id,
        timeout_ms: 2000,
    });
    assert_eq!(p.event().event, event::ROUTE_RESOLVED);
}

#[test]
fn two_processes_connect_exchange_private_data_and_disconnect_over_qp1() {
    let d = Daemon::start("rc", &["rxe0=127.0.23.1"]);
    // A tracer sees the CM MADs in words and writes them to a pcap.
    let pcap_path = d.path.with_file_name("cm.pcap");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let tracer = {
        let (sock, pcap_path) = (d.path.clone(), pcap_path.clone());
        std::thread::spawn(move || {
            let f = std::fs::File::create(&pcap_path).unwrap();
            let w = wire::pcap::PcapWriter::new(f).unwrap();
            let mut out = Vec::new();
            let opts = emulator_daemon::trace::TraceOptions {
                explain: true,
                count: Some(5),
            };
            emulator_daemon::trace::run(&sock, "rxe0", &opts, Some(w), &mut out, || {
                ready_tx.send(()).unwrap()
            })
            .unwrap();
            String::from_utf8(out).unwrap()
        })
    };
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let server = Proc::new(&d);
    let client = Proc::new(&d);
    let l = server.id(0x106);
    server.ok(Request::Bind {
        id: l,
        addr: "0.0.0.0".parse().unwrap(),
        port: 7471,
    });
    server.ok(Request::Listen { id: l, backlog: 4 });
    let c = client.id(0x106);
    resolve(&client, c, "127.0.23.1", 7471);
    client.ok(Request::Connect {
        id: c,
        param: param(0x10011, b"hello"),
    });
    let req = server.event();
    assert_eq!(
        (req.event, req.listen_id),
        (event::CONNECT_REQUEST, Some(l))
    );
    assert_eq!(&req.param.as_ref().unwrap().private_data[..5], b"hello");
    assert_eq!(req.addrs.device.as_deref(), Some("rxe0"));
    server.ok(Request::Accept {
        id: req.id,
        param: param(0x20011, b"welcome"),
    });
    let rsp = client.event();
    assert_eq!(rsp.event, event::CONNECT_RESPONSE);
    let p = rsp.param.unwrap();
    assert_eq!((p.qp_num, &p.private_data[..7]), (0x20011, &b"welcome"[..]));
    client.ok(Request::Establish { id: c });
    assert_eq!(server.event().event, event::ESTABLISHED);
    client.ok(Request::Disconnect { id: c });
    assert_eq!(client.event().event, event::DISCONNECTED);
    assert_eq!(server.event().event, event::DISCONNECTED);
    let text = tracer.join().unwrap();
    for want in [
        "CM REQ (connect)",
        "rdma_cm Tcp port 7471",
        "private data 5 B \"hello\"",
        "CM REP (accept)",
        "CM RTU",
        "CM DREQ",
        "CM DREP",
    ] {
        assert!(text.contains(want), "{want:?} not in {text}");
    }
    let report = emulator_daemon::pcap_check::check(&std::fs::read(&pcap_path).unwrap()).unwrap();
    assert!(report.passed(), "{}", report.render());
    let st = emulator_daemon::client::request(&d.path, "STATUS").unwrap();
    assert!(
        st.contains("cm_mads_received 5"),
        "REQ REP RTU DREQ DREP: {st}"
    );
}

#[test]
fn a_reject_carries_private_data_and_a_dead_process_disconnects_its_peer() {
    let d = Daemon::start("rej", &["rxe0=127.0.23.2", "rxe1=127.0.23.3"]);
    let server = Proc::new(&d);
    let client = Proc::new(&d);
    let l = server.id(0x106);
    server.ok(Request::Bind {
        id: l,
        addr: "127.0.23.3".parse().unwrap(),
        port: 7472,
    });
    server.ok(Request::Listen { id: l, backlog: 4 });
    // From rxe0 to rxe1: two devices, MADs between two addresses.
    let c = client.id(0x106);
    p_resolve_from(&client, c, "127.0.23.2", "127.0.23.3", 7472);
    client.ok(Request::Connect {
        id: c,
        param: param(0x10011, b""),
    });
    let req = server.event();
    server.ok(Request::Reject {
        id: req.id,
        private_data: b"not today".to_vec(),
        reason: 0,
    });
    let e = client.event();
    assert_eq!((e.event, e.status), (event::REJECTED, 28));
    assert_eq!(&e.param.unwrap().private_data[..9], b"not today");

    // Again, accepted; then the server process dies.
    let c2 = client.id(0x106);
    p_resolve_from(&client, c2, "127.0.23.2", "127.0.23.3", 7472);
    client.ok(Request::Connect {
        id: c2,
        param: param(0x10012, b""),
    });
    let req = server.event();
    server.ok(Request::Accept {
        id: req.id,
        param: param(0x20012, b""),
    });
    assert_eq!(client.event().event, event::CONNECT_RESPONSE);
    client.ok(Request::Establish { id: c2 });
    assert_eq!(server.event().event, event::ESTABLISHED);
    drop(server);
    let e = client.event();
    assert_eq!((e.id, e.event), (c2, event::DISCONNECTED));
    // Nobody listens any more: a new REQ is rejected, not left hanging.
    let c3 = client.id(0x106);
    p_resolve_from(&client, c3, "127.0.23.2", "127.0.23.3", 7472);
    client.ok(Request::Connect {
        id: c3,
        param: param(0x10013, b""),
    });
    let e = client.event();
    assert_eq!((e.id, e.event), (c3, event::REJECTED));
    std::thread::sleep(Duration::from_millis(10));
}

fn p_resolve_from(p: &Proc, id: u64, src: &str, dst: &str, port: u16) {
    p.ok(Request::ResolveAddr {
        id,
        src: Some((src.parse().unwrap(), 0)),
        dst: (dst.parse().unwrap(), port),
        timeout_ms: 2000,
    });
    let e = p.event();
    assert_eq!(e.event, event::ADDR_RESOLVED, "{e:?}");
    assert_eq!(
        e.addrs.src.unwrap().0,
        src.parse::<std::net::IpAddr>().unwrap()
    );
    p.ok(Request::ResolveRoute {
        id,
        timeout_ms: 2000,
    });
    assert_eq!(p.event().event, event::ROUTE_RESOLVED);
}

/// A process that sends CM requests and never reads the answers cannot
/// block the daemon: it is dropped once it owes 1 MiB of answers, and
/// everybody else is served meanwhile.
#[test]
fn a_client_that_never_reads_cannot_block_the_daemon() {
    use std::io::Write;
    let d = Daemon::start("unread", &["rxe0=127.0.23.4"]);
    let mut s = std::os::unix::net::UnixStream::connect(&d.path).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"CM\n").unwrap();
    let line = "CREATE chan=999 ps=262 qp_type=2\n".repeat(1000);
    let mut dropped = false;
    for _ in 0..200 {
        if s.write_all(line.as_bytes()).is_err() {
            dropped = true;
            break;
        }
        // Another process is served meanwhile.
        let p = Proc::new(&d);
        p.id(0x106);
    }
    assert!(dropped, "the daemon kept a client that read nothing");
}
