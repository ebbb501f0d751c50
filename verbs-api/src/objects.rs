//! PD, MR, CQ, QP, SRQ and AH: thin owners of engine objects that release
//! them on drop.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use rxe_core::{AhHandle, CqHandle, PdHandle, SrqHandle};

use crate::device::Device;
use crate::{
    AccessFlags, AhAttr, AsyncEvent, Error, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr,
    Result, SendWr, SrqAttr, WorkCompletion,
};

impl Device {
    /// Allocate a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        self.inner.check_alive()?;
        let h = self.inner.lock().alloc_pd()?;
        Ok(ProtectionDomain {
            dev: self.clone(),
            h,
            closed: false,
            owned: true,
        })
    }

    /// Another handle on PD `handle` of this device (`ibv_import_pd`, for
    /// a context imported from another one's command fd). Dropping it
    /// leaves the PD allocated (`ibv_unimport_pd`); [`ProtectionDomain::close`]
    /// frees it for every holder.
    pub fn import_pd(&self, handle: u32) -> Result<ProtectionDomain> {
        self.inner.check_alive()?;
        let h = PdHandle(handle);
        if !self.inner.lock().has_pd(h) {
            return Err(Error::Verbs(rxe_core::Error::NotFound(format!(
                "PD {handle}"
            ))));
        }
        Ok(ProtectionDomain {
            dev: self.clone(),
            h,
            closed: false,
            owned: false,
        })
    }

    /// Create a completion queue with room for `cqe` completions.
    pub fn create_cq(&self, cqe: u32) -> Result<CompletionQueue> {
        self.inner.check_alive()?;
        let h = self.inner.lock().create_cq(cqe)?;
        Ok(CompletionQueue {
            dev: self.clone(),
            h,
            closed: false,
            idle_at: AtomicU64::new(u64::MAX),
            idle_until: AtomicU64::new(u64::MAX),
        })
    }

    /// Create a completion channel (`ibv_create_comp_channel`): a file
    /// descriptor that becomes readable when an armed CQ attached to it
    /// gets a completion.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel> {
        let (tx, rx) =
            std::os::unix::net::UnixDatagram::pair().map_err(|e| Error::Io(e.to_string()))?;
        tx.set_nonblocking(true)
            .map_err(|e| Error::Io(e.to_string()))?;
        Ok(CompletionChannel {
            tx: std::sync::Arc::new(crate::device::ChannelTx { tx }),
            rx,
        })
    }

    /// Create a CQ whose notifications go to `channel`.
    pub fn create_cq_with_channel(
        &self,
        cqe: u32,
        channel: &CompletionChannel,
    ) -> Result<CompletionQueue> {
        let cq = self.create_cq(cqe)?;
        self.inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cq.h, channel.tx.clone());
        Ok(cq)
    }

    /// The next asynchronous event without waiting (`None` if there is
    /// none). Events carry the reason in words.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        let ev = self
            .inner
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()?;
        // Consume its signal byte (sent after the push; the fd is non-blocking).
        let _ = self.inner.event_rx.recv(&mut [0u8; 1]);
        Some(ev)
    }

    /// Wait for the next asynchronous event (`ibv_get_async_event`), at most
    /// `timeout` (`None`: no limit).
    pub fn get_async_event(&self, timeout: Option<std::time::Duration>) -> Option<AsyncEvent> {
        let start = std::time::Instant::now();
        loop {
            if let Some(ev) = self.poll_async_event() {
                return Some(ev);
            }
            let left = match timeout {
                Some(t) => t.checked_sub(start.elapsed())?,
                None => std::time::Duration::from_secs(1),
            };
            crate::sys::wait_readable(
                &[self.async_fd()],
                Some(left.min(std::time::Duration::from_secs(1))),
            );
        }
    }

    /// The file descriptor that is readable while an asynchronous event is
    /// waiting (the `async_fd` of `ibv_context`), for poll/epoll.
    pub fn async_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.inner.event_rx)
    }
}

/// A protection domain.
pub struct ProtectionDomain {
    dev: Device,
    h: PdHandle,
    closed: bool,
    /// False for an imported handle: dropping it does not free the PD.
    owned: bool,
}

