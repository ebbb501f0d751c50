//! Device memory and parent domains through the C API: `tests/c/dm_pd.c`,
//! compiled against the system's `<infiniband/verbs.h>` and run on our
//! libibverbs. It checks every error path (errno values as rdma-core's
//! providers and the kernel give them: EINVAL, EFAULT, EBUSY), the
//! dependency order of frees, and RDMA WRITE/READ with device memory as
//! local source, remote target and remote source, with accesses past the
//! DM MR failing cleanly and leaving the bytes beyond it untouched.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn device_memory_and_parent_domains_from_c() {
    if !have_file("/usr/include/infiniband/verbs.h", "libibverbs-dev") || !have_program("cc", "gcc")
    {
        return;
    }
    let _s = serial();
    let dir = scratch_dir("dm-pd");
    let exe = dir.join("dm_pd");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/dm_pd.c");
    // Link against the system's libibverbs (as a program is built), run
    // on ours (LD_LIBRARY_PATH).
    let cc = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-libverbs")
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let d = Daemon::start("dm-pd", "rxe0=127.0.94.1");
    let mut c = d.command(exe.to_str().unwrap());
    c.env("RXE_EMU_DEBUG", "1");
    let (out, timed_out) = wait_limited(c.spawn().unwrap(), Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!timed_out, "dm_pd hung:\n{text}");
    assert!(out.status.success() && text.contains("ALL OK"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
