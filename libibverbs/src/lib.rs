//! # rxe-libibverbs: a drop-in `libibverbs.so.1` over rxe-emu
//!
//! Programs built against rdma-core (C, C++, Python through pyverbs) load
//! this library instead of the system's when `LD_LIBRARY_PATH` names its
//! directory (`rxe-emu exec` does that). They then find the rxe-emu
//! devices (`rxe0`) of the running `rxe-emud`, with no kernel module, no
//! `/dev/infiniband` and no root.
//!
//! It is a thin C layer over `verbs-api`: every object a program gets is a
//! C struct of `<infiniband/verbs.h>` embedded at the start of a Rust
//! object that owns the `verbs-api` one. The inline functions of
//! `verbs.h` (`ibv_post_send`, `ibv_poll_cq`, `ibv_wr_*`, `ibv_start_poll`,
//! `ibv_query_port`, ...) call through function pointers we fill in
//! (`ibv_context.ops`, the `verbs_context` before it, `ibv_qp_ex`,
//! `ibv_cq_ex`); the exported functions carry rdma-core's version nodes
//! (see `build.rs` and `exports.txt`).
//!
//! Rules this crate keeps:
//! - It never exits, aborts or unwinds into C: every entry point catches
//!   panics and reports an error (`EIO`).
//! - It prints nothing unless `RXE_EMU_DEBUG=1` asks for messages on
//!   stderr (why a call failed, in words).
//! - Unsupported verbs fail as they do on kernel rxe (`EOPNOTSUPP`).
//!
//! The whole crate is a C ABI, so its functions are `unsafe extern "C"`
//! and trust the pointers C hands them as libibverbs does; each unsafe
//! block says which pointer it relies on.

#![allow(clippy::missing_safety_doc)]

mod abi;
mod buf;
mod device;
mod dm;
mod domain;
mod objects;
mod post;
mod strings;
mod stubs;
mod xrc;

include!(concat!(env!("OUT_DIR"), "/symver.rs"));

use std::ffi::c_int;

/// Set the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// `RXE_EMU_DEBUG` is set to something other than `0`.
pub(crate) fn debug_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RXE_EMU_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Say why a call failed, on stderr, when `RXE_EMU_DEBUG` asks for it.
pub(crate) fn debug(msg: impl FnOnce() -> String) {
    if debug_on() {
        eprintln!("rxe-emu libibverbs: {}", msg());
    }
}

/// Report a `verbs_api` error: log it (debug only) and return its errno.
pub(crate) fn fail(what: &str, e: &verbs_api::Error) -> c_int {
    debug(|| format!("{what}: {e}"));
    e.errno()
}

/// Run `f`, turning a panic into `on_panic` (no unwinding into C).
pub(crate) fn guard<T>(what: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            debug(|| format!("{what}: internal error (panic); reported as EIO"));
            set_errno(libc::EIO);
            on_panic
        }
    }
}
