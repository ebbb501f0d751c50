//! rxe-rc-pingpong (the ibv_rc_pingpong protocol) between two processes.

use std::process::Command;

#[test]
fn rc_pingpong_between_two_processes() {
    let exe = env!("CARGO_BIN_EXE_rxe-rc-pingpong");
    let server = Command::new(exe)
        .args([
            "--ip",
            "127.0.11.1",
            "-p",
            "18611",
            "-n",
            "200",
            "-s",
            "1500",
        ])
        .spawn()
        .unwrap();
    let client = Command::new(exe)
        .args([
            "--ip",
            "127.0.11.2",
            "-p",
            "18611",
            "-n",
            "200",
            "-s",
            "1500",
            "127.0.0.1",
        ])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "client failed: {out}\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(server.status.success(), "server failed");
    assert!(out.contains("200 iters in"), "{out}");
    assert!(
        out.contains("GID ::ffff:127.0.11.2") && out.contains("GID ::ffff:127.0.11.1"),
        "{out}"
    );
}

#[test]
fn ud_pingpong_between_two_processes() {
    let exe = env!("CARGO_BIN_EXE_rxe-ud-pingpong");
    let server = Command::new(exe)
        .args([
            "--ip",
            "127.0.11.3",
            "-p",
            "18613",
            "-n",
            "200",
            "-s",
            "1024",
        ])
        .spawn()
        .unwrap();
    let client = Command::new(exe)
        .args([
            "--ip",
            "127.0.11.4",
            "-p",
            "18613",
            "-n",
            "200",
            "-s",
            "1024",
            "127.0.0.1",
        ])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&client.stdout);
    assert!(
        client.status.success(),
        "client failed: {out}\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(server.status.success(), "server failed");
    assert!(out.contains("200 iters in"), "{out}");
}

/// Server and client of `exe` on two loopback addresses with the same
/// extra options; (server, client) outputs.
fn pair(exe: &str, ips: [&str; 2], port: &str, extra: &[&str]) -> [std::process::Output; 2] {
    let server = Command::new(exe)
        .args(["--ip", ips[0], "-p", port])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let client = Command::new(exe)
        .args(["--ip", ips[1], "-p", port])
        .args(extra)
        .arg(ips[0])
        .output()
        .unwrap();
    [server.wait_with_output().unwrap(), client]
}

fn text(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

#[test]
fn uc_pingpong_checks_every_message() {
    let exe = env!("CARGO_BIN_EXE_rxe-rc-pingpong");
    let outs = pair(
        exe,
        ["127.0.11.5", "127.0.11.6"],
        "18615",
        &["--uc", "-c", "-n", "50", "-s", "10000"],
    );
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
        assert!(
            text(o).contains("50 received messages checked"),
            "{}",
            text(o)
        );
    }
}

#[test]
fn ud_pingpong_checks_every_message() {
    let exe = env!("CARGO_BIN_EXE_rxe-ud-pingpong");
    let outs = pair(
        exe,
        ["127.0.11.7", "127.0.11.8"],
        "18617",
        &["-c", "-n", "50", "-s", "984", "--netdev-mtu", "1500"],
    );
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
        assert!(
            text(o).contains("50 received messages checked"),
            "{}",
            text(o)
        );
    }
}

#[test]
fn path_mtu_4096_needs_a_9000_byte_netdev() {
    let exe = env!("CARGO_BIN_EXE_rxe-rc-pingpong");
    let outs = pair(
        exe,
        ["127.0.11.9", "127.0.11.10"],
        "18619",
        &[
            "-c",
            "-n",
            "20",
            "-s",
            "65536",
            "-m",
            "4096",
            "--netdev-mtu",
            "9000",
        ],
    );
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
        assert!(
            text(o).contains("20 received messages checked"),
            "{}",
            text(o)
        );
    }
    // On a 1500-byte netdev the active MTU is 1024 and rxe-emu refuses a
    // larger path MTU (kernel rxe 6.1 compares with max_mtu, 4096, and
    // accepts it). The client fails at RTR; the server then sees the
    // exchange cut short.
    let [server, client] = pair(
        exe,
        ["127.0.11.11", "127.0.11.12"],
        "18621",
        &["-n", "5", "-m", "4096", "--netdev-mtu", "1500"],
    );
    assert!(!server.status.success() && !client.status.success());
    assert!(
        text(&server).contains("Failed to modify QP to RTR") && text(&server).contains("path_mtu"),
        "{}",
        text(&server)
    );
}

#[test]
fn chk_catches_a_peer_that_does_not_mark_its_buffer() {
    // The client sends 0x7b everywhere (no -c): the checking server must
    // see that byte 0 is not the 0 that ibv_*_pingpong -c writes.
    let exe = env!("CARGO_BIN_EXE_rxe-rc-pingpong");
    let server = Command::new(exe)
        .args([
            "--ip",
            "127.0.11.13",
            "-p",
            "18623",
            "-c",
            "-n",
            "5",
            "-s",
            "64",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut client = Command::new(exe)
        .args(["--ip", "127.0.11.14", "-p", "18623", "-n", "5", "-s", "64"])
        .arg("127.0.11.13")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let _ = client.kill();
    let _ = client.wait();
    assert!(!server.status.success());
    assert!(
        text(&server).contains("invalid data at offset 0: 0x7b, expected 0x00"),
        "{}",
        text(&server)
    );
}