impl ProtectionDomain {
    /// Register `buf` for RDMA. The buffer stays borrowed until the region is
    /// dropped (deregistered), so it cannot be freed or touched behind the
    /// device's back; use [`MemoryRegion::read`] and [`MemoryRegion::write`].
    pub fn reg_mr<'a>(&self, buf: &'a mut [u8], access: AccessFlags) -> Result<MemoryRegion<'a>> {
        let addr = buf.as_mut_ptr() as usize as u64;
        let len = buf.len() as u64;
        self.dev.inner.check_alive()?;
        // Borrowed Rust memory never moves.
        self.dev.inner.note_mr_range(addr, len, access, false);
        let r = self.dev.inner.lock().reg_mr(self.h, addr, len, access);
        let mr = r.inspect_err(|_| self.dev.inner.forget_mr_range(addr, len))?;
        self.dev.inner.publish_mr(&mr);
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            lkey: mr.lkey,
            rkey: mr.rkey,
            addr: mr.iova,
            host: addr,
            len,
            closed: false,
            owned: true,
            _buf: PhantomData,
        })
    }

    /// Register `len` bytes of process memory at `addr` that peers and SGEs
    /// name by `iova` (`None`: the address itself): `ibv_reg_mr_iova2`
    /// for the C ABI, whose callers manage their own memory.
    ///
    /// # Safety
    ///
    /// `addr..addr+len` must be memory of this process that stays mapped
    /// until the region is dropped or closed. The device reads and writes
    /// it whenever local work or a permitted remote access names it, as a
    /// NIC would; the caller accepts that these accesses race with its own.
    pub unsafe fn reg_mr_raw(
        &self,
        addr: u64,
        len: u64,
        iova: Option<u64>,
        access: AccessFlags,
    ) -> Result<MemoryRegion<'static>> {
        self.dev.inner.check_alive()?;
        self.dev.inner.note_mr_range(addr, len, access, true);
        let mut e = self.dev.inner.lock();
        let mr = match e.reg_mr_iova(self.h, addr, len, iova, access) {
            Ok(mr) => mr,
            Err(err) => {
                drop(e);
                self.dev.inner.forget_mr_range(addr, len);
                return Err(err.into());
            }
        };
        if access.contains(AccessFlags::ON_DEMAND) {
            // Its pages may come and go: every access checks them.
            e.mem_mut().add_odp(mr.lkey, addr, len);
        }
        drop(e);
        self.dev.inner.publish_mr(&mr);
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            lkey: mr.lkey,
            rkey: mr.rkey,
            addr: mr.iova,
            host: addr,
            len,
            closed: false,
            owned: true,
            _buf: PhantomData,
        })
    }

    /// `ibv_advise_mr`: each SGE must lie in an on-demand-paging MR of this
    /// PD (else EINVAL, naming the SGE). With `fault_in`, the pages are
    /// touched now (read through the checked path), so the first RDMA on
    /// them finds them present; an unmapped page fails (EIO, naming it).
    pub fn advise_mr(&self, sges: &[rxe_core::Sge], fault_in: bool) -> Result<()> {
        let e = self.dev.inner.lock();
        for (i, sge) in sges.iter().enumerate() {
            let mr = e
                .mr(sge.lkey)
                .filter(|m| m.lkey == sge.lkey)
                .ok_or_else(|| {
                    Error::Verbs(rxe_core::Error::Invalid(format!(
                        "SGE {i}: lkey {:#x} names no MR",
                        sge.lkey
                    )))
                })?;
            let inside = sge
                .addr
                .checked_sub(mr.iova)
                .is_some_and(|off| off <= mr.length && u64::from(sge.length) <= mr.length - off);
            let why = if mr.pd != self.h {
                Some("is in another PD")
            } else if !mr.access.contains(AccessFlags::ON_DEMAND) {
                Some("is not an on-demand-paging MR")
            } else if !inside {
                Some("does not cover the SGE's range")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Error::Verbs(rxe_core::Error::Invalid(format!(
                    "SGE {i}: MR {:#x} {why}",
                    sge.lkey
                ))));
            }
            if fault_in {
                let host = mr.host_addr + (sge.addr - mr.iova);
                let mut chunk = vec![0u8; (sge.length as usize).min(1 << 16)];
                let mut off = 0u64;
                while off < u64::from(sge.length) {
                    let n = (u64::from(sge.length) - off).min(chunk.len() as u64) as usize;
                    rxe_core::mem::Memory::read(e.mem(), host + off, &mut chunk[..n]).map_err(
                        |f| {
                            Error::Io(format!(
                                "SGE {i}: {} bytes at {:#x} are not mapped",
                                f.len, f.addr
                            ))
                        },
                    )?;
                    off += n as u64;
                }
            }
        }
        Ok(())
    }

    /// This PD's handle, what [`Device::import_pd`] takes.
    pub fn handle(&self) -> u32 {
        self.h.0
    }

    /// Another handle on the MR of this PD whose lkey is `lkey`
    /// (`ibv_import_mr`). Dropping it leaves the MR registered
    /// (`ibv_unimport_mr`); [`MemoryRegion::close`] deregisters it.
    pub fn import_mr(&self, lkey: u32) -> Result<MemoryRegion<'static>> {
        self.dev.inner.check_alive()?;
        let mr = self.dev.inner.lock().mr(lkey).cloned();
        match mr {
            Some(mr) if mr.pd == self.h && mr.lkey == lkey => Ok(MemoryRegion {
                dev: self.dev.clone(),
                lkey: mr.lkey,
                rkey: mr.rkey,
                addr: mr.iova,
                host: mr.host_addr,
                len: mr.length,
                closed: false,
                owned: false,
                _buf: PhantomData,
            }),
            _ => Err(Error::Verbs(rxe_core::Error::NotFound(format!(
                "MR with lkey {lkey:#x} in PD {}",
                self.h.0
            )))),
        }
    }

    /// Allocate a memory window of `mw_type` (`ibv_alloc_mw`).
    pub fn alloc_mw(&self, mw_type: rxe_core::MwType) -> Result<MemoryWindow> {
        self.dev.inner.check_alive()?;
        let rkey = self.dev.inner.lock().alloc_mw(self.h, mw_type)?;
        Ok(MemoryWindow {
            dev: self.dev.clone(),
            rkey,
            closed: false,
        })
    }

    /// `ibv_dealloc_pd` with its error: refused (and the PD handed back)
    /// while objects still use it.
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let r = self.dev.inner.lock().dealloc_pd(self.h);
        match r {
            Ok(()) => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err((self, e.into())),
        }
    }

    /// Create a queue pair; it starts in RESET.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        srq: Option<&SharedReceiveQueue>,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<QueuePair> {
        self.dev.inner.check_alive()?;
        let qpn = self.dev.inner.lock().create_qp(rxe_core::QpInitAttr {
            pd: self.h,
            qp_type,
            send_cq: send_cq.h,
            recv_cq: recv_cq.h,
            srq: srq.map(|s| s.h),
            cap,
            sq_sig_all,
        })?;
        Ok(QueuePair {
            dev: self.dev.clone(),
            qpn,
        })
    }

    /// Create a shared receive queue.
    pub fn create_srq(&self, attr: SrqAttr) -> Result<SharedReceiveQueue> {
        self.dev.inner.check_alive()?;
        let h = self.dev.inner.lock().create_srq(self.h, attr)?;
        Ok(SharedReceiveQueue {
            dev: self.dev.clone(),
            h,
            closed: false,
        })
    }

    /// Create an XRC SRQ (`IBV_SRQT_XRC`) in `xrcd`: it serves the XRC_RECV
    /// QPs of that domain whose requests name its number
    /// ([`SharedReceiveQueue::srq_num`]); their receives complete on `cq`,
    /// and RDMA to them uses this PD.
    pub fn create_xrc_srq(
        &self,
        xrcd: &XrcDomain,
        cq: &CompletionQueue,
        attr: SrqAttr,
    ) -> Result<SharedReceiveQueue> {
        self.dev.inner.check_alive()?;
        let h = self
            .dev
            .inner
            .lock()
            .create_xrc_srq(self.h, xrcd.h, cq.h, attr)?;
        Ok(SharedReceiveQueue {
            dev: self.dev.clone(),
            h,
            closed: false,
        })
    }

    /// Create an address handle for UD sends.
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        let h = self.dev.inner.lock().create_ah(self.h, attr)?;
        Ok(AddressHandle {
            dev: self.dev.clone(),
            h,
        })
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        if !self.closed && self.owned {
            let _ = self.dev.inner.lock().dealloc_pd(self.h);
        }
    }
}

