//! Placement: the responder's write done in the sender's context.
//!
//! Kernel rxe's `rxe_loopback()` runs the responder in the sender's
//! context, so an RDMA WRITE between two QPs of one device is in the
//! target's memory before the sender's `ibv_post_send` returns, and a
//! program that waits for it by watching memory (`ib_write_lat`, ring
//! buffers) sees it without the target process doing anything. Here the
//! target's engine runs in the target's process; without help the data
//! lands only when one of the target's threads reads the packet from its
//! inbox, and a target that spins on memory has no thread to spare.
//!
//! So the consumer of an inbox publishes in it what a sender needs to
//! decide, as its responder would, that an RDMA WRITE packet is to be
//! executed now and where its bytes go:
//! - **its MRs with remote write access** (rkey, PD, I/O address, length,
//!   host address): [`Inbox::publish_mr`], and [`Inbox::unpublish_mr`]
//!   before the MR is deregistered or changed;
//! - **its RC QPs' responders** (QPN, PD, the next PSN expected, and
//!   whether it would execute a WRITE ONLY or FIRST at that PSN now:
//!   state RTR or RTS, remote write allowed, no message or READ reply in
//!   progress; or whether it is in the middle of a WRITE message, which
//!   it would go on executing): [`Inbox::publish_qp`], after the first
//!   and last packet of every request and every change of the QP.
//!
//! A sender that finds its packet acceptable by those tables (a WRITE
//! ONLY or FIRST whose whole range lies in the MR, at the PSN of a ready
//! responder; a MIDDLE or LAST of a message whose FIRST it placed, while
//! the responder has not passed it, and only into pages in shared
//! memory) writes the payload into the consumer's memory (a copy into
//! those pages, or through its `/proc/<pid>/mem` or with
//! `process_vm_writev`, whichever is faster here: [`WayChoice`];
//! [`PlacingRun::place_and_push`]) and then pushes the packet as usual, marked
//! with the host address it wrote, and without the payload if it asks
//! (the record says where it was left out). The consumer's engine
//! checks and acknowledges the packet exactly as any other; only its copy
//! of the payload is skipped when it would have written the same bytes to
//! the same address. Anything the sender cannot decide (a memory window,
//! an MR that does not fit the table, a responder with work in progress,
//! a retransmission, a peer it has no ptrace rights over) goes the usual
//! way, unplaced. (The driver, verbs-api, also leaves a stream's packets
//! unplaced: it places only packets of the last work request posted,
//! `rxe_core::Transmit::last_posted`.)
//!
//! **READ responses** are placed the other way round: by the responder,
//! into the requester, as kernel rxe's loopback runs the requester's
//! completer in the responder's context. The requester (the consumer of
//! the responses) names the destination in the READ request's record
//! ([`crate::ReadHint`], [`Inbox::push_hinted`]): where it lies in its
//! shared pages, the path MTU, and its READ epoch. The responder's driver
//! keeps it for a request its engine takes as new and places each
//! response once, in order ([`PlacingRun::place_read_and_push`]), only into
//! those pages, and only while the requester's epoch is the hint's. The
//! requester moves its epoch on ([`Inbox::end_read_hints`], which waits
//! for placements in flight as [`Inbox::unpublish_mr`] does) before
//! anything but a READ's own responses can end it or take its memory.
//!
//! **Deregistration.** A consumer must not let its memory go while a
//! sender writes into it. Each ring's control block has a `placing`
//! counter that its producer makes odd for the duration of a placement
//! (around the table lookup and the write). [`Inbox::unpublish_mr`]
//! removes the entry, then waits until no ring's counter is odd with the
//! value it saw; a producer that died mid-placement (its process is gone)
//! is not waited for. Either the producer's lookup sees the entry gone,
//! or the consumer sees the counter odd and waits: both sides use
//! sequentially consistent fences between their store and their load.
//!
//! **Who may write the tables.** Every process of the device maps every
//! inbox writable (it produces into its ring there), so the tables are
//! only as trustworthy as those processes: a process of the same user
//! could write the consumer's memory directly anyway, but one of another
//! user could steer a producer's write elsewhere in the consumer. The
//! driver therefore places only where the daemon serves a single user.
//!
//! **Whose memory.** The consumer publishes its process ID and PID
//! namespace; a producer in another namespace does not place. A consumer
//! that closes its device withdraws placement first
//! ([`Inbox::withdraw_placement`]); one that exits loses its memory with
//! its process (the write fails, `ESRCH`). What is not covered is a
//! consumer that calls `execve` with its device open: until the daemon
//! sees its connection close and closes its inbox (which every placement
//! checks first), its process ID names the new program. A producer would
//! have to place in that window, at an address that the new program has
//! mapped writable, to touch it.
//!
//! **Tables** (after the rings' control blocks, before their data): MR
//! entries of 64 bytes, at a hash of the rkey; QP entries of 32 bytes, at
//! the QPN's low bits. Each entry is a seqlock (`seq` odd while the
//! consumer writes it); readers retry nothing: a torn or busy entry means
//! "not placeable". Entries are written only by the consumer, so a
//! producer can at worst make its own placements fail.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering::*};

use crate::{shm, Inbox, PushError};

/// MR entries in an inbox (a power of two).
pub(crate) const MR_ENTRIES: usize = 512;
/// QP entries in an inbox (a power of two).
pub(crate) const QP_ENTRIES: usize = 1024;
const MR_ENTRY: usize = 64;
/// A QP entry's state word: ready for a new WRITE message at its PSN, or
/// in the middle of one (0: neither, nothing placeable).
const QP_READY: u32 = 1;
const QP_MID_WRITE: u32 = 2;
const QP_ENTRY: usize = 32;
/// Bytes of both tables.
pub(crate) const TABLES_LEN: usize = MR_ENTRIES * MR_ENTRY + QP_ENTRIES * QP_ENTRY;

