//! Memory regions, memory windows and their keys.
//!
//! Keys follow kernel rxe (`rxe_mr.c`, `rxe_mw.c`): a key is `index << 8 | key
//! byte`, where the index names the object and the low byte changes on every
//! registration so that a stale key is refused. MR indices and MW indices live
//! in separate ranges (`RXE_MIN_MR_INDEX..`, `RXE_MIN_MW_INDEX..`), so the
//! index alone tells whether an rkey names an MR or a window.
//!
//! Every access the engine makes to registered memory is checked here first:
//! key, state, protection domain, access flags and bounds. Only a range that
//! passes is handed to [`crate::mem::Memory`].

use bitflags::bitflags;
use rustc_hash::FxHashMap;
use std::fmt;

use crate::PdHandle;

bitflags! {
    /// `enum ibv_access_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: receives and READ responses may write the region.
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE it.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ it.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may CAS/FAA on it.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to it.
        const MW_BIND = 1 << 4;
        /// Remote addresses are offsets from 0, not the registered address.
        const ZERO_BASED = 1 << 5;
        /// `IBV_ACCESS_ON_DEMAND`: the engine treats it as any MR; the
        /// driver's memory backend checks each page of such an MR as it
        /// is touched (verbs-api `HostMemory`).
        const ON_DEMAND = 1 << 6;
        /// `IBV_ACCESS_HUGETLB` (accepted and ignored).
        const HUGETLB = 1 << 7;
        /// `IBV_ACCESS_FLUSH_GLOBAL`.
        const FLUSH_GLOBAL = 1 << 8;
        /// `IBV_ACCESS_FLUSH_PERSISTENT`.
        const FLUSH_PERSISTENT = 1 << 9;
        /// `IBV_ACCESS_RELAXED_ORDERING` (accepted; ordering is always strict).
        const RELAXED_ORDERING = 1 << 20;
    }
}

/// First MR index (kernel `RXE_MIN_MR_INDEX`).
pub const MIN_MR_INDEX: u32 = 0x0000_0001;
/// Last MR index (kernel `RXE_MAX_MR_INDEX`).
pub const MAX_MR_INDEX: u32 = 0x0001_0000;
/// First MW index (kernel `RXE_MIN_MW_INDEX`).
pub const MIN_MW_INDEX: u32 = 0x0001_0001;
/// Last MW index (kernel `RXE_MAX_MW_INDEX`).
pub const MAX_MW_INDEX: u32 = 0x0002_0000;

/// Whether an rkey names a memory window in kernel rxe's index ranges
/// (kernel `rkey_is_mw`). A table with another [`KeySpace`] answers with
/// [`KeySpace::is_mw`].
pub fn key_is_mw(key: u32) -> bool {
    KeySpace::default().is_mw(key)
}

/// The MR and MW key indices (`key >> 8`) a table allocates from.
///
/// One engine owns a whole device by default and uses kernel rxe's ranges.
/// When several engines share one device (the daemon gives each client
/// process a slot), each gets a disjoint space, so a key one process hands
/// out can never name another process's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpace {
    /// First MR index.
    pub mr_first: u32,
    /// Last MR index.
    pub mr_last: u32,
    /// First MW index.
    pub mw_first: u32,
    /// Last MW index.
    pub mw_last: u32,
}

impl Default for KeySpace {
    /// Kernel rxe's ranges.
    fn default() -> Self {
        KeySpace {
            mr_first: MIN_MR_INDEX,
            mr_last: MAX_MR_INDEX,
            mw_first: MIN_MW_INDEX,
            mw_last: MAX_MW_INDEX,
        }
    }
}

