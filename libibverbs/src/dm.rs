//! Device memory (`ibv_alloc_dm`, `ibv_memcpy_to_dm`/`_from_dm`,
//! `ibv_reg_dm_mr`, `ibv_free_dm`, `ibv_import_dm`), which kernel rxe lacks.
//!
//! On a NIC, device memory is on-chip memory the program reaches only
//! through copies and through MRs registered on it. A software device has
//! no memory of its own: rxe-emu's "device memory" is a block of this
//! process's heap owned by the library. The program never gets its
//! address; it copies in and out by offset, and `ibv_reg_dm_mr` registers
//! a range of it zero-based (`IBV_ACCESS_ZERO_BASED` is required, as the
//! kernel requires it), so SGE addresses and remote addresses are offsets
//! from the registered range's start and every access goes through the
//! engine's MR bounds checks like any other MR.
//!
//! Copies follow the ConnectX rule (mlx5 is the provider with DM): offset
//! and length must be multiples of 4 (EINVAL), and the range must lie in
//! the allocation (EFAULT). Programs written against rxe-emu then keep
//! working on hardware.

use std::alloc::Layout;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rxe_core::AccessFlags;

use crate::abi::*;
use crate::objects::{access_flags, hold_pd, pd, Mr};
use crate::{debug, fail, guard, set_errno};

/// `max_dm_size` in `ibv_query_device_ex`: the largest single allocation.
pub const MAX_DM_SIZE: u64 = 256 * 1024;
/// The largest `log_align_req` accepted: a 4 KiB page.
const MAX_LOG_ALIGN: u32 = 12;
/// Copies move whole 32-bit words (ConnectX's device-memory rule).
const DM_COPY_ALIGN: u64 = 4;

/// The memory of one allocation, shared by the DM and its imports.
pub struct DmMem {
    ptr: *mut u8,
    layout: Layout,
    /// MRs registered on it: `ibv_free_dm` fails with EBUSY until they are
    /// deregistered.
    mrs: AtomicU32,
}

// SAFETY: the block is plain heap memory; concurrent copies into it race
// only as a NIC's device memory would, which the verbs contract leaves to
// the program.
unsafe impl Send for DmMem {}
// SAFETY: as for Send.
unsafe impl Sync for DmMem {}

impl DmMem {
    fn len(&self) -> u64 {
        self.layout.size() as u64
    }
}