/// In page 0: the consumer's process ID (0: placement not offered), and
/// the inode of its PID namespace (a process ID means that process only
/// in that namespace).
pub(crate) const OFF_OWNER_PID: usize = 256;
const OFF_OWNER_PIDNS: usize = 264;
/// In a ring's control block: the producer's placement counter (odd while
/// it places) and its process ID.
const CTRL_PLACING: usize = 64;
const CTRL_PRODUCER_PID: usize = 72;

/// How much of each MR [`Inbox::warm_placement`] faults in: what a
/// conversation of small messages touches first, at a cost bounded for
/// large MRs (256 page faults at most).
const WARM_PAGES_PER_MR: usize = 1 << 20;

/// How long [`Inbox::unpublish_mr`] waits before it asks whether a
/// producer that looks busy still exists, and then again between asks.
const PRODUCER_CHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// An MR as its owner publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaceableMr {
    pub rkey: u32,
    pub pd: u32,
    /// The address peers name (RETH VA) of its first byte.
    pub iova: u64,
    pub len: u64,
    /// Its first byte in the owner's address space.
    pub host_addr: u64,
    /// Where its whole pages are in shared memory, if they moved there
    /// ([`crate::shared_mr`]).
    pub shared: Option<crate::SharedPages>,
}

/// A responder as its owner publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaceableQp {
    pub qpn: u32,
    pub pd: u32,
    /// The PSN it expects next (24 bits).
    pub epsn: u32,
    /// False: it would execute a WRITE ONLY or FIRST at `epsn` now (no
    /// message in progress). True: it is in the middle of an RDMA WRITE
    /// message (published after that message's FIRST packet), which it
    /// would go on executing.
    pub mid_write: bool,
}

/// A packet of an RDMA WRITE a sender would like to place: a WRITE ONLY
/// or FIRST (the responder must be ready for a new message at `psn`), or
/// a MIDDLE or LAST of a message whose FIRST it placed (`first_psn`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Placement<'a> {
    pub qpn: u32,
    pub psn: u32,
    pub rkey: u32,
    /// Where `data` goes (RETH VA, or the address the message has reached).
    pub va: u64,
    pub data: &'a [u8],
    /// The bytes from `va` the message may write (RETH DMA length, for a
    /// FIRST or ONLY; at least `data`'s length): all must lie in the MR.
    pub span: u64,
    /// A MIDDLE or LAST: the PSN of its message's FIRST, which was placed.
    /// The responder must then be in that message (or about to begin it).
    pub first_psn: Option<u32>,
    /// Leave the payload (its offset and length in the datagram) out of
    /// the record if it was placed: the consumer's engine then finds it
    /// where it was placed, and its bytes of the buffer are not written.
    pub elide: Option<(usize, usize)>,
}

/// Why a packet was not placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaceError {
    /// The tables do not allow it now (no entry, another PSN, out of
    /// bounds, an entry being rewritten): send it unplaced.
    NotNow,
    /// The consumer does not offer placement, or this process may not
    /// write its memory (no ptrace rights, or it is gone): no packet to
    /// this inbox will be placed.
    Refused,
    /// The write failed part way (an unmapped page): send it unplaced;
    /// the consumer's engine writes it (or fails) as it would have.
    Fault,
}

fn mr_index(rkey: u32) -> usize {
    (rkey.wrapping_mul(0x61C8_8647) >> 16) as usize & (MR_ENTRIES - 1)
}

fn qp_index(qpn: u32) -> usize {
    qpn as usize & (QP_ENTRIES - 1)
}

impl Inbox {
    fn mr_entry(&self, i: usize) -> usize {
        self.layout.tables() + i * MR_ENTRY
    }

    fn qp_entry(&self, i: usize) -> usize {
        self.layout.tables() + MR_ENTRIES * MR_ENTRY + i * QP_ENTRY
    }

    /// Begin a seqlock write of the entry at `off` (single writer: the
    /// consumer, under its own lock).
    fn entry_write_begin(&self, off: usize) {
        let seq = self.map.u64_at(off);
        seq.store(seq.load(Relaxed) | 1, Relaxed);
        fence(Release);
    }

    fn entry_write_end(&self, off: usize) {
        let seq = self.map.u64_at(off);
        seq.store((seq.load(Relaxed) | 1).wrapping_add(1), Release);
    }

    /// Consumer: offer placement to producers (this process's ID goes
    /// into the inbox; they write its memory with it). Returns false,
    /// offering nothing, where the process's PID namespace cannot be
    /// told (no `/proc`).
    pub fn offer_placement(&self) -> bool {
        let Some(ns) = pid_namespace() else {
            return false;
        };
        self.map.u64_at(OFF_OWNER_PIDNS).store(ns, SeqCst);
        self.map.u32_at(OFF_OWNER_PID).store(shm::own_pid(), SeqCst);
        true
    }

