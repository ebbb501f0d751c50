//! Debian 12's unmodified rdmacm-utils and perftest on our librdmacm and
//! libibverbs, two processes on one rxe-emud device: `rping`,
//! `ucmatose` (also with `-m`, migrating ids between channels),
//! `udaddy` (UD, SIDR), `rdma_server`/`rdma_client` (`rdma_create_ep`,
//! synchronous ids, `rdma_get_request`), and perftest's `ib_send_bw -R`
//! and `ib_write_lat -R`. Each is skipped, saying so, if its binary is
//! absent (failed under CI). Every device has its own address, so tests
//! do not share UDP/4791.

#[path = "../../libibverbs/tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

fn run(tag: &str, addr: &str, server: (&str, &[&str]), client: (&str, &[&str])) -> Option<Run> {
    let package = if server.0.starts_with("ib_") {
        "perftest"
    } else {
        "rdmacm-utils"
    };
    if !have_program(server.0, package) {
        return None;
    }
    let _s = serial();
    let d = Daemon::start(tag, &format!("rxe0={addr}"));
    let r = client_server_retrying(&d, server, client, LIMIT);
    assert!(r.ok(), "{tag} failed:\n{}", r.text());
    Some(r)
}

#[test]
fn rping_ten_pings_with_data_check() {
    let a = "127.0.97.1";
    let args = ["-a", a, "-v", "-C", "10", "-p", "7001"];
    let Some(r) = run(
        "rping",
        a,
        ("rping", &[&["-s"][..], &args].concat()),
        ("rping", &[&["-c"][..], &args].concat()),
    ) else {
        return;
    };
    let (s, c) = r.stdout();
    for i in 0..10 {
        assert!(
            c.contains(&format!("ping data: rdma-ping-{i}: ")),
            "client ping {i}:\n{}",
            r.text()
        );
        assert!(
            s.contains(&format!("server ping data: rdma-ping-{i}: ")),
            "server ping {i}:\n{}",
            r.text()
        );
    }
    // The server waits for the DISCONNECTED event; rping's client
    // prints its own from its CM thread and may exit first (so it is not
    // asserted: it fails now and then with kernel rdma_cm too).
    assert!(r.text().contains("server DISCONNECT EVENT"), "{}", r.text());
}

#[test]
fn ucmatose_four_connections() {
    let a = "127.0.97.2";
    let Some(r) = run(
        "ucmatose",
        a,
        ("ucmatose", &["-b", a, "-c", "4", "-C", "20"]),
        ("ucmatose", &["-s", a, "-c", "4", "-C", "20"]),
    ) else {
        return;
    };
    let (s, c) = r.stdout();
    for t in [&s, &c] {
        assert!(t.contains("data transfers complete"), "{}", r.text());
        assert!(t.contains("return status 0"), "{}", r.text());
    }
}

#[test]
fn ucmatose_migrating_ids_and_ack_timeout() {
    let a = "127.0.97.3";
    let Some(r) = run(
        "ucmatose-m",
        a,
        (
            "ucmatose",
            &["-b", a, "-c", "2", "-C", "10", "-m", "-a", "14"],
        ),
        (
            "ucmatose",
            &["-s", a, "-c", "2", "-C", "10", "-m", "-a", "14"],
        ),
    ) else {
        return;
    };
    let (s, c) = r.stdout();
    assert!(s.contains("return status 0"), "{}", r.text());
    assert!(c.contains("return status 0"), "{}", r.text());
}

#[test]
fn udaddy_ud_sidr() {
    let a = "127.0.97.4";
    let Some(r) = run(
        "udaddy",
        a,
        ("udaddy", &["-b", a, "-c", "2", "-C", "10"]),
        ("udaddy", &["-s", a, "-c", "2", "-C", "10"]),
    ) else {
        return;
    };
    let (s, c) = r.stdout();
    for t in [&s, &c] {
        assert!(t.contains("data transfers complete"), "{}", r.text());
        assert!(t.contains("return status 0"), "{}", r.text());
    }
}

#[test]
fn rdma_server_and_client_endpoints() {
    let a = "127.0.97.5";
    let Some(r) = run(
        "rdma_server",
        a,
        ("rdma_server", &["-s", a, "-p", "7005"]),
        ("rdma_client", &["-s", a, "-p", "7005"]),
    ) else {
        return;
    };
    let (s, c) = r.stdout();
    assert!(s.contains("rdma_server: end 0"), "{}", r.text());
    assert!(c.contains("rdma_client: end 0"), "{}", r.text());
}

/// perftest `-R` has a race of its own: after the two sides' handshake
/// the client connects the data QP while the server creates its data
/// listener, and a client that comes first is rejected (no listener,
/// reason 8) and then crashes in perftest's retry path (it reuses the ids
/// it just destroyed); the server waits for ever. On rxe-emu the client
/// usually wins: the server learns that its last handshake SEND completed
/// only when the client's ACK leaves, which the client's device holds
/// until its progress thread looks (up to 1 ms after the client stopped
/// polling). So a run whose client was rejected is started again, whole,
/// at most 12 times; a run that fails otherwise fails the test.
fn perftest(tag: &str, addr: &str, prog: &str, result_cols: usize) {
    if !have_program(prog, "perftest") {
        return;
    }
    let _s = serial();
    let d = Daemon::start(tag, &format!("rxe0={addr}"));
    let args = ["-R", "-n", "200", "-p", "7006"];
    let cargs = [&args[..], &[addr]].concat();
    let mut r = None;
    for _ in 0..12 {
        let s = d.command(prog).args(args).spawn().unwrap();
        // The server's first (handshake) listener is up well within this.
        std::thread::sleep(Duration::from_millis(1000));
        let (c, t1) = wait_limited(d.command(prog).args(&cargs).spawn().unwrap(), LIMIT);
        let limit = if c.status.success() {
            LIMIT
        } else {
            Duration::from_secs(2)
        };
        let (s, t2) = wait_limited(s, limit);
        let run = Run {
            server: s,
            client: c,
            timed_out: t1 || t2,
            attempts: 1,
        };
        let raced = String::from_utf8_lossy(&run.client.stderr)
            .contains("RDMA_CM_EVENT_REJECTED; error: 8");
        if run.ok() || !raced {
            r = Some(run);
            break;
        }
        eprintln!(
            "{tag}: perftest's data-connection race (client rejected, no listener yet); again"
        );
    }
    let r = r.expect("perftest -R lost its own race 12 times in a row");
    assert!(r.ok(), "{tag} failed:\n{}", r.text());
    let (s, c) = r.stdout();
    for t in [&s, &c] {
        assert!(t.contains("rdma_cm QPs\t : ON"), "{}", r.text());
        // The result line: the size, then 200 iterations, then figures.
        let line = t
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("200"))
            .unwrap_or_else(|| panic!("no result line:\n{}", r.text()));
        assert!(
            line.split_whitespace().count() >= result_cols,
            "{line}\n{}",
            r.text()
        );
    }
}

#[test]
fn perftest_send_bw_over_rdma_cm() {
    perftest("send_bw", "127.0.97.6", "ib_send_bw", 5);
}

#[test]
fn perftest_write_lat_over_rdma_cm() {
    perftest("write_lat", "127.0.97.7", "ib_write_lat", 7);
}
