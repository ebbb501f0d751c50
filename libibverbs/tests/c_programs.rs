//! C programs compiled against the system's `<infiniband/verbs.h>` and
//! run on our libibverbs, each ending with "ALL OK": device memory and
//! parent domains (`tests/c/dm_pd.c`: every error path, with errno values
//! as rdma-core's providers and the kernel give them, the dependency order
//! of frees, and RDMA with DM as local source, remote target and remote
//! source, accesses past the DM MR failing and leaving the bytes beyond it
//! untouched), on-demand paging (`tests/c/odp.c`: ODP and
//! implicit ODP MRs, `ibv_advise_mr` and its errors, RDMA into pages that
//! are no longer mapped failing with an error completion instead of a
//! crash) and XRC (`tests/c/xrc.c`: domains by file, XRC SRQs, XRC_SEND to
//! XRC_RECV traffic, close order) and the `ibv_wr_*` inline and SGE
//! list rules (`tests/c/wr_inline.c`: a list of inline buffers is bounded
//! by `max_inline_data`, not `max_send_sge`; ENOSPC and EINVAL where the
//! rxe provider gives them) and FLUSH (`tests/c/flush.c`: `ibv_wr_flush`
//! of a range and of a whole MR completing as IBV_WC_FLUSH, a FLUSH of an
//! MR without IBV_ACCESS_FLUSH_GLOBAL failing with IBV_WC_REM_ACCESS_ERR,
//! IBV_ACCESS_FLUSH_PERSISTENT refused at registration, the capability
//! bits) and registered memory in shared memory (`tests/c/shared_mr.c`:
//! an MR's whole pages move into a memfd with their contents, a peer's
//! WRITEs reach a process that only watches memory, a forked child gets
//! a private copy, a WRITE whose payload the target saw and deregistered
//! on at once still succeeds, deregistration makes them private again,
//! and nothing moves while the application has a second thread), WRITEs
//! of several packets placed into a process that watches memory
//! (`tests/c/write_placed.c`), and chains given to one `ibv_post_send`
//! and `ibv_wr_*` batches (`tests/c/write_chain.c`: posted whole before
//! their packets leave, so a WRITE with work behind it is never placed by
//! its sender; a refused WR named in `bad_wr`, those before it sent).
//! `wr_inline.c` also checks that a UD batch with a send lacking an
//! address fails whole (EINVAL, nothing sent). READ responses placed by
//! their responder into a requester's MR of local write access
//! (`tests/c/read_placed.c`: all of a READ's responses placed, every byte
//! where it belongs; a last response too short to place, a READ too
//! short to hint, and a READ into an MR without local write access, which
//! fails, placed nothing), and none placed once the READ can no longer
//! take them (`tests/c/read_placed_end.c`: its destination MR
//! deregistered, its QP moved to ERR or destroyed while its responses
//! are being placed; not a byte written after the call returns).

mod common;

use std::time::Duration;

use common::*;

#[test]
fn device_memory_and_parent_domains_from_c() {
    run_c("dm_pd", "rxe0=127.0.94.2");
}

#[test]
fn on_demand_paging_from_c() {
    run_c("odp", "rxe0=127.0.95.1");
}

#[test]
fn xrc_from_c() {
    run_c("xrc", "rxe0=127.0.95.2");
}

#[test]
fn inline_data_and_sge_lists_of_the_wr_api_from_c() {
    run_c("wr_inline", "rxe0=127.0.95.3");
}

#[test]
fn flush_from_c() {
    run_c("flush", "rxe0=127.0.95.4");
}

#[test]
fn registered_memory_in_shared_memory_from_c() {
    run_c("shared_mr", "rxe0=127.0.95.5");
}

#[test]
fn multi_packet_writes_into_a_process_that_watches_memory_from_c() {
    run_c("write_placed", "rxe0=127.0.95.6");
}

#[test]
fn a_chain_is_posted_whole_and_only_its_last_write_may_be_placed_from_c() {
    run_c("write_chain", "rxe0=127.0.95.7");
}

#[test]
fn read_responses_placed_by_their_responder_from_c() {
    run_c("read_placed", "rxe0=127.0.95.8");
}

#[test]
fn a_read_cut_short_by_dereg_err_or_destroy_is_placed_no_further_from_c() {
    run_c("read_placed_end", "rxe0=127.0.95.9");
}

fn run_c(name: &str, device: &str) {
    let dir = scratch_dir(name);
    let Some(exe) = compile_c(name, &dir) else {
        return;
    };
    let _s = serial();
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
