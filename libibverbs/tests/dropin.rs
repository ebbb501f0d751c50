//! Debian's unmodified rdma-core programs (ibverbs-utils, perftest) on our
//! libibverbs.so.1: two processes on one rxe-emud device, as on a host
//! with kernel rxe. Each test has its own daemon, device address and TCP
//! port. The tools are required under CI (`.ci/run` installs them) and
//! skipped with a message elsewhere.

mod common;

use std::time::Duration;

use common::{client_server, have_program, serial, Daemon};

const LIMIT: Duration = Duration::from_secs(90);

#[test]
fn ibv_devices_and_ibv_devinfo_see_rxe0_as_kernel_rxe_shows_it() {
    if !have_program("ibv_devinfo", "ibverbs-utils") {
        return;
    }
    let _s = serial();
    let d = Daemon::start("devinfo", "rxe0=127.0.91.1");
    let out = d.command("ibv_devices").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("rxe0"), "{text}");
    let out = d.command("ibv_devinfo").arg("-v").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "hca_id:\trxe0",
        "transport:\t\t\tInfiniBand (0)",
        "vendor_id:\t\t\t0xffffff",
        "phys_port_cnt:\t\t\t1",
        "max_qp_rd_atom:\t\t\t128",
        "state:\t\t\tPORT_ACTIVE (4)",
        "max_mtu:\t\t4096 (5)",
        "link_layer:\t\tEthernet",
        // The IPv4-mapped GID of the device's address at index 1.
        "GID[  1]:\t\t::ffff:127.0.91.1, RoCE v2",
    ] {
        assert!(
            text.contains(want),
            "ibv_devinfo -v lacks {want:?}:\n{text}"
        );
    }
    // No daemon (and no autostart): no device, and a clear answer.
    drop(d);
    let out = std::process::Command::new("ibv_devinfo")
        .env("LD_LIBRARY_PATH", common::dropin_dir())
        .env("RXE_EMU_SOCKET", "/nonexistent/rxe-emud.sock")
        .env("RXE_EMU_AUTOSTART", "0")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("No IB devices found"), "{all}");
}

/// Run an `ibv_*_pingpong` at each size, polling and with `-e`, with
/// `--chk` validating every received buffer.
fn pingpong(prog: &str, tag: &str, addr: &str, port: u16, sizes: &[u32]) {
    if !have_program(prog, "ibverbs-utils") {
        return;
    }
    let _s = serial();
    let d = Daemon::start(tag, &format!("rxe0=127.0.{addr}.1"));
    for &size in sizes {
        for event in [false, true] {
            let size_s = size.to_string();
            let mut args = vec!["-d", "rxe0", "-g", "1", "-n", "50", "-s", &size_s, "-c"];
            if event {
                args.push("-e");
            }
            let r = client_server(&d, prog, &args, port, LIMIT);
            assert!(r.ok(), "{prog} {args:?} failed:\n{}", r.text());
            let (s, c) = r.stdout();
            let bytes = format!("{} bytes in", 2 * 50 * size as u64);
            for side in [&s, &c] {
                assert!(
                    side.contains("50 iters in"),
                    "{prog} {args:?}:\n{}",
                    r.text()
                );
                if prog != "ibv_srq_pingpong" {
                    assert!(
                        side.contains(&bytes),
                        "{prog} {args:?}: want {bytes}:\n{}",
                        r.text()
                    );
                }
            }
        }
    }
}

#[test]
fn ibv_rc_pingpong_1b_to_64k_polling_and_events() {
    pingpong("ibv_rc_pingpong", "rc", "92", 18601, &[1, 4096, 65536]);
}

#[test]
fn ibv_uc_pingpong_1b_to_64k_polling_and_events() {
    pingpong("ibv_uc_pingpong", "uc", "93", 18602, &[1, 4096, 65536]);
}

#[test]
fn ibv_ud_pingpong_1b_to_the_path_mtu_polling_and_events() {
    // A UD message fits one packet: at most the port MTU (4096 here).
    pingpong("ibv_ud_pingpong", "ud", "94", 18603, &[1, 1024, 4096]);
}

#[test]
fn ibv_srq_pingpong_1b_to_64k_polling_and_events() {
    pingpong("ibv_srq_pingpong", "srq", "95", 18604, &[1, 4096, 65536]);
}

/// Run a perftest benchmark; it must finish and print its result table.
fn perftest(d: &Daemon, prog: &str, extra: &[&str], port: u16) -> String {
    let mut args = vec!["-d", "rxe0", "-x", "1"];
    args.extend_from_slice(extra);
    let r = client_server(d, prog, &args, port, LIMIT);
    assert!(r.ok(), "{prog} {args:?} failed:\n{}", r.text());
    let (_, c) = r.stdout();
    assert!(
        c.contains("#bytes"),
        "{prog} {args:?} printed no results:\n{}",
        r.text()
    );
    c
}

