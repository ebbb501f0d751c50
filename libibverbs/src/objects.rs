//! PD, MR, MW, completion channel, CQ (and `ibv_cq_ex`), SRQ, QP (and
//! `ibv_qp_ex`), AH: each is its C struct followed by the `verbs-api`
//! object it stands for.

use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use rxe_core::{AccessFlags, MwType, QpState, QpType, SrqAttr, WorkCompletion};
use verbs_api::{
    AddressHandle, CompletionQueue, MemoryRegion, MemoryWindow, ProtectionDomain, QueuePair,
    SharedReceiveQueue,
};

use crate::abi::*;
use crate::device::{ctx, Ctx};
use crate::{debug, fail, guard, set_errno};

/// Fill the function pointers of a new context.
pub fn fill_ops(v: &mut verbs_context) {
    let ops = &mut v.context.ops;
    ops.poll_cq = Some(crate::post::poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(crate::post::post_send);
    ops.post_recv = Some(crate::post::post_recv);
    ops.post_srq_recv = Some(crate::post::post_srq_recv);
    ops.alloc_mw = Some(alloc_mw);
    ops.bind_mw = Some(bind_mw);
    ops.dealloc_mw = Some(dealloc_mw);
    v.query_port = Some(crate::device::query_port);
    v.query_device_ex = Some(crate::device::query_device_ex);
    v.create_cq_ex = Some(create_cq_ex);
    v.create_qp_ex = Some(create_qp_ex);
    v.create_srq_ex = Some(create_srq_ex);
    v.get_srq_num = Some(get_srq_num);
    v.alloc_parent_domain = Some(crate::domain::alloc_parent_domain);
    v.alloc_td = Some(crate::domain::alloc_td);
    v.dealloc_td = Some(crate::domain::dealloc_td);
    v.advise_mr = Some(advise_mr);
    v.open_xrcd = Some(crate::xrc::open_xrcd);
    v.close_xrcd = Some(crate::xrc::close_xrcd);
    v.alloc_dm = Some(crate::dm::alloc_dm);
    v.free_dm = Some(crate::dm::free_dm);
    v.reg_dm_mr = Some(crate::dm::reg_dm_mr);
    v.dm_export_dmabuf_fd = Some(crate::dm::rxe_ibv_dm_export_dmabuf_fd);
    v.alloc_dmah = Some(crate::stubs::rxe_ibv_alloc_dmah);
    v.dealloc_dmah = Some(crate::stubs::rxe_ibv_dealloc_dmah);
    crate::buf::fill_ops(v);
}

/// `ibv_advise_mr` (verbs_context op): prefetch advice for ranges of
/// on-demand-paging MRs. PREFETCH and PREFETCH_WRITE fault the pages in
/// now; PREFETCH_NO_FAULT only validates. Flags: IBV_ADVISE_MR_FLAG_FLUSH
/// (wait until done, which this always does).
unsafe extern "C" fn advise_mr(
    p: *mut ibv_pd,
    advice: c_uint,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    const PREFETCH: c_uint = 0;
    const PREFETCH_WRITE: c_uint = 1;
    const PREFETCH_NO_FAULT: c_uint = 2;
    const FLAG_FLUSH: u32 = 1;
    if p.is_null() || (sg_list.is_null() && num_sge > 0) || num_sge == 0 {
        return libc::EINVAL;
    }
    if advice > PREFETCH_NO_FAULT || flags & !FLAG_FLUSH != 0 {
        debug(|| format!("ibv_advise_mr: unknown advice {advice} or flags {flags:#x}"));
        return libc::EOPNOTSUPP;
    }
    guard("ibv_advise_mr", libc::EIO, || {
        // SAFETY: the caller's array of `num_sge` SGEs (checked non-NULL).
        let sges: Vec<rxe_core::Sge> =
            unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) }
                .iter()
                .map(|s| rxe_core::Sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                })
                .collect();
        // SAFETY: a live PD.
        let pdo = unsafe { pd(p) };
        let fault_in = matches!(advice, PREFETCH | PREFETCH_WRITE);
        match pdo.pd.advise_mr(&sges, fault_in) {
            Ok(()) => 0,
            Err(e) => fail("ibv_advise_mr", &e),
        }
    })
}

pub(crate) fn null_with<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

// ---------------------------------------------------------------------------
// PD

/// A PD or a parent domain (`ibv_alloc_parent_domain`): both are an
/// `ibv_pd` to the program, usable wherever a PD is.
#[repr(C)]
pub struct Pd {
    pub ibv: ibv_pd,
    /// For a parent domain, a non-owning handle on its protection
    /// domain's PD, so every verb that takes a PD works on it unchanged.
    pub pd: ProtectionDomain,
    /// `Some` for a parent domain.
    pub parent: Option<crate::domain::ParentDomain>,
    /// For a PD, the parent domains built on it; for a parent domain, the
    /// objects created through it (QP, CQ, SRQ, MR, MW, AH). Freeing
    /// either while this is not zero fails with EBUSY, as in rdma-core's
    /// providers.
    pub users: AtomicU32,
}

/// # Safety
/// `p` must be a PD we handed out and not freed.
pub unsafe fn pd<'a>(p: *mut ibv_pd) -> &'a Pd {
    // SAFETY: ibv_pd is the first field of the repr(C) Pd.
    unsafe { &*(p as *const Pd) }
}