/// A registered memory region borrowing its buffer for `'a`.
pub struct MemoryRegion<'a> {
    dev: Device,
    lkey: u32,
    rkey: u32,
    /// Where SGEs and peers point (the iova).
    addr: u64,
    /// Where the bytes are in this process.
    host: u64,
    len: u64,
    closed: bool,
    /// False for an imported handle: dropping it does not deregister.
    owned: bool,
    _buf: PhantomData<&'a mut [u8]>,
}

impl MemoryRegion<'_> {
    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key, for peers.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Start address (what peers put in RETH).
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An SGE for `len` bytes at `offset` of this region.
    pub fn sge(&self, offset: u64, len: u32) -> rxe_core::Sge {
        rxe_core::Sge {
            addr: self.addr + offset,
            length: len,
            lkey: self.lkey,
        }
    }

    fn check(&self, offset: u64, len: usize) -> Result<()> {
        if offset.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(Error::Config(format!(
                "{len} bytes at offset {offset} exceed the {}-byte region",
                self.len
            )));
        }
        Ok(())
    }

    /// Copy bytes out of the region (serialised with the device's accesses).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        let e = self.dev.inner.lock();
        rxe_core::mem::Memory::read(e.mem(), self.host + offset, out)
            .map_err(|f| Error::Io(f.to_string()))
    }

    /// Copy bytes into the region (serialised with the device's accesses).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        let mut e = self.dev.inner.lock();
        rxe_core::mem::Memory::write(e.mem_mut(), self.host + offset, data)
            .map_err(|f| Error::Io(f.to_string()))
    }
}

