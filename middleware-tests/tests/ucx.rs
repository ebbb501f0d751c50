//! UCX (Debian's ucx-utils and libucx-dev) on rxe0, unmodified, through
//! `rxe-emu exec`, with no UCX setting beyond choosing the device and the
//! transports (kernel rxe needs `UCX_UD_VERBS_ETH_DGID_CHECK=n` too).

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(90);

/// The transports UCX may use: `rc_verbs` needs `ud_verbs` beside it to
/// wire up (UCX's design, on any device).
const RC: &str = "rc_verbs,ud_verbs";
const UD: &str = "ud_verbs";

fn have_ucx() -> bool {
    have_program("ucx_perftest", "ucx-utils")
}

/// `ucx_info -d` lists rxe0's memory domain with rc_verbs and ud_verbs on
/// port 1, and the rdmacm connection manager, as on kernel rxe.
#[test]
fn ucx_info_shows_rxe0_with_rc_verbs_ud_verbs_and_rdmacm() {
    if !have_ucx() {
        return;
    }
    let _s = serial();
    let d = Rxe::start("info", "rxe0=127.0.61.1");
    let out = d.exec("ucx_info").arg("-d").output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let lines: Vec<&str> = t.lines().map(str::trim).collect();
    let md = lines
        .iter()
        .position(|l| *l == "# Memory domain: rxe0")
        .unwrap_or_else(|| panic!("no rxe0 memory domain:\n{t}"));
    let after: Vec<&str> = lines[md..].iter().take(80).copied().collect();
    for want in [
        "#      Transport: rc_verbs",
        "#      Transport: ud_verbs",
        "#         Device: rxe0:1",
    ] {
        assert!(after.iter().any(|l| l == &want.trim()), "{want}:\n{t}");
    }
    assert!(
        lines.contains(&"# Connection manager: rdmacm"),
        "no rdmacm CM:\n{t}"
    );
}

/// One ucx_perftest run, server and client, on `tls`; returns the
/// client's `Final:` line.
fn perftest(d: &Rxe, tls: &str, port: u16, args: &[&str]) -> String {
    let port_s = port.to_string();
    let cmd = |client: bool| {
        let mut c = d.exec("ucx_perftest");
        c.env("UCX_NET_DEVICES", "rxe0:1")
            .env("UCX_TLS", tls)
            .args(["-p", &port_s])
            .args(args);
        if client {
            c.arg("127.0.0.1");
        }
        c
    };
    let r = server_client(cmd(false), port, cmd(true), LIMIT);
    assert!(r.ok(), "ucx_perftest {args:?} over {tls}:\n{}", r.text());
    let client = text(&r.client);
    let fin = client
        .lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("no result line:\n{}", r.text()))
        .to_string();
    eprintln!("{tls:>17} {:<40} {fin}", args.join(" "));
    fin
}

/// The tests, sizes 8 B to 4 MiB, of a transport; each must finish with
/// its result line (ucx_perftest fails on any transport error).
fn perftests(tag: &str, addr: &str, tls: &str, uct_tl: &str, base_port: u16) {
    let _s = serial();
    let d = Rxe::start(tag, &format!("rxe0={addr}"));
    let mut port = base_port;
    let mut run = |args: &[&str]| {
        port += 1;
        perftest(&d, tls, port, args)
    };
    run(&["-t", "tag_lat", "-s", "8", "-n", "5000"]);
    for size in ["8", "65536", "4194304"] {
        let n = if size == "4194304" { "20" } else { "2000" };
        run(&["-t", "tag_bw", "-s", size, "-n", n]);
        run(&["-t", "ucp_put_bw", "-s", size, "-n", n]);
        run(&["-t", "ucp_get", "-s", size, "-n", n]);
        run(&["-t", "ucp_am_bw", "-s", size, "-n", n]);
    }
    // UCT level: active-message latency straight on the transport.
    run(&["-t", "am_lat", "-d", "rxe0:1", "-x", uct_tl, "-n", "5000"]);
}