impl Drop for DmMem {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in alloc_dm, freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

#[repr(C)]
pub struct Dm {
    pub ibv: ibv_dm,
    pub mem: Arc<DmMem>,
    /// From `ibv_import_dm`: `ibv_unimport_dm` frees it, `ibv_free_dm`
    /// does not apply.
    imported: bool,
}

/// Live allocations by handle, for `ibv_import_dm`: the device (its
/// `ibv_device` pointer) and the memory.
static TABLE: Mutex<Vec<(u32, usize, std::sync::Weak<DmMem>)>> = Mutex::new(Vec::new());
static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

fn null_with<T>(e: c_int) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// # Safety
/// `d` must be a DM we handed out and not freed.
unsafe fn dm<'a>(d: *mut ibv_dm) -> &'a Dm {
    // SAFETY: ibv_dm is the first field of the repr(C) Dm.
    unsafe { &*(d as *const Dm) }
}

/// An MR on device memory `mem` was deregistered.
pub fn release_dm(mem: Option<Arc<DmMem>>) {
    if let Some(m) = mem {
        m.mrs.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The range `off..off+len` of an allocation of `size` bytes, or why not.
fn check_copy(size: u64, off: u64, len: usize) -> Result<usize, c_int> {
    let len = len as u64;
    if off % DM_COPY_ALIGN != 0 || len % DM_COPY_ALIGN != 0 {
        debug(|| format!("ibv_memcpy_*_dm: offset {off} and length {len} must be multiples of 4"));
        return Err(libc::EINVAL);
    }
    match off.checked_add(len) {
        Some(end) if end <= size => Ok(off as usize),
        _ => {
            debug(|| {
                format!("ibv_memcpy_*_dm: {len} bytes at offset {off} exceed the {size}-byte allocation")
            });
            Err(libc::EFAULT)
        }
    }
}

unsafe extern "C" fn memcpy_to_dm(
    d: *mut ibv_dm,
    off: u64,
    src: *const c_void,
    len: usize,
) -> c_int {
    if d.is_null() || (src.is_null() && len > 0) {
        return libc::EINVAL;
    }
    guard("ibv_memcpy_to_dm", libc::EIO, || {
        // SAFETY: a live DM.
        let mem = &unsafe { dm(d) }.mem;
        match check_copy(mem.len(), off, len) {
            Ok(at) => {
                // SAFETY: at+len is inside the block (checked); the source
                // is the program's len readable bytes.
                unsafe { std::ptr::copy(src as *const u8, mem.ptr.add(at), len) };
                0
            }
            Err(e) => e,
        }
    })
}

unsafe extern "C" fn memcpy_from_dm(
    dst: *mut c_void,
    d: *mut ibv_dm,
    off: u64,
    len: usize,
) -> c_int {
    if d.is_null() || (dst.is_null() && len > 0) {
        return libc::EINVAL;
    }
    guard("ibv_memcpy_from_dm", libc::EIO, || {
        // SAFETY: a live DM.
        let mem = &unsafe { dm(d) }.mem;
        match check_copy(mem.len(), off, len) {
            Ok(at) => {
                // SAFETY: at+len is inside the block (checked); the
                // destination is the program's len writable bytes.
                unsafe { std::ptr::copy(mem.ptr.add(at), dst as *mut u8, len) };
                0
            }
            Err(e) => e,
        }
    })
}

fn new_dm(c: *mut ibv_context, handle: u32, mem: Arc<DmMem>, imported: bool) -> *mut ibv_dm {
    Box::into_raw(Box::new(Dm {
        ibv: ibv_dm {
            context: c,
            memcpy_to_dm: Some(memcpy_to_dm),
            memcpy_from_dm: Some(memcpy_from_dm),
            comp_mask: 0,
            handle,
        },
        mem,
        imported,
    })) as *mut ibv_dm
}

/// `ibv_alloc_dm`: `length` bytes (1 ..= `max_dm_size`), aligned to
/// `2^log_align_req` (at most 4 KiB), zero-filled; no `comp_mask` bits
/// are defined.
pub unsafe extern "C" fn alloc_dm(c: *mut ibv_context, a: *mut ibv_alloc_dm_attr) -> *mut ibv_dm {
    if c.is_null() || a.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_alloc_dm", std::ptr::null_mut(), || {
        // SAFETY: caller-provided attributes.
        let a = unsafe { &*a };
        if a.comp_mask != 0 {
            debug(|| format!("ibv_alloc_dm: unknown comp_mask {:#x}", a.comp_mask));
            return null_with(libc::EINVAL);
        }
        if a.length == 0 || a.length as u64 > MAX_DM_SIZE {
            debug(|| {
                format!(
                    "ibv_alloc_dm: length {} is not in 1..={MAX_DM_SIZE} (max_dm_size)",
                    a.length
                )
            });
            return null_with(libc::EINVAL);
        }
        if a.log_align_req > MAX_LOG_ALIGN {
            debug(|| {
                format!(
                    "ibv_alloc_dm: log_align_req {} exceeds {MAX_LOG_ALIGN} (4 KiB)",
                    a.log_align_req
                )
            });
            return null_with(libc::EINVAL);
        }
        let align = (1usize << a.log_align_req).max(64);
        let Ok(layout) = Layout::from_size_align(a.length, align) else {
            return null_with(libc::EINVAL);
        };
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return null_with(libc::ENOMEM);
        }
        let mem = Arc::new(DmMem {
            ptr,
            layout,
            mrs: AtomicU32::new(0),
        });
        let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        // SAFETY: live context.
        let device = unsafe { (*c).device } as usize;
        TABLE.lock().unwrap_or_else(|p| p.into_inner()).push((
            handle,
            device,
            Arc::downgrade(&mem),
        ));
        new_dm(c, handle, mem, false)
    })
}

/// `ibv_free_dm`: EBUSY while MRs are registered on it (as the kernel's
/// uverbs does).
pub unsafe extern "C" fn free_dm(d: *mut ibv_dm) -> c_int {
    if d.is_null() {
        return libc::EINVAL;
    }
    guard("ibv_free_dm", libc::EIO, || {
        // SAFETY: a live DM.
        let dmo = unsafe { dm(d) };
        if dmo.imported {
            debug(|| "ibv_free_dm: an imported DM is released with ibv_unimport_dm".into());
            return libc::EINVAL;
        }
        let mrs = dmo.mem.mrs.load(Ordering::Acquire);
        if mrs != 0 {
            debug(|| format!("ibv_free_dm: {mrs} MRs are still registered on it"));
            return libc::EBUSY;
        }
        let handle = dmo.ibv.handle;
        TABLE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e| e.0 != handle);
        // SAFETY: ownership comes back here. Imports keep the memory
        // alive until they are unimported.
        drop(unsafe { Box::from_raw(d as *mut Dm) });
        0
    })
}