/// Count one more object created through `p` if it is a parent domain
/// (a plain PD's users are counted by the engine).
///
/// # Safety
/// `p` must be NULL or a live PD.
pub unsafe fn hold_pd(p: *mut ibv_pd) {
    if !p.is_null() {
        // SAFETY: a live PD.
        let pdo = unsafe { pd(p) };
        if pdo.parent.is_some() {
            pdo.users.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// `obj.with_hold(p)`: [`hold_pd`] for a just-created object of PD `p`.
trait WithHold: Sized {
    /// # Safety
    /// `p` must be NULL or a live PD.
    unsafe fn with_hold(self, p: *mut ibv_pd) -> Self {
        // SAFETY: forwarded caller contract.
        unsafe { hold_pd(p) };
        self
    }
}
impl<T> WithHold for *mut T {}

/// The object counted by [`hold_pd`] is gone.
///
/// # Safety
/// `p` must be NULL or a live PD.
pub unsafe fn release_pd(p: *mut ibv_pd) {
    if !p.is_null() {
        // SAFETY: a live PD.
        let pdo = unsafe { pd(p) };
        if pdo.parent.is_some() {
            pdo.users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    if c.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_alloc_pd", std::ptr::null_mut(), || {
        // SAFETY: live context.
        let cx = unsafe { ctx(c) };
        match cx.dev.alloc_pd() {
            Ok(pd) => {
                let b = Box::new(Pd {
                    ibv: ibv_pd {
                        context: c,
                        handle: pd.handle(),
                    },
                    pd,
                    parent: None,
                    users: AtomicU32::new(0),
                });
                Box::into_raw(b) as *mut ibv_pd
            }
            Err(e) => null_with(fail("ibv_alloc_pd", &e)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    if p.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_dealloc_pd", libc::EIO, || {
        {
            // SAFETY: a live PD we handed out.
            let pdo = unsafe { pd(p) };
            let users = pdo.users.load(Ordering::Acquire);
            if users != 0 {
                debug(|| {
                    if pdo.parent.is_some() {
                        format!("ibv_dealloc_pd: parent domain still used by {users} objects")
                    } else {
                        format!("ibv_dealloc_pd: PD still used by {users} parent domains")
                    }
                });
                return libc::EBUSY;
            }
        }
        // SAFETY: a PD we handed out; ownership comes back here.
        let b = unsafe { Box::from_raw(p as *mut Pd) };
        let Pd {
            ibv,
            pd,
            parent,
            users,
        } = *b;
        if let Some(parent) = parent {
            // A parent domain: its ProtectionDomain does not own the PD.
            parent.release();
            return 0;
        }
        match pd.close() {
            Ok(()) => 0,
            Err((pd, e)) => {
                // Still in use: the PD stays valid where it was.
                let errno = fail("ibv_dealloc_pd", &e);
                // SAFETY: put the object back at its address.
                unsafe {
                    std::ptr::write(
                        p as *mut Pd,
                        Pd {
                            ibv,
                            pd,
                            parent,
                            users,
                        },
                    )
                };
                errno
            }
        }
    })
}

/// `ibv_import_pd`: another `ibv_pd` for PD `handle` of the device of
/// context `c` (typically imported with `ibv_import_device`).
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_import_pd(c: *mut ibv_context, handle: u32) -> *mut ibv_pd {
    if c.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_import_pd", std::ptr::null_mut(), || {
        // SAFETY: live context.
        let cx = unsafe { ctx(c) };
        match cx.dev.import_pd(handle) {
            Ok(pd) => Box::into_raw(Box::new(Pd {
                ibv: ibv_pd { context: c, handle },
                pd,
                parent: None,
                users: AtomicU32::new(0),
            })) as *mut ibv_pd,
            Err(e) => null_with(fail("ibv_import_pd", &e)),
        }
    })
}

/// `ibv_unimport_pd`: free the `ibv_pd`, not the PD.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_unimport_pd(p: *mut ibv_pd) {
    if p.is_null() {
        return;
    }
    guard("ibv_unimport_pd", (), || {
        // SAFETY: a PD from ibv_import_pd; ownership comes back here. Its
        // ProtectionDomain does not own the PD, so dropping it frees nothing.
        drop(unsafe { Box::from_raw(p as *mut Pd) });
    })
}

// ---------------------------------------------------------------------------
// MR

#[repr(C)]
pub struct Mr {
    pub ibv: ibv_mr,
    pub mr: MemoryRegion<'static>,
    /// The device memory this MR maps (`ibv_reg_dm_mr`); the DM cannot be
    /// freed while the MR exists.
    pub dm: Option<std::sync::Arc<crate::dm::DmMem>>,
}

/// `IBV_ACCESS_OPTIONAL_RANGE`: flags a device may ignore.
const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

pub(crate) fn access_flags(access: c_int) -> Result<AccessFlags, c_int> {
    let a = access as u32 & !ACCESS_OPTIONAL_RANGE;
    // IBV_ACCESS_ON_DEMAND is accepted: the device reports ODP
    // capabilities, and verbs-api's HostMemory checks each page of such an
    // MR as it is touched (see query_device_ex and advise_mr).
    AccessFlags::from_bits(a).ok_or_else(|| {
        debug(|| format!("reg_mr: unknown access flags {a:#x}"));
        libc::EINVAL
    })
}

pub(crate) unsafe fn reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: Option<u64>,
    access: c_int,
) -> *mut ibv_mr {
    if p.is_null() {
        return null_with(libc::EINVAL);
    }
    let access = match access_flags(access) {
        Ok(a) => a,
        Err(e) => return null_with(e),
    };
    // An implicit on-demand-paging MR (addr NULL, length SIZE_MAX) covers
    // the whole address space; any other NULL registration is invalid.
    // (verbs.h's ibv_reg_mr passes a non-constant access through
    // ibv_reg_mr_iova2 with iova = addr = 0.)
    let implicit = addr.is_null()
        && len == usize::MAX
        && iova.unwrap_or(0) == 0
        && access.contains(AccessFlags::ON_DEMAND);
    if addr.is_null() && len > 0 && !implicit {
        debug(|| {
            format!("ibv_reg_mr: NULL address with length {len} (only an implicit ODP MR, SIZE_MAX with IBV_ACCESS_ON_DEMAND, may be NULL)")
        });
        return null_with(libc::EINVAL);
    }
    guard("ibv_reg_mr", std::ptr::null_mut(), || {
        // SAFETY: a live PD.
        let pdo = unsafe { pd(p) };
        // SAFETY: the program registers its own memory and keeps it mapped
        // until ibv_dereg_mr, as the verbs contract requires.
        let r = unsafe { pdo.pd.reg_mr_raw(addr as u64, len as u64, iova, access) };
        match r {
            Ok(mr) => {
                let b = Box::new(Mr {
                    ibv: ibv_mr {
                        context: pdo.ibv.context,
                        pd: p,
                        addr,
                        length: len,
                        handle: mr.lkey(),
                        lkey: mr.lkey(),
                        rkey: mr.rkey(),
                    },
                    mr,
                    dm: None,
                });
                // SAFETY: the live PD the MR was registered in.
                unsafe { hold_pd(p) };
                Box::into_raw(b) as *mut ibv_mr
            }
            Err(e) => null_with(fail("ibv_reg_mr", &e)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded caller contract.
    unsafe { reg_mr(p, addr, len, None, access) }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_reg_mr_iova(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded caller contract.
    unsafe { reg_mr(p, addr, len, Some(iova), access) }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_reg_mr_iova2(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: forwarded caller contract.
    unsafe { reg_mr(p, addr, len, Some(iova), access as c_int) }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_reg_dmabuf_mr(
    _p: *mut ibv_pd,
    _offset: u64,
    _len: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    debug(|| {
        "ibv_reg_dmabuf_mr: dma-buf memory is device memory of a GPU; rxe-emu has none".into()
    });
    null_with(libc::EOPNOTSUPP)
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    if m.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_dereg_mr", libc::EIO, || {
        // SAFETY: an MR we handed out; ownership comes back here.
        let b = unsafe { Box::from_raw(m as *mut Mr) };
        let Mr { ibv, mr, dm } = *b;
        match mr.close() {
            Ok(()) => {
                // SAFETY: the MR's PD outlives it (freeing it fails with
                // EBUSY while the MR exists).
                unsafe { release_pd(ibv.pd) };
                crate::dm::release_dm(dm);
                0
            }
            Err((mr, e)) => {
                let errno = fail("ibv_dereg_mr", &e);
                // SAFETY: put the object back at its address.
                unsafe { std::ptr::write(m as *mut Mr, Mr { ibv, mr, dm }) };
                errno
            }
        }
    })
}

/// `ibv_import_mr`: another `ibv_mr` for the MR of PD `p` whose handle
/// (its lkey here) is `handle`. Its `addr` is NULL, as rdma-core leaves it.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_import_mr(p: *mut ibv_pd, handle: u32) -> *mut ibv_mr {
    if p.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_import_mr", std::ptr::null_mut(), || {
        // SAFETY: a live PD.
        let pdo = unsafe { pd(p) };
        match pdo.pd.import_mr(handle) {
            Ok(mr) => Box::into_raw(Box::new(Mr {
                ibv: ibv_mr {
                    context: pdo.ibv.context,
                    pd: p,
                    addr: std::ptr::null_mut(),
                    length: mr.len() as usize,
                    handle,
                    lkey: mr.lkey(),
                    rkey: mr.rkey(),
                },
                mr,
                dm: None,
            })) as *mut ibv_mr,
            Err(e) => null_with(fail("ibv_import_mr", &e)),
        }
    })
}

/// `ibv_unimport_mr`: free the `ibv_mr`, not the registration.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_unimport_mr(m: *mut ibv_mr) {
    if m.is_null() {
        return;
    }
    guard("ibv_unimport_mr", (), || {
        // SAFETY: an MR from ibv_import_mr; ownership comes back here. Its
        // MemoryRegion does not own the registration.
        drop(unsafe { Box::from_raw(m as *mut Mr) });
    })
}

/// `IBV_REREG_MR_CHANGE_TRANSLATION`, `_CHANGE_PD`, `_CHANGE_ACCESS`.
const REREG_TRANSLATION: c_int = 1;
const REREG_PD: c_int = 2;
const REREG_ACCESS: c_int = 4;
/// `IBV_REREG_MR_ERR_INPUT`: refused, the old MR is still valid.
const REREG_ERR_INPUT: c_int = -1;

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_rereg_mr(
    m: *mut ibv_mr,
    flags: c_int,
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    let fail_input = |e: c_int| {
        set_errno(e);
        REREG_ERR_INPUT
    };
    // libibverbs' own checks (verbs.c): known flags only, at least one,
    // a translation needs an address and a length, a PD change a PD.
    let known = REREG_TRANSLATION | REREG_PD | REREG_ACCESS;
    if m.is_null() || flags & !known != 0 || flags == 0 {
        return fail_input(libc::EINVAL);
    }
    if flags & REREG_TRANSLATION != 0 && (addr.is_null() || len == 0) {
        return fail_input(libc::EINVAL);
    }
    if flags & REREG_PD != 0 && p.is_null() {
        return fail_input(libc::EINVAL);
    }
    let new_access = if flags & REREG_ACCESS != 0 {
        match access_flags(access) {
            Ok(a) => Some(a),
            Err(e) => return fail_input(e),
        }
    } else {
        None
    };
    guard("ibv_rereg_mr", REREG_ERR_INPUT, || {
        // SAFETY: an MR we handed out and the caller's PD, both live.
        let mo = unsafe { &mut *(m as *mut Mr) };
        if mo.dm.is_some() {
            // As the kernel's ib_uverbs_rereg_mr: a device-memory MR
            // cannot be re-registered.
            debug(|| "ibv_rereg_mr: an MR of device memory cannot be re-registered".into());
            return fail_input(libc::EINVAL);
        }
        let new_pd = (flags & REREG_PD != 0).then(|| unsafe { pd(p) });
        if let Some(np) = new_pd {
            if np.ibv.context != mo.ibv.context {
                return fail_input(libc::EINVAL);
            }
        }
        let range = (flags & REREG_TRANSLATION != 0).then_some((addr as u64, len as u64, None));
        // SAFETY: the program keeps the new memory mapped until the MR is
        // deregistered, as the verbs contract requires.
        match unsafe { mo.mr.rereg_raw(new_pd.map(|x| &x.pd), range, new_access) } {
            Ok(()) => {
                if flags & REREG_PD != 0 {
                    // SAFETY: both PDs are live; the MR moves to the new one.
                    unsafe {
                        hold_pd(p);
                        release_pd(mo.ibv.pd);
                    }
                    mo.ibv.pd = p;
                }
                if flags & REREG_TRANSLATION != 0 {
                    mo.ibv.addr = addr;
                    mo.ibv.length = len;
                }
                0
            }
            Err(e) => fail_input(fail("ibv_rereg_mr", &e)),
        }
    })
}

// ---------------------------------------------------------------------------
// MW

#[repr(C)]
pub struct Mw {
    pub ibv: ibv_mw,
    pub mw: Mutex<MemoryWindow>,
}

unsafe extern "C" fn alloc_mw(p: *mut ibv_pd, ty: c_int) -> *mut ibv_mw {
    if p.is_null() {
        return null_with(libc::EINVAL);
    }
    let mw_type = match ty {
        1 => MwType::Type1,
        2 => MwType::Type2,
        _ => return null_with(libc::EINVAL),
    };
    guard("ibv_alloc_mw", std::ptr::null_mut(), || {
        // SAFETY: a live PD.
        let pdo = unsafe { pd(p) };
        match pdo.pd.alloc_mw(mw_type) {
            Ok(mw) => {
                let ptr = Box::into_raw(Box::new(Mw {
                    ibv: ibv_mw {
                        context: pdo.ibv.context,
                        pd: p,
                        rkey: mw.rkey(),
                        handle: mw.rkey(),
                        type_: ty,
                    },
                    mw: Mutex::new(mw),
                }))
                .cast::<ibv_mw>();
                // SAFETY: the live PD the object was created in.
                unsafe { ptr.with_hold(p) }
            }
            Err(e) => null_with(fail("ibv_alloc_mw", &e)),
        }
    })
}

unsafe extern "C" fn dealloc_mw(w: *mut ibv_mw) -> c_int {
    if w.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_dealloc_mw", libc::EIO, || {
        // SAFETY: an MW we handed out; ownership comes back here.
        let b = unsafe { Box::from_raw(w as *mut Mw) };
        let Mw { ibv, mw } = *b;
        match mw.into_inner().unwrap_or_else(|p| p.into_inner()).close() {
            Ok(()) => {
                // SAFETY: the window's PD outlives it.
                unsafe { release_pd(ibv.pd) };
                0
            }
            Err((mw, e)) => {
                let errno = fail("ibv_dealloc_mw", &e);
                // SAFETY: put the object back at its address.
                unsafe {
                    std::ptr::write(
                        w as *mut Mw,
                        Mw {
                            ibv,
                            mw: Mutex::new(mw),
                        },
                    )
                };
                errno
            }
        }
    })
}