#[test]
fn ucx_perftest_over_rc_verbs_8b_to_4mib() {
    if !have_ucx() {
        return;
    }
    perftests("rc", "127.0.61.2", RC, "rc_verbs", 17100);
}

#[test]
fn ucx_perftest_over_ud_verbs_8b_to_4mib() {
    if !have_ucx() {
        return;
    }
    perftests("ud", "127.0.61.3", UD, "ud_verbs", 17200);
}

/// UCX's own examples from libucx-dev, compiled and run unchanged:
/// ucp_hello_world in its three progress modes (busy polling, wait, event
/// fd), and ucp_client_server with each API, which connects through the
/// rdmacm connection manager (the daemon's CM sees the MADs).
#[test]
fn ucx_examples_run_unchanged() {
    const EX: &str = "/usr/share/doc/libucx-dev/examples";
    if !have_ucx()
        || !have_file(&format!("{EX}/ucp_client_server.c"), "libucx-dev")
        || !have_program("cc", "gcc")
    {
        return;
    }
    let _s = serial();
    let dir = scratch_dir("ucx-examples");
    for ex in ["ucp_hello_world", "ucp_client_server"] {
        for f in [
            format!("{ex}.c"),
            "hello_world_util.h".into(),
            "ucp_util.h".into(),
        ] {
            let _ = std::fs::copy(format!("{EX}/{f}"), dir.join(&f));
        }
        compile(
            &dir.join(format!("{ex}.c")),
            &dir.join(ex),
            &["-lucp", "-lucs"],
        );
    }
    let d = Rxe::start("examples", "rxe0=127.0.61.4");
    let env = |c: &mut std::process::Command| {
        c.env("UCX_NET_DEVICES", "rxe0:1").env("UCX_TLS", RC);
    };
    let mut port = 17300;
    for mode in ["-b", "-w", "-f"] {
        port += 1;
        let p = port.to_string();
        let mut s = d.exec(dir.join("ucp_hello_world"));
        s.args([mode, "-p", &p]);
        env(&mut s);
        let mut c = d.exec(dir.join("ucp_hello_world"));
        c.args([mode, "-p", &p, "-n", "127.0.0.1"]);
        env(&mut c);
        let r = server_client(s, port, c, LIMIT);
        assert!(r.ok(), "ucp_hello_world {mode}:\n{}", r.text());
        assert!(text(&r.client).contains("UCP TEST SUCCESS"), "{}", r.text());
    }
    for api in ["stream", "tag", "am"] {
        port += 1;
        let p = port.to_string();
        let before = d.status_counter("cm_mads_received");
        let mut s = d.exec(dir.join("ucp_client_server"));
        s.args(["-l", "127.0.61.4", "-p", &p, "-c", api, "-i", "4"]);
        env(&mut s);
        // The server serves clients for ever: it is stopped below.
        let server = s.spawn().unwrap();
        let start = std::time::Instant::now();
        while !listening(port) && start.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut c = d.exec(dir.join("ucp_client_server"));
        c.args(["-a", "127.0.61.4", "-p", &p, "-c", api, "-i", "4"]);
        c.env("UCX_SOCKADDR_TLS_PRIORITY", "rdmacm");
        env(&mut c);
        let (client, _) = wait_limited(c.spawn().unwrap(), LIMIT);
        let mut server = server;
        let _ = server.kill();
        let server = server.wait_with_output().unwrap();
        let t = text(&client);
        assert!(
            client.status.success(),
            "ucp_client_server -c {api}:\n{t}\n--- server:\n{}",
            text(&server)
        );
        // The client prints what it received on every other iteration.
        assert_eq!(t.matches("ABCDEFGHIJKLMNO").count(), 2, "{t}");
        let mads = d.status_counter("cm_mads_received") - before;
        assert!(
            mads >= 3,
            "ucp_client_server -c {api} did not connect through rdma_cm ({mads} CM MADs)"
        );
    }
}