impl MemoryRegion<'static> {
    /// `ibv_rereg_mr`: move the region to `pd`, grant it `access`, or point
    /// it at `len` bytes at host address `addr` (seen by peers at `iova`,
    /// or at `addr`). The keys stay the same. On error nothing changed.
    ///
    /// # Safety
    /// With a new range, the caller keeps that memory mapped (and lets the
    /// device write it, per `access`) until the region is deregistered or
    /// re-registered again, as for [`ProtectionDomain::reg_mr_raw`].
    pub unsafe fn rereg_raw(
        &mut self,
        pd: Option<&ProtectionDomain>,
        range: Option<(u64, u64, Option<u64>)>,
        access: Option<AccessFlags>,
    ) -> Result<()> {
        self.dev.inner.check_alive()?;
        // No peer may be writing the old range (or with the old rights)
        // once this returns; on error it is published again as it was.
        self.dev.inner.unpublish_mr(self.rkey);
        // A new range is noted (and may move) before the region points
        // at it; the old one is let go of once it no longer does.
        if let Some((addr, len, _)) = range {
            let access = access.unwrap_or_else(|| {
                self.dev
                    .inner
                    .lock()
                    .mr(self.lkey)
                    .map_or(AccessFlags::empty(), |m| m.access)
            });
            self.dev.inner.note_mr_range(addr, len, access, true);
        }
        let mut e = self.dev.inner.lock();
        let mr = match e.rereg_mr(self.lkey, pd.map(|p| p.h), range, access) {
            Ok(mr) => mr,
            Err(err) => {
                if let Some(old) = e.mr(self.lkey) {
                    self.dev.inner.publish_mr(old);
                }
                drop(e);
                if let Some((addr, len, _)) = range {
                    self.dev.inner.forget_mr_range(addr, len);
                }
                return Err(err.into());
            }
        };
        if range.is_some() {
            self.dev.inner.forget_mr_range(self.host, self.len);
        }
        e.mem_mut().remove_odp(mr.lkey);
        if mr.access.contains(AccessFlags::ON_DEMAND) {
            e.mem_mut().add_odp(mr.lkey, mr.host_addr, mr.length);
        }
        drop(e);
        self.dev.inner.publish_mr(&mr);
        self.addr = mr.iova;
        self.host = mr.host_addr;
        self.len = mr.length;
        Ok(())
    }
}

impl<'a> MemoryRegion<'a> {
    /// `ibv_dereg_mr` with its error: refused (and the region handed
    /// back) while memory windows are bound to it.
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        self.dev.inner.unpublish_mr(self.rkey);
        let r = {
            let mut e = self.dev.inner.lock();
            let r = e.dereg_mr(self.lkey);
            if r.is_ok() {
                e.mem_mut().remove_odp(self.lkey);
            } else if let Some(mr) = e.mr(self.lkey) {
                // Still registered (windows are bound to it).
                self.dev.inner.publish_mr(mr);
            }
            r
        };
        match r {
            Ok(()) => {
                self.closed = true;
                self.dev.inner.forget_mr_range(self.host, self.len);
                Ok(())
            }
            Err(e) => Err((self, e.into())),
        }
    }
}

impl Drop for MemoryRegion<'_> {
    fn drop(&mut self) {
        // Work still in flight that names this key fails its key check
        // (LOC_PROT_ERR / REM_ACCESS_ERR); it never touches the buffer again.
        if !self.closed && self.owned {
            self.dev.inner.unpublish_mr(self.rkey);
            let mut e = self.dev.inner.lock();
            if e.dereg_mr(self.lkey).is_ok() {
                e.mem_mut().remove_odp(self.lkey);
                drop(e);
                self.dev.inner.forget_mr_range(self.host, self.len);
            }
        }
    }
}

