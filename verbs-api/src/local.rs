//! The same-host path of a daemon device: datagrams for a QP of another
//! (or this) process of the same device go through that process's
//! shared-memory inbox (`local_link`) instead of UDP. They are the same
//! RoCEv2 bytes, built by the engine and passed through fault injection
//! and the tracer exactly as UDP datagrams are; only the last hop differs.
//!
//! Which datagrams: those to the device's own address and port 4791 whose
//! BTH destination QP lies in a slot of the device (QPN >> 16 in
//! 1..slots): exactly the ones the daemon's steering program would have
//! delivered to that slot's socket. QP1 (slot 0, the daemon's connection
//! manager), multicast and other addresses keep UDP. A slot nobody owns
//! has no inbox, and its datagrams go by UDP as before, where the daemon
//! counts them.
//!
//! The inbox of a slot is asked of the daemon once (`INBOX`) and kept
//! until it is closed (its owner let go of the slot). Until a process has
//! it, datagrams for that slot go by UDP, so the first packets of a
//! conversation may take UDP and the rest the inbox: they can overtake
//! each other once, as on any network.

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use local_link::{Icrc, Inbox, PlaceError, PlaceableMr, PlaceableQp, Placement, PushError};
use rxe_core::{Engine, Instant, Transmit};

use crate::hostmem::HostMemory;

/// How long a slot without an inbox (nobody owns it, or the daemon could
/// not be asked) goes by UDP before it is asked about again.
const NO_INBOX_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// The most bytes waiting for room in full inboxes; past it a datagram
/// is dropped (and counted as a send error) as a full socket buffer
/// drops one. Reliable QPs retransmit.
const MAX_PENDING_BYTES: usize = 32 << 20;

enum Peer {
    Inbox(Arc<Inbox>),
    /// No inbox: UDP until then.
    Udp(Instant),
}

/// What a sender keeps on its peers, under one lock: a datagram costs
/// that one lock, and no reference count (each a locked instruction: an
/// atomic helper call in the TCG guest).
#[derive(Default)]
struct Pending {
    /// Per destination slot, in order: datagrams its full inbox refused.
    queues: FxHashMap<usize, VecDeque<Transmit>>,
    bytes: usize,
    /// Per slot asked about: its inbox, or UDP until a time.
    peers: FxHashMap<usize, Peer>,
    /// The slots written by the current `send`, to kick once each at its
    /// end (kept here so a flush allocates nothing).
    kick: Vec<usize>,
    /// Slots written but not kicked, their consumers' applications having
    /// polled just before: kicked later, if those applications stop
    /// polling before taking the datagrams (`LocalLink::rekick`).
    unkicked: Vec<usize>,
    /// Multi-packet RDMA WRITEs whose FIRST was placed, by the peer's slot
    /// and QP: where the next packet's payload goes. (Here, under the lock
    /// every push already holds, rather than behind a lock of its own.)
    writes: Writes,
    /// READ requests from the peer in a slot, by that slot and the QP
    /// that asked, whose responses this process may place: the hints
    /// they came with, for requests our engine took as new. (Here too,
    /// under the lock every push holds.)
    reads: Reads,
}

/// [`Pending::writes`].
type Writes = FxHashMap<(usize, u32), PlacedWrite>;

/// What [`LocalLink::send`] keeps while it pushes: the placed WRITEs
/// and READ plans (out of [`Pending`] meanwhile), and the placements
/// made, counted at the end.
struct SendState {
    writes: Writes,
    reads: Reads,
    placed: u64,
    placed_reads: u64,
}

/// The inbox that [`LocalLink::send`] pushes a run of datagrams into
/// (consecutive datagrams to one slot), and the run of placements into
/// it ([`local_link::PlacingRun`]), started at its first placement and
/// ended with the datagrams' run: one odd period of the ring's
/// `placing` counter for them all, not one per payload.
struct ToInbox<'a> {
    inbox: &'a Inbox,
    slot: usize,
    run: Option<local_link::PlacingRun<'a>>,
}

impl<'a> ToInbox<'a> {
    /// The run of placements into ring `ring` (ours), started now if not
    /// yet.
    fn run(&mut self, ring: usize) -> Result<&mut local_link::PlacingRun<'a>, PushError> {
        if self.run.is_none() {
            self.run = Some(self.inbox.placing_run(ring)?);
        }
        Ok(self.run.as_mut().expect("started"))
    }
}

/// [`Pending::reads`].
type Reads = FxHashMap<(usize, u32), VecDeque<ReadPlan>>;

/// READ requests of one requester QP kept at most: as many as a QP may
/// have in flight (the device's `max_qp_rd_atom`), with room to spare.
const MAX_READS_KEPT: usize = 256;

/// A READ request whose responses this process may place
/// ([`LocalLink::note_read_request`]).
struct ReadPlan {
    /// The requester's inbox as known when the request came: a slot
    /// whose inbox was replaced since (its process gone, another in its
    /// place) is not placed into by this plan.
    inbox: Arc<Inbox>,
    /// The request's PSN: response `k` comes at `psn + k`.
    psn: u32,
    /// Its responses.
    npsn: u32,
    /// The response expected next: each is placed once, in order, on
    /// the first pass (a READ answered again goes unplaced).
    next: u32,
    hint: local_link::ReadHint,
}

impl Pending {
    /// Queue `t` behind what waits for `slot`, or drop it past
    /// [`MAX_PENDING_BYTES`] (counted in `out`).
    fn queue(&mut self, slot: usize, mut t: Transmit, out: &mut Sent) {
        if self.bytes + t.payload.len() > MAX_PENDING_BYTES {
            out.dropped += 1;
        } else {
            // Pushed later without a word on its ICRC: complete it (and
            // its payload, which must not wait for a later flush).
            crate::hostmem::fill_gathered(&mut t);
            t.write_icrc();
            self.bytes += t.payload.len();
            self.queues.entry(slot).or_default().push_back(t);
        }
    }

    fn kick_later(&mut self, slot: usize) {
        if !self.kick.contains(&slot) {
            self.kick.push(slot);
        }
    }

    /// The inbox of `slot` as known (not closed).
    fn known(&self, slot: usize) -> Option<&Arc<Inbox>> {
        match self.peers.get(&slot) {
            Some(Peer::Inbox(i)) if !i.is_closed() => Some(i),
            _ => None,
        }
    }
}

