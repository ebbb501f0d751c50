//! The engine's memory backend for an in-process device: process virtual
//! addresses. This is the only module of the crate with `unsafe` code.

use std::sync::atomic::{AtomicU64, Ordering};

use rxe_core::mem::{AtomicOp, Memory, MemoryFault};

/// Process memory, addressed by virtual address.
///
/// Soundness rests on two facts. First, the engine calls these methods only
/// for ranges it has checked against a registered MR (key, PD, access,
/// bounds). Second, an MR is created only by
/// [`crate::ProtectionDomain::reg_mr`], which borrows the buffer mutably for
/// the MR's lifetime `'a` and deregisters it in `Drop`: while the MR exists
/// the bytes stay allocated and no safe Rust code can touch them except
/// through the MR's methods, which take the device lock as the engine does.
#[derive(Debug, Default)]
pub struct HostMemory;

impl Memory for HostMemory {
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), MemoryFault> {
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: `addr..addr+len` lies inside a registered MR (checked by the
        // engine), whose buffer is borrowed and alive (see the type's docs);
        // `out` is a distinct Rust slice, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: as for `read`; the MR was registered with the access the
        // engine checked, and the buffer is exclusively borrowed by the MR.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len())
        };
        Ok(())
    }

    fn atomic(&mut self, addr: u64, op: AtomicOp) -> Result<u64, MemoryFault> {
        if !addr.is_multiple_of(8) {
            return Err(MemoryFault { addr, len: 8 });
        }
        // SAFETY: the 8 bytes lie inside a registered MR (checked by the
        // engine) and are 8-byte aligned (checked above), which is what
        // AtomicU64 requires; real atomic instructions keep this atomic with
        // respect to other threads of the process too.
        let a = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
        Ok(match op {
            AtomicOp::FetchAdd { add } => a.fetch_add(add, Ordering::SeqCst),
            AtomicOp::CompareSwap { compare, swap } => {
                match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        })
    }
}
