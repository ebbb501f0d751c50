//! The engine's memory backend for an in-process device: process virtual
//! addresses. This is the only module of the crate with `unsafe` code.

use rustc_hash::FxHashMap;
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
///
/// On-demand-paging MRs (`IBV_ACCESS_ON_DEMAND`, registered through the C
/// layer) promise less: their pages need not be mapped, and an implicit
/// one covers the whole address space. Every access that touches such a
/// range goes through `process_vm_readv`/`process_vm_writev` on our own
/// process, which report an unmapped or read-only page as EFAULT instead
/// of faulting: the engine turns that into an error completion, as a NIC
/// does when it cannot resolve a page fault.
#[derive(Debug, Default)]
pub struct HostMemory {
    /// On-demand-paging ranges `[start, end)` by the lkey of their MR.
    odp: FxHashMap<u32, (u64, u64)>,
    /// The payload of the packet being handled is already at this address
    /// (address, length): a sender on this host placed it there
    /// (`local_link::Inbox::place`).
    placed: Option<(u64, usize)>,
    /// The packet's payload did not come with it (the inbox record left
    /// it out, as it was placed): the engine's buffer holds no such bytes.
    elided: bool,
}

impl HostMemory {
    /// Mark MR `lkey`'s host range as on-demand paging.
    pub fn add_odp(&mut self, lkey: u32, start: u64, len: u64) {
        self.odp.insert(lkey, (start, start.saturating_add(len)));
    }

    /// The MR is gone (or no longer on demand).
    pub fn remove_odp(&mut self, lkey: u32) {
        self.odp.remove(&lkey);
    }

    /// The packet about to be handled carries `len` bytes that its sender
    /// already wrote at `addr`: the engine's write of exactly those bytes
    /// there is skipped (it would write them again, over anything the
    /// application did with them since). Any other write is done.
    pub fn expect_placed(&mut self, addr: u64, len: usize) {
        self.placed = Some((addr, len));
    }

    /// As [`HostMemory::expect_placed`], for a packet whose payload was
    /// left out of its record: until [`HostMemory::end_placed`], any write
    /// but that of the placed bytes fails (a memory fault: the engine
    /// answers it as it answers a page it cannot write), so that bytes
    /// the packet does not carry never land anywhere.
    pub fn expect_placed_elided(&mut self, addr: u64, len: usize) {
        self.placed = Some((addr, len));
        self.elided = true;
    }

    /// The packet was handled: returns whether its placed payload was the
    /// engine's write (it was checked and accepted where it lies).
    pub fn end_placed(&mut self) -> bool {
        self.elided = false;
        self.placed.take().is_none()
    }

    /// Copy `len` bytes of this process's memory at `addr` into `out`, a
    /// page at a time through the kernel: an address a peer named (a
    /// placed payload, read back for a tracer) that is not mapped gives
    /// an error instead of a fault.
    pub fn read_checked(addr: u64, out: &mut [u8]) -> bool {
        out.is_empty() || Self::copy_checked(addr, out.as_mut_ptr(), out.len(), false).is_ok()
    }

    /// Whether `[addr, addr + len)` touches an on-demand-paging range.
    fn is_odp(&self, addr: u64, len: usize) -> bool {
        let end = addr.saturating_add(len as u64);
        self.odp.values().any(|&(s, e)| addr < e && s < end)
    }

    /// Copy between our own address space and `buf` without faulting:
    /// `process_vm_readv` (`write == false`: from `addr` into `buf`) or
    /// `process_vm_writev` (from `buf` to `addr`). A page that is not
    /// mapped, or not writable, gives `MemoryFault`.
    fn copy_checked(addr: u64, buf: *mut u8, len: usize, write: bool) -> Result<(), MemoryFault> {
        let fault = MemoryFault { addr, len };
        let mut done = 0usize;
        while done < len {
            let local = libc::iovec {
                iov_base: buf.wrapping_add(done) as *mut libc::c_void,
                iov_len: len - done,
            };
            let remote = libc::iovec {
                iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
                iov_len: len - done,
            };
            // SAFETY: `local` describes `len - done` bytes of a buffer the
            // caller owns (readable for writev, writable for readv);
            // `remote` names addresses in our own process, which the kernel
            // checks page by page and reports as EFAULT instead of touching
            // an unmapped or protected page. One iovec each.
            let n = unsafe {
                if write {
                    libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0)
                } else {
                    libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0)
                }
            };
            if n <= 0 {
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                return Err(fault);
            }
            done += n as usize;
        }
        Ok(())
    }
}