/// Whether `op` is an RC READ response (FIRST, MIDDLE, LAST or ONLY).
fn is_read_response(op: wire::Opcode) -> bool {
    (wire::Opcode::RC_RDMA_READ_RESPONSE_FIRST.0..=wire::Opcode::RC_RDMA_READ_RESPONSE_ONLY.0)
        .contains(&op.0)
}

/// The BTH destination QP of a RoCEv2 UDP payload.
fn dest_qpn(payload: &[u8]) -> Option<u32> {
    wire::bth::Packet::new_checked(payload)
        .ok()
        .map(|b| b.dest_qpn())
}

/// A multi-packet RDMA WRITE being placed into a peer: its FIRST was.
#[derive(Debug, Clone, Copy)]
struct PlacedWrite {
    first_psn: u32,
    /// The PSN of the packet to place next, and where its payload goes.
    next_psn: u32,
    next_va: u64,
    /// The end of the message's range (RETH VA + DMA length).
    end_va: u64,
    rkey: u32,
}

pub(crate) struct LocalLink {
    /// This process's inbox (it consumes it; it also produces into its
    /// own ring of it for its own QPs).
    pub own: Arc<Inbox>,
    /// This process's slot: the ring it writes in others' inboxes.
    slot: usize,
    daemon: PathBuf,
    device: String,
    pending: Mutex<Pending>,
    /// `pending.bytes > 0`, readable without the lock (the progress loop
    /// and every flush ask).
    any_pending: AtomicBool,
    /// `pending.unkicked` is not empty.
    any_unkicked: AtomicBool,
    /// CLOCK_MONOTONIC (ns) before which [`LocalLink::rekick`] has no
    /// one to kick: the earliest time an application of
    /// `pending.unkicked` may be found to have stopped polling.
    rekick_at: AtomicU64,
    /// CLOCK_MONOTONIC (ns) at which the first kick of `pending.unkicked`
    /// to a consumer whose application said it may stop polling
    /// (`local_link::KickDue::left`) is due; `u64::MAX` if none waits.
    /// Unlike the others, nothing else would take their datagrams: the
    /// progress thread wakes for them if this process's application may
    /// not be polling ([`LocalLink::left_due`]).
    left_due: AtomicU64,
    /// CLOCK_MONOTONIC (ns) as the device read it last
    /// ([`LocalLink::note_time`]): the time a push's kick judges a
    /// consumer's last poll by.
    time: AtomicU64,
    /// Kicks that woke another process's progress thread (or this one's):
    /// `rxe-emu stat`'s `inbox_kicks`.
    kicks: AtomicU64,
    /// Placement (`local_link::place`) is on: this process publishes its
    /// MRs and responders and places WRITE ONLY payloads into peers.
    /// `RXE_EMU_PLACEMENT=off` turns it off.
    placement: bool,
    /// Bit `s`: the process in slot `s` cannot be placed into (it offers
    /// no placement, or we have no ptrace rights over it).
    no_place: AtomicU64,
    /// WRITE payloads (one per packet) placed into peers: `rxe-emu
    /// stat`'s `placed_writes`.
    placed: AtomicU64,
    /// READ response payloads placed into peers: `placed_reads`.
    placed_reads: AtomicU64,
    /// This process traces its packets (`TRACE`): a placed payload is kept
    /// in its record all the same, so that the peer's tracer (every
    /// process of a device traces) shows the bytes that were sent.
    tracing: AtomicBool,
    /// The engine's [`Engine::qp_errors`] when this process's responders
    /// were last published all together.
    qp_errors_seen: AtomicU64,
}

impl Drop for LocalLink {
    fn drop(&mut self) {
        // Our memory may go once the device is closed: no producer may
        // still be writing into it.
        self.own.withdraw_placement();
    }
}

/// What one [`LocalLink::send`] did.
#[derive(Default)]
pub(crate) struct Sent {
    /// Datagrams not for the inbox path (UDP's).
    pub udp: Vec<Transmit>,
    /// Datagrams dropped (full beyond [`MAX_PENDING_BYTES`], or queued for
    /// an inbox that closed): send errors.
    pub dropped: u64,
}

impl LocalLink {
    /// `trusted`: only processes of this user can write the device's
    /// inboxes (the daemon serves no other user). Otherwise placement is
    /// off both ways: another user's process could forge the tables a
    /// sender acts on, and make it write elsewhere into a process of ours.
    pub(crate) fn new(
        own: Inbox,
        slot: usize,
        daemon: PathBuf,
        device: String,
        trusted: bool,
    ) -> LocalLink {
        let own = Arc::new(own);
        let placement = trusted
            && std::env::var("RXE_EMU_PLACEMENT").as_deref() != Ok("off")
            && own.offer_placement();
        let mut pending = Pending::default();
        pending.peers.insert(slot, Peer::Inbox(own.clone()));
        LocalLink {
            own,
            slot,
            daemon,
            device,
            pending: Mutex::new(pending),
            any_pending: AtomicBool::new(false),
            any_unkicked: AtomicBool::new(false),
            rekick_at: AtomicU64::new(0),
            left_due: AtomicU64::new(u64::MAX),
            time: AtomicU64::new(0),
            kicks: AtomicU64::new(0),
            placement,
            no_place: AtomicU64::new(0),
            placed: AtomicU64::new(0),
            placed_reads: AtomicU64::new(0),
            tracing: AtomicBool::new(false),
            qp_errors_seen: AtomicU64::new(0),
        }
    }

    /// Other processes' inboxes this process has open (`rxe-emu stat`'s
    /// `peer_inboxes`): learned at a connected QP's RTR or at the first
    /// datagram to them.
    pub(crate) fn peer_inboxes(&self) -> usize {
        let p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        p.peers
            .iter()
            .filter(|(s, peer)| **s != self.slot && matches!(peer, Peer::Inbox(_)))
            .count()
    }

    /// WRITE payloads placed into peers so far (`placed_writes`).
    pub(crate) fn placed(&self) -> u64 {
        self.placed.load(Ordering::Relaxed)
    }

    /// READ response payloads placed into peers so far (`placed_reads`).
    pub(crate) fn placed_reads(&self) -> u64 {
        self.placed_reads.load(Ordering::Relaxed)
    }

    /// Whether placement is on (the engine's READ requests then say where
    /// their responses go: `Engine::hint_reads`).
    pub(crate) fn placement(&self) -> bool {
        self.placement
    }

