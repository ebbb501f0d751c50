//! C programs compiled against the system's `<infiniband/verbs.h>` and
//! run on our libibverbs: on-demand paging (`tests/c/odp.c`: ODP and
//! implicit ODP MRs, `ibv_advise_mr` and its errors, RDMA into pages that
//! are no longer mapped failing with an error completion instead of a
//! crash) and XRC (`tests/c/xrc.c`: domains by file, XRC SRQs, XRC_SEND to
//! XRC_RECV traffic, close order).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn on_demand_paging_from_c() {
    run_c("odp", "rxe0=127.0.95.1");
}

#[test]
fn xrc_from_c() {
    run_c("xrc", "rxe0=127.0.95.2");
}

fn run_c(name: &str, device: &str) {
    if !have_file("/usr/include/infiniband/verbs.h", "libibverbs-dev") || !have_program("cc", "gcc")
    {
        return;
    }
    let _s = serial();
    let dir = scratch_dir(name);
    let exe = dir.join(name);
    let src = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
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
    let d = Daemon::start(name, device);
    let mut c = d.command(exe.to_str().unwrap());
    c.env("RXE_EMU_DEBUG", "1");
    let (out, timed_out) = wait_limited(c.spawn().unwrap(), Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!timed_out, "{name} hung:\n{text}");
    assert!(out.status.success() && text.contains("ALL OK"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
