//! # rxe-librdmacm: a drop-in `librdmacm.so.1` over rxe-emud
//!
//! Programs built against rdma-core's librdmacm (`rping`, `ucmatose`,
//! `udaddy`, perftest with `-R`, ...) load this library instead of the
//! system's when `LD_LIBRARY_PATH` names its directory (`rxe-emu exec`
//! does that), and connect over the rxe-emu devices of the running
//! `rxe-emud`.
//!
//! It has the shape of rdma-core's librdmacm over the kernel's ucma:
//! the connection manager itself (IB CM MADs on QP1, port spaces, service
//! IDs, address and route resolution) runs in the daemon, which this
//! library reaches through `emulator_daemon::cm_client` (one command
//! connection per process, one `SOCK_SEQPACKET` socket per event
//! channel; see `emulator_daemon::cmproto`). The library keeps the C
//! `struct rdma_cm_id`s and moves QPs through INIT, RTR and RTS itself
//! with the public verbs, with the attributes kernel rdma_cm would give
//! them; it links against `libibverbs.so.1`, which at run time is our
//! drop-in.
//!
//! Rules this crate keeps (as `rxe-libibverbs` does):
//! - It never exits, aborts or unwinds into C: every entry point catches
//!   panics and reports an error (`EIO`).
//! - It prints nothing unless `RXE_EMU_DEBUG=1` asks for messages on
//!   stderr (why a call failed, in words).
//! - If the daemon goes away, calls fail with `ENODEV` and blocked
//!   `rdma_get_cm_event` calls return `ENODEV`: nothing hangs.
//!
//! Not implemented: rsockets (`rsocket`, `rbind`, ..., exported so that
//! programs load, failing with `ENOSYS`), `AF_IB` addresses and IB path
//! records (`RDMA_OPTION_IB_PATH`): RoCE has no subnet administrator.

#![allow(clippy::missing_safety_doc)]

mod abi;
mod addrinfo;
mod conn;
mod device;
mod ep;
mod event;
mod ffi;
mod id;
mod mcast;
mod qp;
mod rsocket;
mod sockaddr;

include!(concat!(env!("OUT_DIR"), "/symver.rs"));

use std::ffi::c_int;

use emulator_daemon::cmproto::CmErr;

/// Set the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// `RXE_EMU_DEBUG` is set to something other than `0`.
pub(crate) fn debug_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RXE_EMU_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Say something on stderr when `RXE_EMU_DEBUG` asks for it.
pub(crate) fn debug(msg: impl FnOnce() -> String) {
    if debug_on() {
        eprintln!("rxe-emu librdmacm: {}", msg());
    }
}

/// Fail a call: log why (debug only), set errno, return -1.
pub(crate) fn fail(what: &str, e: &CmErr) -> c_int {
    debug(|| format!("{what}: {e}"));
    set_errno(e.errno);
    -1
}

/// Shorthand for an error with an errno and words.
pub(crate) fn err(errno: c_int, msg: impl Into<String>) -> CmErr {
    CmErr::new(errno, msg)
}

/// `Ok(())` → 0; `Err` → errno set, -1.
pub(crate) fn ret(what: &str, r: Result<(), CmErr>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(what, &e),
    }
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

/// Run a call that returns 0 or -1 with errno, under [`guard`].
pub(crate) fn call(what: &str, f: impl FnOnce() -> Result<(), CmErr>) -> c_int {
    guard(what, -1, || ret(what, f()))
}
