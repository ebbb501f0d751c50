//! Open MPI (Debian's openmpi-bin 4.1) on rxe0, unmodified, through
//! `rxe-emu exec`: a C program of ours (`tests/c/mpi_check.c`: point to
//! point from 0 B to 16 MiB with every byte checked, non-blocking and
//! wildcard receives, MPI_Put/Get/Accumulate, Allreduce, Alltoall, Bcast,
//! Barrier) with 2 and 4 ranks, shared memory and TCP excluded: over UCX
//! (rc_verbs, ud_verbs), and over libfabric's verbs provider (verbs;ofi_rxm).
//!
//! Open MPI's openib BTL is not run: Debian's build has no rdmacm
//! connection method and its udcm method refuses RoCE ports, so it cannot
//! connect on kernel rxe either.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(180);

fn mpi_check() -> Option<PathBuf> {
    if !have_program("mpirun", "openmpi-bin") || !have_program("mpicc", "libopenmpi-dev") {
        return None;
    }
    let dir = scratch_dir("mpi");
    let exe = dir.join("mpi_check");
    let out = std::process::Command::new("mpicc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/mpi_check.c"))
        .output()
        .unwrap();
    assert!(out.status.success(), "mpicc: {}", text(&out));
    Some(exe)
}

/// `mpirun -np N <mca...> mpi_check [max]` under `rxe-emu exec`; every
/// rank must say ok and mpirun succeed.
fn run(d: &Rxe, np: usize, mca: &[&str], exe: &PathBuf, max: Option<&str>) {
    let mut c = d.exec("mpirun");
    if is_root() {
        c.arg("--allow-run-as-root");
    }
    c.args(["--oversubscribe", "-np", &np.to_string()])
        .args(mca)
        .arg(exe);
    if let Some(m) = max {
        c.arg(m);
    }
    let (out, timed_out) = wait_limited(c.spawn().unwrap(), LIMIT);
    let t = text(&out);
    assert!(
        !timed_out && out.status.success(),
        "mpirun -np {np} {mca:?}:\n{t}"
    );
    for r in 0..np {
        assert!(
            t.contains(&format!("rank {r} of {np}: ok")),
            "rank {r} of {np} did not pass ({mca:?}):\n{t}"
        );
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"))
    })
}

#[test]
fn open_mpi_over_ucx_2_and_4_ranks() {
    let Some(exe) = mpi_check() else { return };
    let _s = serial();
    let d = Rxe::start("mpi-ucx", "rxe0=127.0.62.1");
    for np in [2, 4] {
        run(&d, np, MPI_OVER_UCX, &exe, None);
    }
}

/// pml cm with libfabric's verbs provider (verbs;ofi_rxm); one-sided
/// through pml (osc pt2pt). Messages up to 8 MiB: the provider takes the
/// port's max_msg_sz, 8 MiB as on kernel rxe (Linux 6.1).
#[test]
fn open_mpi_over_libfabric_verbs_2_and_4_ranks() {
    let Some(exe) = mpi_check() else { return };
    if !have_program("ip", "iproute2") || !have_root("network namespaces") {
        return;
    }
    let _s = serial();
    let ns = Netns::new("rxe-mw-mpi", "10.89.1.1", "10.89.1.2");
    let d = Rxe::start_in(Some(&ns.name), "mpi-ofi", "rxe0=10.89.1.1");
    let mca = [
        "--mca",
        "pml",
        "cm",
        "--mca",
        "mtl",
        "ofi",
        "--mca",
        "mtl_ofi_provider_include",
        "verbs;ofi_rxm",
        "--mca",
        "btl",
        "self",
        "--mca",
        "osc",
        "pt2pt",
    ];
    for np in [2, 4] {
        run(&d, np, &mca, &exe, Some("8388608"));
    }
}