/// A memory window (`ibv_mw`).
pub struct MemoryWindow {
    dev: Device,
    rkey: u32,
    closed: bool,
}

impl MemoryWindow {
    /// The window's current rkey (it changes with each bind).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Bind this type 1 window through `qp` (`ibv_bind_mw`): it takes
    /// effect at once and returns the new rkey, which the window keeps.
    pub fn bind_type1(&mut self, qp: &QueuePair, bind: &rxe_core::MwBindInfo) -> Result<u32> {
        let rkey = self
            .dev
            .inner
            .lock()
            .bind_mw_type1(qp.qpn, self.rkey, bind)?;
        self.rkey = rkey;
        Ok(rkey)
    }

    /// Record the rkey a BIND_MW work request gave a type 2 window.
    pub fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
    }

    /// `ibv_dealloc_mw` with its error.
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let r = self.dev.inner.lock().dealloc_mw(self.rkey);
        match r {
            Ok(()) => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err((self, e.into())),
        }
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.dev.inner.lock().dealloc_mw(self.rkey);
        }
    }
}

/// Identifies a CQ in a completion-channel event (what `ibv_get_cq_event`
/// hands back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

/// A completion channel: a pollable file descriptor.
pub struct CompletionChannel {
    tx: std::sync::Arc<crate::device::ChannelTx>,
    rx: std::os::unix::net::UnixDatagram,
}

impl std::os::fd::AsFd for CompletionChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.rx.as_fd()
    }
}

impl CompletionChannel {
    /// The file descriptor to give to poll/epoll; readable when an event
    /// is waiting.
    pub fn fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.rx)
    }

    /// Blocking (default) or non-blocking `get_cq_event`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        self.rx
            .set_nonblocking(nonblocking)
            .map_err(|e| Error::Io(e.to_string()))
    }

    /// Wait for the next event (`ibv_get_cq_event`). In non-blocking mode,
    /// `Ok(None)` when none is waiting. Each event must be acknowledged
    /// with [`CompletionQueue::ack_events`].
    pub fn get_cq_event(&self) -> Result<Option<CqId>> {
        let mut b = [0u8; 4];
        match self.rx.recv(&mut b) {
            Ok(4) => Ok(Some(CqId(u32::from_ne_bytes(b)))),
            Ok(_) => Err(Error::Io("short completion-channel event".into())),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(Error::Io(e.to_string())),
        }
    }
}

/// A completion queue.
pub struct CompletionQueue {
    dev: Device,
    h: CqHandle,
    closed: bool,
    /// The engine's lock count (`Inner::lock_count`) at which a locked
    /// poll last found this CQ empty with nothing to drive; `u64::MAX`
    /// never.
    idle_at: AtomicU64,
    /// The engine's next deadline then (ns; `u64::MAX`: none).
    idle_until: AtomicU64,
}

impl CompletionQueue {
    /// This CQ's identity in channel events.
    pub fn id(&self) -> CqId {
        CqId(self.h.0)
    }