    /// Consumer: publish an MR with remote write access. Returns false
    /// if its entry is taken by another MR (it is then never placed into).
    pub fn publish_mr(&self, mr: &PlaceableMr) -> bool {
        let off = self.mr_entry(mr_index(mr.rkey));
        let m = &self.map;
        if m.u32_at(off + 40).load(Relaxed) != 0 && m.u32_at(off + 8).load(Relaxed) != mr.rkey {
            return false;
        }
        self.entry_write_begin(off);
        m.u32_at(off + 8).store(mr.rkey, Relaxed);
        m.u32_at(off + 12).store(mr.pd, Relaxed);
        m.u64_at(off + 16).store(mr.iova, Relaxed);
        m.u64_at(off + 24).store(mr.len, Relaxed);
        m.u64_at(off + 32).store(mr.host_addr, Relaxed);
        let (fd, ino, shm_off) = mr
            .shared
            .map_or((u32::MAX, 0, 0), |s| (s.fd as u32, s.ino, s.off));
        m.u32_at(off + 44).store(fd, Relaxed);
        m.u64_at(off + 48).store(ino, Relaxed);
        m.u64_at(off + 56).store(shm_off, Relaxed);
        m.u32_at(off + 40).store(1, Relaxed);
        self.entry_write_end(off);
        true
    }

    /// Consumer: `rkey` is about to be deregistered or changed. Removes
    /// its entry and returns once no producer can still be writing into
    /// it (a producer whose process is gone is not waited for), with the
    /// packet of every placement into it in the inbox. Returns whether it
    /// was published.
    pub fn unpublish_mr(&self, rkey: u32) -> bool {
        let off = self.mr_entry(mr_index(rkey));
        let m = &self.map;
        if m.u32_at(off + 40).load(Relaxed) == 0 || m.u32_at(off + 8).load(Relaxed) != rkey {
            return false;
        }
        self.entry_write_begin(off);
        m.u32_at(off + 40).store(0, Relaxed);
        self.entry_write_end(off);
        self.wait_for_placements();
        true
    }

    /// Wait until every placement that may have seen the tables (or the
    /// owner's process ID) as they were before this call has ended.
    fn wait_for_placements(&self) {
        let m = &self.map;
        // Pairs with the fence in `place`: either its lookup sees the
        // change, or this sees its counter odd.
        fence(SeqCst);
        for ring in 0..self.layout.rings {
            let ctrl = self.layout.ctrl(ring);
            let placing = m.u64_at(ctrl + CTRL_PLACING);
            let seen = placing.load(SeqCst);
            if seen % 2 == 0 {
                continue;
            }
            let pid = m.u32_at(ctrl + CTRL_PRODUCER_PID).load(SeqCst) as i32;
            let mut next_check = std::time::Instant::now() + PRODUCER_CHECK;
            while placing.load(SeqCst) == seen {
                if std::time::Instant::now() >= next_check {
                    if pid <= 0 || !shm::process_exists(pid) {
                        break;
                    }
                    next_check += PRODUCER_CHECK;
                }
                std::thread::yield_now();
            }
        }
    }

    /// Consumer: publish the responder of RC QP `qp.qpn` as ready to
    /// execute a WRITE ONLY at `qp.epsn`, or (`None`) as not ready.
    pub fn publish_qp(&self, qpn: u32, qp: Option<&PlaceableQp>) {
        let off = self.qp_entry(qp_index(qpn));
        let m = &self.map;
        let (cur_qpn, cur_ok) = (
            m.u32_at(off + 8).load(Relaxed),
            m.u32_at(off + 20).load(Relaxed),
        );
        match qp {
            None if cur_ok == 0 || cur_qpn != qpn => {}
            None => {
                self.entry_write_begin(off);
                m.u32_at(off + 20).store(0, Relaxed);
                self.entry_write_end(off);
            }
            Some(q) => {
                let state = if q.mid_write { QP_MID_WRITE } else { QP_READY };
                if cur_ok == state
                    && cur_qpn == q.qpn
                    && m.u32_at(off + 12).load(Relaxed) == q.pd
                    && m.u32_at(off + 16).load(Relaxed) == q.epsn
                {
                    return;
                }
                self.entry_write_begin(off);
                m.u32_at(off + 8).store(q.qpn, Relaxed);
                m.u32_at(off + 12).store(q.pd, Relaxed);
                m.u32_at(off + 16).store(q.epsn, Relaxed);
                m.u32_at(off + 20).store(state, Relaxed);
                self.entry_write_end(off);
            }
        }
    }

    /// Read an entry under its seqlock: `read` gets the entry's offset.
    fn entry_read<T>(&self, off: usize, read: impl FnOnce(usize) -> T) -> Option<T> {
        let seq = self.map.u64_at(off);
        let s1 = seq.load(Acquire);
        if s1 % 2 == 1 {
            return None;
        }
        let v = read(off);
        fence(Acquire);
        (seq.load(Relaxed) == s1).then_some(v)
    }

    fn lookup_mr(&self, rkey: u32) -> Option<PlaceableMr> {
        self.mr_at(mr_index(rkey)).filter(|mr| mr.rkey == rkey)
    }

    /// The MR published in entry `i`, if any.
    fn mr_at(&self, i: usize) -> Option<PlaceableMr> {
        let m = &self.map;
        let e = self.entry_read(self.mr_entry(i), |off| {
            (
                m.u32_at(off + 40).load(Relaxed),
                PlaceableMr {
                    rkey: m.u32_at(off + 8).load(Relaxed),
                    pd: m.u32_at(off + 12).load(Relaxed),
                    iova: m.u64_at(off + 16).load(Relaxed),
                    len: m.u64_at(off + 24).load(Relaxed),
                    host_addr: m.u64_at(off + 32).load(Relaxed),
                    shared: {
                        let fd = m.u32_at(off + 44).load(Relaxed);
                        let ino = m.u64_at(off + 48).load(Relaxed);
                        // An entry of an older library has zeros here.
                        (fd <= i32::MAX as u32 && ino != 0).then(|| crate::SharedPages {
                            fd: fd as i32,
                            ino,
                            off: m.u64_at(off + 56).load(Relaxed),
                        })
                    },
                },
            )
        })?;
        (e.0 != 0).then_some(e.1)
    }

