//! The daemon survives whatever clients and the network send it, and
//! refuses clearly to run twice.

use std::io::{Read, Write};
use std::net::UdpSocket;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use emulator_daemon::client;
use emulator_daemon::server::{Server, ServerConfig};

struct Daemon {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn config(tag: &str, device: &str) -> ServerConfig {
    let dir = std::env::temp_dir().join(format!("rxe-emud-test-{}-{tag}", std::process::id()));
    ServerConfig {
        socket_path: dir.join("rxe-emud.sock"),
        devices: vec![device.parse().unwrap()],
        slots: 4,
        any_user: false,
    }
}

impl Daemon {
    fn start(tag: &str, device: &str) -> Daemon {
        let cfg = config(tag, device);
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

fn counter(status: &str, name: &str) -> u64 {
    status
        .split_whitespace()
        .skip_while(|w| *w != name)
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {status}"))
}

#[test]
fn floods_of_random_and_malformed_datagrams_are_counted_and_dropped() {
    let d = Daemon::start("flood", "rxe0=127.0.22.1");
    let s = UdpSocket::bind("127.0.22.2:0").unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sent = 0u64;
    for i in 0..3000usize {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = match i % 4 {
            0 => (x % 8) as usize, // too short for a BTH
            1 => 12 + (x % 64) as usize,
            2 => (x % 1500) as usize,
            _ => 0,
        };
        let mut dg: Vec<u8> = (0..len).map(|k| (x >> (k % 56)) as u8).collect();
        if i % 4 == 1 {
            // A plausible BTH for a QPN in a slot nobody owns (2 or 3).
            dg[5] = 2 + (i % 2) as u8;
        }
        if s.send_to(&dg, "127.0.22.1:4791").is_ok() {
            sent += 1;
        }
    }
    let start = Instant::now();
    loop {
        let st = client::request(&d.path, "STATUS").expect("the daemon still answers");
        let seen = counter(&st, "dropped_no_owner") + counter(&st, "dropped_daemon_slot");
        if seen == sent {
            assert!(counter(&st, "dropped_no_owner") > 0, "{st}");
            assert!(counter(&st, "dropped_daemon_slot") > 0, "{st}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{seen} of {sent} counted: {st}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // And it still hands out devices.
    let o = client::open(&d.path, "rxe0").unwrap();
    assert_eq!(o.info.slot, 1);
}

#[test]
fn malformed_requests_get_errors_and_the_daemon_keeps_serving() {
    let d = Daemon::start("garbage", "rxe0=127.0.22.3");
    let ask = |bytes: &[u8]| -> String {
        let mut s = UnixStream::connect(&d.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.write_all(bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    assert!(ask(b"HELLO\n").starts_with("ERR unknown request"));
    assert!(ask(b"OPEN\n").starts_with("ERR"));
    assert!(ask(b"OPEN nosuch\n").contains("no device \"nosuch\""));
    assert!(ask(&[0xff; 10000]).is_empty(), "an endless line is cut off");
    assert_eq!(ask(b""), "");
    assert!(ask(b"\x00\x01\x02\n").starts_with("ERR"));
    // Clients that connect and vanish, or open and vanish.
    for _ in 0..20 {
        drop(UnixStream::connect(&d.path).unwrap());
        drop(client::open(&d.path, "rxe0").unwrap());
    }
    let st = client::request(&d.path, "STATUS").unwrap();
    assert!(st.contains("slots 0/3"), "every slot came back: {st}");
    assert!(client::open(&d.path, "rxe0").is_ok());
}

#[test]
fn a_second_daemon_fails_clearly() {
    let d = Daemon::start("twice", "rxe0=127.0.22.4");
    // Same control socket.
    let e = Server::bind(config("twice", "rxe0=127.0.22.5"), false)
        .err()
        .expect("a second daemon on the same socket");
    assert!(e.contains("already running"), "{e}");
    // Same address, another socket.
    let e = Server::bind(config("twice-b", "rxe0=127.0.22.4"), false)
        .err()
        .expect("a second daemon on the same address");
    assert!(e.contains("cannot bind UDP 127.0.22.4:4791"), "{e}");
    let _ = std::fs::remove_dir_all(
        config("twice-b", "x=127.0.0.1")
            .socket_path
            .parent()
            .unwrap(),
    );
    drop(d);
}

/// A request line may be as long as a traced process's report of a whole
/// 64 KiB datagram in hex (the daemon answers it); a longer line is a
/// confused peer, and the daemon closes that connection and goes on.
#[test]
fn long_lines_are_answered_and_endless_ones_close_the_connection() {
    let d = Daemon::start("lines", "rxe0=127.0.22.9");
    // 100 000 bytes and a newline: an unknown request, answered.
    let mut s = UnixStream::connect(&d.path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut line = vec![b'x'; 100_000];
    line.push(b'\n');
    s.write_all(&line).unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("ERR unknown request"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // 300 000 bytes without a newline: the connection is closed.
    let mut s2 = UnixStream::connect(&d.path).unwrap();
    s2.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s2.write_all(&vec![b'y'; 300_000]);
    let mut rest = Vec::new();
    let r = s2.read_to_end(&mut rest);
    assert!(
        matches!(&r, Ok(0))
            || r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
    // The daemon still serves.
    assert!(client::request(&d.path, "STATUS").unwrap().contains("rxe0"));
}
