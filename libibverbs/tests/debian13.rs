//! Debian 13's unmodified programs (rdma-core 56.1, perftest 25.01) on
//! the drop-in, as a Debian 13 user runs them: in a Debian 13 root
//! (`common/debian.rs`: built with `mmdebstrap`, cached, entered with
//! `chroot`, this build at `/opt/rxe-emu`). Every program of the packages
//! that links libibverbs or librdmacm must load with `LD_BIND_NOW`
//! (every symbol and version node it and its providers import, libmlx5
//! included, exists in ours), and perftest's pairs must run to the end.
//! And rdma-core 56.1's own test suite, unmodified, on rxe0.
//! Needs root, `mmdebstrap` and Debian's package registry.

mod common;

use common::debian::{self, Suite};

const TRIXIE: Suite = Suite {
    name: "trixie",
    label: "Debian 13",
    packages: "perftest,ibverbs-utils,rdmacm-utils,ibverbs-providers,python3-pyverbs,iproute2",
};

#[test]
fn debian13_programs_load_and_perftest_25_runs_on_rxe0() {
    let Some(root) = debian::root(&TRIXIE) else {
        return;
    };
    debian::assert_built();
    let _s = common::serial();
    debian::programs_load(&root, 30);
    debian::perftest_pairs(
        &root,
        &[
            "ib_write_bw -s 65536",
            "ib_send_bw -s 65536",
            "ib_read_bw -s 65536",
            "ib_atomic_bw",
            "ib_write_lat",
            "ib_send_lat",
            "ib_read_lat",
            "ib_atomic_lat",
            "ib_write_bw -c UC",
            "ib_send_lat -c UD",
            "ib_send_bw -c UD",
            "ib_write_lat -R",
        ],
    );
}

/// rdma-core 56.1's own test suite (Debian 13's `python3-pyverbs`),
/// unmodified, on rxe0 (`debian::rdma_core_suite`). The anchor, kernel
/// rxe 6.12 under the same suite in a Debian 13 guest (`conformance-tests/run
/// --anchor`): 321 ran, 102 passed, 218 skipped, 0 failed, 1 error
/// (`test_resize_cq`, timing). Here: no failure, no error, every test the
/// kernel passes (`conformance-tests/anchor/linux-6.12.passed`), and at
/// least 150 passed (153 measured on 2026-11-26): the kernel's passes and
/// the tests it skips for what rxe-emu has (device memory, ODP, XRC,
/// parent domains, rereg, extended CQs).
#[test]
fn rdma_core_56_test_suite_on_rxe0() {
    let Some(root) = debian::root(&TRIXIE) else {
        return;
    };
    debian::assert_built();
    let _s = common::serial();
    let run = debian::rdma_core_suite(&root);
    run.assert_clean("rdma-core 56.1", 321, 150);
    debian::assert_passes_what_the_kernel_passes(
        &run.log,
        "6.12",
        include_str!("../../conformance-tests/anchor/linux-6.12.passed"),
    );
}
