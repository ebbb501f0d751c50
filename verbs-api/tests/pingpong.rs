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