    /// Whether the pages of an MR with `access` move into shared memory
    /// (`local_link::shared_mr`): those peers may place into, and a READ's
    /// destination (local write), not on-demand paging.
    pub(crate) fn shares(&self, access: rxe_core::AccessFlags) -> bool {
        use rxe_core::AccessFlags;
        self.placeable(access)
            || (self.placement
                && access.contains(AccessFlags::LOCAL_WRITE)
                && !access.contains(AccessFlags::ON_DEMAND))
    }

    /// No response to a READ this process asked for until now is placed
    /// by a peer once this returns: called before a hinted READ's work
    /// request can end otherwise than by its responses (its QP in ERR or
    /// RESET, or destroyed) and before an MR goes.
    pub(crate) fn end_read_hints(&self) {
        if self.placement {
            self.own.end_read_hints();
        }
    }

    /// Where the responses to the READ request `t` may be placed, if its
    /// destination lies in this process's shared pages.
    fn read_hint(&self, t: &Transmit) -> Option<local_link::ReadHint> {
        let d = t.read_dest?;
        let pages = local_link::shared_mr::shared_range(d.host, d.len)?;
        Some(local_link::ReadHint {
            host: d.host,
            len: d.len,
            pages,
            mtu: d.mtu,
            epoch: self.own.read_epoch(),
        })
    }

    /// A READ request (`datagram`) from the process in slot `ring` came
    /// with `hint`, before our engine takes it: keep the hint if the
    /// engine takes the request as new (a duplicate, a READ asked again,
    /// is answered unplaced: its first answer may have completed the work
    /// request already).
    pub(crate) fn note_read_request(
        &self,
        e: &Engine<HostMemory>,
        datagram: &[u8],
        ring: usize,
        hint: local_link::ReadHint,
    ) {
        let Ok(bth) = wire::bth::Packet::new_checked(datagram) else {
            return;
        };
        if bth.opcode() != wire::Opcode::RC_RDMA_READ_REQUEST || hint.mtu == 0 {
            return;
        }
        let psn = bth.psn().value();
        let Some(requester) = e.takes_new_request(bth.dest_qpn(), psn) else {
            return;
        };
        let npsn = hint.len.div_ceil(u64::from(hint.mtu)).max(1);
        let Ok(npsn) = u32::try_from(npsn) else {
            return;
        };
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let Some(inbox) = p.known(ring).cloned() else {
            return;
        };
        let plans = p.reads.entry((ring, requester)).or_default();
        // The same PSN asked again before it was answered: this one.
        plans.retain(|r| r.psn != psn);
        if plans.len() >= MAX_READS_KEPT {
            plans.pop_front();
        }
        plans.push_back(ReadPlan {
            inbox,
            psn,
            npsn,
            next: 0,
            hint,
        });
    }

    /// Publish MR `mr` for placement if peers may write it (remote write,
    /// not on-demand paging, whose pages need not be there).
    pub(crate) fn publish_mr(&self, mr: &rxe_core::mr::Mr) {
        if self.placeable(mr.access) {
            self.own.publish_mr(&PlaceableMr {
                rkey: mr.rkey,
                pd: mr.pd.0,
                iova: mr.iova,
                len: mr.length,
                host_addr: mr.host_addr,
                shared: local_link::shared_mr::shared_pages(mr.host_addr, mr.length),
            });
        }
    }

    /// Whether peers may place into an MR with `access` (remote write, not
    /// on-demand paging, whose pages need not be there): such an MR's
    /// pages are worth moving into shared memory (`local_link::shared_mr`).
    pub(crate) fn placeable(&self, access: rxe_core::AccessFlags) -> bool {
        use rxe_core::AccessFlags;
        self.placement
            && access.contains(AccessFlags::REMOTE_WRITE)
            && !access.contains(AccessFlags::ON_DEMAND)
    }

    /// `rkey` is about to be deregistered or changed: returns once no
    /// peer can still be placing into it.
    pub(crate) fn unpublish_mr(&self, rkey: u32) -> bool {
        self.placement && self.own.unpublish_mr(rkey)
    }

    /// Publish whether QP `qpn`'s responder would execute a WRITE ONLY
    /// now (after each packet for it and each change of it).
    pub(crate) fn publish_qp(&self, e: &Engine<HostMemory>, qpn: u32) {
        if !self.placement || (qpn >> 16) as usize != self.slot {
            return;
        }
        let ready = e.write_target(qpn).map(|t| (t, false));
        let view = ready
            .or_else(|| e.write_continuing(qpn).map(|t| (t, true)))
            .map(|((pd, epsn), mid_write)| PlaceableQp {
                qpn,
                pd: pd.0,
                epsn: epsn.value(),
                mid_write,
            });
        self.own.publish_qp(qpn, view.as_ref());
    }

    /// Called after the engine ran: if a QP entered ERR by itself (a
    /// retry count exceeded, say), publish every responder again, so no
    /// peer places a WRITE for a QP that will drop it.
    pub(crate) fn publish_after_errors(&self, e: &Engine<HostMemory>) {
        if !self.placement {
            return;
        }
        let n = e.qp_errors();
        // A load first: this runs at every flush, and nearly always
        // nothing changed.
        if self.qp_errors_seen.load(Ordering::Relaxed) != n {
            self.qp_errors_seen.store(n, Ordering::Relaxed);
            // A READ of a QP in ERR completes with an error, before its
            // responses: none may land after that.
            self.own.end_read_hints();
            for qpn in e.qp_numbers() {
                self.publish_qp(e, qpn);
            }
        }
    }

    /// After the engine handled `datagram` from this process's inbox:
    /// publish its destination QP's responder again.
    /// Only the first and last packet of a request can change whether a
    /// WRITE ONLY would be executed at once (a message starts or ends);
    /// responses and middle packets are skipped, which saves a lookup
    /// per packet of a stream (a fault in them moves the QP to ERR, which
    /// [`LocalLink::publish_after_errors`] catches).
    pub(crate) fn publish_responder(&self, e: &Engine<HostMemory>, datagram: &[u8]) {
        use wire::OpFlags;
        let edge = datagram
            .first()
            .and_then(|&op| wire::Opcode(op).info())
            .is_some_and(|i| {
                i.flags.contains(OpFlags::REQ) && i.flags.intersects(OpFlags::START | OpFlags::END)
            });
        if let (true, Some(qpn)) = (edge, dest_qpn(datagram)) {
            self.publish_qp(e, qpn);
        }
    }