    /// The memfds (inodes) the published MRs' entries name now.
    fn shared_inodes(&self) -> Vec<u64> {
        let m = &self.map;
        (0..MR_ENTRIES)
            .filter_map(|i| {
                self.entry_read(self.mr_entry(i), |off| {
                    (m.u32_at(off + 40).load(Relaxed) != 0)
                        .then(|| m.u64_at(off + 48).load(Relaxed))
                        .filter(|&ino| ino != 0)
                })
                .flatten()
            })
            .collect()
    }

    fn lookup_qp(&self, qpn: u32) -> Option<PlaceableQp> {
        let m = &self.map;
        let e = self.entry_read(self.qp_entry(qp_index(qpn)), |off| {
            (
                m.u32_at(off + 20).load(Relaxed),
                PlaceableQp {
                    qpn: m.u32_at(off + 8).load(Relaxed),
                    pd: m.u32_at(off + 12).load(Relaxed),
                    epsn: m.u32_at(off + 16).load(Relaxed),
                    mid_write: false,
                },
            )
        })?;
        let (state, mut qp) = e;
        qp.mid_write = state == QP_MID_WRITE;
        (matches!(state, QP_READY | QP_MID_WRITE) && qp.qpn == qpn).then_some(qp)
    }

    /// Consumer, letting go of its inbox (or of placement): producers
    /// stop placing, and this returns once none can still be writing
    /// into this process (as [`Inbox::unpublish_mr`] for every MR).
    pub fn withdraw_placement(&self) {
        self.map.u32_at(OFF_OWNER_PID).store(0, SeqCst);
        self.wait_for_placements();
    }

    /// Producer (the process in slot `ring`): start a run of placements
    /// into this inbox, which lasts until the [`PlacingRun`] is dropped.
    /// The ring's `placing` counter is odd for the whole run: a consumer
    /// that withdraws an MR (or placement, or its READ hints) from here on
    /// waits for the run's end; everything a placement decides on is read
    /// after the counter went odd. It stays odd until the packet of every
    /// placement of the run is in the ring, so that a consumer whose
    /// withdrawal returned finds those packets in its inbox, and can have
    /// its engine take them while the MR is still registered (its
    /// application may see a payload, and deregister, before its engine
    /// has read the packet: kernel rxe's responder has checked the rkey
    /// before the payload is written, so the WRITE succeeds).
    ///
    /// One run for many placements: every locked instruction (the
    /// counter's sequentially consistent store and fence, the mappings'
    /// lock, a shared count) waits for the stores before it to leave the
    /// store buffer, and after a payload's copy that is the whole copy;
    /// per READ response they were a quarter of a responder's time in a
    /// host `ib_read_bw` (perf). A run holds the counter odd and the
    /// mappings locked from its first placement to its end, so keep it to
    /// one batch of packets (a consumer's withdrawal waits for it), and
    /// use it from one thread at a time (it holds a lock: not `Send`).
    pub fn placing_run(&self, ring: usize) -> Result<PlacingRun<'_>, PushError> {
        if ring >= self.layout.rings {
            return Err(PushError::Invalid);
        }
        if self.is_closed() {
            return Err(PushError::Closed);
        }
        let ctrl = self.layout.ctrl(ring);
        let me = shm::own_pid();
        let pid_word = self.map.u32_at(ctrl + CTRL_PRODUCER_PID);
        if pid_word.load(Relaxed) != me {
            pid_word.store(me, SeqCst);
        }
        let placing = self.map.u64_at(ctrl + CTRL_PLACING);
        let odd = placing.load(Relaxed) | 1;
        placing.store(odd, SeqCst);
        fence(SeqCst);
        Ok(PlacingRun {
            inbox: self,
            ring,
            odd,
            maps: None,
            shared: 0,
        })
    }

    /// Consumer: the READ epoch a [`crate::ReadHint`] given now carries.
    pub fn read_epoch(&self) -> u64 {
        self.map.u64_at(crate::OFF_READ_EPOCH).load(SeqCst)
    }

    /// Consumer: no response to a READ hinted before this call is placed
    /// once it returns. Call it before anything but the READ's own
    /// responses can end a hinted READ's work request, or take its
    /// destination away: a QP leaving RTS (ERR, RESET, destroyed), an MR
    /// deregistered or changed. The epoch moves on, and this waits for
    /// the placements that may have seen the old one.
    pub fn end_read_hints(&self) {
        self.map.u64_at(crate::OFF_READ_EPOCH).fetch_add(1, SeqCst);
        self.wait_for_placements();
    }

    /// The consumer's process ID, if it offers placement and names a
    /// process of this PID namespace (one from another namespace names
    /// another process here: containers that share one daemon).
    fn owner_pid(&self) -> Option<i32> {
        let pid = self.map.u32_at(OFF_OWNER_PID).load(SeqCst);
        if pid == 0 || pid > i32::MAX as u32 {
            return None;
        }
        (pid_namespace() == Some(self.map.u64_at(OFF_OWNER_PIDNS).load(SeqCst)))
            .then_some(pid as i32)
    }
}

/// A run of placements into one ring of an inbox, from
/// [`Inbox::placing_run`] to its drop: the ring's `placing` counter odd
/// throughout, the producer's mappings of the consumer's memfds locked
/// from the run's first placement through shared pages.
pub struct PlacingRun<'a> {
    inbox: &'a Inbox,
    ring: usize,
    /// The counter's value during the run.
    odd: u64,
    maps: Option<std::sync::MutexGuard<'a, Vec<SharedMap>>>,
    /// Placements through shared pages, counted at the end.
    shared: u64,
}

