//! `tests/c/cm_edges.c`, compiled against the system's `<rdma/rdma_cma.h>`
//! and run on our librdmacm: a listener rejects with private data and the
//! client sees RDMA_CM_EVENT_REJECTED with status 28 (consumer reject),
//! that private data and its QP in ERR, and EAGAIN from a non-blocking
//! channel, and EINVAL for a destroyed id used again; a connection to an
//! address where no CM answers ends in
//! RDMA_CM_EVENT_UNREACHABLE with status -110 (after kernel cm's 16 REQ
//! timeouts, about 100 s), never a hang; with no daemon,
//! rdma_create_event_channel fails with ENODEV. And `tests/c/cm_addrinfo.c`,
//! linked against our librdmacm: rdma-core v60's RDMACM_1.4 calls.

#[path = "../../libibverbs/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// Compile `tests/c/<name>.c` with `-lrdmacm -libverbs` into `dir`.
fn compile_c(name: &str, dir: &Path) -> Option<PathBuf> {
    if !have_file("/usr/include/rdma/rdma_cma.h", "librdmacm-dev") || !have_program("cc", "gcc") {
        return None;
    }
    let exe = dir.join(name);
    let src = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    Some(exe)
}

/// Compile `tests/c/<name>.c` and link it against our librdmacm, as a
/// program built against rdma-core v60+ is linked (it uses RDMACM_1.4,
/// which Debian 12's librdmacm lacks).
fn compile_c_against_ours(name: &str, dir: &Path) -> Option<PathBuf> {
    if !have_file("/usr/include/rdma/rdma_cma.h", "librdmacm-dev") || !have_program("cc", "gcc") {
        return None;
    }
    let libs = dropin_dir();
    let exe = dir.join(name);
    let src = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&exe)
        .arg(src)
        .arg(libs.join("librdmacm.so.1"))
        .arg(format!("-Wl,-rpath-link,{}", libs.display()))
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    Some(exe)
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn reject_with_private_data_reaches_the_client() {
    let dir = scratch_dir("reject");
    let Some(exe) = compile_c("cm_edges", &dir) else {
        return;
    };
    let exe = exe.to_str().unwrap();
    let _s = serial();
    let a = "127.0.98.1";
    let d = Daemon::start("reject", &format!("rxe0={a}"));
    let r = client_server_retrying(
        &d,
        (exe, &["server", a, "7100"]),
        (exe, &["client", a, "7100"]),
        Duration::from_secs(30),
    );
    assert!(r.ok(), "{}", r.text());
    let (s, c) = r.stdout();
    assert!(s.contains("OK server rejected"), "{}", r.text());
    assert!(
        c.contains("OK rejected status=28 private_data=\"go away!\", destroyed id refused"),
        "{}",
        r.text()
    );
}

/// Retry counts above 7 (libfabric asks for 15) are capped at 7 as
/// kernel rdma_cm caps them, on both sides: the connection is made and
/// the QP gets 7, instead of the QP refusing the count at RTS.
#[test]
fn retry_counts_above_7_are_capped_as_kernel_rdma_cm_caps_them() {
    let dir = scratch_dir("retries");
    let Some(exe) = compile_c("cm_edges", &dir) else {
        return;
    };
    let exe = exe.to_str().unwrap();
    let _s = serial();
    let a = "127.0.98.4";
    let d = Daemon::start("retries", &format!("rxe0={a}"));
    let r = client_server_retrying(
        &d,
        (exe, &["acceptor", a, "7103"]),
        (exe, &["retries", a, "7103"]),
        Duration::from_secs(30),
    );
    assert!(r.ok(), "{}", r.text());
    let (s, c) = r.stdout();
    assert!(s.contains("OK acceptor"), "{}", r.text());
    assert!(c.contains("OK retries capped at 7"), "{}", r.text());
}

#[test]
fn no_daemon_is_enodev_and_dgram_rsockets_are_enosys() {
    let dir = scratch_dir("nodaemon");
    let Some(exe) = compile_c("cm_edges", &dir) else {
        return;
    };
    let out = Command::new(&exe)
        .arg("nodaemon")
        .env("LD_LIBRARY_PATH", dropin_dir())
        .env("RXE_EMU_SOCKET", dir.join("no-daemon-here.sock"))
        .env("RXE_EMU_AUTOSTART", "0")
        .env_remove("RXE_EMU_MODE")
        .output()
        .unwrap();
    assert!(
        out.status.success() && text(&out).contains("OK nodaemon"),
        "{}",
        text(&out)
    );
}

/// The peer host is gone: nothing answers the REQ at 127.0.98.3 (no
/// device there), so the CM gives up after kernel cm's retries.
#[test]
fn vanished_peer_is_unreachable_not_a_hang() {
    let dir = scratch_dir("unreachable");
    let Some(exe) = compile_c("cm_edges", &dir) else {
        return;
    };
    // Mostly idle waiting: no serial() lock, so other tests run meanwhile.
    let d = Daemon::start("unreachable", "rxe0=127.0.98.2");
    let child = d
        .command(exe.to_str().unwrap())
        .args(["unreachable", "127.0.98.2", "127.0.98.3", "7101"])
        .spawn()
        .unwrap();
    let (out, timed_out) = wait_limited(child, Duration::from_secs(200));
    assert!(!timed_out, "hung:\n{}", text(&out));
    assert!(
        out.status.success() && text(&out).contains("OK unreachable status=-110"),
        "{}",
        text(&out)
    );
}

/// rdma-core v60's RDMACM_1.4 (`tests/c/cm_addrinfo.c`, linked against
/// our library): rdma_write_cm_event's USER event read back with its
/// status and arg (on a thread it wakes, and after rdma_migrate_id),
/// rdma_resolve_addrinfo's ADDRINFO_RESOLVED and rdma_query_addrinfo's
/// list, and the errors rdma-core gives (EINVAL, EBUSY, ENOENT,
/// EAI_NONAME with no event, EOPNOTSUPP for RAI_SA).
#[test]
fn resolve_query_addrinfo_and_user_events() {
    let dir = scratch_dir("addrinfo");
    let Some(exe) = compile_c_against_ours("cm_addrinfo", &dir) else {
        return;
    };
    let _s = serial();
    let a = "127.0.98.5";
    let d = Daemon::start("addrinfo", &format!("rxe0={a}"));
    let child = d.command(exe.to_str().unwrap()).arg(a).spawn().unwrap();
    let (out, timed_out) = wait_limited(child, Duration::from_secs(60));
    assert!(!timed_out, "hung:\n{}", text(&out));
    assert!(
        out.status.success() && text(&out).contains("OK addrinfo and user events"),
        "{}",
        text(&out)
    );
}