impl KeySpace {
    /// The space of slot `slot` (1..=63) of a shared device: indices
    /// `slot << 18 | i`, MRs with `i` in 1..=0x1ffff, MWs in
    /// 0x20000..=0x3ffff (131071 of each). Slot 0 is kernel rxe's ranges.
    pub fn for_slot(slot: u32) -> KeySpace {
        if slot == 0 || slot > 63 {
            return KeySpace::default();
        }
        let base = slot << 18;
        KeySpace {
            mr_first: base | 1,
            mr_last: base | 0x1_ffff,
            mw_first: base | 0x2_0000,
            mw_last: base | 0x3_ffff,
        }
    }

    /// Whether `key` names a memory window of this space.
    pub fn is_mw(&self, key: u32) -> bool {
        (self.mw_first..=self.mw_last).contains(&(key >> 8))
    }
}

/// A registered memory region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mr {
    /// Protection domain.
    pub pd: PdHandle,
    /// Local key, for SGEs.
    pub lkey: u32,
    /// Remote key, for peers (RETH, AtomicETH).
    pub rkey: u32,
    /// Start of the region in the backend's address space.
    pub host_addr: u64,
    /// Start of the region in the address space keys refer to: `host_addr`,
    /// or 0 for a `ZERO_BASED` registration.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Access flags granted.
    pub access: AccessFlags,
    /// Number of memory windows bound to this MR; it cannot be deregistered
    /// while any is (kernel: `-EINVAL` from dereg with `num_mw > 0`).
    pub bound_windows: u32,
}

/// Memory window type (IBTA 10.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Bound with `ibv_bind_mw`, usable by any QP of the PD.
    Type1,
    /// Bound with a BIND_MW work request, usable only by the bound QP.
    Type2,
}

/// State of a memory window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwState {
    /// Allocated, not bound (type 2) or unbound (type 1).
    Free,
    /// Bound and usable.
    Valid,
    /// Invalidated; a type 2 window must be bound again.
    Invalid,
}

/// A memory window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mw {
    /// Protection domain.
    pub pd: PdHandle,
    /// Type 1 (bound with `bind_mw`) or type 2 (bound by a BIND_MW WR).
    pub mw_type: MwType,
    /// Remote key, for peers (RETH, AtomicETH).
    pub rkey: u32,
    /// Valid, free or invalid.
    pub state: MwState,
    /// lkey of the MR the window is bound to.
    pub mr_lkey: Option<u32>,
    /// QP a type 2 window is bound to.
    pub qpn: Option<u32>,
    /// Start of the bound range (remote address space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// Access flags granted.
    pub access: AccessFlags,
}

/// Why a key check failed. The caller maps it to a completion status or NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// No MR or MW has this key (or the key byte is stale).
    UnknownKey(u32),
    /// The object belongs to another protection domain.
    PdMismatch(u32),
    /// The object does not grant the access needed.
    AccessDenied {
        /// The key used.
        key: u32,
        /// The access the operation needs.
        needed: AccessFlags,
        /// The access the object grants.
        granted: AccessFlags,
    },
    /// The range is not inside the object.
    OutOfBounds {
        /// The key used.
        key: u32,
        /// Start of the range asked for.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A window that is not bound, or bound to another QP.
    WindowNotUsable(u32),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::UnknownKey(k) => write!(f, "key {k:#x} names no registered MR or bound MW"),
            KeyError::PdMismatch(k) => {
                write!(
                    f,
                    "key {k:#x} belongs to a different protection domain than the QP"
                )
            }
            KeyError::AccessDenied {
                key,
                needed,
                granted,
            } => write!(
                f,
                "key {key:#x} grants {granted:?} but the operation needs {needed:?}"
            ),
            KeyError::OutOfBounds { key, addr, len } => write!(
                f,
                "{len} bytes at {addr:#x} fall outside the region of key {key:#x}"
            ),
            KeyError::WindowNotUsable(k) => write!(
                f,
                "memory window {k:#x} is not bound, was invalidated, or is bound to another QP"
            ),
        }
    }
}

