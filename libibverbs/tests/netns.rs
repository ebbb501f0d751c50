//! Two hosts on one machine: two network namespaces joined by a veth pair,
//! an `rxe-emud` in each with `rxe0` bound to its end of the pair
//! (`NAME=netdev:IF`), and Debian's unmodified `ibv_rc_pingpong` and
//! `ibv_ud_pingpong` on our libibverbs between them, as between two
//! machines with kernel rxe. Needs root and `ip` (iproute2): skipped
//! without them, failed under CI.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// The namespaces, the veth pair and the daemons; all removed on drop,
/// also when the test fails.
struct Hosts {
    ns: [String; 2],
    addr: [&'static str; 2],
    sock: [PathBuf; 2],
    daemons: Vec<Child>,
    dir: PathBuf,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Hosts {
    fn new() -> Hosts {
        let id = std::process::id() % 100_000;
        let ns = [format!("rxe-t{id}a"), format!("rxe-t{id}b")];
        let veth = [format!("rxa{id}"), format!("rxb{id}")];
        let dir = scratch_dir("netns");
        let mut h = Hosts {
            ns: ns.clone(),
            addr: ["10.199.7.1", "10.199.7.2"],
            sock: [dir.join("a.sock"), dir.join("b.sock")],
            daemons: Vec::new(),
            dir,
        };
        for n in &ns {
            ip(&["netns", "add", n]);
        }
        ip(&[
            "link", "add", &veth[0], "netns", &ns[0], "type", "veth", "peer", "name", &veth[1],
            "netns", &ns[1],
        ]);
        for i in 0..2 {
            let cidr = format!("{}/24", h.addr[i]);
            ip(&["-n", &ns[i], "addr", "add", &cidr, "dev", &veth[i]]);
            ip(&["-n", &ns[i], "link", "set", &veth[i], "up"]);
            ip(&["-n", &ns[i], "link", "set", "lo", "up"]);
        }
        for i in 0..2 {
            let dev = format!("rxe0=netdev:{}", veth[i]);
            let mut c = Command::new("ip")
                .args(["netns", "exec", &ns[i]])
                .arg(profile_dir().join("rxe-emud"))
                .arg("--socket")
                .arg(&h.sock[i])
                .args(["--device", &dev, "--slots", "4"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut line = String::new();
            let _ = BufReader::new(c.stdout.take().unwrap()).read_line(&mut line);
            h.daemons.push(c);
            assert_eq!(line.trim(), "ready", "rxe-emud in {} did not start", ns[i]);
        }
        h
    }

    /// `prog` in namespace `i`, on our libibverbs and that host's daemon.
    fn command(&self, i: usize, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[i], prog])
            .env("LD_LIBRARY_PATH", dropin_dir())
            .env("RXE_EMU_SOCKET", &self.sock[i])
            .env("RXE_EMU_MODE", "daemon")
            .env("RXE_EMU_AUTOSTART", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Whether something listens on TCP `port` in namespace `i`.
    fn listening(&self, i: usize, port: u16) -> bool {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns[i],
                "cat",
                "/proc/net/tcp",
                "/proc/net/tcp6",
            ])
            .output()
            .unwrap();
        let suffix = format!(":{port:04X}");
        String::from_utf8_lossy(&out.stdout).lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() > 3 && w[3] == "0A" && w[1].ends_with(&suffix)
        })
    }

    /// `prog args` as the server on host 0 and as its client on host 1.
    fn client_server(&self, prog: &str, args: &[&str], port: u16) -> Run {
        let p = port.to_string();
        let server = self
            .command(0, prog)
            .args(args)
            .args(["-p", &p])
            .spawn()
            .unwrap();
        let start = Instant::now();
        while !self.listening(0, port) && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let client = self
            .command(1, prog)
            .args(args)
            .args(["-p", &p, self.addr[0]])
            .spawn()
            .unwrap();
        let (client, t1) = wait_limited(client, LIMIT);
        let slimit = if client.status.success() {
            LIMIT
        } else {
            Duration::from_secs(3)
        };
        let (server, t2) = wait_limited(server, slimit);
        Run {
            server,
            client,
            timed_out: t1 || t2,
            attempts: 1,
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        for n in &self.ns {
            // Deleting a namespace destroys its end of the veth pair, and
            // with it the other end.
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn two_daemons_in_two_network_namespaces_over_veth_are_two_hosts() {
    if !have_program("ip", "iproute2")
        || !have_program("ibv_rc_pingpong", "ibverbs-utils")
        || !have_root("network namespaces")
    {
        return;
    }
    assert!(Path::new(&profile_dir().join("rxe-emud")).exists());
    let _s = serial();
    let h = Hosts::new();

    // Each host's rxe0 took its veth's address and MTU.
    let out = h.command(0, "ibv_devinfo").arg("-v").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("::ffff:10.199.7.1"), "GID of host A: {text}");
    assert!(
        text.contains("active_mtu:\t\t1024 (3)"),
        "veth MTU 1500: {text}"
    );

    // RC: 200 SENDs of 4 KiB each way, every byte checked (-c), and the
    // peer's GID is the other host's address.
    let r = h.client_server(
        "ibv_rc_pingpong",
        &["-g", "1", "-n", "200", "-s", "4096", "-c"],
        18601,
    );
    assert!(r.ok(), "{}", r.text());
    let (server, client) = r.stdout();
    assert!(client.contains("GID ::ffff:10.199.7.1"), "{client}");
    assert!(server.contains("GID ::ffff:10.199.7.2"), "{server}");
    for out in [&server, &client] {
        assert!(out.contains("1638400 bytes in"), "{}", r.text());
        assert!(out.contains("200 iters in"), "{}", r.text());
    }

    // UD with the GRH across the two hosts.
    let r = h.client_server(
        "ibv_ud_pingpong",
        &["-g", "1", "-n", "100", "-s", "1000", "-c"],
        18602,
    );
    assert!(r.ok(), "{}", r.text());
    let (server, client) = r.stdout();
    for out in [&server, &client] {
        assert!(out.contains("100 iters in"), "{}", r.text());
    }

    // Each daemon saw only its own host's traffic go through its device
    // (nothing reached it for QPNs it never gave out).
    for i in 0..2 {
        let st = emulator_daemon::client::request(&h.sock[i], "STATUS").unwrap();
        assert!(
            st.contains(&format!("addr {} ", h.addr[i])) && st.contains("dropped_no_owner 0"),
            "{st}"
        );
    }
}