/// `ibv_bind_mw` (type 1): posted as a BIND_MW work request with the next
/// key, as the rxe provider does; it completes (when signalled) with
/// `IBV_WC_BIND_MW`, and `mw->rkey` is the new key from now on.
unsafe extern "C" fn bind_mw(q: *mut ibv_qp, w: *mut ibv_mw, b: *mut ibv_mw_bind) -> c_int {
    if q.is_null() || w.is_null() || b.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_bind_mw", libc::EIO, || {
        // SAFETY: live QP, MW and a caller-provided bind struct.
        let (qpo, mwo, bind) = unsafe { (qp(q), &mut *(w as *mut Mw), &*b) };
        let info = &bind.bind_info;
        let lkey = if info.mr.is_null() {
            0
        } else {
            // SAFETY: a live MR of the program.
            unsafe { (*info.mr).lkey }
        };
        let cur = mwo.mw.lock().unwrap_or_else(|p| p.into_inner()).rkey();
        let new_key = (cur.wrapping_add(1) & 0xff) as u8;
        let wr = rxe_core::SendWr {
            xrc_remote_srqn: None,
            wr_id: bind.wr_id,
            op: rxe_core::SendOp::BindMw {
                mw_rkey: cur,
                new_key,
                bind: rxe_core::MwBindInfo {
                    mr_lkey: lkey,
                    addr: info.addr,
                    length: info.length,
                    access: AccessFlags::from_bits_truncate(info.mw_access_flags),
                },
            },
            sg_list: Vec::new(),
            flags: rxe_core::SendFlags::from_bits_truncate(bind.send_flags),
            ud: None,
        };
        match qpo.qp.post_send(wr) {
            Ok(()) => {
                let rkey = (cur & !0xff) | u32::from(new_key);
                mwo.mw
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .set_rkey(rkey);
                mwo.ibv.rkey = rkey;
                0
            }
            Err(e) => fail("ibv_bind_mw", &e),
        }
    })
}

