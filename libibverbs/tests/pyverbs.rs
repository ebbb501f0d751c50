//! rdma-core's own test suite (Debian's python3-pyverbs ships it under
//! /usr/share/doc/rdma-core/tests), run unmodified by the system Python
//! against rxe0 on our libibverbs: zero failures, zero errors, and at
//! least the tests that pass on rxe-emu today must pass.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// Copy the suite and gunzip its compressed files, as the Debian docs ask.
fn unpack(dst: &Path) {
    let st = Command::new("cp")
        .args(["-r", SUITE])
        .arg(dst)
        .status()
        .unwrap();
    assert!(st.success(), "cp -r {SUITE}");
    let st = Command::new("sh")
        .arg("-c")
        .arg("find . -name '*.gz' -exec gunzip -f {} +")
        .current_dir(dst)
        .status()
        .unwrap();
    assert!(st.success(), "gunzip the suite");
}

/// Tests that must pass: each one covers a fix (GID index 0 traffic,
/// atomics, type 2 windows, rereg, import, CQ purge on reset) or a verb
/// kernel rxe passes.
const MUST_PASS: &[&str] = &[
    "test_atomic_cmp_and_swap",
    "test_atomic_fetch_and_add",
    "test_atomic_invalid_rkey",
    "test_mw_type2",
    "test_mw_type2_invalidate_dealloc",
    "test_mr_rereg_access",
    "test_mr_rereg_addr",
    "test_imported_rc_ex_rdma_write",
    "test_resize_cq",
    "test_cq_events_rc",
    "test_qp_ex_rc_rdma_write",
    "test_create_rc_qp_ex_no_attr",
    // Kernel rxe 6.1 errors here (no ATOMIC WRITE before Linux 6.2).
    "test_qp_ex_rc_atomic_write",
    // Device memory, which kernel rxe lacks (process memory here).
    "test_create_dm",
    "test_destroy_dm",
    "test_create_dm_bad_flow",
    "test_destroy_dm_bad_flow",
    "test_dm_write",
    "test_dm_write_bad_flow",
    "test_dm_read",
    "test_multi_process_alloc_dm",
    "test_import_dm",
    "test_create_dm_mr",
    "test_dm_bad_access",
    "test_dm_bad_registration",
    "test_dm_traffic",
    "test_dm_remote_traffic",
    // Parent domains, which kernel rxe lacks.
    "test_without_allocators_rc_traffic",
    "test_default_allocators_rc_traffic",
    "test_mem_align_rc_traffic",
    "test_mem_align_ud_traffic",
    "test_mem_align_srq_excq_rc_traffic",
    // On-demand paging, which kernel rxe 6.1 lacks (the huge-page ones
    // need 2 MiB pages, the XRC one XRC).
    "test_odp_rc_traffic",
    "test_odp_ud_traffic",
    "test_odp_rc_srq_traffic",
    "test_odp_rc_rdma_read",
    "test_odp_rc_rdma_write",
    "test_odp_rc_atomic_cmp_and_swp",
    "test_odp_rc_atomic_fetch_and_add",
    "test_odp_implicit_rc_traffic",
    "test_odp_sync_prefetch_rc_traffic",
    "test_odp_async_prefetch_rc_traffic",
    "test_odp_implicit_sync_prefetch_rc_traffic",
    "test_odp_implicit_async_prefetch_rc_traffic",
    "test_odp_prefetch_sync_no_page_fault_rc_traffic",
    "test_odp_prefetch_async_no_page_fault_rc_traffic",
    // XRC, which kernel rxe lacks.
    "test_odp_xrc_traffic",
    "test_xrc_atomic_cmp_and_swap",
    "test_xrc_atomic_fetch_and_add",
    "test_xrc_traffic_cq_ex",
    "test_qp_ex_xrc_send",
    "test_qp_ex_xrc_send_imm",
    "test_ro_xrc_traffic",
];