impl PlacingRun<'_> {
    /// Push `datagram`, the first transmission of an RC RDMA WRITE packet
    /// described by `p`, into the run's ring, after writing its payload
    /// into the consumer's memory if the consumer's tables say its
    /// responder would, now, write it there: with room in the ring for
    /// the packet's whole record (what goes when its payload is not
    /// placed after all; nothing is written otherwise, so a placed
    /// payload is always followed by its packet), place it if the
    /// consumer's tables allow, then push the packet. Returns the push's
    /// result and, inside, where the payload was placed or why not.
    /// `icrc`: as for [`Inbox::push_with`].
    ///
    /// Call it only with nothing before `datagram` for this inbox still
    /// waiting to be pushed.
    pub fn place_and_push(
        &mut self,
        src_port: u16,
        tos: u8,
        datagram: &[u8],
        p: &Placement<'_>,
        icrc: crate::Icrc,
    ) -> Result<Result<u64, PlaceError>, PushError> {
        if !self.inbox.has_room_placed(self.ring, datagram.len())? {
            return Err(PushError::Full);
        }
        let placed = self.place_checked(p);
        let at = placed.as_ref().ok().copied();
        let extra = crate::Extra {
            placed: at,
            elide: p.elide.filter(|_| at.is_some()),
            ..crate::Extra::default()
        };
        self.inbox
            .push_record(self.ring, src_port, tos, datagram, icrc, extra)?;
        Ok(placed)
    }

    /// Push `datagram` into the run's ring, the `k`th
    /// response (from 0) to the READ request whose record carried `hint`,
    /// after writing its payload where the requester's completer would:
    /// `hint.host + k * hint.mtu`. The payload, bytes `at..at + len` of
    /// the datagram, is not in `datagram` but at `payload` (as for
    /// [`Inbox::push_gathered`]). Placed only through the requester's
    /// shared pages, while its READ epoch is the hint's, for a payload of
    /// the size the requester takes there (`mtu`, or what is left of the
    /// READ); a placed payload is left out of the record, one that is not
    /// is copied into it. Returns as [`PlacingRun::place_and_push`], with
    /// the same rules for its caller.
    ///
    /// # Safety
    /// `payload` must be valid for reads of `len` bytes during the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn place_read_and_push(
        &mut self,
        src_port: u16,
        tos: u8,
        datagram: &[u8],
        hint: &crate::ReadHint,
        k: u32,
        at: usize,
        payload: *const u8,
        len: usize,
        icrc: crate::Icrc,
    ) -> Result<Result<u64, PlaceError>, PushError> {
        if at.checked_add(len).is_none_or(|end| end > datagram.len())
            || icrc == crate::Icrc::Unchecked
        {
            return Err(PushError::Invalid);
        }
        if !self.inbox.has_room_placed(self.ring, datagram.len())? {
            return Err(PushError::Full);
        }
        // SAFETY: the caller vouches for `payload`.
        let placed = unsafe { self.place_read(hint, k, payload, len) };
        let extra = match placed {
            Ok(host) => crate::Extra {
                placed: Some(host),
                elide: Some((at, len)),
                ..crate::Extra::default()
            },
            // Unplaced: the payload goes into the record.
            Err(_) => crate::Extra {
                gap: Some(crate::Gap {
                    at,
                    src: payload,
                    len,
                }),
                ..crate::Extra::default()
            },
        };
        self.inbox
            .push_record(self.ring, src_port, tos, datagram, icrc, extra)?;
        Ok(placed)
    }

    /// # Safety
    /// As [`PlacingRun::place_read_and_push`].
    unsafe fn place_read(
        &mut self,
        hint: &crate::ReadHint,
        k: u32,
        payload: *const u8,
        n: usize,
    ) -> Result<u64, PlaceError> {
        let inbox = self.inbox;
        let pid = inbox.owner_pid().ok_or(PlaceError::Refused)?;
        if inbox.read_epoch() != hint.epoch {
            return Err(PlaceError::NotNow);
        }
        let offset = u64::from(k) * u64::from(hint.mtu);
        // The size the requester's completer takes at that PSN: a full
        // MTU, or the rest of the READ in its last response.
        let fits = hint.mtu > 0
            && offset < hint.len
            && n as u64 == (hint.len - offset).min(u64::from(hint.mtu));
        if !fits {
            return Err(PlaceError::NotNow);
        }
        let off = hint
            .pages
            .off
            .checked_add(offset)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(PlaceError::NotNow)?;
        // A memfd that does not open (gone with its MR's pages) refuses
        // this READ only.
        let map = self
            .map_of(pid, hint.pages, true)
            .ok_or(PlaceError::NotNow)?;
        if off.checked_add(n).is_none_or(|end| end > map.len()) {
            return Err(PlaceError::NotNow);
        }
        // SAFETY: `off..off + n` lies in the mapping (checked above); the
        // caller vouches for `payload`.
        unsafe { map.write_raw(off, payload, n) };
        self.shared += 1;
        Ok(hint.host.wrapping_add(offset))
    }

    /// This producer's mapping of memfd `s` of process `pid` (mapped now
    /// if it is not yet: [`Inbox::shared_map`]), with the mappings locked
    /// until the run's end. `read`: for a READ's responses, whose
    /// destination no table names, so the mapping is kept when mappings
    /// no table names are dropped (a WRITE's MR is in the consumer's).
    fn map_of(&mut self, pid: i32, s: crate::SharedPages, read: bool) -> Option<&shm::Mapping> {
        let inbox = self.inbox;
        let maps = self
            .maps
            .get_or_insert_with(|| inbox.shared_maps.lock().unwrap_or_else(|p| p.into_inner()));
        let i = inbox.shared_map(maps, pid, s)?;
        maps[i].reads |= read;
        maps[i].map.as_ref()
    }

    fn place_checked(&mut self, p: &Placement<'_>) -> Result<u64, PlaceError> {
        let inbox = self.inbox;
        let pid = inbox.owner_pid().ok_or(PlaceError::Refused)?;
        let qp = inbox.lookup_qp(p.qpn).ok_or(PlaceError::NotNow)?;
        const PSN_MASK: u32 = 0x00ff_ffff;
        let in_step = match p.first_psn {
            // A new message: its responder ready for it at this PSN.
            None => !qp.mid_write && qp.epsn == p.psn & PSN_MASK,
            // Its message goes on: the responder has not taken the FIRST
            // yet, or is in that message at a PSN from FIRST + 1 to this
            // one (it is published again only after a FIRST or a LAST).
            Some(first) => {
                let behind = p.psn.wrapping_sub(qp.epsn) & PSN_MASK;
                let since = p.psn.wrapping_sub(first) & PSN_MASK;
                if qp.mid_write {
                    behind < since
                } else {
                    qp.epsn == first & PSN_MASK
                }
            }
        };
        if !in_step {
            return Err(PlaceError::NotNow);
        }
        let mr = inbox.lookup_mr(p.rkey).ok_or(PlaceError::NotNow)?;
        let len = (p.data.len() as u64).max(p.span);
        let inside =
            mr.pd == qp.pd && p.va >= mr.iova && len <= mr.len && p.va - mr.iova <= mr.len - len;
        if !inside || p.data.is_empty() {
            return Err(PlaceError::NotNow);
        }
        let host = mr.host_addr.wrapping_add(p.va - mr.iova);
        if let Some(done) = self.write_shared(pid, &mr, host, p.data) {
            return done;
        }
        if p.first_psn.is_some() || len > p.data.len() as u64 {
            // A message of several packets is placed only with a memory
            // copy: a system call for each packet would cost the sender
            // more than the copies it saves the consumer.
            return Err(PlaceError::NotNow);
        }
        match inbox.write_owner(pid, host, p.data) {
            Ok(n) if n == p.data.len() => Ok(host),
            Ok(_) => Err(PlaceError::Fault),
            Err(e) => match e.raw_os_error() {
                Some(libc::EFAULT) => Err(PlaceError::Fault),
                Some(libc::EINTR | libc::ENOMEM) => Err(PlaceError::NotNow),
                _ => Err(PlaceError::Refused),
            },
        }
    }
    /// Write `data` at `host` of the owner, process `pid`, through this
    /// process's mapping of the memfd that holds `mr`'s whole pages, if
    /// they are in one and `host..host + len` lies in them: a memory
    /// copy, no system call. The mapping is made at the first such write
    /// (opening `/proc/<pid>/fd/<n>`, which needs the rights that writing
    /// the process's memory needs, and checking the file's inode) and
    /// kept. `None`: write it another way.
    fn write_shared(
        &mut self,
        pid: i32,
        mr: &PlaceableMr,
        host: u64,
        data: &[u8],
    ) -> Option<Result<u64, PlaceError>> {
        let s = mr.shared?;
        let (first, end) = crate::shared_mr::whole_pages(mr.host_addr, mr.len);
        if host < first || host.checked_add(data.len() as u64)? > end {
            return None;
        }
        let off = usize::try_from(s.off.checked_add(host - first)?).ok()?;
        let map = self.map_of(pid, s, false)?;
        if off.checked_add(data.len())? > map.len() {
            return None;
        }
        map.write(off, data);
        self.shared += 1;
        Some(Ok(host))
    }
}