/// Where no namespace can be made (an unprivileged container, Ubuntu
/// 24.04's restricted user namespaces) the program still sees the device:
/// rxe-emu shows it with a preloaded library, not with mounts.
#[test]
fn middleware_sees_rxe0_where_namespaces_are_denied() {
    if !have_ucx() {
        return;
    }
    let Some(deny) = deny_ns() else { return };
    let _s = serial();
    // The filter works: no namespace for anybody under it.
    let unshare = std::process::Command::new(&deny)
        .args(["unshare", "--user", "true"])
        .output()
        .unwrap();
    assert!(!unshare.status.success(), "deny-ns let unshare through");
    let d = Rxe::start("denied", "rxe0=127.0.61.5");
    let out = d
        .exec_denied_ns(&deny, "sh")
        .args([
            "-c",
            "ls /sys/class/infiniband; cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/1; test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 && test -w /dev/infiniband/uverbs0 && echo uverbs0",
        ])
        .output()
        .unwrap();
    assert_eq!(text(&out), "rxe0\nRoCE v2\nuverbs0\n");
    let info = d
        .exec_denied_ns(&deny, "ucx_info")
        .arg("-d")
        .output()
        .unwrap();
    let t = text(&info);
    assert!(
        t.contains("# Memory domain: rxe0") && t.contains("Transport: rc_verbs"),
        "{t}"
    );
    let cmd = |client: bool| {
        let mut c = d.exec_denied_ns(&deny, "ucx_perftest");
        c.env("UCX_NET_DEVICES", "rxe0:1")
            .env("UCX_TLS", RC)
            .args(["-p", "17400", "-t", "tag_lat", "-n", "1000"]);
        if client {
            c.arg("127.0.0.1");
        }
        c
    };
    let r = server_client(cmd(false), 17400, cmd(true), LIMIT);
    assert!(r.ok(), "{}", r.text());
}

/// A normal user, where namespaces are denied too: `rxe-emu exec` run as
/// uid 65534 (its own daemon, its own view) shows UCX the device. The
/// programs are copied where that user can reach them (the build tree may
/// be private to root).
#[test]
fn a_normal_user_without_namespaces_gets_rxe0_in_ucx() {
    if !have_ucx() || !have_root("to run a program as another user") {
        return;
    }
    let Some(deny) = deny_ns() else { return };
    if !have_program("setpriv", "util-linux") {
        return;
    }
    let _s = serial();
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch_dir("nobody");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for f in [
        "rxe-emu",
        "rxe-emud",
        "libibverbs.so",
        "librdmacm.so",
        "librxe_emu_preload.so",
    ] {
        std::fs::copy(profile_dir().join(f), bin.join(f)).unwrap();
    }
    std::fs::copy(&deny, bin.join("deny-ns")).unwrap();
    let run_dir = dir.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    for d in [&dir, &bin, &run_dir] {
        let mode = if d == &run_dir { 0o777 } else { 0o755 };
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let socket = run_dir.join("rxe-emud.sock");
    let as_nobody = |args: &[&str]| {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin.join("deny-ns"))
            .arg(bin.join("rxe-emu"))
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("LD_PRELOAD")
            .env("HOME", &run_dir)
            .env_remove("XDG_RUNTIME_DIR")
            .stdin(std::process::Stdio::null());
        c
    };
    let out = as_nobody(&[
        "exec",
        "--device",
        "rxe0=127.0.61.6",
        "--",
        "sh",
        "-c",
        "id -u; ucx_info -d",
    ])
    .output()
    .unwrap();
    let stop = as_nobody(&["stop"]).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.starts_with("65534\n"), "{t}");
    assert!(
        t.contains("# Memory domain: rxe0") && t.contains("Transport: ud_verbs"),
        "{t}"
    );
    assert!(stop.status.success(), "{}", text(&stop));
}