/// A checked range, ready for the memory backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRange {
    /// Start in the memory backend.
    pub host_addr: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Why an MW bind failed (completion status `MW_BIND_ERR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindError(pub String);

/// All MRs and MWs of one device.
#[derive(Debug, Default)]
pub struct KeyTable {
    mrs: FxHashMap<u32, Mr>,
    mws: FxHashMap<u32, Mw>,
    next_mr_index: u32,
    next_mw_index: u32,
    key_state: u64,
    space: KeySpace,
    /// MRs without remote access get rkey 0 (kernel rxe up to 6.4;
    /// `RxeRelease::local_mr_rkey_is_lkey`).
    local_rkey_zero: bool,
}

/// The rkey of an MR with lkey `key` and `access`: the lkey, or 0 for an
/// MR without remote access when `local_rkey_zero` (kernel rxe up to 6.4:
/// `rkey = (access & IB_ACCESS_REMOTE) ? lkey : 0`).
fn rkey_for(local_rkey_zero: bool, key: u32, access: AccessFlags) -> u32 {
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if local_rkey_zero && !access.intersects(remote) {
        0
    } else {
        key
    }
}

fn in_bounds(start: u64, length: u64, addr: u64, len: u64) -> bool {
    match (addr.checked_sub(start), start.checked_add(length)) {
        (Some(off), Some(_)) => off <= length && len <= length - off,
        _ => false,
    }
}

impl KeyTable {
    /// An empty table with kernel rxe's index ranges; `seed` makes the key
    /// bytes deterministic.
    pub fn new(seed: u64) -> Self {
        Self::with_space(seed, KeySpace::default())
    }

    /// An empty table allocating from `space`.
    pub fn with_space(seed: u64, space: KeySpace) -> Self {
        KeyTable {
            mrs: FxHashMap::default(),
            mws: FxHashMap::default(),
            next_mr_index: space.mr_first,
            next_mw_index: space.mw_first,
            key_state: seed | 1,
            space,
            local_rkey_zero: false,
        }
    }

    /// Give MRs registered without remote access the rkey 0, as kernel
    /// rxe did up to 6.4 (`RxeRelease::local_mr_rkey_is_lkey`).
    pub fn with_local_rkey_zero(mut self, on: bool) -> Self {
        self.local_rkey_zero = on;
        self
    }

    fn next_key_byte(&mut self) -> u32 {
        // xorshift64: deterministic for a seed, different on every registration.
        let mut x = self.key_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.key_state = x;
        (x & 0xff) as u32
    }

    fn alloc_index(next: &mut u32, min: u32, max: u32, used: impl Fn(u32) -> bool) -> Option<u32> {
        let span = max - min + 1;
        for _ in 0..span {
            let idx = *next;
            *next = if idx >= max { min } else { idx + 1 };
            if !used(idx) {
                return Some(idx);
            }
        }
        None
    }

    /// Number of MRs.
    pub fn mr_count(&self) -> usize {
        self.mrs.len()
    }

    /// Number of MWs.
    pub fn mw_count(&self) -> usize {
        self.mws.len()
    }

    /// Register a region. Returns `None` when the index space is exhausted.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        host_addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Option<&Mr> {
        let mrs = &self.mrs;
        let (lo, hi) = (self.space.mr_first, self.space.mr_last);
        let idx = Self::alloc_index(&mut self.next_mr_index, lo, hi, |i| mrs.contains_key(&i))?;
        let key = (idx << 8) | self.next_key_byte();
        let iova = if access.contains(AccessFlags::ZERO_BASED) {
            0
        } else {
            host_addr
        };
        let rkey = rkey_for(self.local_rkey_zero, key, access);
        self.mrs.insert(
            idx,
            Mr {
                pd,
                lkey: key,
                rkey,
                host_addr,
                iova,
                length,
                access,
                bound_windows: 0,
            },
        );
        self.mrs.get(&idx)
    }

    /// Give a just-registered MR an I/O virtual address other than its host
    /// address (`ibv_reg_mr_iova2`).
    pub fn set_iova(&mut self, lkey: u32, iova: u64) -> Option<&Mr> {
        let mr = self.mrs.get_mut(&(lkey >> 8)).filter(|m| m.lkey == lkey)?;
        mr.iova = iova;
        Some(mr)
    }

    /// The MR named by `lkey`, to change in place (`ibv_rereg_mr`).
    pub fn mr_mut(&mut self, lkey: u32) -> Option<&mut Mr> {
        self.mrs.get_mut(&(lkey >> 8)).filter(|m| m.lkey == lkey)
    }

    /// The MR named by a key (lkey or rkey), if the key is current.
    pub fn mr(&self, key: u32) -> Option<&Mr> {
        self.mrs.get(&(key >> 8)).filter(|m| m.lkey == key)
    }

    /// The MW named by an rkey, if the key is current.
    pub fn mw(&self, rkey: u32) -> Option<&Mw> {
        self.mws.get(&(rkey >> 8)).filter(|m| m.rkey == rkey)
    }

    /// Look up a memory window by the index part of `rkey`, whatever its
    /// key byte now is: a type 2 bind gives the window a new rkey, but the
    /// application still frees it by the `ibv_mw` it allocated.
    pub fn mw_any_key(&self, rkey: u32) -> Option<&Mw> {
        self.mws.get(&(rkey >> 8))
    }

    /// Deregister; fails while windows are bound to it.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<Mr, String> {
        match self.mr(lkey) {
            None => Err(format!("lkey {lkey:#x} names no registered MR")),
            Some(m) if m.bound_windows > 0 => Err(format!(
                "MR {lkey:#x} still has {} memory window(s) bound to it; unbind or free them first",
                m.bound_windows
            )),
            Some(_) => self
                .mrs
                .remove(&(lkey >> 8))
                .ok_or_else(|| format!("lkey {lkey:#x} names no registered MR")),
        }
    }

    /// Re-register a region in place (`ibv_rereg_mr`): the keys change.
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        pd: Option<PdHandle>,
        range: Option<(u64, u64)>,
        access: Option<AccessFlags>,
    ) -> Result<&Mr, String> {
        let key_byte = self.next_key_byte();
        let local_rkey_zero = self.local_rkey_zero;
        let mr = self
            .mrs
            .get_mut(&(lkey >> 8))
            .filter(|m| m.lkey == lkey)
            .ok_or_else(|| format!("lkey {lkey:#x} names no registered MR"))?;
        if mr.bound_windows > 0 {
            return Err(format!("MR {lkey:#x} has memory windows bound to it"));
        }
        if let Some(pd) = pd {
            mr.pd = pd;
        }
        if let Some((addr, len)) = range {
            mr.host_addr = addr;
            mr.length = len;
        }
        if let Some(a) = access {
            mr.access = a;
        }
        mr.iova = if mr.access.contains(AccessFlags::ZERO_BASED) {
            0
        } else {
            mr.host_addr
        };
        let key = (lkey & !0xff) | key_byte;
        mr.lkey = key;
        mr.rkey = rkey_for(local_rkey_zero, key, mr.access);
        Ok(mr)
    }

    /// Allocate a memory window.
    pub fn alloc_mw(&mut self, pd: PdHandle, mw_type: MwType) -> Option<u32> {
        let mws = &self.mws;
        let (lo, hi) = (self.space.mw_first, self.space.mw_last);
        let idx = Self::alloc_index(&mut self.next_mw_index, lo, hi, |i| mws.contains_key(&i))?;
        let rkey = (idx << 8) | self.next_key_byte();
        self.mws.insert(
            idx,
            Mw {
                pd,
                mw_type,
                rkey,
                state: MwState::Free,
                mr_lkey: None,
                qpn: None,
                addr: 0,
                length: 0,
                access: AccessFlags::empty(),
            },
        );
        Some(rkey)
    }

    fn unbind_from_mr(&mut self, mw_idx: u32) {
        if let Some(lkey) = self.mws.get_mut(&mw_idx).and_then(|w| w.mr_lkey.take()) {
            if let Some(mr) = self.mrs.get_mut(&(lkey >> 8)) {
                mr.bound_windows = mr.bound_windows.saturating_sub(1);
            }
        }
    }

    /// Free a memory window (unbinding it).
    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<(), String> {
        if self.mw_any_key(rkey).is_none() {
            return Err(format!("rkey {rkey:#x} names no memory window"));
        }
        self.unbind_from_mr(rkey >> 8);
        self.mws.remove(&(rkey >> 8));
        Ok(())
    }

    /// Drop every window bound to QP `qpn` back to Invalid (QP destroyed).
    pub fn invalidate_windows_of_qp(&mut self, qpn: u32) {
        let idxs: Vec<u32> = self
            .mws
            .iter()
            .filter(|(_, w)| w.qpn == Some(qpn))
            .map(|(i, _)| *i)
            .collect();
        for i in idxs {
            self.unbind_from_mr(i);
            if let Some(w) = self.mws.get_mut(&i) {
                w.state = MwState::Invalid;
                w.qpn = None;
            }
        }
    }

    /// Bind a window (IBTA 10.6.7.2, kernel `rxe_check_bind_mw`/`rxe_do_bind_mw`).
    /// `qp_pd` is the PD of the QP that posts the bind; `qpn` is set for type 2.
    /// Returns the window's new rkey.
    pub fn bind_mw(
        &mut self,
        mw_rkey: u32,
        new_key: u8,
        qp_pd: PdHandle,
        qpn: Option<u32>,
        bind: &crate::wr::MwBindInfo,
    ) -> Result<u32, BindError> {
        let idx = mw_rkey >> 8;
        let mw = self
            .mws
            .get(&idx)
            .filter(|w| w.rkey == mw_rkey)
            .ok_or_else(|| BindError(format!("rkey {mw_rkey:#x} names no memory window")))?
            .clone();
        if mw.mw_type == MwType::Type2 {
            if mw.state != MwState::Free && mw.state != MwState::Invalid {
                return Err(BindError(format!(
                    "type 2 window {mw_rkey:#x} is already bound; invalidate it first"
                )));
            }
            if mw.pd != qp_pd {
                return Err(BindError(format!(
                    "type 2 window {mw_rkey:#x} belongs to another PD than the QP"
                )));
            }
        }
        let unbind = bind.length == 0;
        if !unbind {
            let mr = self
                .mr(bind.mr_lkey)
                .ok_or_else(|| BindError(format!("lkey {:#x} names no MR", bind.mr_lkey)))?;
            if mr.pd != qp_pd {
                return Err(BindError("the MR belongs to another PD than the QP".into()));
            }
            if !mr.access.contains(AccessFlags::MW_BIND) {
                return Err(BindError(format!(
                    "MR {:#x} was not registered with IBV_ACCESS_MW_BIND",
                    bind.mr_lkey
                )));
            }
            if bind
                .access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
                && !mr.access.contains(AccessFlags::LOCAL_WRITE)
            {
                return Err(BindError(
                    "remote write or atomic access on a window needs LOCAL_WRITE on the MR".into(),
                ));
            }
            if mw.mw_type == MwType::Type1 && bind.access.contains(AccessFlags::ZERO_BASED) {
                return Err(BindError("type 1 windows cannot be zero based".into()));
            }
            if !in_bounds(mr.iova, mr.length, bind.addr, bind.length) {
                return Err(BindError(format!(
                    "window range {:#x}+{} is outside MR {:#x}",
                    bind.addr, bind.length, bind.mr_lkey
                )));
            }
        }
        self.unbind_from_mr(idx);
        // Both types take the key byte the bind names (kernel
        // `rxe_do_bind_mw`); `ibv_bind_mw` passes `ibv_inc_rkey` of the
        // current key for type 1.
        let new_rkey = (mw_rkey & !0xff) | u32::from(new_key);
        if !unbind {
            if let Some(mr) = self.mrs.get_mut(&(bind.mr_lkey >> 8)) {
                mr.bound_windows += 1;
            }
        }
        let w = self
            .mws
            .get_mut(&idx)
            .ok_or_else(|| BindError("window vanished".into()))?;
        w.rkey = new_rkey;
        if unbind {
            w.state = MwState::Free;
            w.mr_lkey = None;
            w.qpn = None;
            w.addr = 0;
            w.length = 0;
            w.access = AccessFlags::empty();
        } else {
            w.state = MwState::Valid;
            w.mr_lkey = Some(bind.mr_lkey);
            w.qpn = if mw.mw_type == MwType::Type2 {
                qpn
            } else {
                None
            };
            w.addr = bind.addr;
            w.length = bind.length;
            w.access = bind.access;
        }
        Ok(new_rkey)
    }

    /// Invalidate an rkey (LOCAL_INV or SEND_WITH_INV). As in kernel rxe,
    /// only type 2 windows can be invalidated this way: user MRs are not
    /// fast-registration MRs, so invalidating one is an error.
    pub fn invalidate(&mut self, rkey: u32, qpn: u32, qp_pd: PdHandle) -> Result<(), String> {
        if !self.space.is_mw(rkey) {
            return if self.mr(rkey).is_some() {
                Err(format!(
                    "rkey {rkey:#x} names a user MR; only type 2 memory windows can be invalidated"
                ))
            } else {
                Err(format!("rkey {rkey:#x} names no MR or MW"))
            };
        }
        let idx = rkey >> 8;
        let w = self
            .mws
            .get(&idx)
            .filter(|w| w.rkey == rkey)
            .ok_or_else(|| format!("rkey {rkey:#x} names no memory window"))?;
        if w.mw_type != MwType::Type2 {
            return Err(format!(
                "window {rkey:#x} is type 1; only type 2 can be invalidated"
            ));
        }
        if w.state != MwState::Valid {
            return Err(format!("window {rkey:#x} is not bound"));
        }
        if w.pd != qp_pd || w.qpn.is_some_and(|q| q != qpn) {
            return Err(format!("window {rkey:#x} is bound to another QP or PD"));
        }
        self.unbind_from_mr(idx);
        if let Some(w) = self.mws.get_mut(&idx) {
            w.state = MwState::Invalid;
            w.qpn = None;
        }
        Ok(())
    }

    /// Check a local SGE-style access through an lkey.
    pub fn check_local(
        &self,
        pd: PdHandle,
        lkey: u32,
        addr: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<HostRange, KeyError> {
        let mr = self.mr(lkey).ok_or(KeyError::UnknownKey(lkey))?;
        if mr.pd != pd {
            return Err(KeyError::PdMismatch(lkey));
        }
        if !mr.access.contains(needed) {
            return Err(KeyError::AccessDenied {
                key: lkey,
                needed,
                granted: mr.access,
            });
        }
        if !in_bounds(mr.iova, mr.length, addr, len) {
            return Err(KeyError::OutOfBounds {
                key: lkey,
                addr,
                len,
            });
        }
        Ok(HostRange {
            host_addr: mr.host_addr + (addr - mr.iova),
            len,
        })
    }

    /// Check a remote access through an rkey that names an MR or a window
    /// (kernel `check_rkey` in rxe_resp.c).
    pub fn check_remote(
        &self,
        pd: PdHandle,
        qpn: u32,
        rkey: u32,
        va: u64,
        len: u64,
        needed: AccessFlags,
    ) -> Result<HostRange, KeyError> {
        if self.space.is_mw(rkey) {
            let w = self.mw(rkey).ok_or(KeyError::UnknownKey(rkey))?;
            if w.state != MwState::Valid {
                return Err(KeyError::WindowNotUsable(rkey));
            }
            match w.mw_type {
                MwType::Type1 if w.pd != pd => return Err(KeyError::PdMismatch(rkey)),
                MwType::Type2 if w.qpn != Some(qpn) => return Err(KeyError::WindowNotUsable(rkey)),
                _ => {}
            }
            if !w.access.contains(needed) {
                return Err(KeyError::AccessDenied {
                    key: rkey,
                    needed,
                    granted: w.access,
                });
            }
            // A zero-based type 2 window addresses from 0.
            let base = if w.access.contains(AccessFlags::ZERO_BASED) {
                0
            } else {
                w.addr
            };
            if !in_bounds(base, w.length, va, len) {
                return Err(KeyError::OutOfBounds {
                    key: rkey,
                    addr: va,
                    len,
                });
            }
            let mr = w
                .mr_lkey
                .and_then(|k| self.mr(k))
                .ok_or(KeyError::WindowNotUsable(rkey))?;
            let mr_addr = w.addr + (va - base);
            return Ok(HostRange {
                host_addr: mr.host_addr + (mr_addr - mr.iova),
                len,
            });
        }
        let mr = self.mr(rkey).ok_or(KeyError::UnknownKey(rkey))?;
        if mr.pd != pd {
            return Err(KeyError::PdMismatch(rkey));
        }
        if !mr.access.contains(needed) {
            return Err(KeyError::AccessDenied {
                key: rkey,
                needed,
                granted: mr.access,
            });
        }
        if !in_bounds(mr.iova, mr.length, va, len) {
            return Err(KeyError::OutOfBounds {
                key: rkey,
                addr: va,
                len,
            });
        }
        Ok(HostRange {
            host_addr: mr.host_addr + (va - mr.iova),
            len,
        })
    }

    /// The whole remote address range an rkey names, as `(va, length)`:
    /// an MR's (iova, length), a bound window's (its start, 0 when
    /// zero-based, and length). `None` if the key names nothing. A FLUSH
    /// of selectivity "whole MR" is checked over this range (kernel
    /// `check_rkey` skips the RETH range for `IB_FLUSH_MR`).
    pub fn remote_extent(&self, rkey: u32) -> Option<(u64, u64)> {
        if self.space.is_mw(rkey) {
            let w = self.mw(rkey)?;
            let base = if w.access.contains(AccessFlags::ZERO_BASED) {
                0
            } else {
                w.addr
            };
            return Some((base, w.length));
        }
        self.mr(rkey).map(|m| (m.iova, m.length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::MwBindInfo;

    const PD: PdHandle = PdHandle(1);

    #[test]
    fn bounds_are_checked_without_overflow() {
        assert!(in_bounds(100, 10, 100, 10));
        assert!(in_bounds(100, 10, 110, 0));
        assert!(!in_bounds(100, 10, 110, 1));
        assert!(!in_bounds(100, 10, 99, 1));
        assert!(!in_bounds(100, 10, 105, u64::MAX));
        assert!(!in_bounds(u64::MAX - 1, 10, u64::MAX, 1));
    }

    #[test]
    fn mr_checks() {
        let mut t = KeyTable::new(7);
        let mr = t
            .reg_mr(
                PD,
                0x1000,
                0x100,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap()
            .clone();
        assert_eq!(mr.lkey >> 8, MIN_MR_INDEX);
        assert!(t
            .check_local(PD, mr.lkey, 0x1000, 0x100, AccessFlags::LOCAL_WRITE)
            .is_ok());
        assert_eq!(
            t.check_local(PD, mr.lkey, 0x1001, 0x100, AccessFlags::empty()),
            Err(KeyError::OutOfBounds {
                key: mr.lkey,
                addr: 0x1001,
                len: 0x100
            })
        );
        assert!(matches!(
            t.check_remote(PD, 1, mr.rkey, 0x1000, 8, AccessFlags::REMOTE_WRITE),
            Err(KeyError::AccessDenied { .. })
        ));
        assert_eq!(
            t.check_remote(PdHandle(2), 1, mr.rkey, 0x1000, 8, AccessFlags::REMOTE_READ),
            Err(KeyError::PdMismatch(mr.rkey))
        );
        assert_eq!(
            t.check_remote(PD, 1, mr.rkey ^ 0x1, 0x1000, 8, AccessFlags::REMOTE_READ),
            Err(KeyError::UnknownKey(mr.rkey ^ 1))
        );
        // Zero-based: remote addresses are offsets.
        let zb = t
            .reg_mr(
                PD,
                0x8000,
                0x100,
                AccessFlags::REMOTE_READ | AccessFlags::ZERO_BASED,
            )
            .unwrap()
            .clone();
        assert_eq!(
            t.check_remote(PD, 1, zb.rkey, 0x10, 8, AccessFlags::REMOTE_READ),
            Ok(HostRange {
                host_addr: 0x8010,
                len: 8
            })
        );
        assert!(t.dereg_mr(mr.lkey).is_ok());
        assert!(t
            .check_local(PD, mr.lkey, 0x1000, 1, AccessFlags::empty())
            .is_err());
    }

    #[test]
    fn type2_window_lifecycle() {
        let mut t = KeyTable::new(9);
        let mr = t
            .reg_mr(
                PD,
                0x1000,
                0x1000,
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND | AccessFlags::REMOTE_WRITE,
            )
            .unwrap()
            .clone();
        let rkey = t.alloc_mw(PD, MwType::Type2).unwrap();
        assert!(key_is_mw(rkey));
        let bind = MwBindInfo {
            mr_lkey: mr.lkey,
            addr: 0x1100,
            length: 0x100,
            access: AccessFlags::REMOTE_WRITE,
        };
        let k2 = t.bind_mw(rkey, 0x42, PD, Some(5), &bind).unwrap();
        assert_eq!(k2 & 0xff, 0x42);
        assert!(t
            .check_remote(PD, 5, k2, 0x1100, 0x100, AccessFlags::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            t.check_remote(PD, 6, k2, 0x1100, 1, AccessFlags::REMOTE_WRITE),
            Err(KeyError::WindowNotUsable(k2))
        );
        assert!(matches!(
            t.check_remote(PD, 5, k2, 0x10ff, 1, AccessFlags::REMOTE_WRITE),
            Err(KeyError::OutOfBounds { .. })
        ));
        assert!(
            t.dereg_mr(mr.lkey).is_err(),
            "bound MR cannot be deregistered"
        );
        assert!(
            t.invalidate(mr.rkey, 5, PD).is_err(),
            "user MR cannot be invalidated"
        );
        t.invalidate(k2, 5, PD).unwrap();
        assert_eq!(
            t.check_remote(PD, 5, k2, 0x1100, 1, AccessFlags::REMOTE_WRITE),
            Err(KeyError::WindowNotUsable(k2))
        );
        assert!(t.dereg_mr(mr.lkey).is_ok());
    }

    #[test]
    fn bind_requires_mw_bind_access() {
        let mut t = KeyTable::new(3);
        let mr = t
            .reg_mr(PD, 0x1000, 0x1000, AccessFlags::LOCAL_WRITE)
            .unwrap()
            .clone();
        let rkey = t.alloc_mw(PD, MwType::Type2).unwrap();
        let bind = MwBindInfo {
            mr_lkey: mr.lkey,
            addr: 0x1000,
            length: 0x10,
            access: AccessFlags::REMOTE_READ,
        };
        assert!(t.bind_mw(rkey, 1, PD, Some(1), &bind).is_err());
    }
}