impl Drop for PlacingRun<'_> {
    fn drop(&mut self) {
        if self.shared > 0 {
            PLACED_SHARED.fetch_add(self.shared, Relaxed);
        }
        self.maps = None;
        // Release: every placement's bytes and every record pushed in the
        // run are visible before a consumer that waits sees the counter
        // move on (x86: a plain store, no wait for the store buffer).
        let ctrl = self.inbox.layout.ctrl(self.ring);
        self.inbox
            .map
            .u64_at(ctrl + CTRL_PLACING)
            .store(self.odd.wrapping_add(1), Release);
    }
}

impl Inbox {
    /// The index in `maps` of this process's mapping of the memfd `s` of
    /// process `pid`, mapped now if it is not yet. `None`: it does not
    /// open (no rights, the owner gone), now or when first tried.
    fn shared_map(
        &self,
        maps: &mut Vec<SharedMap>,
        pid: i32,
        s: crate::SharedPages,
    ) -> Option<usize> {
        if let Some(i) = maps.iter().position(|m| m.ino == s.ino) {
            return Some(i);
        }
        // A memfd that did not open is not tried again at every packet.
        if maps.iter().any(|m| m.failed == Some(s.ino)) {
            return None;
        }
        let Some(m) = SharedMap::open(pid, s) else {
            maps.retain(|m| m.failed.is_none());
            maps.push(SharedMap::failed(s.ino));
            return None;
        };
        // Mappings of memfds no published MR names any more (their owner
        // deregistered the MRs) keep only memory alive.
        let live = self.shared_inodes();
        // (A READ's destination is kept, as no table names it; the bound
        // below clears it with the rest.)
        maps.retain(|m| m.failed.is_some() || m.reads || live.contains(&m.ino));
        let total: usize = maps.iter().map(|m| m.len()).sum();
        if total + m.len() > 2 * crate::shared_mr::MAX_TOTAL as usize {
            maps.clear();
        }
        maps.push(m);
        Some(maps.len() - 1)
    }