#[test]
fn rdma_core_test_suite_passes_on_rxe0() {
    if !have_file(SUITE, "python3-pyverbs") || !have_program("python3", "python3") {
        return;
    }
    let _s = serial();
    let dir = scratch_dir("pyverbs");
    unpack(&dir);
    let d = Daemon::start_with_slots("pyverbs", "rxe0=127.0.93.1", 64);
    // run_tests.py is in tests/; the suite imports `tests.*` from its parent.
    let mut c = d.command("/usr/bin/python3");
    c.args(["tests/run_tests.py", "--dev", "rxe0", "-v"])
        .current_dir(&dir);
    let (out, timed_out) = wait_limited(c.spawn().unwrap(), Duration::from_secs(900));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!timed_out, "the suite hung:\n{log}");
    let results = unittest_results(&log);
    let passed: Vec<&str> = results
        .iter()
        .filter(|r| r.1 == "ok")
        .map(|r| r.0)
        .collect();
    let bad: Vec<&(&str, &str)> = results
        .iter()
        .filter(|r| r.1 == "ERROR" || r.1 == "FAIL")
        .collect();
    let ran = log
        .lines()
        .find_map(|l| l.strip_prefix("Ran "))
        .unwrap_or("?");
    eprintln!("pyverbs: ran {ran}; {} passed", passed.len());
    assert!(bad.is_empty(), "failures/errors: {bad:#?}\n{log}");
    assert!(out.status.success(), "run_tests.py failed:\n{log}");
    for t in MUST_PASS {
        assert!(passed.contains(t), "{t} did not pass:\n{log}");
    }
    // Kernel rxe (Linux 6.1) passes 86 (`conformance-tests/run --anchor`);
    // rxe-emu passes each of those, and more.
    assert!(passed.len() >= 132, "only {} passed:\n{log}", passed.len());
    debian::assert_passes_what_the_kernel_passes(
        &log,
        "6.1",
        include_str!("../../conformance-tests/anchor/linux-6.1.passed"),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The RDMA CM tests of rdma-core's suite (`test_rdmacm.py`): both
/// processes of each test find rxe0's address through
/// `/sys/class/infiniband/rxe0/device/net/` (`rxe-emu exec` shows the
/// device there) and connect through our librdmacm. They run in a network
/// namespace of their own, where rxe0 is on `lo`'s only address,
/// 127.0.0.1, the address the suite picks.
#[test]
fn rdma_core_rdmacm_tests_pass_on_rxe0() {
    if !have_file(SUITE, "python3-pyverbs")
        || !have_program("python3", "python3")
        || !have_program("ip", "iproute2")
        || !have_root("network namespaces")
    {
        return;
    }
    let lib = profile_dir().join("librdmacm.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo build --release --workspace",
        lib.display()
    );
    let _s = serial();
    let dir = scratch_dir("pyverbs-cm");
    unpack(&dir);
    let ns = format!("rxe-pycm-{}", std::process::id());
    let ip = |args: &[&str]| {
        let st = Command::new("ip").args(args).status().unwrap();
        assert!(st.success(), "ip {args:?}");
    };
    ip(&["netns", "add", &ns]);
    ip(&["-n", &ns, "link", "set", "lo", "up"]);
    let socket = dir.join("rxe-emud.sock");
    let cli = profile_dir().join("rxe-emu");
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns])
        .arg(&cli)
        .arg("--socket")
        .arg(&socket)
        .args(["exec", "--device", "rxe0=127.0.0.1", "--"])
        .args([
            "/usr/bin/python3",
            "tests/run_tests.py",
            "--dev",
            "rxe0",
            "-v",
            "-k",
            "rdmacm",
        ])
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RXE_EMU_MODE")
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let (out, timed_out) = wait_limited(c.spawn().unwrap(), Duration::from_secs(600));
    let _ = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(&cli)
        .arg("--socket")
        .arg(&socket)
        .arg("stop")
        .output();
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!timed_out, "the rdmacm tests hung:\n{log}");
    let count = |what: &str| log.lines().filter(|l| l.ends_with(what)).count();
    let ok = count("... ok");
    let skipped = log.lines().filter(|l| l.contains("... skipped")).count();
    eprintln!("pyverbs rdmacm: {ok} passed, {skipped} skipped");
    for l in log.lines().filter(|l| l.contains(" ... ")) {
        eprintln!("  {l}");
    }
    assert!(out.status.success(), "test_rdmacm failed:\n{log}");
    assert!(
        !log.contains("... ERROR") && !log.contains("... FAIL"),
        "{log}"
    );
    assert!(ok >= 10, "only {ok} passed:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
