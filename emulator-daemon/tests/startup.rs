//! What a person reads when rxe-emud cannot start: the daemon's own
//! reason, and from `rxe-emu exec` what to do about it; never Rust debug
//! formatting of an exit status.

use std::net::UdpSocket;
use std::path::PathBuf;
use std::process::Command;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rxe-startup-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_daemon_that_cannot_bind_says_why() {
    // Someone else owns the device's address and port.
    let _owner = UdpSocket::bind("127.0.77.1:4791").unwrap();
    let sock = scratch("spawn").join("rxe-emud.sock");
    let err = emulator_daemon::client::spawn_daemon(
        std::path::Path::new(env!("CARGO_BIN_EXE_rxe-emud")),
        &sock,
        &["rxe0=127.0.77.1".to_string()],
        false,
        true,
    )
    .unwrap_err();
    assert!(
        err.starts_with("rxe-emud could not start: device rxe0: cannot bind UDP 127.0.77.1:4791"),
        "{err}"
    );
    assert!(
        !err.contains("ExitStatus") && !err.contains("Some("),
        "{err}"
    );

    // `rxe-emu exec` adds what to do.
    let out = Command::new(env!("CARGO_BIN_EXE_rxe-emu"))
        .args(["exec", "--device", "rxe0=127.0.77.1", "--", "true"])
        .env("RXE_EMU_SOCKET", scratch("exec").join("rxe-emud.sock"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("cannot bind UDP 127.0.77.1:4791"), "{text}");
    assert!(text.contains("RXE_EMU_SOCKET"), "{text}");
    assert!(text.contains("--device rxe0=127.0.0.2"), "{text}");
    assert!(!text.contains("ExitStatus"), "{text}");
}

#[test]
fn a_daemon_that_dies_before_it_is_ready_is_described_in_words() {
    // A "daemon" that exits at once without a word.
    let err = emulator_daemon::client::spawn_daemon(
        std::path::Path::new("/bin/false"),
        &scratch("false").join("s.sock"),
        &[],
        false,
        true,
    )
    .unwrap_err();
    assert_eq!(
        err, "rxe-emud (/bin/false) exited with status 1 before it was ready",
        "{err}"
    );
}
