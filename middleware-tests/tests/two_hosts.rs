//! Two hosts, as a user whose tests outgrow one machine runs them: two
//! network namespaces joined by a veth pair, each with its own rxe-emud on
//! its own address (the way two machines each run one). UCX's perftest
//! across them, and the MPI program of `mpi.rs` with one rank per host,
//! started by `mpirun` through an rsh agent that enters the other
//! namespace under that host's `rxe-emu exec`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(180);
const HOSTS: [(&str, &str, &str); 2] = [
    ("rxe-mw-h1", "mwh1", "10.89.2.1"),
    ("rxe-mw-h2", "mwh2", "10.89.2.2"),
];

/// The two namespaces and the veth pair between them.
struct Hosts;

impl Hosts {
    fn new() -> Hosts {
        Hosts::clean();
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {}", text(&out));
        };
        for (ns, _, _) in HOSTS {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        let (a, b) = (HOSTS[0], HOSTS[1]);
        ip(&[
            "link", "add", a.1, "netns", a.0, "type", "veth", "peer", "name", b.1, "netns", b.0,
        ]);
        for (ns, dev, addr) in HOSTS {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        Hosts
    }

    fn clean() {
        for (ns, _, _) in HOSTS {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        Hosts::clean();
    }
}

#[test]
fn ucx_and_open_mpi_across_two_hosts_each_with_its_own_rxe_emud() {
    if !have_program("ucx_perftest", "ucx-utils")
        || !have_program("mpirun", "openmpi-bin")
        || !have_program("mpicc", "libopenmpi-dev")
        || !have_program("ip", "iproute2")
        || !have_root("network namespaces")
    {
        return;
    }
    let _s = serial();
    let _hosts = Hosts::new();
    let h: Vec<Rxe> = HOSTS
        .iter()
        .map(|(ns, _, addr)| Rxe::start_in(Some(ns), ns, &format!("rxe0={addr}")))
        .collect();

    // UCX: server on host 1, client on host 2; the data crosses the link.
    let rx0 = rx_bytes();
    for (test, size) in [("tag_lat", "8"), ("tag_bw", "1048576")] {
        let cmd = |i: usize| {
            let mut c = h[i].exec("ucx_perftest");
            c.env("UCX_NET_DEVICES", "rxe0:1")
                .env("UCX_TLS", "rc_verbs,ud_verbs")
                .args(["-p", "17500", "-t", test, "-s", size, "-n", "500"]);
            if i == 1 {
                c.arg(HOSTS[0].2);
            }
            c
        };
        let r = server_client(cmd(0), 17500, cmd(1), LIMIT);
        assert!(r.ok(), "ucx_perftest -t {test} across hosts:\n{}", r.text());
        let t = text(&r.client);
        let fin = t.lines().find(|l| l.starts_with("Final:"));
        assert!(fin.is_some(), "{}", r.text());
        eprintln!("across hosts: {test} {size}: {}", fin.unwrap_or_default());
    }

    let rx = rx_bytes() - rx0;
    assert!(
        rx >= 500 << 20,
        "only {rx} bytes crossed the link to host 1"
    );

    // Open MPI, one rank per host: mpirun on host 1 starts host 2's orted
    // through an rsh agent, which runs it under host 2's rxe-emu exec.
    let dir = scratch_dir("two-hosts");
    let exe = dir.join("mpi_check");
    let out = Command::new("mpicc")
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/mpi_check.c"))
        .output()
        .unwrap();
    assert!(out.status.success(), "mpicc: {}", text(&out));
    let agent = dir.join("agent");
    let mut script = String::from("#!/bin/sh\n# agent HOST CMD: CMD on HOST (its namespace, its rxe-emu).\nhost=$1; shift\ncase \"$host\" in\n");
    for (i, (ns, _, addr)) in HOSTS.iter().enumerate() {
        script += &format!(
            "  {addr}) exec ip netns exec {ns} {} --socket {} exec -- sh -c \"$*\" ;;\n",
            cli().display(),
            h[i].socket.display()
        );
    }
    script += "esac\necho \"agent: unknown host $host\" >&2\nexit 1\n";
    std::fs::write(&agent, script).unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hosts = format!("{},{}", HOSTS[0].2, HOSTS[1].2);
    let mut c = h[0].exec("mpirun");
    c.args([
        "--allow-run-as-root",
        "-H",
        &hosts,
        "-np",
        "2",
        "--mca",
        "plm_rsh_agent",
    ])
    .arg(&agent)
    .args(["--mca", "oob_tcp_if_include", "10.89.2.0/24"])
    .args(MPI_OVER_UCX)
    .arg(&exe);
    let (out, timed_out) = wait_limited(c.spawn().unwrap(), LIMIT);
    let t = text(&out);
    assert!(
        !timed_out && out.status.success(),
        "mpirun across hosts:\n{t}"
    );
    for r in 0..2 {
        assert!(t.contains(&format!("rank {r} of 2: ok")), "{t}");
    }
}

/// Bytes host 1's end of the link has received (ucx_perftest's client,
/// on host 2, sends the data to its server on host 1).
fn rx_bytes() -> u64 {
    let (ns, dev, _) = HOSTS[0];
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/dev"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{dev}:")))
        .and_then(|l| l.split(':').nth(1)?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {dev} in {ns}'s /proc/net/dev"))
}
