//! Thread domains (`ibv_alloc_td`) and parent domains
//! (`ibv_alloc_parent_domain`), which kernel rxe's provider lacks and
//! rdma-core's mlx5 provider has.
//!
//! A parent domain is an `ibv_pd` usable wherever a PD is: QPs, SRQs, MRs,
//! MWs and AHs created through it belong to its protection domain, and an
//! extended CQ may name it (`IBV_CQ_INIT_ATTR_MASK_PD`). Here it is a
//! [`Pd`] whose `ProtectionDomain` is a non-owning handle on the protection
//! domain's PD, so every verb taking a PD works on it unchanged.
//!
//! A thread domain promises that the objects of a parent domain built on
//! it are used by one thread at a time, so a provider may skip locks.
//! rxe-emu's engine sits behind one device lock either way, so a thread
//! domain changes no behaviour; it exists, is counted, and is checked.
//!
//! Custom allocators (`IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`) are what
//! mlx5 calls for the queue buffers and doorbell records it shares with
//! the hardware. rxe-emu allocates no such buffers: work queues and
//! completion queues live in the engine's own memory, never in memory the
//! program provides or the device maps. So the allocators are kept with
//! the parent domain and never called, which is what a provider without
//! such buffers does (the program's allocator would only be asked for
//! memory nobody uses).
//!
//! Freeing follows mlx5: a PD with parent domains, a parent domain with
//! objects, and a thread domain with parent domains fail with EBUSY.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::abi::*;
use crate::device::ctx;
use crate::objects::{pd, Pd};
use crate::{debug, fail, guard, set_errno};

fn null_with<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// `IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS`, `_PD_CONTEXT`.
const PARENT_DOMAIN_INIT_ATTR_ALLOCATORS: u32 = 1;
const PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT: u32 = 2;

type AllocFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, usize, u64) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, *mut c_void, u64);

/// What makes a [`Pd`] a parent domain.
pub struct ParentDomain {
    /// The protection domain (a plain PD of the same context).
    pub protection: *mut ibv_pd,
    /// The thread domain, or NULL.
    pub td: *mut ibv_td,
    /// The program's allocators and their context, kept as given (see the
    /// module documentation for why they are not called).
    #[allow(dead_code)]
    pub alloc: Option<AllocFn>,
    #[allow(dead_code)]
    pub free: Option<FreeFn>,
    #[allow(dead_code)]
    pub pd_context: *mut c_void,
}

