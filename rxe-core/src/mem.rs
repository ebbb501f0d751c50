//! Memory access through a small trait.
//!
//! The engine never dereferences an address itself. Every byte it moves between
//! the wire and registered memory goes through [`Memory`], after the engine has
//! checked the key, the protection domain, the access flags and the bounds of the
//! MR or MW that covers it (see [`crate::mr`]). So the same engine runs
//! in-process (raw pointers, in the verbs crate), in a daemon, or in a simulator
//! ([`VecMemory`]).

use std::collections::BTreeMap;
use std::fmt;

/// An access that the memory backend refused. The engine turns it into the
/// completion status the kernel would report (protection or access error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFault {
    /// First address of the access.
    pub addr: u64,
    /// Length of the access in bytes.
    pub len: usize,
}

impl fmt::Display for MemoryFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory fault: {} bytes at {:#x} are not backed by registered memory",
            self.len, self.addr
        )
    }
}

impl std::error::Error for MemoryFault {}

/// An 8-byte atomic operation (IBTA 9.4.5). Values are host-order integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Compare and swap: if `*addr == compare` then `*addr = swap`.
    CompareSwap {
        /// Value to compare with.
        compare: u64,
        /// Value stored if equal.
        swap: u64,
    },
    /// Fetch and add: `*addr += add` (wrapping).
    FetchAdd {
        /// Value added.
        add: u64,
    },
}

impl AtomicOp {
    /// The new value of the location given its original value.
    pub fn apply(self, orig: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } => {
                if orig == compare {
                    swap
                } else {
                    orig
                }
            }
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
        }
    }
}

/// Backend for the bytes behind memory regions.
///
/// Addresses are those the application registered (its virtual addresses, or
/// whatever space the backend defines). The engine only calls these methods for
/// ranges it has already validated against a registered MR, so an implementation
/// over raw pointers is sound as long as registration guarantees the range stays
/// mapped while the MR exists.
pub trait Memory {
    /// Copy `out.len()` bytes starting at `addr` into `out`.
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), MemoryFault>;
    /// Copy `data` to `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault>;
    /// Perform an 8-byte atomic at `addr` (8-byte aligned) and return the
    /// original value. Atomic with respect to the engine's other operations;
    /// an in-process backend should use real atomic instructions so that it is
    /// also atomic with respect to the host CPU. Values are host-order integers
    /// stored in native byte order, like a `u64` in the application's memory.
    fn atomic(&mut self, addr: u64, op: AtomicOp) -> Result<u64, MemoryFault> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        let orig = u64::from_ne_bytes(b);
        self.write(addr, &op.apply(orig).to_ne_bytes())?;
        Ok(orig)
    }

    /// Store `value` at `addr` (8-byte aligned) as one indivisible 8-byte
    /// write, ordered after every earlier access (an ATOMIC WRITE, IBTA 1.5
    /// Annex A19; kernel rxe does `smp_store_release`). `value` holds the 8
    /// bytes in memory order, as `u64::from_ne_bytes` of them.
    ///
    /// The default is a compare-and-swap loop over [`Memory::atomic`], so a
    /// backend whose `atomic` uses real atomic instructions gets a real
    /// atomic store without more code; a backend may override it with a
    /// release store.
    fn atomic_write(&mut self, addr: u64, value: u64) -> Result<(), MemoryFault> {
        let mut expect = 0u64;
        loop {
            let seen = self.atomic(
                addr,
                AtomicOp::CompareSwap {
                    compare: expect,
                    swap: value,
                },
            )?;
            if seen == expect {
                return Ok(());
            }
            expect = seen;
        }
    }

    /// Whether the driver may read the `len` bytes at `addr` itself, later,
    /// instead of the engine copying them into a packet now
    /// ([`crate::Engine::defer_gather`]): true only for a backend whose
    /// addresses the driver can read directly, and only for bytes that
    /// stay readable as long as their MR is registered. The default (and
    /// every simulated memory): no.
    fn direct(&self, addr: u64, len: usize) -> bool {
        let _ = (addr, len);
        false
    }
}

/// A simulated address space made of separately allocated regions, for tests,
/// simulators and fuzzers. Accesses that do not fall inside one region fault.
#[derive(Debug, Default, Clone)]
pub struct VecMemory {
    regions: BTreeMap<u64, Vec<u8>>,
    next: u64,
    /// [`VecMemory::set_direct`].
    direct: bool,
}

impl VecMemory {
    /// Say ([`Memory::direct`]) that the bytes of its regions may be read
    /// by the driver later, as a driver over process memory can: for
    /// tests of [`crate::Engine::defer_gather`], whose driver then reads
    /// them with [`crate::Engine::fill_gathered`].
    pub fn set_direct(&mut self, on: bool) {
        self.direct = on;
    }

