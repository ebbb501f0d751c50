//! Debian 12's unmodified `rstream` (rdmacm-utils) on our librdmacm's
//! rsockets: server and client are two processes on one rxe-emud device,
//! each loading our `libibverbs.so.1` and `librdmacm.so.1`. Transfers of
//! several sizes and counts in each of rstream's modes (non-blocking
//! spinning, `rpoll` async, blocking), with data verification; its full
//! default run (latency then bandwidth, two connections); and a client
//! killed mid-transfer, which must end the server (ECONNRESET/EOF), not
//! hang it. Skipped, saying so, if `rstream` is absent (failed under CI).

#[path = "../../libibverbs/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(90);

fn have_rstream() -> bool {
    have_program("rstream", "rdmacm-utils")
}

/// One rstream run with `args` on both sides; both must succeed and
/// print a result line of `name` for `size` transfers.
fn rstream(d: &Daemon, addr: &str, port: u16, args: &[&str], expect: &[&str]) {
    let port = port.to_string();
    let s: Vec<&str> = [&["-b", addr, "-p", &port][..], args].concat();
    let c: Vec<&str> = [&["-s", addr, "-p", &port][..], args].concat();
    let r = client_server_retrying(d, ("rstream", &s), ("rstream", &c), LIMIT);
    assert!(r.ok(), "rstream {args:?} failed:\n{}", r.text());
    let (so, co) = r.stdout();
    for want in expect {
        assert!(
            so.lines().any(|l| l.starts_with(want)) && co.lines().any(|l| l.starts_with(want)),
            "rstream {args:?}: no result line {want:?}:\n{}",
            r.text()
        );
    }
}

#[test]
fn rstream_sizes_counts_and_modes() {
    if !have_rstream() {
        return;
    }
    let _s = serial();
    let a = "127.0.96.1";
    let d = Daemon::start("rstream", &format!("rxe0={a}"));
    let cases: &[(&[&str], &str)] = &[
        // The default mode: non-blocking calls, spinning on EAGAIN.
        (&["-S", "4096", "-C", "1000"], "custom    4k      1k"),
        (
            &["-S", "1000000", "-C", "20", "-T", "v"],
            "custom    976k    20",
        ),
        // Async: rpoll before every call.
        (
            &["-S", "100", "-C", "500", "-T", "a", "-T", "v"],
            "custom    100     500",
        ),
        (
            &["-S", "3000", "-I", "20", "-C", "10", "-T", "a"],
            "custom    2.9k    10      20",
        ),
        // Blocking calls (MSG_WAITALL), with a small buffer (8 KiB
        // halves: many credit and target SGL updates).
        (
            &["-S", "65536", "-C", "200", "-T", "b", "-T", "v"],
            "custom    64k     200",
        ),
        (
            &[
                "-S", "5000", "-C", "300", "-B", "8192", "-T", "b", "-T", "v",
            ],
            "custom    4.8k    300",
        ),
    ];
    for (i, (args, want)) in cases.iter().enumerate() {
        rstream(&d, a, 7470 + i as u16, args, &[want]);
    }
}

#[test]
fn rstream_default_latency_and_bandwidth_runs() {
    if !have_rstream() {
        return;
    }
    let _s = serial();
    let a = "127.0.96.2";
    let d = Daemon::start("rstream-default", &format!("rxe0={a}"));
    rstream(
        &d,
        a,
        7480,
        &[],
        &[
            "64_lat", "4k_lat", "64k_lat", "1m_lat", "64_bw", "4k_bw", "64k_bw", "1m_bw",
        ],
    );
}

/// A client killed mid-transfer: the server hears of it (the daemon's
/// CM sends the DREQ of the dead process's id) and ends, whichever mode.
#[test]
fn rstream_server_ends_when_its_client_is_killed() {
    if !have_rstream() {
        return;
    }
    let _s = serial();
    let a = "127.0.96.3";
    let d = Daemon::start("rstream-kill", &format!("rxe0={a}"));
    for (i, mode) in ["a", "b", "n"].iter().enumerate() {
        let port = (7490 + i).to_string();
        // A million transfers of 64 KiB: no machine ends them in the
        // 1.5 s before the kill (100,000 were, once, with -T n on the
        // 2-CPU host).
        let args = ["-S", "65536", "-C", "1000000", "-T", mode, "-p", &port];
        // rstream -T b/n prints a perror per transfer left: to a file,
        // not a pipe that would fill up and stop it.
        let log = scratch_dir("rstream-kill").join(format!("server-{mode}.err"));
        let server = d
            .command("rstream")
            .args([&["-b", a][..], &args].concat())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let mut client = d
            .command("rstream")
            .args([&["-s", a][..], &args].concat())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            client.try_wait().unwrap().is_none(),
            "-T {mode}: the client ended before it was killed"
        );
        let _ = client.kill();
        let _ = client.wait();
        let t0 = Instant::now();
        let (out, timed_out) = wait_limited(server, Duration::from_secs(30));
        let err = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !timed_out,
            "-T {mode}: the server hung after its client was killed:\n{}",
            err.lines().take(20).collect::<Vec<_>>().join("\n")
        );
        assert!(
            !out.status.success(),
            "-T {mode}: the server succeeded without its client"
        );
        eprintln!(
            "-T {mode}: server ended {:?} after the kill ({:?}); first error: {}",
            t0.elapsed(),
            out.status,
            err.lines().next().unwrap_or("")
        );
    }
}
