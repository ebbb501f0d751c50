//! The verbs an rsocket uses beyond those of `crate::ffi`: memory
//! registration, completion events, and the data-path calls that
//! `verbs.h` inlines through the context's ops (`ibv_post_send`,
//! `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`).

use std::ffi::{c_int, c_void};

use crate::abi::verbs::{
    ibv_comp_channel, ibv_cq, ibv_mr, ibv_pd, ibv_qp, ibv_recv_wr, ibv_send_wr, ibv_wc,
};

#[link(name = "libibverbs.so.1", kind = "dylib", modifiers = "+verbatim")]
extern "C" {
    pub fn ibv_reg_mr(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> *mut ibv_mr;
    pub fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    pub fn ibv_get_cq_event(
        ch: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void,
    ) -> c_int;
    pub fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32);
}

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const IBV_SEND_INLINE: u32 = 8;
pub const IBV_WC_SUCCESS: c_int = 0;
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;

/// `ibv_poll_cq` (verbs.h inline): up to `wc.len()` completions.
///
/// # Safety
/// `cq` is a live CQ.
pub unsafe fn poll_cq(cq: *mut ibv_cq, wc: &mut [ibv_wc]) -> c_int {
    // SAFETY: as the caller promises; the ops table is the provider's.
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(f) => f(cq, wc.len() as c_int, wc.as_mut_ptr()),
            None => -libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_req_notify_cq` (verbs.h inline).
///
/// # Safety
/// `cq` is a live CQ.
pub unsafe fn req_notify_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: as above.
    unsafe {
        match (*(*cq).context).ops.req_notify_cq {
            Some(f) => f(cq, 0),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_post_send` (verbs.h inline): 0 or an errno.
///
/// # Safety
/// `qp` is live; `wr` and its SGEs are valid for the call.
pub unsafe fn post_send(qp: *mut ibv_qp, wr: &mut ibv_send_wr) -> c_int {
    let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
    // SAFETY: as the caller promises.
    unsafe {
        match (*(*qp).context).ops.post_send {
            Some(f) => f(qp, wr, &mut bad),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_post_recv` (verbs.h inline): 0 or an errno.
///
/// # Safety
/// `qp` is live; `wr` is valid for the call.
pub unsafe fn post_recv(qp: *mut ibv_qp, wr: &mut ibv_recv_wr) -> c_int {
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    // SAFETY: as the caller promises.
    unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(f) => f(qp, wr, &mut bad),
            None => libc::EOPNOTSUPP,
        }
    }
}
