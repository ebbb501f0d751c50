//! What a user without an RDMA device compares us with: UCX's
//! `ucx_perftest` over rxe0 (`rc_verbs`, with `ud_verbs` for wire-up)
//! beside UCX's `tcp` transport on the same loopback, in one run, as
//! ratios. `cargo bench -p middleware-tests` (needs ucx-utils and a
//! release build of the workspace). Prints figures; asserts nothing.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn profile_dir() -> PathBuf {
    // target/release/deps/<bench>
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(|p| p.parent()).unwrap().to_path_buf()
}

/// The median latency (µs) or the bandwidth (MB/s) of one run.
#[derive(Clone, Copy)]
enum Figure {
    MedianLatency,
    Bandwidth,
}

fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .is_ok_and(|t| t.lines().any(|l| l.contains(&hex) && l.contains(" 0A ")))
    })
}

fn run(
    cli: &PathBuf,
    socket: &PathBuf,
    tls: &str,
    dev: &str,
    port: u16,
    args: &[&str],
) -> Option<String> {
    let cmd = |client: bool| {
        let mut c = Command::new(cli);
        c.arg("--socket")
            .arg(socket)
            .args(["exec", "--", "ucx_perftest", "-p", &port.to_string()])
            .args(args)
            .env("UCX_TLS", tls)
            .env("UCX_NET_DEVICES", dev)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if client {
            c.arg("127.0.0.1");
        }
        c
    };
    let mut server = cmd(false).spawn().ok()?;
    let t0 = Instant::now();
    while !listening(port) && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = cmd(true).output().ok()?;
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.starts_with("Final:"))
        .map(str::to_string)
}

fn figure(line: &str, f: Figure) -> f64 {
    // Final: iterations, latency 50%ile, avg, overall, bw avg, overall, ...
    let w: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    match f {
        Figure::MedianLatency => w.get(1).copied().unwrap_or(f64::NAN),
        Figure::Bandwidth => w.get(5).copied().unwrap_or(f64::NAN),
    }
}

fn main() {
    let cli = profile_dir().join("rxe-emu");
    let have_ucx = Command::new("ucx_perftest").arg("-h").output().is_ok();
    if !cli.exists() || !have_ucx {
        eprintln!(
            "ucx_vs_tcp: needs {} (cargo build --release --workspace) and ucx_perftest (apt-get install ucx-utils)",
            cli.display()
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("rxe-ucx-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("rxe-emud.sock");
    let start = Command::new(&cli)
        .arg("--socket")
        .arg(&socket)
        .args(["start", "--device", "rxe0=127.0.64.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !start.is_ok_and(|s| s.success()) {
        eprintln!("ucx_vs_tcp: rxe-emu start failed");
        return;
    }
    let cases: [(&str, &[&str], Figure, &str); 4] = [
        (
            "tag_lat 8 B",
            &["-t", "tag_lat", "-s", "8", "-n", "20000"],
            Figure::MedianLatency,
            "us",
        ),
        (
            "tag_bw 64 KiB",
            &["-t", "tag_bw", "-s", "65536", "-n", "5000"],
            Figure::Bandwidth,
            "MB/s",
        ),
        (
            "tag_bw 1 MiB",
            &["-t", "tag_bw", "-s", "1048576", "-n", "500"],
            Figure::Bandwidth,
            "MB/s",
        ),
        (
            "tag_bw 4 MiB",
            &["-t", "tag_bw", "-s", "4194304", "-n", "100"],
            Figure::Bandwidth,
            "MB/s",
        ),
    ];
    println!(
        "UCX ucx_perftest, two processes on this machine, rxe0 (rc_verbs) beside UCX tcp on lo"
    );
    println!(
        "{:<16} {:>14} {:>14} {:>8}",
        "test", "rxe0 rc_verbs", "tcp (lo)", "ratio"
    );
    let mut port = 18100;
    for (name, args, fig, unit) in cases {
        port += 2;
        let rxe =
            run(&cli, &socket, "rc_verbs,ud_verbs", "rxe0:1", port, args).map(|l| figure(&l, fig));
        let tcp = run(&cli, &socket, "tcp", "lo", port + 1, args).map(|l| figure(&l, fig));
        match (rxe, tcp) {
            (Some(r), Some(t)) => {
                // Ratio: how many times better rxe0 is (latency: tcp/rxe).
                let ratio = match fig {
                    Figure::MedianLatency => t / r,
                    Figure::Bandwidth => r / t,
                };
                println!(
                    "{name:<16} {:>9.2} {unit:<4} {:>9.2} {unit:<4} {ratio:>7.2}x",
                    r, t
                );
            }
            _ => println!("{name:<16} failed (rxe0: {rxe:?}, tcp: {tcp:?})"),
        }
    }
    println!("ratio > 1: rxe0 is better (lower latency, higher bandwidth)");
    let _ = Command::new(&cli)
        .arg("--socket")
        .arg(&socket)
        .arg("stop")
        .output();
    let _ = std::fs::remove_dir_all(&dir);
}
