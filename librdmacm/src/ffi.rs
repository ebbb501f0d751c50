//! The libibverbs functions we call (exported by `libibverbs.so.1`, ours
//! at run time), and the two that `verbs.h` inlines through the
//! `verbs_context` (`ibv_create_qp_ex`, `ibv_create_srq_ex`).

use std::ffi::{c_char, c_int, c_void};

use crate::abi::ibv_ece;
use crate::abi::verbs::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_device, ibv_device_attr, ibv_gid, ibv_pd,
    ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_srq,
    ibv_srq_init_attr, ibv_srq_init_attr_ex, verbs_context, VERBS_ABI_IS_EXTENDED,
};

#[link(name = "libibverbs.so.1", kind = "dylib", modifiers = "+verbatim")]
extern "C" {
    pub fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device;
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char;
    pub fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context;
    pub fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    pub fn ibv_query_port(ctx: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int;
    pub fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid)
        -> c_int;
    pub fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd;
    pub fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    pub fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    pub fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel;
    pub fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int;
    pub fn ibv_create_cq(
        ctx: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
    pub fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;
    pub fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
    pub fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
    pub fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int;
}

/// The `verbs_context` in front of `ctx`, if the provider has one.
///
/// # Safety
/// `ctx` is a live context from `ibv_open_device`.
unsafe fn verbs_ctx(ctx: *mut ibv_context) -> Option<*mut verbs_context> {
    // SAFETY: the caller's ctx is live; abi_compat says whether a
    // verbs_context precedes it (verbs.h's verbs_get_ctx).
    unsafe {
        if (*ctx).abi_compat != VERBS_ABI_IS_EXTENDED {
            return None;
        }
        let off = std::mem::offset_of!(verbs_context, context);
        Some((ctx as *mut u8).sub(off) as *mut verbs_context)
    }
}

/// `verbs.h`'s inline `ibv_create_qp_ex`.
///
/// # Safety
/// `ctx` is live and `attr` valid.
pub unsafe fn ibv_create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: as the caller promises; a comp_mask of only PD is the
    // plain ibv_create_qp, as verbs.h does it.
    unsafe {
        if (*attr).comp_mask == crate::abi::IBV_QP_INIT_ATTR_PD {
            return ibv_create_qp((*attr).pd, attr as *mut ibv_qp_init_attr);
        }
        match verbs_ctx(ctx).and_then(|v| (*v).create_qp_ex) {
            Some(f) => f(ctx, attr),
            None => {
                crate::set_errno(libc::EOPNOTSUPP);
                std::ptr::null_mut()
            }
        }
    }
}

/// `verbs.h`'s inline `ibv_create_srq_ex`.
///
/// # Safety
/// `ctx` is live and `attr` valid.
pub unsafe fn ibv_create_srq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    // SAFETY: as the caller promises; verbs.h sends a basic SRQ with a PD
    // to ibv_create_srq.
    unsafe {
        let basic = crate::abi::IBV_SRQ_INIT_ATTR_TYPE | crate::abi::IBV_SRQ_INIT_ATTR_PD;
        if (*attr).comp_mask & !basic == 0
            && (*attr).comp_mask & crate::abi::IBV_SRQ_INIT_ATTR_PD != 0
            && ((*attr).comp_mask & crate::abi::IBV_SRQ_INIT_ATTR_TYPE == 0
                || (*attr).srq_type == crate::abi::IBV_SRQT_BASIC)
        {
            return ibv_create_srq((*attr).pd, attr as *mut ibv_srq_init_attr);
        }
        match verbs_ctx(ctx).and_then(|v| (*v).create_srq_ex) {
            Some(f) => f(ctx, attr),
            None => {
                crate::set_errno(libc::EOPNOTSUPP);
                std::ptr::null_mut()
            }
        }
    }
}