#[test]
fn perftest_bandwidth_and_latency_on_rc_and_ud() {
    if !have_program("ib_write_bw", "perftest") {
        return;
    }
    let _s = serial();
    let d = Daemon::start("perftest", "rxe0=127.0.96.1");
    let mut port = 18610;
    for prog in [
        "ib_send_bw",
        "ib_send_lat",
        "ib_write_bw",
        "ib_write_lat",
        "ib_read_bw",
        "ib_read_lat",
        "ib_atomic_bw",
        "ib_atomic_lat",
    ] {
        perftest(&d, prog, &["-n", "200"], port);
        port += 1;
    }
    perftest(&d, "ib_send_bw", &["-c", "UD", "-n", "200"], port);
    perftest(
        &d,
        "ib_write_bw",
        &["--use_old_post_send", "-n", "200"],
        port + 1,
    );
    perftest(
        &d,
        "ib_send_lat",
        &["--use_old_post_send", "-n", "200"],
        port + 2,
    );
    // -a: every size from 2 B to 8 MiB.
    let all = perftest(&d, "ib_write_bw", &["-a", "-n", "20"], port + 3);
    assert!(all.contains("8388608"), "{all}");
}

/// `rxe-emu --socket SOCKET ARGS...` as a user runs it, with its output.
fn rxe_emu(socket: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(common::profile_dir().join("rxe-emu"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap()
}

#[test]
fn rxe_emu_exec_starts_the_daemon_and_runs_an_unmodified_program_on_rxe0() {
    if !have_program("ibv_devinfo", "ibverbs-utils") {
        return;
    }
    let _s = serial();
    let socket = common::scratch_dir("exec").join("rxe-emud.sock");
    let run = |args: &[&str]| rxe_emu(&socket, args);
    let out = run(&[
        "exec",
        "--device",
        "rxe0=127.0.97.1",
        "--",
        "ibv_devinfo",
        "-v",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let stop = run(&["stop"]);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("::ffff:127.0.97.1, RoCE v2"), "{text}");
    assert!(
        stop.status.success(),
        "the daemon exec started was not running"
    );
    // A program that cannot be run is a clear error.
    let out = run(&[
        "exec",
        "--device",
        "rxe0=127.0.97.2",
        "--",
        "/nonexistent/program",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run"));
    let _ = run(&["stop"]);
}

/// The Rust example `rxe-rc-pingpong` (verbs-api) and Debian's unmodified
/// `ibv_rc_pingpong` (on our libibverbs) on one rxe-emud device, each as
/// server and as client; our side checks every received message of the
/// pattern rdma-core's `-c` writes.
#[test]
fn rust_rc_pingpong_talks_to_debians_ibv_rc_pingpong_on_the_dropin() {
    if !have_program("ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let rust = common::profile_dir().join("rxe-rc-pingpong");
    if !rust.exists() {
        panic!(
            "{} is missing: cargo build --release -p verbs-api --bins",
            rust.display()
        );
    }
    let _s = serial();
    let d = Daemon::start("rust-debian", "rxe0=127.0.96.1");
    let args = ["-d", "rxe0", "-g", "1", "-n", "50", "-s", "4096", "-c"];
    for (port, rust_is_server) in [(18561u16, true), (18562, false)] {
        let port_s = port.to_string();
        let mut rs = d.command(rust.to_str().unwrap());
        rs.env("RXE_EMU_MODE", "daemon")
            .args(args)
            .args(["-p", &port_s]);
        let mut deb = d.command("ibv_rc_pingpong");
        deb.args(args).args(["-p", &port_s]);
        let (mut server, mut client) = if rust_is_server { (rs, deb) } else { (deb, rs) };
        let server = server.spawn().unwrap();
        let start = std::time::Instant::now();
        while !common::listening(port) && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        client.arg("127.0.0.1");
        let (c, t1) = common::wait_limited(client.spawn().unwrap(), LIMIT);
        let (s, t2) = common::wait_limited(server, LIMIT);
        let text = |o: &std::process::Output| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        let (st, ct) = (text(&s), text(&c));
        assert!(
            !t1 && !t2 && s.status.success() && c.status.success(),
            "rust server: {rust_is_server}\nserver:\n{st}\nclient:\n{ct}"
        );
        for t in [&st, &ct] {
            assert!(t.contains("409600 bytes in"), "{t}");
        }
        let ours = if rust_is_server { &st } else { &ct };
        assert!(ours.contains("50 received messages checked"), "{ours}");
    }
}

/// `rxe-emu exec`: iproute2's unmodified `rdma` asks RDMA netlink and
/// sees the daemon's devices as on kernel rxe (`rdma link show` and `-j`,
/// `rdma dev show`, one port by name); an unknown device is refused as
/// the kernel refuses it, a command we do not answer fails cleanly, and
/// other netlink families (`ip`) are untouched.
#[test]
fn rxe_emu_exec_answers_rdma_netlink_for_iproute2s_rdma() {
    if !have_program("rdma", "iproute2") {
        return;
    }
    let _s = serial();
    let cli = common::profile_dir().join("rxe-emu");
    let socket = common::scratch_dir("exec-netlink").join("rxe-emud.sock");
    let run = |args: &[&str]| rxe_emu(&socket, args);
    // The daemon keeps what it inherits open: no pipes for `start`.
    let start = std::process::Command::new(&cli)
        .arg("--socket")
        .arg(&socket)
        .args([
            "start",
            "--device",
            "rxe0=127.0.99.1",
            "--device",
            "rxe1=127.0.99.2",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(start.success(), "rxe-emu start: {start:?}");
    // Stopped however the test ends.
    struct Stop<'a>(&'a dyn Fn(&[&str]) -> std::process::Output);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = (self.0)(&["stop"]);
        }
    }
    let _stop = Stop(&run);
    let exec = |cmd: &str| {
        let o = run(&["exec", "--", "sh", "-c", cmd]);
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let link = exec("rdma link show");
    let json = exec("rdma -j link show");
    let dev = exec("rdma dev show");
    let one = exec("rdma link show rxe1/1");
    let unknown = exec("rdma link show rxe7/1");
    let unsupported = exec("rdma resource show");
    let ip = exec("ip -br link show lo");
    assert_eq!(
        link.1,
        "link rxe0/1 state ACTIVE physical_state LINK_UP netdev lo \n\
         link rxe1/1 state ACTIVE physical_state LINK_UP netdev lo \n",
        "{link:?}"
    );
    assert_eq!(link.0, Some(0));
    // What rdma-core's tests read: ifname, port, netdev.
    assert!(
        json.1.starts_with(r#"[{"ifindex":1,"ifname":"rxe0","port":1,"state":"ACTIVE","physical_state":"LINK_UP","netdev":"lo","netdev_index":1}"#),
        "{json:?}"
    );
    assert!(
        dev.1.starts_with("1: rxe0: node_type ca node_guid "),
        "{dev:?}"
    );
    assert!(dev.1.contains("\n2: rxe1: node_type ca "), "{dev:?}");
    assert!(one.1.starts_with("link rxe1/1 state ACTIVE"), "{one:?}");
    assert_eq!(unknown.0, Some(1), "{unknown:?}");
    assert!(unknown.2.contains("Wrong device name"), "{unknown:?}");
    assert_eq!(unsupported.0, Some(1), "{unsupported:?}");
    assert!(
        unsupported.2.contains("Operation not supported"),
        "{unsupported:?}"
    );
    assert!(ip.1.starts_with("lo "), "{ip:?}");
}

/// `rxe-emu exec`: the program sees /sys/class/infiniband/rxe0 with its
/// netdev, as on kernel rxe (rdma-core's Python tests look there); nothing
/// outside it does.
#[test]
fn rxe_emu_exec_shows_the_device_and_its_netdev_in_sysfs() {
    let _s = serial();
    let socket = common::scratch_dir("exec-sysfs").join("rxe-emud.sock");
    let had_rxe0 = std::path::Path::new("/sys/class/infiniband/rxe0").exists();
    let run = |args: &[&str]| rxe_emu(&socket, args);
    let out = run(&[
        "exec",
        "--device",
        "rxe0=127.0.99.1",
        "--",
        "sh",
        "-c",
        "ls /sys/class/infiniband/rxe0/device/net; cat /sys/class/infiniband/rxe0/ports/1/state /sys/class/infiniband/rxe0/node_type; ls /sys/class/net",
    ]);
    let stop = run(&["stop"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{err}");
    assert!(stop.status.success());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..3], ["lo", "4: ACTIVE", "1: CA"], "{text}");
    // The rest of /sys/class is still there.
    assert!(lines[3..].contains(&"lo"), "{text}");
    // Outside, nothing changed.
    assert_eq!(
        std::path::Path::new("/sys/class/infiniband/rxe0").exists(),
        had_rxe0
    );
}