    /// Push `t` into `inbox` of slot `slot`, placing its payload first if
    /// it is the first transmission of an RDMA WRITE packet that the
    /// peer's tables accept (`place`: nothing in the way, such as fault
    /// injection): a WRITE ONLY, or the FIRST, MIDDLE and LAST packets of a
    /// message into an MR whose pages are in shared memory. A placed
    /// payload is left out of the record when the packet needs no ICRC
    /// check (`intact`).
    fn push(
        &self,
        to: &mut ToInbox<'_>,
        t: &mut Transmit,
        place: bool,
        intact: bool,
        st: &mut SendState,
    ) -> Result<(), PushError> {
        use wire::Opcode;
        let (inbox, slot) = (to.inbox, to.slot);
        let tos = t.ecn.tos(t.dscp);
        // Vouched for: its ICRC need not even be written (the consumer
        // writes it if it looks at the bytes). Otherwise it is checked.
        let icrc = match (intact, t.icrc) {
            (true, true) => Icrc::Right,
            (true, false) => Icrc::Unwritten,
            (false, _) => {
                crate::hostmem::fill_gathered(t);
                t.write_icrc();
                Icrc::Unchecked
            }
        };
        let op = t.payload.first().map(|&b| Opcode(b));
        if place && self.placement {
            if op == Some(Opcode::RC_RDMA_READ_REQUEST) {
                if let Some(h) = self.read_hint(t) {
                    return inbox.push_hinted(
                        self.slot,
                        t.info.src_port,
                        tos,
                        &t.payload,
                        icrc,
                        &h,
                    );
                }
            } else if op.is_some_and(is_read_response)
                && !st.reads.is_empty()
                && self.no_place.load(Ordering::Relaxed) & (1 << slot) == 0
            {
                if let Some(r) = self.push_read_response(to, t, tos, icrc, st) {
                    return r;
                }
            }
        }
        let write = matches!(
            op,
            Some(
                Opcode::RC_RDMA_WRITE_ONLY
                    | Opcode::RC_RDMA_WRITE_FIRST
                    | Opcode::RC_RDMA_WRITE_MIDDLE
                    | Opcode::RC_RDMA_WRITE_LAST
            )
        ) && self.placement;
        // A payload its engine left in memory is copied from there into
        // the ring, unless the packet is to be placed (below).
        if !write {
            return crate::hostmem::push_gathered(inbox, self.slot, tos, t, icrc);
        }
        let Some(qpn) = dest_qpn(&t.payload) else {
            return crate::hostmem::push_gathered(inbox, self.slot, tos, t, icrc);
        };
        // Only a packet of the last work request posted: in a stream the
        // consumer's copy runs in parallel with the sender's work, and a
        // sender that placed the messages it found the responder ready
        // for did their copies alone (host ib_write_bw 15% slower).
        let placeable = place
            && t.fresh
            && t.last_posted
            && self.no_place.load(Ordering::Relaxed) & (1 << slot) == 0;
        let starts = matches!(
            op,
            Some(Opcode::RC_RDMA_WRITE_ONLY | Opcode::RC_RDMA_WRITE_FIRST)
        );
        // A MIDDLE or LAST is placed only after its message's FIRST was:
        // without one going on, it is neither parsed nor looked at.
        let going = if placeable && !starts {
            st.writes.get(&(slot, qpn)).copied()
        } else {
            None
        };
        let candidate = placeable && (starts || going.is_some());
        if candidate {
            crate::hostmem::fill_gathered(t);
        }
        let parsed = candidate
            .then(|| wire::PacketRepr::parse(&t.payload).ok())
            .flatten();
        let Some(pkt) = parsed else {
            // An unplaced FIRST or ONLY ends what went on for that QP (a
            // MIDDLE or LAST retransmitted leaves it: whatever is placed
            // later is checked against the responder again).
            if starts || going.is_some() {
                st.writes.remove(&(slot, qpn));
            }
            return crate::hostmem::push_gathered(inbox, self.slot, tos, t, icrc);
        };
        let psn = pkt.bth.psn.value();
        let len = pkt.payload.len() as u64;
        let whole = self.tracing.load(Ordering::Relaxed);
        let elide = (icrc != Icrc::Unchecked && !whole).then(|| {
            let at = pkt.payload.as_ptr() as usize - t.payload.as_ptr() as usize;
            (at, pkt.payload.len())
        });
        let first = op == Some(Opcode::RC_RDMA_WRITE_FIRST);
        let p = match (pkt.reth, going) {
            (Some(reth), _) => Placement {
                qpn,
                psn,
                rkey: reth.rkey,
                va: reth.va,
                data: pkt.payload,
                span: u64::from(reth.dma_len),
                first_psn: None,
                elide,
            },
            (None, Some(w)) if w.next_psn == psn && w.end_va.saturating_sub(w.next_va) >= len => {
                Placement {
                    qpn,
                    psn,
                    rkey: w.rkey,
                    va: w.next_va,
                    data: pkt.payload,
                    span: len,
                    first_psn: Some(w.first_psn),
                    elide,
                }
            }
            _ => {
                st.writes.remove(&(slot, qpn));
                return inbox.push_with(self.slot, t.info.src_port, tos, &t.payload, icrc);
            }
        };
        let (va, rkey, span, first_psn) = (p.va, p.rkey, p.span, p.first_psn);
        let placed =
            to.run(self.slot)?
                .place_and_push(t.info.src_port, tos, &t.payload, &p, icrc)?;
        match placed {
            Ok(_) => {
                st.placed += 1;
                if first {
                    st.writes.insert(
                        (slot, qpn),
                        PlacedWrite {
                            first_psn: psn,
                            next_psn: (psn + 1) & 0x00ff_ffff,
                            next_va: va + len,
                            end_va: va.saturating_add(span),
                            rkey,
                        },
                    );
                } else if op == Some(Opcode::RC_RDMA_WRITE_MIDDLE) {
                    if let Some(cur) = st.writes.get_mut(&(slot, qpn)) {
                        cur.next_psn = (psn + 1) & 0x00ff_ffff;
                        cur.next_va += len;
                    }
                } else if first_psn.is_some() {
                    st.writes.remove(&(slot, qpn));
                }
            }
            Err(e) => {
                st.writes.remove(&(slot, qpn));
                if e == PlaceError::Refused {
                    self.no_place.fetch_or(1 << slot, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    /// Push the READ response `t` into `inbox` of slot `slot`, placing its
    /// payload first if it answers a request that came with a hint
    /// ([`LocalLink::note_read_request`]), in order, on its first pass.
    /// `None`: nothing to place it by (pushed the usual way).
    fn push_read_response(
        &self,
        to: &mut ToInbox<'_>,
        t: &Transmit,
        tos: u8,
        icrc: Icrc,
        st: &mut SendState,
    ) -> Option<Result<(), PushError>> {
        let (inbox, slot) = (to.inbox, to.slot);
        let bth = wire::bth::Packet::new_checked(&t.payload[..]).ok()?;
        let key = (slot, bth.dest_qpn());
        let plans = st.reads.get_mut(&key)?;
        let psn = bth.psn().value();
        let i = plans
            .iter()
            .position(|r| psn.wrapping_sub(r.psn) & 0x00ff_ffff < r.npsn)?;
        let r = &mut plans[i];
        let k = psn.wrapping_sub(r.psn) & 0x00ff_ffff;
        // Answered again (a duplicate request), or out of step: the rest
        // of this READ goes unplaced.
        let in_step = k == r.next && std::ptr::eq(&*r.inbox, inbox);
        r.next += 1;
        let hint = r.hint;
        if !in_step || r.next == r.npsn {
            plans.remove(i);
            // (No READ of that QP kept: no look at later responses.)
            if plans.is_empty() {
                st.reads.remove(&key);
            }
        }
        if !in_step {
            return None;
        }
        // Only a payload the engine left in memory (one range of an MR,
        // 256 bytes or more), with an ICRC no one checks, and no tracer
        // (which shows each packet whole); others go unplaced, and the
        // READ's next response may still be placed.
        let g = t.gathered?;
        if icrc == Icrc::Unchecked || self.tracing.load(Ordering::Relaxed) {
            return None;
        }
        let run = match to.run(self.slot) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        // SAFETY: as in `hostmem::push_gathered`, `g.addr..g.addr + g.len`
        // is mapped, readable memory of this process for the whole call
        // (a checked range of a registered MR, in the flush that took `t`
        // from the engine).
        let res = unsafe {
            run.place_read_and_push(
                t.info.src_port,
                tos,
                &t.payload,
                &hint,
                k,
                g.at,
                g.addr as usize as *const u8,
                g.len,
                icrc,
            )
        };
        Some(res.map(|placed| match placed {
            Ok(_) => {
                st.placed_reads += 1;
            }
            Err(PlaceError::Refused) => {
                self.no_place.fetch_or(1 << slot, Ordering::Relaxed);
            }
            Err(_) => {}
        }))
    }

    /// The device's tracer was turned on or off.
    pub(crate) fn set_tracing(&self, on: bool) {
        self.tracing.store(on, Ordering::Relaxed);
    }

    /// Kicks so far that woke a sleeping thread (`inbox_kicks`).
    pub(crate) fn kicks(&self) -> u64 {
        self.kicks.load(Ordering::Relaxed)
    }

    /// The slot whose inbox `t` goes to, if it takes this path.
    fn dest_slot(&self, t: &Transmit, addr: std::net::IpAddr) -> Option<usize> {
        if t.info.dst != addr || t.info.dst_port != wire::ROCEV2_UDP_PORT {
            return None;
        }
        let slot = (dest_qpn(&t.payload)? >> 16) as usize;
        (slot != 0 && slot < self.own.rings()).then_some(slot)
    }

    /// Whether `t` takes this path (if the slot it goes to has an inbox).
    pub(crate) fn takes(&self, t: &Transmit, addr: std::net::IpAddr) -> bool {
        self.dest_slot(t, addr).is_some()
    }

    /// The inbox of `slot`, asking the daemon if not known (or closed).
    fn inbox<'p>(
        &self,
        p: &'p mut Pending,
        slot: usize,
        now: &dyn Fn() -> Instant,
    ) -> Option<&'p Arc<Inbox>> {
        let now = match p.peers.get(&slot) {
            Some(Peer::Inbox(i)) if !i.is_closed() => None,
            Some(Peer::Udp(until)) => {
                let now = now();
                if now < *until {
                    return None;
                }
                Some(now)
            }
            _ => Some(now()),
        };
        let Some(now) = now else {
            return p.known(slot);
        };
        let got = emulator_daemon::client::inbox(&self.daemon, &self.device, slot)
            .ok()
            .flatten()
            .and_then(|(m, e)| Inbox::open(m, e).ok())
            .filter(|i| !i.is_closed() && i.rings() == self.own.rings());
        match got {
            Some(i) => {
                p.peers.insert(slot, Peer::Inbox(Arc::new(i)));
                p.known(slot)
            }
            None => {
                p.peers.insert(slot, Peer::Udp(now + NO_INBOX_RETRY));
                None
            }
        }
    }

    /// Ready the path to and from `slot` before a conversation with it
    /// starts (a connected QP going to RTR): learn its inbox (a request to
    /// the daemon, otherwise made by the first datagram), fault in the
    /// ring this process writes there and the ring `slot` writes here,
    /// and, where this process places into `slot`, map the shared pages
    /// of the MRs it has published ([`Inbox::warm_placement`]).
    pub(crate) fn warm(&self, slot: usize, now: &dyn Fn() -> Instant) {
        if slot == 0 || slot >= self.own.rings() {
            return;
        }
        let inbox = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            self.inbox(&mut pending, slot, now).cloned()
        };
        if let Some(i) = inbox {
            i.warm(self.slot, true);
            if self.placement && self.no_place.load(Ordering::Relaxed) & (1 << slot) == 0 {
                i.warm_placement();
            }
        }
        self.own.warm(slot, false);
    }

    /// Stop using `slot`'s inbox (closed or inconsistent).
    fn forget(&self, p: &mut Pending, slot: usize, now: Instant, retry_now: bool) {
        self.no_place.fetch_and(!(1 << slot), Ordering::Relaxed);
        if retry_now {
            p.peers.remove(&slot);
        } else {
            p.peers.insert(slot, Peer::Udp(now + NO_INBOX_RETRY));
        }
    }

    /// Kick the inboxes written without a kick (their applications were
    /// polling) whose consumers have not taken those datagrams and whose
    /// applications have since stopped polling ([`Inbox::kick`]). Kernel
    /// rxe's responder runs at once; a consumer whose application polled
    /// just before a datagram came, then stopped, would otherwise leave it
    /// for its progress thread's next look (up to 200 ms), and a sender
    /// waiting for the answer (two devices driven by one thread, as
    /// rdma-core's tests do) with it. Called at each round of progress;
    /// it looks only once one of those applications may have stopped
    /// polling (its last poll [`local_link::POLL_STALE`] ago, or
    /// [`local_link::LEFT_GRACE`] if it said it may stop, as it stood at
    /// the last look): in a stream, where the consumer is awake and
    /// polling, a look per round (a lock, loads of lines the consumer
    /// writes, a clock read) was 7% of a sender's time (host
    /// `ib_send_bw`, perf).
    pub(crate) fn rekick(&self) {
        let now_ns = self.time();
        if self.rekick_due(now_ns) {
            self.rekick_at_time(now_ns);
        }
    }

    /// A kick to a consumer whose application may stop polling waits
    /// ([`LocalLink::left_due`]): forget those whose datagrams were taken
    /// since, and kick those due. Called when this process's application
    /// may stop polling itself: its progress thread would otherwise wake
    /// at `left_due` for datagrams that are gone (in a ping-pong, the
    /// peer took them as it posted its answer).
    pub(crate) fn forget_taken(&self) {
        if self.left_due.load(Ordering::Relaxed) != u64::MAX {
            self.rekick_at_time(self.time());
        }
    }

    /// When a kick to a consumer whose application said it may stop
    /// polling is due (CLOCK_MONOTONIC ns), if one waits: the progress
    /// thread wakes then unless this process's application polls (its
    /// polls kick).
    pub(crate) fn left_due(&self) -> Option<u64> {
        match self.left_due.load(Ordering::Relaxed) {
            u64::MAX => None,
            at => Some(at),
        }
    }

    fn rekick_at_time(&self, now_ns: u64) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let p = &mut *pending;
        let slot = self.slot;
        let mut kicked = 0;
        let mut next = u64::MAX;
        let mut next_left = u64::MAX;
        p.unkicked.retain(|s| {
            // Taken, gone, or kicked by another sender meanwhile (its
            // thread will look): nothing left to do for it.
            let Some(Peer::Inbox(i)) = p.peers.get(s) else {
                return false;
            };
            if i.taken(slot) || i.is_closed() {
                return false;
            }
            if i.kick_at(now_ns) {
                kicked += 1;
                return false;
            }
            match i.kick_due() {
                Some(d) => {
                    next = next.min(d.at);
                    if d.left {
                        next_left = next_left.min(d.at);
                    }
                    true
                }
                None => false,
            }
        });
        self.rekick_at.store(next, Ordering::Relaxed);
        self.left_due.store(next_left, Ordering::Relaxed);
        self.kicks.fetch_add(kicked, Ordering::Relaxed);
        self.any_unkicked
            .store(!p.unkicked.is_empty(), Ordering::Release);
    }

    /// The device read the clock: CLOCK_MONOTONIC `mono_ns`.
    pub(crate) fn note_time(&self, mono_ns: u64) {
        self.time.store(mono_ns, Ordering::Relaxed);
    }

    /// The time the device read last ([`LocalLink::note_time`]), at most
    /// a few datagrams or a round of progress ago: kicks judge by it
    /// whether a consumer's application stopped polling (1 ms ago or
    /// more), where a clock read per flush was 3-5% of a sender's time
    /// (host `ib_send_bw`, perf). A time a little behind only makes a
    /// kick wait for a later look.
    fn time(&self) -> u64 {
        match self.time.load(Ordering::Relaxed) {
            0 => local_link::monotonic_ns(),
            t => t,
        }
    }

    /// Whether inboxes written without a kick wait for
    /// [`LocalLink::rekick`], and it may find one to kick at `now_ns`.
    pub(crate) fn rekick_due(&self, now_ns: u64) -> bool {
        self.any_unkicked.load(Ordering::Acquire)
            && now_ns >= self.rekick_at.load(Ordering::Relaxed)
    }

    /// Whether datagrams wait for room in a full inbox.
    pub(crate) fn has_pending(&self) -> bool {
        self.any_pending.load(Ordering::Acquire)
    }

    /// Put `ts` into inboxes (after what waited for room), in order per
    /// destination; `sent` sees each datagram that went in. Returns the
    /// datagrams for UDP and how many were dropped.
    pub(crate) fn send(
        &self,
        ts: &mut Vec<Transmit>,
        addr: std::net::IpAddr,
        now: &dyn Fn() -> Instant,
        place: bool,
        intact: bool,
        mut sent: impl FnMut(Transmit),
    ) -> Sent {
        let mut out = Sent::default();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let p = &mut *pending;
        // First what waited: each queue in order until its inbox is full.
        if p.bytes > 0 {
            let slots: Vec<usize> = p.queues.keys().copied().collect();
            for slot in slots {
                // (Cloned: this is the rare path of a full inbox.)
                let inbox = self.inbox(p, slot, now).cloned();
                let Pending { queues, bytes, .. } = &mut *p;
                let q = queues.get_mut(&slot).expect("listed");
                while let Some(t) = q.front() {
                    let r = match &inbox {
                        Some(i) => {
                            i.push(self.slot, t.info.src_port, t.ecn.tos(t.dscp), &t.payload)
                        }
                        None => Err(PushError::Closed),
                    };
                    if r == Err(PushError::Full) {
                        break;
                    }
                    let t = q.pop_front().expect("front");
                    *bytes -= t.payload.len();
                    match r {
                        Ok(()) => sent(t),
                        // Its owner is gone: what waited for it is lost, as
                        // it would be in a dead process's socket.
                        Err(_) => out.dropped += 1,
                    }
                }
                if q.is_empty() {
                    queues.remove(&slot);
                }
                if inbox.is_some() {
                    p.kick_later(slot);
                }
            }
        }
        // Payloads left in memory (`Transmit::gathered`) are completed for
        // every way but a push: the UDP path, a queue, a closed inbox.
        let mut st = SendState {
            writes: std::mem::take(&mut p.writes),
            reads: std::mem::take(&mut p.reads),
            placed: 0,
            placed_reads: 0,
        };
        let mut ts = ts.drain(..).peekable();
        // A datagram to push again (its inbox was closed: the slot may
        // have a new owner with a new inbox), once.
        let mut again: Option<(usize, Transmit)> = None;
        loop {
            let (slot, mut t, retried) = match again.take() {
                Some((slot, t)) => (slot, t, true),
                None => {
                    let Some(t) = ts.next() else { break };
                    match self.dest_slot(&t, addr) {
                        Some(slot) => (slot, t, false),
                        None => {
                            out.udp.push(t);
                            continue;
                        }
                    }
                }
            };
            if p.queues.contains_key(&slot) {
                // Behind what already waits for this inbox.
                p.queue(slot, t, &mut out);
                continue;
            }
            let Some(inbox) = self.inbox(p, slot, now).cloned() else {
                out.udp.push(t);
                continue;
            };
            // This datagram and the ones after it to the same inbox: one
            // run of pushes, and of placements ([`ToInbox::run`]).
            let mut to = ToInbox {
                inbox: &inbox,
                slot,
                run: None,
            };
            let mut retried = retried;
            let failed = loop {
                match self.push(&mut to, &mut t, place, intact, &mut st) {
                    Ok(()) => {
                        sent(t);
                        p.kick_later(slot);
                    }
                    Err(PushError::Full) => {
                        p.queue(slot, t, &mut out);
                        p.kick_later(slot);
                    }
                    Err(e) => break Some((e, t)),
                }
                match ts.peek() {
                    Some(n)
                        if !p.queues.contains_key(&slot)
                            && self.dest_slot(n, addr) == Some(slot) =>
                    {
                        t = ts.next().expect("peeked");
                        retried = false;
                    }
                    _ => break None,
                }
            };
            drop(to);
            if let Some((e, t)) = failed {
                let retry = e == PushError::Closed && !retried;
                self.forget(p, slot, now(), retry);
                st.writes.retain(|&(s, _), _| s != slot);
                st.reads.retain(|&(s, _), _| s != slot);
                if retry {
                    again = Some((slot, t));
                } else {
                    out.udp.push(t);
                }
            }
        }
        drop(ts);
        let SendState {
            writes,
            reads,
            placed,
            placed_reads,
        } = st;
        // Counted once per send: a locked increment per placement waited
        // each time for the payload just copied to leave the store buffer.
        if placed > 0 {
            self.placed.fetch_add(placed, Ordering::Relaxed);
        }
        if placed_reads > 0 {
            self.placed_reads.fetch_add(placed_reads, Ordering::Relaxed);
        }
        p.writes = writes;
        p.reads = reads;
        let Pending {
            kick,
            unkicked,
            peers,
            ..
        } = p;
        let time = self.time();
        for slot in kick.drain(..) {
            let Some(Peer::Inbox(i)) = peers.get(&slot) else {
                continue;
            };
            if i.kick_at(time) {
                self.kicks.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // A consumer whose application never polled (no kick due: a
            // passive side, as ib_write_bw's server) is served by its
            // progress thread, which sleeps only after looking at the
            // rings once more: a kick is never due for it. Listing it made
            // every round of this process look at its head, a line the
            // consumer writes at every datagram (3-4% of a host
            // ib_write_bw sender's time, perf).
            if let Some(d) = i.kick_due() {
                if !unkicked.contains(&slot) {
                    unkicked.push(slot);
                }
                self.rekick_at.fetch_min(d.at, Ordering::Relaxed);
                if d.left {
                    self.left_due.fetch_min(d.at, Ordering::Relaxed);
                }
            }
        }
        self.any_unkicked
            .store(!unkicked.is_empty(), Ordering::Release);
        self.any_pending.store(pending.bytes > 0, Ordering::Release);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT: usize = 1;
    /// A QP of this process's own slot: datagrams to it go to its inbox.
    const TO_US: u32 = (SLOT as u32) << 16 | 0x11;
    /// The device's address, and the time `LocalLink::send` is given.
    const ADDR: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    fn now() -> Instant {
        Instant(1)
    }

    /// A RoCEv2 datagram to QP `qpn` of this host ([`ADDR`]), `len` bytes, its
    /// payload all `mark`.
    fn datagram(qpn: u32, mark: u8, len: usize) -> Transmit {
        let mut payload = vec![mark; len];
        // BTH: SEND ONLY (4) to `qpn`; only the opcode and QPN matter here.
        payload[..12].fill(0);
        payload[0] = 0x04;
        payload[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        Transmit {
            info: wire::icrc::IpUdpInfo {
                src: ADDR,
                dst: ADDR,
                src_port: 0xc000,
                dst_port: wire::ROCEV2_UDP_PORT,
                ipv4_id: 0,
                ipv4_flags_frag: 0x4000,
            },
            payload,
            ecn: wire::Ecn::NotEct,
            dscp: 0,
            fresh: true,
            last_posted: true,
            icrc: true,
            gathered: None,
            read_dest: None,
        }
    }

    /// Datagrams for a full inbox wait, and go in the order they were
    /// sent, after those that went in, and a later one waits behind them
    /// even where it would fit; a datagram to another slot between them
    /// ends a run of pushes but not the order (here it has no inbox: the
    /// daemon named is not there, so it goes by UDP).
    #[test]
    fn datagrams_behind_a_full_inbox_wait_in_order() {
        let (_file, ll) = own_link();
        let elsewhere = 2 << 16 | 0x11;
        // 32 datagrams into a ring of 128 KiB: 15 records of 8 KiB fill
        // it but for 8,072 bytes, the rest are 12 KiB; one to slot 2
        // among them.
        let len = |i: u8| if i < 15 { 8192 } else { 12288 };
        let mut ts: Vec<Transmit> = (0..32u8).map(|i| datagram(TO_US, i, len(i))).collect();
        ts.insert(3, datagram(elsewhere, 0xee, 64));
        // Last, a short one that would fit: it waits behind them too.
        ts.push(datagram(TO_US, 0x81, 64));
        let mut sent = Vec::new();
        let out = ll.send(&mut ts, ADDR, &now, false, true, |t| {
            sent.push(t.payload[12])
        });
        assert_eq!(out.dropped, 0);
        assert_eq!(out.udp.len(), 1);
        assert_eq!(out.udp[0].payload[12], 0xee);
        assert!(ll.has_pending(), "the inbox filled: some wait");
        assert!(sent.len() < 32 && sent.iter().copied().eq(0..sent.len() as u8));
        // The consumer takes one (8 KiB of room, where the first waiting
        // needs 12 KiB); a short datagram sent now, which would fit at
        // the ring's end, waits behind them.
        let mut buf = vec![0u8; local_link::MAX_DATAGRAM];
        let mut got = Vec::new();
        let p = ll.own.pop(&mut buf).unwrap();
        assert_eq!(p.len, len(0));
        got.push(buf[12]);
        let mut short = vec![datagram(TO_US, 0x80, 64)];
        ll.send(&mut short, ADDR, &now, false, true, |t| {
            sent.push(t.payload[12])
        });
        assert_ne!(sent.last(), Some(&0x80));
        // The rest follows, in order.
        while got.len() < 34 {
            match ll.own.pop(&mut buf) {
                Some(p) => {
                    let n = got.len() as u8;
                    assert_eq!(p.len, if n < 32 { len(n) } else { 64 });
                    got.push(buf[12]);
                }
                None => {
                    let before = sent.len();
                    ll.send(&mut Vec::new(), ADDR, &now, false, true, |t| {
                        sent.push(t.payload[12])
                    });
                    assert!(sent.len() > before, "nothing left the queue");
                }
            }
        }
        assert!(!ll.has_pending());
        assert_eq!(got, (0..32).chain([0x81, 0x80]).collect::<Vec<u8>>());
        assert_eq!(sent, got);
    }

    /// A link in slot [`SLOT`] of a device whose daemon is not there, with
    /// an inbox of its own (four rings of 128 KiB), where datagrams to
    /// its own slot go; the inbox lives while its file does.
    fn own_link() -> (local_link::InboxFile, LocalLink) {
        let f = local_link::InboxFile::create("t", 4, 128 << 10).unwrap();
        let own = Inbox::open(
            f.memfd().try_clone_to_owned().unwrap(),
            f.eventfd().try_clone_to_owned().unwrap(),
        )
        .unwrap();
        let ll = LocalLink::new(
            own,
            SLOT,
            PathBuf::from("/nonexistent/rxe-emu-test.sock"),
            "rxe0".into(),
            false,
        );
        (f, ll)
    }

    /// Send a 64-byte datagram marked `mark` to this process's own inbox,
    /// which must take it.
    fn send_to_us(ll: &LocalLink, mark: u8) {
        let mut ts = vec![datagram(TO_US, mark, 64)];
        let out = ll.send(&mut ts, ADDR, &now, false, true, |_| {});
        assert_eq!((out.dropped, out.udp.len()), (0, 0));
    }

    /// A datagram left unkicked in the inbox of a consumer whose
    /// application never polled is not listed for a rekick (no kick by
    /// staleness can fall due for it); once that application has polled,
    /// one is listed, and kicked when its last poll is `POLL_STALE` old.
    #[test]
    fn only_a_consumer_whose_application_polled_is_listed_for_rekicks() {
        let (_file, ll) = own_link();
        let stale = local_link::POLL_STALE.as_nanos() as u64;
        let t0 = 1_000_000_000;
        ll.note_time(t0);
        let send = |mark: u8| send_to_us(&ll, mark);
        // Never polled: the datagram waits unkicked, and nothing is due.
        send(1);
        assert!(!ll.rekick_due(u64::MAX));
        ll.rekick();
        assert_eq!(ll.kicks(), 0);
        // Its application polls, then stops: the next datagram is listed,
        // and kicked once that poll is stale, not before.
        ll.own.note_poll(t0);
        send(2);
        assert!(ll.rekick_due(u64::MAX));
        ll.rekick();
        assert_eq!(ll.kicks(), 0);
        assert!(!ll.rekick_due(t0 + stale));
        assert!(ll.rekick_due(t0 + stale + 1));
        ll.note_time(t0 + stale + 1);
        ll.rekick();
        assert_eq!(ll.kicks(), 1);
        assert!(!ll.rekick_due(u64::MAX));
    }

    /// A consumer whose application said it may stop polling just after
    /// a poll is kicked `LEFT_GRACE` after that poll, not at once (in a
    /// ping-pong it comes back first); the kick is owed until then
    /// (`left_due`, which the progress thread watches), and forgotten
    /// once the datagram was taken.
    #[test]
    fn a_consumer_that_may_stop_polling_is_kicked_after_left_grace_unless_it_took_the_datagram() {
        let (_file, ll) = own_link();
        let grace = local_link::LEFT_GRACE.as_nanos() as u64;
        let t0 = 1_000_000_000;
        ll.note_time(t0);
        let send = |mark: u8| send_to_us(&ll, mark);
        let mut buf = vec![0u8; local_link::MAX_DATAGRAM];
        // It polled at t0 and may stop: a datagram then is not kicked yet.
        ll.own.note_poll(t0);
        assert!(ll.own.kick_me());
        send(1);
        assert_eq!(ll.kicks(), 0);
        assert_eq!(ll.left_due(), Some(t0 + grace + 1));
        // Not due before; kicked once due.
        ll.note_time(t0 + grace);
        ll.rekick();
        assert_eq!(ll.kicks(), 0);
        ll.note_time(t0 + grace + 1);
        ll.rekick();
        assert_eq!(ll.kicks(), 1);
        assert_eq!(ll.left_due(), None);
        ll.own.sleep_end();
        assert!(ll.own.pop(&mut buf).is_some());
        // Again, but the consumer takes the datagram first: the kick is
        // forgotten, and nothing is owed.
        let t1 = t0 + 10 * grace;
        ll.note_time(t1);
        ll.own.note_poll(t1);
        assert!(ll.own.kick_me());
        send(2);
        assert_eq!(ll.left_due(), Some(t1 + grace + 1));
        assert!(ll.own.pop(&mut buf).is_some());
        ll.forget_taken();
        assert_eq!(ll.left_due(), None);
        assert!(!ll.rekick_due(u64::MAX));
        ll.note_time(t1 + grace + 1);
        ll.rekick();
        assert_eq!(ll.kicks(), 1);
        // A consumer whose last poll is older than LEFT_GRACE is kicked at
        // once, as before.
        let t2 = t1 + 10 * grace;
        ll.note_time(t2);
        ll.own.polling_again();
        ll.own.note_poll(t2 - grace - 1);
        assert!(ll.own.kick_me());
        send(3);
        assert_eq!(ll.kicks(), 2);
        assert_eq!(ll.left_due(), None);
    }
}