/// `ibv_import_dm`: another `ibv_dm` on DM `handle` of the same device
/// (a context from `ibv_import_device`, or another context of this
/// process on the device).
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_import_dm(c: *mut ibv_context, handle: u32) -> *mut ibv_dm {
    if c.is_null() {
        return null_with(libc::EINVAL);
    }
    guard("ibv_import_dm", std::ptr::null_mut(), || {
        // SAFETY: live context.
        let device = unsafe { (*c).device } as usize;
        let mem = TABLE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|e| e.0 == handle && e.1 == device)
            .and_then(|e| e.2.upgrade());
        match mem {
            Some(mem) => new_dm(c, handle, mem, true),
            None => {
                debug(|| format!("ibv_import_dm: no DM with handle {handle} on this device"));
                null_with(libc::EINVAL)
            }
        }
    })
}

/// `ibv_unimport_dm`: free the `ibv_dm`, not the memory.
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_unimport_dm(d: *mut ibv_dm) {
    if d.is_null() {
        return;
    }
    guard("ibv_unimport_dm", (), || {
        // SAFETY: a live DM.
        if !unsafe { dm(d) }.imported {
            debug(|| "ibv_unimport_dm: not an imported DM; use ibv_free_dm".into());
            return;
        }
        // SAFETY: an imported DM; ownership comes back here.
        drop(unsafe { Box::from_raw(d as *mut Dm) });
    })
}

/// `IBV_ACCESS_ZERO_BASED`.
const ACCESS_ZERO_BASED: c_uint = 1 << 5;

/// `ibv_reg_dm_mr`: register `length` bytes of DM `d` from `off`,
/// zero-based: SGEs and remote accesses address it from 0. The kernel's
/// checks: `IBV_ACCESS_ZERO_BASED` required, the range inside the DM,
/// the PD and the DM of one device.
pub unsafe extern "C" fn reg_dm_mr(
    p: *mut ibv_pd,
    d: *mut ibv_dm,
    off: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    if p.is_null() || d.is_null() {
        return null_with(libc::EINVAL);
    }
    if access & ACCESS_ZERO_BASED == 0 {
        debug(|| {
            "ibv_reg_dm_mr: device memory is registered zero-based: add IBV_ACCESS_ZERO_BASED"
                .into()
        });
        return null_with(libc::EINVAL);
    }
    let flags = match access_flags(access as c_int) {
        Ok(f) => f,
        Err(e) => return null_with(e),
    };
    guard("ibv_reg_dm_mr", std::ptr::null_mut(), || {
        // SAFETY: the program's live PD and DM.
        let (pdo, dmo) = unsafe { (pd(p), dm(d)) };
        // SAFETY: both contexts are live.
        if unsafe { (*pdo.ibv.context).device != (*dmo.ibv.context).device } {
            debug(|| "ibv_reg_dm_mr: the PD and the DM belong to different devices".into());
            return null_with(libc::EINVAL);
        }
        let size = dmo.mem.len();
        let len = length as u64;
        if off > size || len > size - off {
            debug(|| {
                format!("ibv_reg_dm_mr: {len} bytes at offset {off} exceed the {size}-byte DM")
            });
            return null_with(libc::EINVAL);
        }
        debug_assert!(flags.contains(AccessFlags::ZERO_BASED));
        let host = dmo.mem.ptr as u64 + off;
        // SAFETY: host..host+len lies in the DM's block (checked above),
        // which stays allocated while the MR exists: the MR holds the
        // memory (Arc) and ibv_free_dm refuses while MRs are registered.
        let r = unsafe { pdo.pd.reg_mr_raw(host, len, None, flags) };
        match r {
            Ok(mr) => {
                dmo.mem.mrs.fetch_add(1, Ordering::AcqRel);
                let b = Box::new(Mr {
                    ibv: ibv_mr {
                        context: pdo.ibv.context,
                        pd: p,
                        // Zero-based: the MR's addresses start at 0.
                        addr: std::ptr::null_mut(),
                        length,
                        handle: mr.lkey(),
                        lkey: mr.lkey(),
                        rkey: mr.rkey(),
                    },
                    mr,
                    dm: Some(dmo.mem.clone()),
                });
                // SAFETY: the live PD the MR was registered in.
                unsafe { hold_pd(p) };
                Box::into_raw(b) as *mut ibv_mr
            }
            Err(e) => null_with(fail("ibv_reg_dm_mr", &e)),
        }
    })
}

/// `ibv_dm_export_dmabuf_fd` (rdma-core 65): our device memory is a heap
/// block of this library, not a dma-buf; -1 with EOPNOTSUPP, as rdma-core
/// answers for a provider without the op (rxe's).
#[no_mangle]
pub unsafe extern "C" fn rxe_ibv_dm_export_dmabuf_fd(d: *mut ibv_dm) -> c_int {
    set_errno(if d.is_null() {
        libc::EINVAL
    } else {
        libc::EOPNOTSUPP
    });
    -1
}