    /// An empty address space. Regions are placed from 0x10000 upwards with
    /// unmapped gaps between them, so an overrun faults instead of landing in
    /// the neighbour.
    pub fn new() -> Self {
        VecMemory {
            regions: BTreeMap::new(),
            next: 0x1_0000,
            direct: false,
        }
    }

    /// Allocate a zeroed region of `len` bytes and return its address.
    pub fn alloc(&mut self, len: usize) -> u64 {
        let addr = self.next;
        let span = (len as u64).div_ceil(0x1000).max(1) * 0x1000;
        self.next = addr + span + 0x1000;
        self.regions.insert(addr, vec![0; len]);
        addr
    }

    /// Allocate a zeroed region at a chosen address (to mirror another
    /// host's addresses, e.g. when replaying a capture). Fails if it would
    /// overlap an existing region.
    pub fn alloc_at(&mut self, addr: u64, len: usize) -> Option<u64> {
        let end = addr.checked_add(len as u64)?;
        let overlaps = self
            .regions
            .range(..end)
            .next_back()
            .is_some_and(|(&b, r)| b + r.len() as u64 > addr);
        if overlaps {
            return None;
        }
        self.regions.insert(addr, vec![0; len]);
        self.next = self.next.max(end.div_ceil(0x1000) * 0x1000 + 0x1000);
        Some(addr)
    }

    /// Free a region by its address.
    pub fn free(&mut self, addr: u64) -> bool {
        self.regions.remove(&addr).is_some()
    }

    fn locate(&self, addr: u64, len: usize) -> Option<(u64, usize)> {
        let (&base, region) = self.regions.range(..=addr).next_back()?;
        let off = usize::try_from(addr - base).ok()?;
        let end = off.checked_add(len)?;
        (end <= region.len()).then_some((base, off))
    }

    /// The bytes of `len` at `addr`, if they lie inside one region.
    pub fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let (base, off) = self.locate(addr, len)?;
        self.regions.get(&base).map(|r| &r[off..off + len])
    }

    /// Mutable bytes of `len` at `addr`, if they lie inside one region.
    pub fn slice_mut(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let (base, off) = self.locate(addr, len)?;
        self.regions.get_mut(&base).map(|r| &mut r[off..off + len])
    }
}

impl Memory for VecMemory {
    fn direct(&self, addr: u64, len: usize) -> bool {
        self.direct && self.slice(addr, len).is_some()
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), MemoryFault> {
        let src = self.slice(addr, out.len()).ok_or(MemoryFault {
            addr,
            len: out.len(),
        })?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        let dst = self.slice_mut(addr, data.len()).ok_or(MemoryFault {
            addr,
            len: data.len(),
        })?;
        dst.copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_isolated() {
        let mut m = VecMemory::new();
        let a = m.alloc(16);
        let b = m.alloc(16);
        assert!(m.write(a, &[1; 16]).is_ok());
        assert!(m.write(a + 8, &[1; 16]).is_err(), "overrun must fault");
        assert!(m.read(b + 16, &mut [0; 1]).is_err());
        let mut out = [0u8; 16];
        m.read(a, &mut out).unwrap();
        assert_eq!(out, [1; 16]);
    }

    #[test]
    fn alloc_at_refuses_overlap() {
        let mut m = VecMemory::new();
        assert_eq!(m.alloc_at(0x5000_0000, 100), Some(0x5000_0000));
        assert_eq!(m.alloc_at(0x5000_0050, 10), None);
        assert_eq!(m.alloc_at(0x4fff_fff0, 0x20), None);
        assert_eq!(m.alloc_at(0x5000_0064, 10), Some(0x5000_0064));
        let a = m.alloc(10);
        assert!(a > 0x5000_0064);
    }

    #[test]
    fn atomics() {
        let mut m = VecMemory::new();
        let a = m.alloc(8);
        m.write(a, &5u64.to_ne_bytes()).unwrap();
        assert_eq!(m.atomic(a, AtomicOp::FetchAdd { add: 3 }).unwrap(), 5);
        assert_eq!(
            m.atomic(
                a,
                AtomicOp::CompareSwap {
                    compare: 8,
                    swap: 1
                }
            )
            .unwrap(),
            8
        );
        assert_eq!(
            m.atomic(
                a,
                AtomicOp::CompareSwap {
                    compare: 8,
                    swap: 2
                }
            )
            .unwrap(),
            1
        );
    }

    #[test]
    fn atomic_write_stores_whatever_was_there() {
        let mut m = VecMemory::new();
        let a = m.alloc(16);
        m.atomic_write(a, 0x1122_3344_5566_7788).unwrap();
        m.write(a + 8, &7u64.to_ne_bytes()).unwrap();
        m.atomic_write(a + 8, 0).unwrap();
        let mut out = [0u8; 16];
        m.read(a, &mut out).unwrap();
        assert_eq!(&out[..8], &0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(&out[8..], &[0; 8]);
        assert!(m.atomic_write(a + 16, 1).is_err(), "outside the region");
    }
}