    /// Producer: get ready now, before the first packet, to place into
    /// this inbox's consumer: its process and PID namespace are checked,
    /// the memfds of its published MRs' shared pages are mapped, and the
    /// first [`WARM_PAGES_PER_MR`] bytes of each MR are faulted in,
    /// writable (no byte changes). The first placement did all of this;
    /// in the TCG guest it was 1.5-2.5 ms of `ib_write_lat`'s first
    /// iteration (opening `/proc/<pid>/fd/<n>` 0.8-1.3 ms, the first
    /// write's page fault 0.45 ms). MRs published later are mapped at
    /// their first placement, as before.
    pub fn warm_placement(&self) {
        let Some(pid) = self.owner_pid() else { return };
        // The MRs with shared pages: their whole pages' range, and where
        // the first of those lies in which memfd.
        let mrs: Vec<(u64, u64, crate::SharedPages)> = (0..MR_ENTRIES)
            .filter_map(|i| self.mr_at(i))
            .filter_map(|mr| mr.shared.map(|s| (mr.host_addr, mr.len, s)))
            .collect();
        let mut maps = self.shared_maps.lock().unwrap_or_else(|p| p.into_inner());
        for (host, len, s) in mrs {
            let Some(i) = self.shared_map(&mut maps, pid, s) else {
                continue;
            };
            let (first, end) = crate::shared_mr::whole_pages(host, len);
            let (Ok(off), Ok(len)) = (usize::try_from(s.off), usize::try_from(end - first)) else {
                continue;
            };
            if let Some(map) = &maps[i].map {
                map.populate(off, len.min(WARM_PAGES_PER_MR), true);
            }
        }
    }

    /// Whether this producer has mapped the memfd of inode `ino` (tests).
    #[cfg(test)]
    pub(crate) fn shared_mapped(&self, ino: u64) -> bool {
        let maps = self.shared_maps.lock().unwrap_or_else(|p| p.into_inner());
        maps.iter().any(|m| m.ino == ino && m.map.is_some())
    }

    /// Write `data` at `addr` of the owner, process `pid`, the faster of
    /// two ways on this machine ([`WAY`]): through its `/proc/<pid>/mem`,
    /// opened once per inbox where that opens (the same ptrace rights as
    /// `process_vm_writev`, checked at open rather than at every write),
    /// or with `process_vm_writev`. Which is faster depends on the
    /// kernel: on the 2-CPU host the ptrace check at every
    /// `process_vm_writev` runs a BPF security program, a third of each
    /// call, and `/proc/<pid>/mem` took `ib_write_lat` from 2.25-2.31 to
    /// 1.89-1.92 µs; in the TCG guest (Linux 6.1, no such program) its
    /// longer kernel path (a bounce page per write) took it from 10.8-11.0
    /// to 15.0-15.7 µs. The file stays bound to the process it was opened
    /// for: once that process is gone, writes through it fail instead of
    /// reaching another with its ID.
    fn write_owner(&self, pid: i32, addr: u64, data: &[u8]) -> std::io::Result<usize> {
        let way = WAY.way();
        if way == Way::Pvw {
            return shm::write_to_process(pid, addr, data);
        }
        let mem = self
            .owner_mem
            .get_or_init(|| shm::open_process_mem(pid).ok().map(|f| (pid, f)));
        let f = match mem {
            Some((p, f)) if *p == pid => f,
            _ => return shm::write_to_process(pid, addr, data),
        };
        if way == Way::Mem {
            return shm::write_process_mem(f, addr, data);
        }
        WAY.timed(|w| match w {
            Way::Mem => shm::write_process_mem(f, addr, data),
            _ => shm::write_to_process(pid, addr, data),
        })
    }
}

/// A peer's memfd of moved MR pages, mapped here (or one that would not
/// open: `failed`).
pub(crate) struct SharedMap {
    ino: u64,
    map: Option<shm::Mapping>,
    failed: Option<u64>,
    /// Written by a READ response: a READ's destination, which no
    /// published MR names (it may have local write only).
    reads: bool,
}

impl SharedMap {
    fn failed(ino: u64) -> SharedMap {
        SharedMap {
            ino: 0,
            map: None,
            failed: Some(ino),
            reads: false,
        }
    }

    fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// Map the memfd `s` of process `pid` (the whole file), if it opens
    /// and is the file named (its inode).
    fn open(pid: i32, s: crate::SharedPages) -> Option<SharedMap> {
        use std::os::unix::fs::MetadataExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/fd/{}", s.fd))
            .ok()?;
        let md = f.metadata().ok()?;
        if md.ino() != s.ino || md.len() == 0 {
            return None;
        }
        let fd: std::os::fd::OwnedFd = f.into();
        let map = shm::Mapping::map(&fd, usize::try_from(md.len()).ok()?).ok()?;
        Some(SharedMap {
            ino: s.ino,
            map: Some(map),
            failed: None,
            reads: false,
        })
    }
}

/// Placements written through a mapping of the owner's MR pages
/// (`rxe-emu stat`'s `placed_shared`), by this process.
static PLACED_SHARED: AtomicU64 = AtomicU64::new(0);

/// This process's placements through shared MR pages so far.
pub fn placed_shared() -> u64 {
    PLACED_SHARED.load(Relaxed)
}

/// How this process writes placements into other processes, in
/// `rxe-emu stat`'s words, where the MR's pages are not in shared memory:
/// `proc_mem`, `process_vm_writev`, or `timing` (not chosen yet: fewer
/// than 32 placements timed so far); `shared_memory` while every
/// placement so far went into shared MR pages (`placed_shared`).
/// Whatever the choice, a peer whose `/proc/<pid>/mem` does not open is
/// written with `process_vm_writev`.
pub fn placement_way() -> &'static str {
    match WAY.way() {
        Way::Mem => "proc_mem",
        Way::Pvw => "process_vm_writev",
        Way::Undecided if WAY.started.load(Relaxed) == 0 && placed_shared() > 0 => "shared_memory",
        Way::Undecided => "timing",
    }
}

