//! On-demand paging through the C API (`tests/c/odp.c`, compiled against
//! the system's `<infiniband/verbs.h>`, run on our libibverbs): ODP and
//! implicit ODP MRs, `ibv_advise_mr` and its errors, and RDMA into pages
//! that are no longer mapped failing with an error completion instead of
//! a crash.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn on_demand_paging_from_c() {
    if !have_file("/usr/include/infiniband/verbs.h", "libibverbs-dev") || !have_program("cc", "gcc")
    {
        return;
    }
    let _s = serial();
    let dir = scratch_dir("odp");
    let exe = dir.join("odp");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/odp.c");
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
    let d = Daemon::start("odp", "rxe0=127.0.95.1");
    let mut c = d.command(exe.to_str().unwrap());
    c.env("RXE_EMU_DEBUG", "1");
    let (out, timed_out) = wait_limited(c.spawn().unwrap(), Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!timed_out, "odp hung:\n{text}");
    assert!(out.status.success() && text.contains("ALL OK"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