impl ParentDomain {
    /// The parent domain is being freed: it no longer counts on its PD
    /// and thread domain.
    pub fn release(self) {
        // SAFETY: the PD and TD cannot be freed while this parent domain
        // counts on them, so both are live.
        unsafe {
            pd(self.protection).users.fetch_sub(1, Ordering::AcqRel);
            if !self.td.is_null() {
                td(self.td).users.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

#[repr(C)]
pub struct Td {
    pub ibv: ibv_td,
    /// Parent domains built on this thread domain.
    pub users: AtomicU32,
}

/// # Safety
/// `t` must be a thread domain we handed out and not freed.
unsafe fn td<'a>(t: *mut ibv_td) -> &'a Td {
    // SAFETY: ibv_td is the first field of the repr(C) Td.
    unsafe { &*(t as *const Td) }
}

/// `ibv_alloc_td`: `attr->comp_mask` must be 0 (no fields are defined).
pub unsafe extern "C" fn alloc_td(c: *mut ibv_context, attr: *mut c_void) -> *mut ibv_td {
    if c.is_null() || attr.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: struct ibv_td_init_attr { uint32_t comp_mask; }.
    let comp_mask = unsafe { *(attr as *const u32) };
    if comp_mask != 0 {
        debug(|| format!("ibv_alloc_td: unknown comp_mask {comp_mask:#x}"));
        return null_with(libc::EINVAL);
    }
    guard("ibv_alloc_td", std::ptr::null_mut(), || {
        Box::into_raw(Box::new(Td {
            ibv: ibv_td { context: c },
            users: AtomicU32::new(0),
        })) as *mut ibv_td
    })
}

/// `ibv_dealloc_td`: EBUSY while a parent domain uses it.
pub unsafe extern "C" fn dealloc_td(t: *mut ibv_td) -> c_int {
    if t.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_dealloc_td", libc::EIO, || {
        // SAFETY: a live thread domain we handed out.
        let users = unsafe { td(t) }.users.load(Ordering::Acquire);
        if users != 0 {
            debug(|| format!("ibv_dealloc_td: still used by {users} parent domains"));
            return libc::EBUSY;
        }
        // SAFETY: ownership comes back here.
        drop(unsafe { Box::from_raw(t as *mut Td) });
        0
    })
}

/// `ibv_alloc_parent_domain`, with libibverbs' and mlx5's checks: known
/// `comp_mask` bits only, a PD (not another parent domain) of this
/// context, a thread domain (if any) of this context.
pub unsafe extern "C" fn alloc_parent_domain(
    c: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    if c.is_null() || attr.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_alloc_parent_domain", std::ptr::null_mut(), || {
        // SAFETY: caller-provided attributes.
        let a = unsafe { &*attr };
        let known = PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
        // rdma-core 65's IBV_PARENT_DOMAIN_INIT_ATTR_ALLOW_CC_UNPROTECTED_ALLOC
        // (memory shared with the host of a confidential-computing guest):
        // a feature this device does not have, EOPNOTSUPP as from a
        // provider without it (rdma-core 65's test_buf skips on it);
        // unknown bits stay EINVAL.
        const ALLOW_CC_UNPROTECTED_ALLOC: u32 = 1 << 2;
        if a.comp_mask & ALLOW_CC_UNPROTECTED_ALLOC != 0 {
            debug(|| {
                "ibv_alloc_parent_domain: IBV_PARENT_DOMAIN_INIT_ATTR_ALLOW_CC_UNPROTECTED_ALLOC is not supported".into()
            });
            return null_with(libc::EOPNOTSUPP);
        }
        if a.comp_mask & !known != 0 {
            debug(|| {
                format!(
                    "ibv_alloc_parent_domain: unknown comp_mask bits {:#x}",
                    a.comp_mask & !known
                )
            });
            return null_with(libc::EINVAL);
        }
        if a.pd.is_null() {
            debug(|| "ibv_alloc_parent_domain: attr->pd is NULL".into());
            return null_with(libc::EINVAL);
        }
        // SAFETY: the program's live PD.
        let protection: &Pd = unsafe { pd(a.pd) };
        if protection.parent.is_some() || protection.ibv.context != c {
            debug(|| {
                "ibv_alloc_parent_domain: attr->pd must be a PD (not a parent domain) of this context"
                    .into()
            });
            return null_with(libc::EINVAL);
        }
        // SAFETY: the program's live thread domain, if any.
        if !a.td.is_null() && unsafe { td(a.td) }.ibv.context != c {
            debug(|| "ibv_alloc_parent_domain: attr->td belongs to another context".into());
            return null_with(libc::EINVAL);
        }
        let (alloc, free) = if a.comp_mask & PARENT_DOMAIN_INIT_ATTR_ALLOCATORS != 0 {
            (a.alloc, a.free)
        } else {
            (None, None)
        };
        let pd_context = if a.comp_mask & PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT != 0 {
            a.pd_context
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: live context.
        let cx = unsafe { ctx(c) };
        let handle = protection.ibv.handle;
        let shared = match cx.dev.import_pd(handle) {
            Ok(p) => p,
            Err(e) => return null_with(fail("ibv_alloc_parent_domain", &e)),
        };
        protection.users.fetch_add(1, Ordering::AcqRel);
        if !a.td.is_null() {
            // SAFETY: checked live above.
            unsafe { td(a.td) }.users.fetch_add(1, Ordering::AcqRel);
        }
        Box::into_raw(Box::new(Pd {
            ibv: ibv_pd { context: c, handle },
            pd: shared,
            parent: Some(ParentDomain {
                protection: a.pd,
                td: a.td,
                alloc,
                free,
                pd_context,
            }),
            users: AtomicU32::new(0),
        })) as *mut ibv_pd
    })
}