    /// Arm the CQ for one notification (`ibv_req_notify_cq`): the next
    /// completion (or, with `solicited_only`, the next solicited or error
    /// completion) produces one event on its channel. As with verbs, poll
    /// once more after arming: completions already queued do not fire.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.dev
            .inner
            .lock()
            .req_notify_cq(self.h, solicited_only)?;
        // The application is going to sleep on the channel.
        self.dev.inner.hand_off();
        Ok(())
    }

    /// Acknowledge `n` events of this CQ (`ibv_ack_cq_events`). Events are
    /// plain datagrams here, so nothing is held; the call exists for
    /// parity with verbs.
    pub fn ack_events(&self, n: u32) {
        let _ = n;
    }

    /// Take up to `max` completions.
    ///
    /// Polling drives the device: when the CQ is empty, the calling thread
    /// reads waiting datagrams and fires due timers itself, so a spinning
    /// application gets its completions without waiting for the progress
    /// thread to be scheduled.
    pub fn poll(&self, max: usize) -> Result<Vec<WorkCompletion>> {
        let mut out = Vec::new();
        self.poll_into(max, &mut out)?;
        Ok(out)
    }

    /// As [`CompletionQueue::poll`], appending to `out` (a vector the
    /// caller reuses: no allocation per poll). Returns how many were
    /// appended.
    pub fn poll_into(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        let inner = &self.dev.inner;
        // Whether the application, having got these completions, may now
        // stop polling (see `Inner::note_app_poll`).
        // Also whether an engine timer is set then (another QP's): the
        // progress thread, which leaves timers to a polling application,
        // is then woken to watch them (`Inner::left_with_timers`).
        let may_leave = |e: &rxe_core::Engine<_>, wcs: &[WorkCompletion]| {
            let leave = wcs
                .last()
                .is_some_and(|wc| !e.qp_awaits_completions(wc.qp_num));
            (leave, leave && e.poll_timeout().is_some())
        };
        let note = |(leave, timers): (bool, bool)| {
            if inner.note_app_poll(leave) && timers {
                inner.left_with_timers();
            }
        };
        // Found idle by a locked poll, and nobody has locked the engine
        // since (no completion, post, arming or timer change can have come
        // without the lock): idle now unless something came from outside
        // (the inbox, UDP) or a timer fell due. Then no lock at all: an
        // empty poll in the TCG guest took 0.8 µs with one, against kernel
        // rxe's 0.05-0.08 (a read of the CQ's memory), and a spinning
        // application noticed a datagram that much later.
        if self.idle_at.load(Ordering::Acquire) == inner.lock_count() {
            let mono = local_link::monotonic_ns();
            let now = inner.at(mono);
            if now.as_nanos() < self.idle_until.load(Ordering::Relaxed)
                && inner.nothing_to_drive(now)
            {
                let _ = inner.note_app_poll_at(false, mono);
                return Ok(0);
            }
        }
        let start = out.len();
        let (first, armed, leave, idle) = {
            let mut e = inner.lock();
            let first = e.poll_cq_into(self.h, max, out)?;
            let leave = may_leave(&e, &out[start..]);
            let armed = e.cq_armed(self.h);
            let idle = first == 0 && !armed && inner.idle_for_poll(&e);
            if idle {
                let until = e.poll_timeout().map_or(u64::MAX, |d| d.as_nanos());
                self.idle_until.store(until, Ordering::Relaxed);
                self.idle_at.store(inner.lock_count(), Ordering::Release);
            }
            (first, armed, leave, idle)
        };
        if idle {
            let _ = inner.note_app_poll(false);
            return Ok(0);
        }
        // Polling an armed CQ is the last look before sleeping on its
        // channel: leave the socket to the progress thread, and hold no
        // responses for a next poll that may not come. Any other poll,
        // fruitful or not, says the application is driving the device:
        // were only empty polls counted, a progress thread that took the
        // datagrams first (so the polls find completions) would keep
        // thinking the application idle, and keep preempting it.
        if first > 0 {
            if !armed {
                note(leave);
            }
            return Ok(first);
        }
        crate::device::with_rx_buf(|b| inner.progress(b, !armed, Some(self.h)));
        let (second, leave) = {
            let mut e = inner.lock();
            let second = e.poll_cq_into(self.h, max, out)?;
            let leave = may_leave(&e, &out[start..]);
            (second, leave)
        };
        if !armed {
            note(leave);
        }
        Ok(second)
    }

    /// Poll until `n` completions arrived or `timeout` passed.
    pub fn wait(&self, n: usize, timeout: std::time::Duration) -> Result<Vec<WorkCompletion>> {
        let start = std::time::Instant::now();
        let mut out = Vec::new();
        while out.len() < n {
            out.extend(self.poll(n - out.len())?);
            if out.len() < n {
                if start.elapsed() > timeout {
                    break;
                }
                std::thread::yield_now();
            }
        }
        Ok(out)
    }
}

impl CompletionQueue {
    /// `ibv_resize_cq`: room for `cqe` completions (at least those queued).
    pub fn resize(&self, cqe: u32) -> Result<()> {
        Ok(self.dev.inner.lock().resize_cq(self.h, cqe)?)
    }

    /// `ibv_destroy_cq` with its error: refused (and the CQ handed back)
    /// while a QP uses it.
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let r = self.dev.inner.lock().destroy_cq(self.h);
        match r {
            Ok(()) => self.closed = true,
            Err(e) => return Err((self, e.into())),
        }
        self.dev
            .inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.h);
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        self.dev
            .inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.h);
        let _ = self.dev.inner.lock().destroy_cq(self.h);
    }
}

/// A queue pair.
pub struct QueuePair {
    dev: Device,
    qpn: u32,
}