/// A way to write into another process.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Way {
    /// Not chosen yet: writes alternate between the two, timed.
    Undecided,
    /// `/proc/<pid>/mem`.
    Mem,
    /// `process_vm_writev`.
    Pvw,
}

/// How many writes of each way are timed before the choice.
const TIMED_WRITES: u64 = 16;

/// The process's choice between the two ways of writing into another
/// process: the first `2 * TIMED_WRITES` placements (into any peer that
/// `/proc/<pid>/mem` opens for) alternate between them, each timed, and
/// the way whose fastest write was faster is used from then on. The
/// fastest of sixteen, so that a write during which the thread lost its
/// CPU does not decide; alternating, so that both see the same sizes in
/// a conversation's repeated messages. Both ways write the same bytes
/// with the same results, so the writes that time them are placements
/// like any other.
pub(crate) struct WayChoice {
    chosen: AtomicU32,
    started: AtomicU64,
    done: AtomicU64,
    /// Fastest write in ns: [`Way::Mem`], [`Way::Pvw`].
    best: [AtomicU64; 2],
}

pub(crate) static WAY: WayChoice = WayChoice::new();

impl WayChoice {
    pub(crate) const fn new() -> WayChoice {
        WayChoice {
            chosen: AtomicU32::new(0),
            started: AtomicU64::new(0),
            done: AtomicU64::new(0),
            best: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
        }
    }

    /// The way chosen, or [`Way::Undecided`].
    pub(crate) fn way(&self) -> Way {
        match self.chosen.load(Relaxed) {
            1 => Way::Mem,
            2 => Way::Pvw,
            _ => Way::Undecided,
        }
    }

    /// Run `write` the way whose turn it is (they alternate), timed.
    pub(crate) fn timed(
        &self,
        write: impl FnOnce(Way) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let n = self.started.fetch_add(1, Relaxed);
        let way = if n % 2 == 0 { Way::Mem } else { Way::Pvw };
        let t0 = shm::monotonic_ns();
        let r = write(way);
        let dt = shm::monotonic_ns().saturating_sub(t0);
        if r.is_ok() {
            self.note(way, dt);
        }
        r
    }

    /// A write of `way` took `ns`: keep the fastest; after
    /// `2 * TIMED_WRITES` such writes, choose (if each way has one).
    pub(crate) fn note(&self, way: Way, ns: u64) {
        let i = usize::from(way == Way::Pvw);
        self.best[i].fetch_min(ns, Relaxed);
        if self.done.fetch_add(1, Relaxed) + 1 >= 2 * TIMED_WRITES {
            let (mem, pvw) = (self.best[0].load(Relaxed), self.best[1].load(Relaxed));
            // Until each way has a write that wrote everything, both
            // stay u64::MAX or one does: keep timing.
            if mem != u64::MAX && pvw != u64::MAX {
                self.chosen.store(if mem <= pvw { 1 } else { 2 }, Relaxed);
            }
        }
    }
}

/// The inode of this process's PID namespace, read once.
fn pid_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    static NS: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::metadata("/proc/self/ns/pid")
            .ok()
            .map(|m| m.ino())
            .filter(|&i| i != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::{Way, WayChoice, TIMED_WRITES};

    /// Feed `choice` timed writes of `mem_ns` and `pvw_ns` (the ways
    /// alternate as `timed` runs them), `n` in all.
    fn run(choice: &WayChoice, n: u64, mem_ns: u64, pvw_ns: u64) -> Vec<Way> {
        let mut seen = Vec::new();
        for _ in 0..n {
            let _ = choice.timed(|w| {
                seen.push(w);
                let ns = if w == Way::Mem { mem_ns } else { pvw_ns };
                let t0 = crate::shm::monotonic_ns();
                while crate::shm::monotonic_ns() - t0 < ns {}
                Ok(8)
            });
        }
        seen
    }

    #[test]
    fn the_way_whose_fastest_write_is_faster_is_chosen_after_the_timed_writes() {
        let c = WayChoice::new();
        let seen = run(&c, 2 * TIMED_WRITES - 1, 20_000, 200_000);
        assert_eq!(c.way(), Way::Undecided);
        assert_eq!(seen[..4], [Way::Mem, Way::Pvw, Way::Mem, Way::Pvw]);
        run(&c, 1, 20_000, 200_000);
        assert_eq!(c.way(), Way::Mem);

        let c = WayChoice::new();
        run(&c, 2 * TIMED_WRITES, 200_000, 20_000);
        assert_eq!(c.way(), Way::Pvw);
    }

    #[test]
    fn a_slow_write_does_not_decide_and_failed_writes_do_not_count() {
        // One way's writes are all fast but one: its fastest still wins.
        let c = WayChoice::new();
        c.note(Way::Mem, 5_000_000);
        for _ in 0..TIMED_WRITES {
            c.note(Way::Pvw, 2_000);
        }
        for _ in 1..TIMED_WRITES {
            c.note(Way::Mem, 1_000);
        }
        assert_eq!(c.way(), Way::Mem);
        // Writes that fail are not timed: with none of a way timed,
        // nothing is chosen.
        let c = WayChoice::new();
        for _ in 0..4 * TIMED_WRITES {
            let _ = c.timed(|w| match w {
                Way::Mem => Err(std::io::Error::from_raw_os_error(libc::EACCES)),
                _ => Ok(8),
            });
        }
        assert_eq!(c.way(), Way::Undecided);
    }
}