// ---------------------------------------------------------------------------
// Completion channel

#[repr(C)]
pub struct Channel {
    pub ibv: ibv_comp_channel,
    pub ch: verbs_api::CompletionChannel,
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    if c.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_create_comp_channel", std::ptr::null_mut(), || {
        // SAFETY: live context.
        let cx = unsafe { ctx(c) };
        match cx.dev.create_comp_channel() {
            Ok(ch) => Box::into_raw(Box::new(Channel {
                ibv: ibv_comp_channel {
                    context: c,
                    fd: ch.fd(),
                    refcnt: 0,
                },
                ch,
            })) as *mut ibv_comp_channel,
            Err(e) => null_with(fail("ibv_create_comp_channel", &e)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    if ch.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a channel we handed out.
    if unsafe { (*ch).refcnt } > 0 {
        debug(|| "ibv_destroy_comp_channel: CQs still use the channel".into());
        return libc::EBUSY;
    }
    // SAFETY: ownership comes back here.
    drop(unsafe { Box::from_raw(ch as *mut Channel) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_ctx: *mut *mut c_void,
) -> c_int {
    if ch.is_null() || cq_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    guard("ibv_get_cq_event", -1, || {
        // SAFETY: a live channel.
        let chan = unsafe { &*(ch as *const Channel) };
        loop {
            let id = match chan.ch.get_cq_event() {
                Ok(Some(id)) => id,
                Ok(None) => {
                    set_errno(libc::EAGAIN);
                    return -1;
                }
                Err(e) => {
                    set_errno(fail("ibv_get_cq_event", &e));
                    return -1;
                }
            };
            // SAFETY: the channel's context is alive while the channel is.
            let cx = unsafe { ctx(chan.ibv.context) };
            let found = cx
                .reg
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .cqs
                .get(&id.0)
                .copied();
            let Some(p) = found else { continue }; // CQ destroyed since
            let cqp = p as *mut ibv_cq;
            // SAFETY: a live CQ (registered) and caller outputs.
            unsafe {
                *cq_out = cqp;
                if !cq_ctx.is_null() {
                    *cq_ctx = (*cqp).cq_context;
                }
            }
            return 0;
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_ack_cq_events(c: *mut ibv_cq, n: c_uint) {
    if c.is_null() {
        return;
    }
    // SAFETY: a live CQ; the program serialises acks as libibverbs requires
    // (it takes the CQ mutex; so do we).
    unsafe {
        libc::pthread_mutex_lock(&mut (*c).mutex);
        (*c).comp_events_completed = (*c).comp_events_completed.wrapping_add(n);
        libc::pthread_cond_broadcast(&mut (*c).cond);
        libc::pthread_mutex_unlock(&mut (*c).mutex);
    }
}

// ---------------------------------------------------------------------------
// CQ

pub struct CqExPoll {
    pub buf: VecDeque<WorkCompletion>,
    pub cur: Option<WorkCompletion>,
}

#[repr(C)]
pub struct Cq {
    pub ibv: ibv_cq_ex,
    pub cq: CompletionQueue,
    pub ex: Mutex<CqExPoll>,
    pub channel: *mut ibv_comp_channel,
    /// The parent domain given with `IBV_CQ_INIT_ATTR_MASK_PD`, or NULL.
    pub parent_domain: *mut ibv_pd,
}

/// # Safety
/// `c` must be a CQ we handed out and not destroyed.
pub unsafe fn cq<'a>(c: *mut ibv_cq) -> &'a Cq {
    // SAFETY: ibv_cq is the prefix of ibv_cq_ex, the first field of Cq.
    unsafe { &*(c as *const Cq) }
}

/// Completion fields rxe can report in an `ibv_cq_ex`
/// (`IBV_WC_STANDARD_FLAGS`).
const SUPPORTED_WC_FLAGS: u64 = 0x7f;

unsafe fn create_cq_common(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    parent_domain: *mut ibv_pd,
) -> *mut ibv_cq_ex {
    if c.is_null() || cqe <= 0 {
        return null_with(libc::EINVAL);
    }
    // SAFETY: live context.
    let cx: &Ctx = unsafe { ctx(c) };
    if comp_vector < 0 || comp_vector >= cx.vctx.context.num_comp_vectors {
        debug(|| format!("create_cq: comp_vector {comp_vector} out of range"));
        return null_with(libc::EINVAL);
    }
    let r = if channel.is_null() {
        cx.dev.create_cq(cqe as u32)
    } else {
        // SAFETY: a live channel of the program.
        let chan = unsafe { &*(channel as *const Channel) };
        cx.dev.create_cq_with_channel(cqe as u32, &chan.ch)
    };
    let cqo = match r {
        Ok(q) => q,
        Err(e) => return null_with(fail("ibv_create_cq", &e)),
    };
    // SAFETY: ibv_cq_ex is C data; zero is valid for all of it (NULL
    // function pointers are filled below, mutex/cond zero = initialisers).
    let mut ibv: ibv_cq_ex = unsafe { std::mem::zeroed() };
    ibv.context = c;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    ibv.handle = cqo.id().0;
    ibv.cqe = cqe;
    crate::post::fill_cq_ex(&mut ibv);
    let id = cqo.id().0;
    let p = Box::into_raw(Box::new(Cq {
        ibv,
        cq: cqo,
        ex: Mutex::new(CqExPoll {
            buf: VecDeque::new(),
            cur: None,
        }),
        channel,
        parent_domain,
    }));
    // SAFETY: NULL or a live parent domain (checked by create_cq_ex).
    unsafe { hold_pd(parent_domain) };
    if !channel.is_null() {
        // SAFETY: a live channel.
        unsafe { (*channel).refcnt += 1 };
    }
    cx.reg
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .cqs
        .insert(id, p as usize);
    p as *mut ibv_cq_ex
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard("ibv_create_cq", std::ptr::null_mut(), || {
        // SAFETY: forwarded caller contract.
        unsafe {
            create_cq_common(
                c,
                cqe,
                cq_context,
                channel,
                comp_vector,
                std::ptr::null_mut(),
            ) as *mut ibv_cq
        }
    })
}

/// `IBV_CQ_INIT_ATTR_MASK_PD`: `parent_domain` is set.
const CQ_INIT_ATTR_MASK_PD: u32 = 2;

unsafe extern "C" fn create_cq_ex(
    c: *mut ibv_context,
    a: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    if a.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_create_cq_ex", std::ptr::null_mut(), || {
        // SAFETY: caller-provided attributes.
        let a = unsafe { &*a };
        if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
            debug(|| {
                format!(
                    "ibv_create_cq_ex: wc_flags {:#x} ask for fields rxe cannot report (it has {SUPPORTED_WC_FLAGS:#x})",
                    a.wc_flags
                )
            });
            return null_with(libc::EOPNOTSUPP);
        }
        // IBV_CQ_INIT_ATTR_MASK_FLAGS = 1, _PD = 2; flags: SINGLE_THREADED
        // and IGNORE_OVERRUN are hints rxe accepts.
        if a.comp_mask & !0x3 != 0 {
            return null_with(libc::EINVAL);
        }
        let parent_domain = if a.comp_mask & CQ_INIT_ATTR_MASK_PD != 0 {
            // As mlx5 (the provider that has parent domains): the PD
            // given must be a parent domain of this context.
            // SAFETY: a non-NULL PD of the program.
            let ok = !a.parent_domain.is_null()
                && unsafe {
                    let pdo = pd(a.parent_domain);
                    pdo.parent.is_some() && pdo.ibv.context == c
                };
            if !ok {
                debug(|| {
                    "ibv_create_cq_ex: IBV_CQ_INIT_ATTR_MASK_PD needs a parent domain of this context".into()
                });
                return null_with(libc::EINVAL);
            }
            a.parent_domain
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: forwarded caller contract.
        unsafe {
            create_cq_common(
                c,
                a.cqe as c_int,
                a.cq_context,
                a.channel,
                a.comp_vector as c_int,
                parent_domain,
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_resize_cq(c: *mut ibv_cq, cqe: c_int) -> c_int {
    if c.is_null() || cqe <= 0 {
        return libc::EINVAL;
    }
    guard("ibv_resize_cq", libc::EIO, || {
        // SAFETY: a live CQ.
        let cqo = unsafe { &mut *(c as *mut Cq) };
        match cqo.cq.resize(cqe as u32) {
            Ok(()) => {
                cqo.ibv.cqe = cqe;
                0
            }
            Err(e) => fail("ibv_resize_cq", &e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_destroy_cq(c: *mut ibv_cq) -> c_int {
    if c.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_destroy_cq", libc::EIO, || {
        // SAFETY: a CQ we handed out; ownership comes back here.
        let b = unsafe { Box::from_raw(c as *mut Cq) };
        let ctxp = b.ibv.context;
        let Cq {
            ibv,
            cq: cqo,
            ex,
            channel,
            parent_domain,
        } = *b;
        let id = cqo.id().0;
        match cqo.close() {
            Ok(()) => {
                // SAFETY: the context outlives its CQs.
                let cx = unsafe { ctx(ctxp) };
                cx.reg
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .cqs
                    .remove(&id);
                if !channel.is_null() {
                    // SAFETY: a channel outlives the CQs that count on it.
                    unsafe { (*channel).refcnt -= 1 };
                }
                // SAFETY: the CQ's parent domain outlives it.
                unsafe { release_pd(parent_domain) };
                0
            }
            Err((cqo, e)) => {
                let errno = fail("ibv_destroy_cq", &e);
                // SAFETY: put the object back at its address.
                unsafe {
                    std::ptr::write(
                        c as *mut Cq,
                        Cq {
                            ibv,
                            cq: cqo,
                            ex,
                            channel,
                            parent_domain,
                        },
                    )
                };
                errno
            }
        }
    })
}

unsafe extern "C" fn req_notify_cq(c: *mut ibv_cq, solicited_only: c_int) -> c_int {
    if c.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ.
    let cqo = unsafe { cq(c) };
    match cqo.cq.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => fail("ibv_req_notify_cq", &e),
    }
}

// ---------------------------------------------------------------------------
// SRQ

#[repr(C)]
pub struct Srq {
    pub ibv: ibv_srq,
    pub srq: SharedReceiveQueue,
}

/// # Safety
/// `s` must be an SRQ we handed out and not destroyed.
pub unsafe fn srq<'a>(s: *mut ibv_srq) -> &'a Srq {
    // SAFETY: ibv_srq is the first field of the repr(C) Srq.
    unsafe { &*(s as *const Srq) }
}

unsafe fn create_srq_common(
    p: *mut ibv_pd,
    srq_context: *mut c_void,
    attr: &mut ibv_srq_attr,
    make: impl FnOnce(&Pd, SrqAttr) -> verbs_api::Result<SharedReceiveQueue>,
) -> *mut ibv_srq {
    if p.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live PD.
    let pdo = unsafe { pd(p) };
    let r = make(
        pdo,
        SrqAttr {
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            srq_limit: attr.srq_limit,
        },
    );
    let s = match r {
        Ok(s) => s,
        Err(e) => return null_with(fail("ibv_create_srq", &e)),
    };
    if let Ok((a, _)) = s.query() {
        attr.max_wr = a.max_wr;
        attr.max_sge = a.max_sge;
    }
    let c = pdo.ibv.context;
    let h = s.handle().0;
    // SAFETY: C data; zero mutex/cond are the initialisers.
    let mut ibv: ibv_srq = unsafe { std::mem::zeroed() };
    ibv.context = c;
    ibv.srq_context = srq_context;
    ibv.pd = p;
    ibv.handle = h;
    let ptr = Box::into_raw(Box::new(Srq { ibv, srq: s }));
    // SAFETY: the live PD the SRQ was created in.
    unsafe { hold_pd(p) };
    // SAFETY: live context.
    unsafe { ctx(c) }
        .reg
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .srqs
        .insert(h, ptr as usize);
    ptr as *mut ibv_srq
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_create_srq(
    p: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if init.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_create_srq", std::ptr::null_mut(), || {
        // SAFETY: caller-provided attributes, updated with what was made.
        unsafe {
            create_srq_common(p, (*init).srq_context, &mut (*init).attr, |pdo, a| {
                pdo.pd.create_srq(a)
            })
        }
    })
}

unsafe extern "C" fn create_srq_ex(
    _c: *mut ibv_context,
    a: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    if a.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_create_srq_ex", std::ptr::null_mut(), || {
        // SAFETY: caller-provided attributes.
        let a = unsafe { &mut *a };
        // IBV_SRQ_INIT_ATTR_TYPE = 1, _PD = 2, _XRCD = 4, _CQ = 8; types
        // IBV_SRQT_BASIC = 0, IBV_SRQT_XRC = 1, IBV_SRQT_TM = 2.
        const TYPE: u32 = 1;
        const PD: u32 = 2;
        const XRCD: u32 = 4;
        const CQ: u32 = 8;
        let ty = if a.comp_mask & TYPE != 0 {
            a.srq_type
        } else {
            0
        };
        if a.comp_mask & PD == 0 || ty > 1 {
            debug(|| "ibv_create_srq_ex: basic or XRC SRQs with a PD (no tag matching)".into());
            return null_with(if ty > 1 {
                libc::EOPNOTSUPP
            } else {
                libc::EINVAL
            });
        }
        if ty == 0 {
            // SAFETY: forwarded caller contract.
            return unsafe {
                create_srq_common(a.pd, a.srq_context, &mut a.attr, |pdo, at| {
                    pdo.pd.create_srq(at)
                })
            };
        }
        if a.comp_mask & (XRCD | CQ) != XRCD | CQ || a.xrcd.is_null() || a.cq.is_null() {
            debug(|| "ibv_create_srq_ex: an XRC SRQ needs an XRCD and a CQ".into());
            return null_with(libc::EINVAL);
        }
        // SAFETY: the program's live XRCD and CQ.
        let (xo, co) = unsafe { (crate::xrc::xrcd(a.xrcd), cq(a.cq)) };
        // Borrowed, not cloned: close_xrcd counts the open references by
        // the Arc's count.
        let shared = &xo.shared;
        // SAFETY: forwarded caller contract.
        unsafe {
            create_srq_common(a.pd, a.srq_context, &mut a.attr, move |pdo, at| {
                let d = shared.domain.lock().unwrap_or_else(|p| p.into_inner());
                match d.as_ref() {
                    Some(d) => pdo.pd.create_xrc_srq(d, &co.cq, at),
                    None => Err(verbs_api::Error::Verbs(rxe_core::Error::Invalid(
                        "the XRC domain is closed".into(),
                    ))),
                }
            })
        }
    })
}

unsafe extern "C" fn get_srq_num(s: *mut ibv_srq, num: *mut u32) -> c_int {
    if s.is_null() || num.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: live SRQ, caller output.
    unsafe { *num = (*s).handle };
    0
}

/// `IBV_SRQ_MAX_WR` and `IBV_SRQ_LIMIT`.
const SRQ_MAX_WR: c_int = 1;
const SRQ_LIMIT: c_int = 2;

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_modify_srq(
    s: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    if s.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_modify_srq", libc::EIO, || {
        // SAFETY: live SRQ and caller attributes.
        let (so, a) = unsafe { (srq(s), &*attr) };
        if mask & !(SRQ_MAX_WR | SRQ_LIMIT) != 0 {
            return libc::EINVAL;
        }
        if mask & SRQ_MAX_WR != 0 {
            match so.srq.resize(a.max_wr) {
                Ok(()) => {}
                Err(e) => return fail("ibv_modify_srq(IBV_SRQ_MAX_WR)", &e),
            }
        }
        if mask & SRQ_LIMIT != 0 {
            if let Err(e) = so.srq.set_limit(a.srq_limit) {
                return fail("ibv_modify_srq(IBV_SRQ_LIMIT)", &e);
            }
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_srq(s: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    if s.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_query_srq", libc::EIO, || {
        // SAFETY: live SRQ.
        match unsafe { srq(s) }.srq.query() {
            Ok((a, _)) => {
                // SAFETY: caller output.
                unsafe {
                    *attr = ibv_srq_attr {
                        max_wr: a.max_wr,
                        max_sge: a.max_sge,
                        srq_limit: a.srq_limit,
                    }
                };
                0
            }
            Err(e) => fail("ibv_query_srq", &e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_destroy_srq(s: *mut ibv_srq) -> c_int {
    if s.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_destroy_srq", libc::EIO, || {
        // SAFETY: an SRQ we handed out; ownership comes back here.
        let b = unsafe { Box::from_raw(s as *mut Srq) };
        let Srq { ibv, srq: so } = *b;
        let h = so.handle().0;
        match so.close() {
            Ok(()) => {
                // SAFETY: the SRQ's PD outlives it.
                unsafe { release_pd(ibv.pd) };
                // SAFETY: the context outlives its SRQs.
                unsafe { ctx(ibv.context) }
                    .reg
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .srqs
                    .remove(&h);
                0
            }
            Err((so, e)) => {
                let errno = fail("ibv_destroy_srq", &e);
                // SAFETY: put the object back at its address.
                unsafe { std::ptr::write(s as *mut Srq, Srq { ibv, srq: so }) };
                errno
            }
        }
    })
}

// ---------------------------------------------------------------------------
// QP

#[repr(C)]
pub struct Qp {
    pub ibv: ibv_qp_ex,
    pub qp: QueuePair,
    pub build: Mutex<crate::post::WrBuild>,
    pub sq_sig_all: bool,
    /// `max_send_sge` and `max_inline_data` as created (they never
    /// change): the `ibv_wr_set_*` calls check against them per WR.
    pub send_caps: (u32, u32),
}

/// # Safety
/// `q` must be a QP we handed out and not destroyed.
pub unsafe fn qp<'a>(q: *mut ibv_qp) -> &'a Qp {
    // SAFETY: ibv_qp is the first field of ibv_qp_ex, the first of Qp.
    unsafe { &*(q as *const Qp) }
}

unsafe fn create_qp_common(p: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> *mut ibv_qp {
    let (qp_context, send_cq, recv_cq, srq_p, qp_type, sq_sig_all) = (
        a.qp_context,
        a.send_cq,
        a.recv_cq,
        a.srq,
        a.qp_type,
        a.sq_sig_all,
    );
    let cap = &mut a.cap;
    let Some(t) = QpType::from_ibv(qp_type as u32) else {
        debug(|| {
            format!(
                "ibv_create_qp: QP type {qp_type} is not one rxe-emu supports (RC, UC, UD, XRC)"
            )
        });
        return null_with(libc::EOPNOTSUPP);
    };
    if t == QpType::XrcRecv {
        debug(|| "ibv_create_qp: an XRC_RECV QP needs ibv_create_qp_ex with an XRCD".into());
        return null_with(libc::EINVAL);
    }
    // An XRC initiator receives nothing: its receive CQ may be NULL.
    let engine_rcq = if t == QpType::XrcSend && recv_cq.is_null() {
        send_cq
    } else {
        recv_cq
    };
    if p.is_null() || send_cq.is_null() || engine_rcq.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: live PD, CQs and SRQ of the program.
    let (pdo, scq, rcq) = unsafe { (pd(p), cq(send_cq), cq(engine_rcq)) };
    let s = if srq_p.is_null() {
        None
    } else {
        // SAFETY: a live SRQ.
        Some(unsafe { &srq(srq_p).srq })
    };
    let rcap = rxe_core::QpCap {
        max_send_wr: cap.max_send_wr,
        max_recv_wr: cap.max_recv_wr,
        max_send_sge: cap.max_send_sge,
        max_recv_sge: cap.max_recv_sge,
        max_inline_data: cap.max_inline_data,
    };
    let q = match pdo
        .pd
        .create_qp(t, &scq.cq, &rcq.cq, s, rcap, sq_sig_all != 0)
    {
        Ok(q) => q,
        Err(e) => return null_with(fail("ibv_create_qp", &e)),
    };
    if let Ok((_, got)) = q.query() {
        *cap = ibv_qp_cap {
            max_send_wr: got.max_send_wr,
            max_recv_wr: got.max_recv_wr,
            max_send_sge: got.max_send_sge,
            max_recv_sge: got.max_recv_sge,
            max_inline_data: got.max_inline_data,
        };
    }
    let send_caps = (cap.max_send_sge, cap.max_inline_data);
    let c = pdo.ibv.context;
    let qpn = q.qpn();
    // SAFETY: C data; zero mutex/cond are the initialisers, and NULL
    // function pointers are filled below.
    let mut ibv: ibv_qp_ex = unsafe { std::mem::zeroed() };
    ibv.qp_base.context = c;
    ibv.qp_base.qp_context = qp_context;
    ibv.qp_base.pd = p;
    ibv.qp_base.send_cq = send_cq;
    ibv.qp_base.recv_cq = recv_cq;
    ibv.qp_base.srq = srq_p;
    ibv.qp_base.handle = qpn;
    ibv.qp_base.qp_num = qpn;
    ibv.qp_base.state = QpState::Reset.ibv() as c_int;
    ibv.qp_base.qp_type = qp_type;
    crate::post::fill_qp_ex(&mut ibv);
    let ptr = Box::into_raw(Box::new(Qp {
        ibv,
        qp: q,
        build: Mutex::new(crate::post::WrBuild::default()),
        sq_sig_all: sq_sig_all != 0,
        send_caps,
    }));
    // SAFETY: the live PD the QP was created in.
    unsafe { hold_pd(p) };
    // SAFETY: live context.
    unsafe { ctx(c) }
        .reg
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .qps
        .insert(qpn, ptr as usize);
    ptr as *mut ibv_qp
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_create_qp(
    p: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    if init.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_create_qp", std::ptr::null_mut(), || {
        // SAFETY: caller-provided attributes (cap updated in place).
        let a = unsafe { &mut *init };
        // SAFETY: forwarded caller contract.
        unsafe { create_qp_common(p, a) }
    })
}

/// `IBV_QP_INIT_ATTR_PD`, `_XRCD`, `_CREATE_FLAGS` and `_SEND_OPS_FLAGS`.
const QP_INIT_ATTR_PD: u32 = 1;
const QP_INIT_ATTR_XRCD: u32 = 1 << 1;
const QP_INIT_ATTR_CREATE_FLAGS: u32 = 1 << 2;
const QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;
/// The `ibv_wr_*` operations rxe implements: RDMA WRITE (with imm), SEND
/// (with imm, with invalidate), RDMA READ, CAS, FAA, LOCAL_INV, BIND_MW,
/// FLUSH, ATOMIC WRITE (not TSO, bit 10).
const SUPPORTED_SEND_OPS: u64 = (0x3ff & !(1 << 10)) | QP_EX_WITH_FLUSH | QP_EX_WITH_ATOMIC_WRITE;
/// `IBV_QP_EX_WITH_FLUSH`.
const QP_EX_WITH_FLUSH: u64 = 1 << 11;
/// `IBV_QP_EX_WITH_ATOMIC_WRITE`.
const QP_EX_WITH_ATOMIC_WRITE: u64 = 1 << 12;

unsafe extern "C" fn create_qp_ex(
    _c: *mut ibv_context,
    a: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if a.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_create_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: caller-provided attributes.
        let a = unsafe { &mut *a };
        let known = QP_INIT_ATTR_PD
            | QP_INIT_ATTR_XRCD
            | QP_INIT_ATTR_CREATE_FLAGS
            | QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 {
            debug(|| {
                format!(
                    "ibv_create_qp_ex: comp_mask {:#x} asks for XRC, TSO or RSS, which rxe lacks",
                    a.comp_mask
                )
            });
            return null_with(libc::EOPNOTSUPP);
        }
        // Kernel rxe accepts the create-flags field but no flag in it.
        if a.comp_mask & QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            debug(|| {
                format!(
                    "ibv_create_qp_ex: create_flags {:#x}: rxe supports none",
                    a.create_flags
                )
            });
            return null_with(libc::EOPNOTSUPP);
        }
        if a.qp_type == QpType::XrcRecv.ibv() as c_int {
            // SAFETY: forwarded caller contract.
            return unsafe { create_xrc_recv_qp(a) };
        }
        if a.comp_mask & QP_INIT_ATTR_PD == 0 {
            return null_with(libc::EINVAL);
        }
        if a.comp_mask & QP_INIT_ATTR_SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !SUPPORTED_SEND_OPS != 0
        {
            debug(|| {
                format!(
                    "ibv_create_qp_ex: send_ops_flags {:#x} include operations rxe lacks",
                    a.send_ops_flags
                )
            });
            return null_with(libc::EOPNOTSUPP);
        }
        // SAFETY: forwarded caller contract.
        unsafe {
            create_qp_common(
                a.pd,
                // The first 64 bytes of ibv_qp_init_attr_ex are an
                // ibv_qp_init_attr (libibverbs casts the same way).
                &mut *(a as *mut ibv_qp_init_attr_ex as *mut ibv_qp_init_attr),
            )
        }
    })
}

/// An XRC_RECV (target) QP: in an XRC domain, with no PD, CQs or queues.
unsafe fn create_xrc_recv_qp(a: &mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    if a.comp_mask & QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
        debug(|| "ibv_create_qp_ex: an XRC_RECV QP needs IBV_QP_INIT_ATTR_XRCD and an XRCD".into());
        return null_with(libc::EINVAL);
    }
    // SAFETY: the program's live XRCD.
    let xo = unsafe { crate::xrc::xrcd(a.xrcd) };
    let c = xo.ibv.xrcd.context;
    let r = {
        let d = xo.shared.domain.lock().unwrap_or_else(|p| p.into_inner());
        match d.as_ref() {
            Some(d) => d.create_recv_qp(),
            None => return null_with(libc::EINVAL),
        }
    };
    let q = match r {
        Ok(q) => q,
        Err(e) => return null_with(fail("ibv_create_qp_ex(XRC_RECV)", &e)),
    };
    a.cap = ibv_qp_cap {
        max_send_wr: 0,
        max_recv_wr: 0,
        max_send_sge: 0,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let qpn = q.qpn();
    // SAFETY: C data; zero mutex/cond are the initialisers.
    let mut ibv: ibv_qp_ex = unsafe { std::mem::zeroed() };
    ibv.qp_base.context = c;
    ibv.qp_base.qp_context = a.qp_context;
    ibv.qp_base.handle = qpn;
    ibv.qp_base.qp_num = qpn;
    ibv.qp_base.state = QpState::Reset.ibv() as c_int;
    ibv.qp_base.qp_type = a.qp_type;
    crate::post::fill_qp_ex(&mut ibv);
    let ptr = Box::into_raw(Box::new(Qp {
        ibv,
        qp: q,
        build: Mutex::new(crate::post::WrBuild::default()),
        sq_sig_all: false,
        send_caps: (0, 0),
    }));
    // SAFETY: live context.
    unsafe { ctx(c) }
        .reg
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .qps
        .insert(qpn, ptr as usize);
    ptr as *mut ibv_qp
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_qp_to_qp_ex(q: *mut ibv_qp) -> *mut ibv_qp_ex {
    // Every QP here carries the extended post-send interface.
    q as *mut ibv_qp_ex
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_modify_qp(
    q: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    if q.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_modify_qp", libc::EIO, || {
        // SAFETY: live QP, caller attributes.
        let (qpo, a) = unsafe { (&mut *(q as *mut Qp), &*attr) };
        let ra = crate::post::qp_attr_from_c(a);
        let Some(m) = rxe_core::QpAttrMask::from_bits(mask as u32) else {
            debug(|| format!("ibv_modify_qp: unknown attribute mask bits {mask:#x}"));
            return libc::EINVAL;
        };
        match qpo.qp.modify(&ra, m) {
            Ok(()) => {
                qpo.ibv.qp_base.state = qpo.qp.state().ibv() as c_int;
                0
            }
            Err(e) => fail(&format!("ibv_modify_qp(qp {:#x})", qpo.qp.qpn()), &e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_qp(
    q: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    if q.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_query_qp", libc::EIO, || {
        // SAFETY: live QP.
        let qpo = unsafe { &mut *(q as *mut Qp) };
        let (ra, cap) = match qpo.qp.query() {
            Ok(x) => x,
            Err(e) => return fail("ibv_query_qp", &e),
        };
        let mut ca = crate::post::qp_attr_to_c(&ra);
        ca.cap = ibv_qp_cap {
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
        };
        qpo.ibv.qp_base.state = ca.qp_state;
        // SAFETY: caller outputs.
        unsafe {
            *attr = ca;
            if !init.is_null() {
                let b = &qpo.ibv.qp_base;
                *init = ibv_qp_init_attr {
                    qp_context: b.qp_context,
                    send_cq: b.send_cq,
                    recv_cq: b.recv_cq,
                    srq: b.srq,
                    cap: ca.cap,
                    qp_type: b.qp_type,
                    sq_sig_all: qpo.sq_sig_all as c_int,
                };
            }
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_query_qp_data_in_order(
    _q: *mut ibv_qp,
    _op: c_int,
    _flags: u32,
) -> c_int {
    // As rdma-core with the rxe provider, which has no
    // query_qp_data_in_order op: libibverbs' default answers 0, with or
    // without IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS. (This returned 1,
    // WHOLE_MSG alone, which rdma-core 56's test_query_data_in_order
    // rejects as a set of capabilities.)
    0
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_destroy_qp(q: *mut ibv_qp) -> c_int {
    if q.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_destroy_qp", libc::EIO, || {
        // SAFETY: a live QP we handed out (borrowed only for the check).
        let groups = unsafe { &*(q as *const Qp) }.qp.mcast_groups();
        if let Some(g) = groups.first() {
            // As kernel uverbs: the application must detach first.
            debug(|| {
                format!(
                    "ibv_destroy_qp: the QP is still attached to {} multicast group(s) (first {}); ibv_detach_mcast first",
                    groups.len(),
                    std::net::Ipv6Addr::from(*g)
                )
            });
            return libc::EBUSY;
        }
        // SAFETY: a QP we handed out; ownership comes back here.
        let b = unsafe { Box::from_raw(q as *mut Qp) };
        let qpn = b.qp.qpn();
        // SAFETY: the context outlives its QPs.
        unsafe { ctx(b.ibv.qp_base.context) }
            .reg
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .qps
            .remove(&qpn);
        let p = b.ibv.qp_base.pd;
        drop(b);
        // SAFETY: the QP's PD outlives it.
        unsafe { release_pd(p) };
        0
    })
}

/// `ibv_attach_mcast` / `ibv_detach_mcast`: 0 or an errno value.
unsafe fn mcast(what: &str, q: *mut ibv_qp, gid: *const u8, lid: u16, attach: bool) -> c_int {
    if q.is_null() || gid.is_null() {
        return libc::EINVAL;
    }
    guard(what, libc::EIO, || {
        // SAFETY: a live QP we handed out; `gid` points to a union ibv_gid
        // (16 bytes) of the caller's.
        let (qpo, g) = unsafe { (&*(q as *const Qp), *(gid as *const [u8; 16])) };
        let r = if attach {
            qpo.qp.attach_mcast(g, lid)
        } else {
            qpo.qp.detach_mcast(g, lid)
        };
        match r {
            Ok(()) => 0,
            Err(e) => fail(what, &e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_attach_mcast(q: *mut ibv_qp, gid: *const u8, lid: u16) -> c_int {
    // SAFETY: forwarded caller pointers, checked inside.
    unsafe { mcast("ibv_attach_mcast", q, gid, lid, true) }
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_detach_mcast(q: *mut ibv_qp, gid: *const u8, lid: u16) -> c_int {
    // SAFETY: forwarded caller pointers, checked inside.
    unsafe { mcast("ibv_detach_mcast", q, gid, lid, false) }
}

// ---------------------------------------------------------------------------
// AH

#[repr(C)]
pub struct Ah {
    pub ibv: ibv_ah,
    pub ah: AddressHandle,
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_create_ah(p: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if p.is_null() || attr.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_create_ah", std::ptr::null_mut(), || {
        // SAFETY: live PD, caller attributes.
        let (pdo, a) = unsafe { (pd(p), &*attr) };
        if a.is_global == 0 {
            debug(|| "ibv_create_ah: RoCE needs a GRH (is_global = 1 and a dgid)".into());
            return null_with(libc::EINVAL);
        }
        match pdo.pd.create_ah(&crate::post::ah_attr_from_c(a)) {
            Ok(ah) => {
                let ptr = Box::into_raw(Box::new(Ah {
                    ibv: ibv_ah {
                        context: pdo.ibv.context,
                        pd: p,
                        handle: ah.handle().0,
                    },
                    ah,
                }))
                .cast::<ibv_ah>();
                // SAFETY: the live PD the object was created in.
                unsafe { ptr.with_hold(p) }
            }
            Err(e) => null_with(fail("ibv_create_ah", &e)),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_destroy_ah(a: *mut ibv_ah) -> c_int {
    if a.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_destroy_ah", libc::EIO, || {
        // SAFETY: an AH we handed out; ownership comes back here.
        let b = unsafe { Box::from_raw(a as *mut Ah) };
        let p = b.ibv.pd;
        drop(b);
        // SAFETY: the AH's PD outlives it.
        unsafe { release_pd(p) };
        0
    })
}

/// `ibv_init_ah_from_wc`: the address vector that answers the sender of a
/// received UD message, from its GRH. On RoCEv2 over IPv4 the 40-byte GRH
/// area holds the IPv4 header in its last 20 bytes.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_init_ah_from_wc(
    c: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut u8,
    ah: *mut ibv_ah_attr,
) -> c_int {
    if c.is_null() || wc.is_null() || ah.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_init_ah_from_wc", -1, || {
        // SAFETY: caller-provided wc and ah.
        let (w, out) = unsafe { (&*wc, &mut *ah) };
        *out = ibv_ah_attr {
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            port_num: port,
            ..Default::default()
        };
        if w.wc_flags & 1 == 0 || grh.is_null() {
            // No GRH: RoCE cannot answer without one.
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's receive buffer starts with the 40-byte GRH.
        let g = unsafe { std::slice::from_raw_parts(grh, 40) };
        let (src, dst, tclass, flow, hops) = if g[20] >> 4 == 4 {
            let s = std::net::Ipv4Addr::new(g[32], g[33], g[34], g[35]);
            let d = std::net::Ipv4Addr::new(g[36], g[37], g[38], g[39]);
            (
                std::net::IpAddr::V4(s),
                std::net::IpAddr::V4(d),
                g[21],
                0,
                0xff,
            )
        } else if g[0] >> 4 == 6 {
            let s: [u8; 16] = g[8..24].try_into().expect("16");
            let d: [u8; 16] = g[24..40].try_into().expect("16");
            let vtf = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
            (
                std::net::IpAddr::from(s),
                std::net::IpAddr::from(d),
                ((vtf >> 20) & 0xff) as u8,
                vtf & 0xfffff,
                0xff,
            )
        } else {
            set_errno(libc::EPROTONOSUPPORT);
            return -1;
        };
        // SAFETY: live context.
        let cx = unsafe { ctx(c) };
        let dgid = rxe_core::ip_to_gid(dst);
        let Some(idx) = cx.dev.gid_table().iter().position(|g| *g == dgid) else {
            debug(|| format!("ibv_init_ah_from_wc: {dst} is not one of this device's GIDs"));
            set_errno(libc::ENOENT);
            return -1;
        };
        out.is_global = 1;
        out.grh = ibv_global_route {
            dgid: ibv_gid {
                raw: rxe_core::ip_to_gid(src),
            },
            flow_label: flow,
            sgid_index: idx as u8,
            hop_limit: hops,
            traffic_class: tclass,
        };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_create_ah_from_wc(
    p: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut u8,
    port: u8,
) -> *mut ibv_ah {
    if p.is_null() {
        return null_with(libc::EINVAL);
    }
    let mut a = ibv_ah_attr::default();
    // SAFETY: live PD; forwarded caller contract.
    let r = unsafe { rxe_ibv_init_ah_from_wc((*p).context, port, wc, grh, &mut a) };
    if r != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    unsafe { rxe_ibv_create_ah(p, &mut a) }
}