impl QueuePair {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        // A failed device's QPs may still go to ERR or RESET; nothing else.
        if !matches!(attr.qp_state, Some(QpState::Err | QpState::Reset))
            || !mask.contains(QpAttrMask::STATE)
        {
            self.dev.inner.check_alive()?;
        }
        // What came before this call is handled by the QP as it was.
        self.dev.inner.catch_up();
        let now = self.dev.inner.now();
        let mut e = self.dev.inner.lock();
        let r = e.modify_qp(now, self.qpn, attr, mask);
        self.dev.inner.publish_qp(&e, self.qpn);
        if matches!(attr.qp_state, Some(QpState::Reset | QpState::Err))
            && mask.contains(QpAttrMask::STATE)
        {
            // Its READs end without their responses.
            self.dev.inner.end_read_hints();
        }
        r?;
        self.dev.inner.flush(&mut e);
        drop(e);
        let to_rtr = QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::DEST_QPN;
        if attr.qp_state == Some(QpState::Rtr) && mask.contains(to_rtr) {
            let dst = rxe_core::gid_to_ip(attr.ah_attr.dgid);
            self.dev.inner.warm_path(dst, attr.dest_qp_num);
        }
        Ok(())
    }

    /// `ibv_query_qp`: current attributes and the creation capabilities.
    pub fn query(&self) -> Result<(QpAttr, QpCap)> {
        let (attr, init) = self.dev.inner.lock().query_qp(self.qpn)?;
        Ok((attr, init.cap))
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.dev
            .inner
            .lock()
            .qp_state(self.qpn)
            .unwrap_or(QpState::Err)
    }

    /// This QP's congestion state on a ConnectX-like device (DCQCN's
    /// current and target rate, α, whether the pacer holds it back); on a
    /// kernel-rxe-like device the QP is never paced and this stays at the
    /// line rate.
    pub fn cc_state(&self) -> Option<rxe_core::QpCcState> {
        self.dev.inner.lock().qp_cc(self.qpn)
    }

    /// This QP's share of the device's protocol counters (kernel rxe's
    /// names): the packets it sent and accepted and the events it caused.
    pub fn counters(&self) -> rxe_core::Counters {
        self.dev
            .inner
            .lock()
            .qp_counters(self.qpn)
            .unwrap_or_default()
    }

    /// Why the QP is in the error state, in words.
    pub fn error_reason(&self) -> Option<String> {
        self.dev
            .inner
            .lock()
            .qp_error_reason(self.qpn)
            .map(str::to_string)
    }

    /// Post a send work request; its packets leave at once.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        self.post_send_list(std::iter::once(wr)).map_err(|(_, e)| e)
    }

    /// Post a list of send work requests (`ibv_post_send`'s chain): all
    /// are queued before any packet leaves, as kernel rxe queues a chain
    /// and then runs its requester. Stops at the first that is refused;
    /// the ones before it stay posted and are sent, and the error comes
    /// with that work request's index in the list.
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        let now = self.dev.inner.note_app_post();
        let mut e = self.dev.inner.lock();
        let r = e
            .post_send_list(now, self.qpn, wrs)
            .map_err(|(i, err)| (i, err.into()));
        self.dev.inner.flush(&mut e);
        r
    }

    /// `ibv_attach_mcast`: this UD QP receives the multicast group `gid`
    /// (an IPv4-mapped class D GID or an ff00::/8 GID; `lid` is unused on
    /// RoCE). The device starts receiving the group's address when its
    /// first QP joins. Attaching twice is a no-op.
    pub fn attach_mcast(&self, gid: [u8; 16], _lid: u16) -> Result<()> {
        self.dev.inner.check_alive()?;
        let mut e = self.dev.inner.lock();
        if e.attach_mcast(self.qpn, gid)? {
            if let Err(err) = self.dev.inner.join_mcast(gid) {
                let _ = e.detach_mcast(self.qpn, gid);
                return Err(err);
            }
        }
        Ok(())
    }

    /// `ibv_detach_mcast`: EINVAL if the QP is not attached to `gid`.
    pub fn detach_mcast(&self, gid: [u8; 16], _lid: u16) -> Result<()> {
        let mut e = self.dev.inner.lock();
        if e.detach_mcast(self.qpn, gid)? {
            self.dev.inner.leave_mcast(gid);
        }
        Ok(())
    }

    /// The multicast groups this QP is attached to.
    pub fn mcast_groups(&self) -> Vec<[u8; 16]> {
        self.dev.inner.lock().qp_mcast_groups(self.qpn)
    }

    /// Post a receive work request.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.dev.inner.note_app_post();
        let mut e = self.dev.inner.lock();
        e.post_recv(self.qpn, wr)?;
        // In ERR the WR was flushed at once: deliver its notification.
        // Responses held by a poll stay held: the next post_send or poll
        // sends them after its own requests.
        self.dev.inner.flush_with(&mut e, true);
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        self.dev.inner.catch_up();
        let mut e = self.dev.inner.lock();
        // Dropped while attached: leave its groups, as the kernel detaches
        // the QPs of a process that exits. (`ibv_destroy_qp` refuses with
        // EBUSY instead; the C layer checks `mcast_groups` first.)
        for gid in e.detach_all_mcast(self.qpn) {
            self.dev.inner.leave_mcast(gid);
        }
        let _ = e.destroy_qp(self.qpn);
        self.dev.inner.publish_qp(&e, self.qpn);
        self.dev.inner.end_read_hints();
        // Responses a poll held back leave now (the peer waits for them).
        self.dev.inner.flush(&mut e);
    }
}