/// Copy into `t` the payload its engine left in memory
/// ([`rxe_core::Engine::defer_gather`]); nothing for a whole packet.
///
/// Sound because of where such a packet comes from and where it goes: an
/// engine over [`HostMemory`] left the bytes only in a registered MR's
/// range that [`HostMemory::direct`] vouched for (not on-demand paging:
/// mapped while the MR exists), and the device sends or completes every
/// such packet in the flush that took it from the engine, with the
/// engine locked, so the MR (deregistered only under that lock) is still
/// there.
pub(crate) fn fill_gathered(t: &mut rxe_core::Transmit) {
    let Some(g) = t.gathered.take() else {
        return;
    };
    let dst = &mut t.payload[g.at..g.at + g.len];
    // SAFETY: see above: `g.addr..g.addr + g.len` is mapped, readable
    // memory of this process; `dst` is a distinct Rust allocation.
    unsafe { std::ptr::copy_nonoverlapping(g.addr as usize as *const u8, dst.as_mut_ptr(), g.len) }
}

/// Push `t`, whose payload its engine left in memory, into ring `ring`
/// of `inbox`, the payload copied there straight from that memory
/// ([`local_link::Inbox::push_gathered`]). As [`fill_gathered`], called
/// in the flush that took `t` from the engine.
pub(crate) fn push_gathered(
    inbox: &local_link::Inbox,
    ring: usize,
    tos: u8,
    t: &rxe_core::Transmit,
    icrc: local_link::Icrc,
) -> Result<(), local_link::PushError> {
    let Some(g) = t.gathered else {
        return inbox.push_with(ring, t.info.src_port, tos, &t.payload, icrc);
    };
    // SAFETY: as in `fill_gathered`, `g.addr..g.addr + g.len` is mapped,
    // readable memory of this process for the whole call.
    unsafe {
        inbox.push_gathered(
            ring,
            t.info.src_port,
            tos,
            &t.payload,
            g.at,
            g.addr as usize as *const u8,
            g.len,
            icrc,
        )
    }
}

impl Memory for HostMemory {
    /// Memory of this process outside on-demand-paging MRs: mapped while
    /// its MR is registered.
    fn direct(&self, addr: u64, len: usize) -> bool {
        !self.is_odp(addr, len)
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), MemoryFault> {
        if out.is_empty() {
            return Ok(());
        }
        if self.is_odp(addr, out.len()) {
            return Self::copy_checked(addr, out.as_mut_ptr(), out.len(), false);
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
        if self.placed == Some((addr, data.len())) {
            self.placed = None;
            return Ok(());
        }
        if self.elided {
            return Err(MemoryFault {
                addr,
                len: data.len(),
            });
        }
        if self.is_odp(addr, data.len()) {
            return Self::copy_checked(addr, data.as_ptr() as *mut u8, data.len(), true);
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
        if self.is_odp(addr, 8) {
            // Fault the page in, or fail cleanly if it is not mapped. (A
            // read-only mapping under an ODP MR with atomic access is not
            // detected here: the atomic below would fault on it.)
            let mut probe = [0u8; 8];
            Self::copy_checked(addr, probe.as_mut_ptr(), 8, false)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placed_payload_is_not_written_again_and_any_other_write_is() {
        let mut buf = vec![0u8; 32];
        let addr = buf.as_mut_ptr() as u64;
        let mut m = HostMemory::default();
        // The sender placed 8 bytes at +8; the application then changed
        // one of them. The engine's write of that payload must not undo it.
        m.expect_placed(addr + 8, 8);
        m.write(addr, &[1; 8]).unwrap();
        m.write(addr + 8, &[2; 4]).unwrap();
        m.write(addr + 8, &[3; 8]).unwrap();
        assert!(m.end_placed(), "the placed write was the engine's");
        let mut want = vec![0u8; 32];
        want[..8].fill(1);
        want[8..12].fill(2);
        assert_eq!(buf, want);
        // Only that one write was skipped.
        m.write(addr + 8, &[4; 8]).unwrap();
        want[8..16].fill(4);
        assert_eq!(buf, want);
        // A packet whose placed payload the engine never wrote.
        m.expect_placed(addr + 16, 8);
        assert!(!m.end_placed());
        m.write(addr + 16, &[5; 8]).unwrap();
        assert_eq!(&buf[16..24], &[5; 8]);
    }

    #[test]
    fn with_its_payload_left_out_a_packet_writes_nothing_but_what_was_placed() {
        let mut buf = vec![0u8; 32];
        let addr = buf.as_mut_ptr() as u64;
        let mut m = HostMemory::default();
        // Any write but the placed one fails, before or after it, and
        // changes nothing.
        m.expect_placed_elided(addr + 8, 8);
        assert!(m.write(addr, &[1; 8]).is_err());
        assert!(m.write(addr + 8, &[1; 4]).is_err());
        m.write(addr + 8, &[2; 8]).unwrap();
        assert!(m.write(addr + 8, &[3; 8]).is_err());
        assert!(m.end_placed());
        assert_eq!(buf, vec![0u8; 32]);
        // The next packet writes as usual.
        m.write(addr, &[4; 8]).unwrap();
        assert_eq!(&buf[..8], &[4; 8]);
    }
}