/// An XRC domain (`ibv_open_xrcd`): XRC SRQs and XRC_RECV QPs in it
/// serve each other's requests.
pub struct XrcDomain {
    dev: Device,
    h: rxe_core::XrcdHandle,
    closed: bool,
}

impl Device {
    /// Open a new XRC domain.
    pub fn alloc_xrcd(&self) -> Result<XrcDomain> {
        self.inner.check_alive()?;
        let h = self.inner.lock().alloc_xrcd()?;
        Ok(XrcDomain {
            dev: self.clone(),
            h,
            closed: false,
        })
    }
}

impl XrcDomain {
    /// Create an XRC_RECV (target) QP in this domain.
    pub fn create_recv_qp(&self) -> Result<QueuePair> {
        self.dev.inner.check_alive()?;
        let qpn = self.dev.inner.lock().create_xrc_recv_qp(self.h)?;
        Ok(QueuePair {
            dev: self.dev.clone(),
            qpn,
        })
    }

    /// `ibv_close_xrcd` with its error: EBUSY (and the domain handed back)
    /// while XRC SRQs or XRC_RECV QPs use it.
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let r = self.dev.inner.lock().dealloc_xrcd(self.h);
        match r {
            Ok(()) => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err((self, e.into())),
        }
    }
}

impl Drop for XrcDomain {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.dev.inner.lock().dealloc_xrcd(self.h);
        }
    }
}

/// A shared receive queue.
pub struct SharedReceiveQueue {
    dev: Device,
    h: SrqHandle,
    closed: bool,
}

impl SharedReceiveQueue {
    /// The number requests name this XRC SRQ by (`ibv_get_srq_num`);
    /// EINVAL for a basic SRQ.
    pub fn srq_num(&self) -> Result<u32> {
        Ok(self.dev.inner.lock().srq_num(self.h)?)
    }

    /// Arm the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): when
    /// fewer than `limit` WQEs remain, SRQ_LIMIT_REACHED is raised once.
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        Ok(self.dev.inner.lock().modify_srq_limit(self.h, limit)?)
    }

    /// `ibv_modify_srq` with `IBV_SRQ_MAX_WR`: room for `max_wr` WQEs.
    pub fn resize(&self, max_wr: u32) -> Result<()> {
        Ok(self.dev.inner.lock().resize_srq(self.h, max_wr)?)
    }

    /// `ibv_query_srq`: the attributes and the number of WQEs queued.
    pub fn query(&self) -> Result<(SrqAttr, usize)> {
        Ok(self.dev.inner.lock().query_srq(self.h)?)
    }

    /// Post a receive work request.
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.dev.inner.note_app_post();
        Ok(self.dev.inner.lock().post_srq_recv(self.h, wr)?)
    }
}

impl SharedReceiveQueue {
    /// The engine handle (what asynchronous events name).
    pub fn handle(&self) -> SrqHandle {
        self.h
    }

    /// `ibv_destroy_srq` with its error: refused while a QP uses it.
    pub fn close(mut self) -> std::result::Result<(), (Self, Error)> {
        let r = self.dev.inner.lock().destroy_srq(self.h);
        match r {
            Ok(()) => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err((self, e.into())),
        }
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.dev.inner.lock().destroy_srq(self.h);
        }
    }
}

/// An address handle.
pub struct AddressHandle {
    dev: Device,
    h: AhHandle,
}

impl AddressHandle {
    /// The engine handle, for [`crate::UdDest`].
    pub fn handle(&self) -> AhHandle {
        self.h
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        let _ = self.dev.inner.lock().destroy_ah(self.h);
    }
}
