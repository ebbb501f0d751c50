//! The same-host path between the processes of one rxe-emu device.
//!
//! Kernel rxe hands a packet for its own device from the requester to the
//! responder without the network stack (`rxe_loopback()`). Two processes
//! of one `rxe-emud` device would otherwise exchange every RoCEv2 packet
//! as a UDP datagram on `<addr>:4791`: a `sendmmsg`, the kernel's UDP path
//! and a `recvfrom` per packet. Here they exchange the same bytes through
//! shared memory instead: the receiver finds a packet with a memory load,
//! and a sender wakes it (an eventfd write) only if it sleeps.
//!
//! **An inbox** belongs to one slot of a device (the process that owns
//! the slot consumes it). `rxe-emud` creates it when it gives the slot out
//! ([`InboxFile::create`]: a memfd and an eventfd), hands both fds to the
//! owner and, on request, to the device's other processes, and marks it
//! closed when the owner lets go of the slot ([`InboxFile::close`]); a
//! process that sees it closed asks again (the slot may have a new owner
//! and a new inbox) or falls back to UDP, where the daemon counts what
//! reaches a slot nobody owns, as before.
//!
//! An inbox holds one single-producer ring per slot of the device: the
//! process in slot `s` writes only to ring `s` of another's inbox, so a
//! process that dies mid-write corrupts nothing but its own ring, whose
//! unpublished record is never seen. Every word another process can write
//! is validated before use, and a ring found inconsistent is emptied and
//! counted ([`Inbox::take_dropped`]), never trusted: packets from it are
//! copied out and parsed by the engine like any packet from the network.
//!
//! Layout (all offsets in bytes, all words little-endian atomics):
//! - page 0: magic (0), rings (8), ring size (16); `closed` (u32, 64);
//!   `sleeping` (u32, 128: 0 awake, 1 asleep, 2 asleep and kicked, 3
//!   awake but its application stopped polling: kick it too);
//!   `active` (u64, 192: bit `s` set once ring `s` was written); the
//!   consumer's process ID (u32, 256: see [`place`](crate::Placement));
//!   when the consumer's application last polled (u64, 320,
//!   CLOCK_MONOTONIC ns; 0: not known);
//! - from page 1: one 256-byte control block per ring: `tail` (u64, 0,
//!   written by the producer) and `head` (u64, 128, by the consumer), both
//!   byte positions that only grow; the producer's `placing` counter (u64,
//!   64) and process ID (u32, 72);
//! - then, page-aligned, the placement tables (64 KiB, written by the
//!   consumer only);
//! - then the rings' data, `ring size` bytes each, page-aligned: records
//!   of an 8-byte header (u32: the datagram's length in bits 0-23, the
//!   lead before it in bits 24-29; u16 UDP source port, u8 IP TOS, u8
//!   flags: bit 0 "placed", bit 1 "ICRC right as built", bit 2 "ICRC
//!   not written yet", see [`Icrc`], bit 3 "payload left out"), the lead
//!   (0-63 bytes that put a payload copied in from elsewhere on a cache
//!   line), and the datagram, padded to 8 bytes with the lead (with the
//!   payload left out: no lead, a u32 offset and a u32 length of the
//!   payload, then the bytes before and after it, padded), then, if
//!   placed, the u64 host address
//!   its payload was written to; a length of `u32::MAX` means "the
//!   rest of this lap is unused, continue at offset 0". A producer writes
//!   one where a record does not fit before the end, and where it finds
//!   its ring empty past the first 64 KiB of a lap (`EARLY_WRAP`).

mod place;
mod remap;
pub mod shared_mr;
mod shm;

pub use place::{
    placed_shared, placement_way, PlaceError, PlaceableMr, PlaceableQp, Placement, PlacingRun,
};
pub use shared_mr::SharedPages;
pub use shm::monotonic_ns;

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

use shm::Mapping;

/// Bytes of each ring: 1 MiB holds the 128 unacknowledged packets a
/// reliable QP may have in flight at path MTU 4096 twice over (pages are
/// allocated only as a ring is written). Not more: a stream walks the
/// whole ring, and a ring larger than a CPU's L2 cache makes each line the
/// producer writes come from the last-level cache or memory. Measured on
/// the 2-CPU host (2 MiB of L2 per CPU, 2026-11-29), 64 KiB messages,
/// alternated runs: `ib_write_bw` 7,320 MB/s with 4 MiB, 8,410 with
/// 1 MiB, 8,580 with 512 KiB; `ib_send_bw` 8,110, 8,940, 8,950; READs
/// and latency unchanged.
pub const DEFAULT_RING_SIZE: usize = 1 << 20;

/// The largest datagram an inbox carries (a UDP payload's limit).
pub const MAX_DATAGRAM: usize = 65507;

const MAGIC: u64 = 0x7278_655f_6c6c_0004; // "rxe_ll", layout 4
const PAGE: usize = 4096;
const CTRL: usize = 256;
const OFF_RINGS: usize = 8;
const OFF_RING_SIZE: usize = 16;
const OFF_CLOSED: usize = 64;
const OFF_SLEEPING: usize = 128;
const OFF_ACTIVE: usize = 192;
const OFF_LAST_POLL: usize = 320;
/// The consumer's READ epoch ([`Inbox::end_read_hints`]).
pub(crate) const OFF_READ_EPOCH: usize = 384;

/// How long after its application's last poll an awake consumer is taken
/// to have stopped polling: producers then kick it too (see
/// [`Inbox::kick`]).
pub const POLL_STALE: std::time::Duration = std::time::Duration::from_millis(1);
/// How long after its application's last poll a consumer that said it may
/// stop polling ([`Inbox::kick_me`]) is left unkicked. In a ping-pong its
/// application says so at each completion and polls again within a few
/// microseconds, taking the datagram itself: a kick then woke its progress
/// thread for nothing, a context switch on a CPU the applications spin on
/// (in the TCG guest about 100 µs, and the ib_write_lat 99.9th percentile
/// twice kernel rxe's). The producer kicks once due ([`Inbox::kick_due`]),
/// from its own polls or its progress thread.
pub const LEFT_GRACE: std::time::Duration = std::time::Duration::from_micros(200);
const REC: usize = 8;
/// Record flag: the datagram's payload is not in the record (its sender
/// placed it; see [`PlacingRun::place_and_push`]).
const ELIDED: u8 = 8;
/// Record flag: a READ request's record carries where its responses may
/// be placed ([`ReadHint`], after the placed address if any).
const HINTED: u8 = 16;
/// Bytes of a [`ReadHint`] in a record.
const HINT_LEN: usize = 48;
/// A producer that finds its ring empty this far into a lap starts the
/// next lap (as at the end of the ring). A conversation of small messages
/// then stays in the ring's first pages instead of walking all of it, each
/// new page a page fault in the producer and another in the consumer:
/// measured on the 2-CPU host, ib_send_lat took one fault per 27
/// iterations in each process; in the TCG guest a fault costs tens of
/// microseconds of a CPU the applications spin on.
const EARLY_WRAP: u64 = 64 << 10;
/// A producer reads its ring's `head` (a word the consumer writes at every
/// datagram it takes, so a cache miss) only when the value it read last
/// leaves too little room, or, past [`EARLY_WRAP`], once per this many
/// bytes pushed.
const HEAD_REFRESH: u64 = 16 << 10;
const WRAP: u32 = u32::MAX;
/// Bytes of the next record a consumer prefetches.
const PREFETCH: usize = 4096 + 128;

const AWAKE: u32 = 0;
const ASLEEP: u32 = 1;
const KICKED: u32 = 2;
/// Set by the consumer's application thread ([`Inbox::kick_me`]).
const LEFT: u32 = 3;

/// When a refused kick may be due ([`Inbox::kick_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KickDue {
    /// CLOCK_MONOTONIC ns ([`monotonic_ns`]).
    pub at: u64,
    /// The consumer's application said it may stop polling
    /// ([`Inbox::kick_me`]): nothing but a kick may take the datagram, so
    /// the producer sees to it that one comes at `at` (its application
    /// may be what looks for consumers to kick, and stop).
    pub left: bool,
}

/// Where things are in an inbox of `rings` rings of `ring_size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    rings: usize,
    ring_size: usize,
}

impl Layout {
    fn new(rings: usize, ring_size: usize) -> io::Result<Layout> {
        let ok = (1..=64).contains(&rings)
            && ring_size % PAGE == 0
            && (2 * (REC + MAX_DATAGRAM + 8)..=1 << 30).contains(&ring_size);
        if !ok {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "inbox layout of {rings} rings of {ring_size} bytes: need 1-64 rings of whole pages, 128 KiB to 1 GiB"
                ),
            ));
        }
        Ok(Layout { rings, ring_size })
    }

    fn ctrl(&self, ring: usize) -> usize {
        PAGE + ring * CTRL
    }

    /// The placement tables (`place`).
    fn tables(&self) -> usize {
        let ctrl_end = PAGE + self.rings * CTRL;
        ctrl_end.div_ceil(PAGE) * PAGE
    }

    fn data(&self, ring: usize) -> usize {
        self.tables() + place::TABLES_LEN + ring * self.ring_size
    }

    fn len(&self) -> usize {
        self.data(self.rings)
    }
}

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// The daemon's handle on one slot's inbox: it creates it, hands out its
/// fds and closes it. It maps only the first page.
pub struct InboxFile {
    memfd: OwnedFd,
    eventfd: OwnedFd,
    header: Mapping,
}

impl InboxFile {
    /// A new inbox of `rings` rings (one per slot of the device) of
    /// `ring_size` bytes each; `name` shows in `/proc/<pid>/maps`.
    pub fn create(name: &str, rings: usize, ring_size: usize) -> io::Result<InboxFile> {
        let layout = Layout::new(rings, ring_size)?;
        let memfd = shm::memfd(name, layout.len() as u64)?;
        let eventfd = shm::eventfd()?;
        let header = Mapping::map(&memfd, PAGE)?;
        header.u64_at(OFF_RINGS).store(rings as u64, Relaxed);
        header
            .u64_at(OFF_RING_SIZE)
            .store(ring_size as u64, Relaxed);
        header.u64_at(0).store(MAGIC, Release);
        Ok(InboxFile {
            memfd,
            eventfd,
            header,
        })
    }

    /// The memfd to hand to a process.
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// The eventfd to hand to a process.
    pub fn eventfd(&self) -> BorrowedFd<'_> {
        self.eventfd.as_fd()
    }

    /// The owner let go of the slot: senders stop writing here (they see
    /// it before their next write) and ask for the slot's new inbox.
    pub fn close(&self) {
        self.header.u32_at(OFF_CLOSED).store(1, SeqCst);
    }
}

impl Drop for InboxFile {
    fn drop(&mut self) {
        self.close();
    }
}

/// Why a datagram did not go into an inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError {
    /// The ring has no room now (the consumer is behind): try later.
    Full,
    /// The inbox's owner let go of its slot: ask the daemon again.
    Closed,
    /// The ring's words are inconsistent (written by someone else):
    /// stop using this inbox.
    Corrupt,
    /// Larger than [`MAX_DATAGRAM`], or a ring that does not exist.
    Invalid,
}

/// Where a producer's next record goes ([`Inbox::room`]).
struct Room {
    tail: u64,
    /// Bytes left unused at the end of the ring before it.
    skip: u64,
    /// Bytes of the record.
    need: u64,
    fits: bool,
}

/// Bytes of a record after its header, for a `len`-byte datagram after a
/// `lead`, with a placed address (or not) and its payload `elide`d
/// (offset, length) or not; `None` if no such record can be (an elided
/// payload has no lead).
fn record_body(
    len: usize,
    lead: usize,
    placed: bool,
    elide: Option<(usize, usize)>,
    hinted: bool,
) -> Option<usize> {
    if len > MAX_DATAGRAM || lead >= ALIGN {
        return None;
    }
    let kept = match elide {
        None => lead + len,
        Some((at, n)) if lead == 0 && at.checked_add(n).is_some_and(|end| end <= len) => {
            8 + len - n
        }
        Some(_) => return None,
    };
    Some(pad8(kept) + if placed { 8 } else { 0 } + if hinted { HINT_LEN } else { 0 })
}

/// Where the responses to a READ request may be written by their
/// responder, if it is a process of this host (the requester's memory,
/// in shared pages; see `place`): the READ's destination, one range of
/// one MR the requester's engine checked for local write access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadHint {
    /// The destination's first byte in the requester's address space.
    pub host: u64,
    /// Its length: the READ's.
    pub len: u64,
    /// The memfd that holds the destination's pages, `off` being where
    /// `host` lies in it.
    pub pages: SharedPages,
    /// The requester's path MTU: the response at the READ's PSN + k
    /// carries bytes `k * mtu..` (a full `mtu` but for the last).
    pub mtu: u32,
    /// The requester's READ epoch when it asked ([`Inbox::read_epoch`]):
    /// nothing is placed once it moved on.
    pub epoch: u64,
}

impl ReadHint {
    fn to_bytes(self) -> [u8; HINT_LEN] {
        let mut b = [0u8; HINT_LEN];
        b[..8].copy_from_slice(&self.host.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.pages.fd.to_le_bytes());
        b[20..24].copy_from_slice(&self.mtu.to_le_bytes());
        b[24..32].copy_from_slice(&self.pages.ino.to_le_bytes());
        b[32..40].copy_from_slice(&self.pages.off.to_le_bytes());
        b[40..48].copy_from_slice(&self.epoch.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8; HINT_LEN]) -> ReadHint {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        ReadHint {
            host: u64_at(0),
            len: u64_at(8),
            pages: SharedPages {
                fd: u32_at(16) as i32,
                ino: u64_at(24),
                off: u64_at(32),
            },
            mtu: u32_at(20),
            epoch: u64_at(40),
        }
    }
}

/// A datagram taken out of an inbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Popped {
    /// The ring it came from: the sender's slot.
    pub ring: usize,
    /// The UDP source port the sender gave it (the sender's QP's port).
    pub src_port: u16,
    /// The IP TOS byte it would have carried (DSCP and ECN).
    pub tos: u8,
    /// Its length, at the start of the caller's buffer.
    pub len: usize,
    /// Where the sender wrote its payload in this process's memory, if it
    /// placed it ([`Inbox::place`]).
    pub placed: Option<u64>,
    /// The payload's bytes (offset, length in the buffer) that the record
    /// left out because the sender placed them (`placed`): those bytes of
    /// the caller's buffer are not written by [`Inbox::pop`]; they are
    /// whatever the buffer held.
    pub elided: Option<(usize, usize)>,
    /// What the sender said of its ICRC ([`Inbox::push_with`]).
    pub icrc: Icrc,
    /// Where a READ request's responses may be placed
    /// ([`Inbox::push_hinted`]).
    pub hint: Option<ReadHint>,
    /// Where in the caller's buffer the datagram starts: 0, unless
    /// [`Inbox::pop_aligned`] put it elsewhere.
    pub at: usize,
}

/// Where a payload copied into a record from elsewhere starts
/// ([`Inbox::push_gathered`]): on a cache line (and where
/// [`Inbox::pop_aligned`] copies it to: on one too). A copy of 4 KiB
/// between two threads through a ring moved 7-8 GB/s with the source or
/// the destination 20-36 bytes off a line, 11 with both on one (2-CPU
/// Intel host).
const ALIGN: usize = 64;
/// A record's length word: the datagram's length in its low 24 bits, the
/// lead before it (0 to [`ALIGN`] - 1 bytes) above them.
const LEAD_SHIFT: u32 = 24;
const LEN_MASK: u32 = (1 << LEAD_SHIFT) - 1;
/// What a producer says of a datagram's ICRC (its last four bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icrc {
    /// Nothing: the consumer checks it, as for a datagram from anywhere.
    Unchecked,
    /// Right: this process built the datagram and nothing changed it
    /// since (no fault injection), so the consumer may skip checking it.
    /// The ICRC guards against bits changed on the way, which shared
    /// memory does not do; it authenticates nothing (any sender can
    /// compute it), so a sender that lies gains nothing it did not have.
    Right,
    /// As `Right`, but not written yet (zeros): right once written
    /// (`wire::icrc::write` with the addresses and ports the consumer
    /// knows). A consumer that looks at the bytes (a tracer) writes it
    /// first.
    Unwritten,
}

impl Icrc {
    fn flags(self) -> u8 {
        match self {
            Icrc::Unchecked => 0,
            Icrc::Right => 2,
            Icrc::Unwritten => 2 | 4,
        }
    }

    fn from_flags(f: u8) -> Icrc {
        match (f & 2 != 0, f & 4 != 0) {
            (true, true) => Icrc::Unwritten,
            (true, false) => Icrc::Right,
            // Bit 2 alone is no flag a producer writes: check.
            (false, _) => Icrc::Unchecked,
        }
    }
}

/// A process's view of an inbox: its own (to consume) or another
/// process's (to produce into its ring).
pub struct Inbox {
    map: Mapping,
    layout: Layout,
    event: std::fs::File,
    /// Consumer: the ring to look at first (round robin between senders).
    cursor: AtomicUsize,
    /// Consumer: records or rings found inconsistent and discarded.
    dropped: AtomicU64,
    /// Consumer: each ring's `tail` as last read. Records before it are
    /// published, so the shared word (which its producer writes at every
    /// push, taking the cache line away) is read again only once they are
    /// all taken.
    seen_tail: Box<[AtomicU64]>,
    /// Producer: each ring's `head` as last read, and the `tail` when it
    /// was ([`HEAD_REFRESH`]).
    seen_head: Box<[AtomicU64]>,
    head_read_at: Box<[AtomicU64]>,
    /// Producer placing into the owner: its `/proc/<pid>/mem`, opened at
    /// the first placement (`None`: it could not be opened).
    owner_mem: std::sync::OnceLock<Option<(i32, std::fs::File)>>,
    /// The owner's memfds of moved MR pages this process has mapped.
    shared_maps: std::sync::Mutex<Vec<place::SharedMap>>,
}

/// [`Inbox::push_gathered`]: the bytes `at..at + len` of a datagram are
/// at `src`.
#[derive(Clone, Copy)]
pub(crate) struct Gap {
    at: usize,
    src: *const u8,
    len: usize,
}

/// What a record says besides its datagram ([`Inbox::push_record`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct Extra<'a> {
    /// The address its payload was written at (placed).
    placed: Option<u64>,
    /// Its payload's offset and length, left out of the record (only
    /// with `placed`).
    elide: Option<(usize, usize)>,
    /// Its bytes there taken from where it says ([`Inbox::push_gathered`],
    /// whose caller vouches for them; never with `elide`).
    gap: Option<Gap>,
    /// Where a READ request's responses may be placed.
    hint: Option<&'a ReadHint>,
}

impl Inbox {
    /// Map an inbox from the fds the daemon handed over, checking that it
    /// is one (magic, a layout that fits the file).
    pub fn open(memfd: OwnedFd, eventfd: OwnedFd) -> io::Result<Inbox> {
        let size = std::fs::File::from(memfd.try_clone()?).metadata()?.len();
        let bad = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an rxe-emu inbox: {what}"),
            )
        };
        if size < PAGE as u64 {
            return Err(bad("shorter than a page"));
        }
        let head = Mapping::map(&memfd, PAGE)?;
        if head.u64_at(0).load(Acquire) != MAGIC {
            return Err(bad("wrong magic"));
        }
        let rings = head.u64_at(OFF_RINGS).load(Relaxed);
        let ring_size = head.u64_at(OFF_RING_SIZE).load(Relaxed);
        drop(head);
        let layout = Layout::new(
            usize::try_from(rings).map_err(|_| bad("ring count"))?,
            usize::try_from(ring_size).map_err(|_| bad("ring size"))?,
        )?;
        if (layout.len() as u64) > size {
            return Err(bad("smaller than its layout"));
        }
        let map = Mapping::map(&memfd, layout.len())?;
        Ok(Inbox {
            map,
            layout,
            event: std::fs::File::from(eventfd),
            cursor: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            seen_tail: (0..layout.rings).map(|_| AtomicU64::new(0)).collect(),
            seen_head: (0..layout.rings).map(|_| AtomicU64::new(0)).collect(),
            head_read_at: (0..layout.rings).map(|_| AtomicU64::new(0)).collect(),
            owner_mem: std::sync::OnceLock::new(),
            shared_maps: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// How many rings (slots) the inbox has.
    pub fn rings(&self) -> usize {
        self.layout.rings
    }

    /// Whether the owner let go of the slot.
    pub fn is_closed(&self) -> bool {
        self.map.u32_at(OFF_CLOSED).load(SeqCst) != 0
    }

    fn tail(&self, ring: usize) -> &AtomicU64 {
        self.map.u64_at(self.layout.ctrl(ring))
    }

    fn head(&self, ring: usize) -> &AtomicU64 {
        self.map.u64_at(self.layout.ctrl(ring) + 128)
    }

    /// Whether `head..tail` can be a ring's content.
    fn consistent(&self, head: u64, tail: u64) -> bool {
        head <= tail && tail - head <= self.layout.ring_size as u64 && (head | tail) % 8 == 0
    }

    /// Producer (the process in slot `ring`): append a datagram with its
    /// UDP source port and IP TOS byte. Call [`Inbox::kick`] after a batch.
    pub fn push(
        &self,
        ring: usize,
        src_port: u16,
        tos: u8,
        datagram: &[u8],
    ) -> Result<(), PushError> {
        self.push_with(ring, src_port, tos, datagram, Icrc::Unchecked)
    }

    /// Producer: as [`Inbox::push`], saying what `icrc` says of the
    /// datagram's ICRC.
    pub fn push_with(
        &self,
        ring: usize,
        src_port: u16,
        tos: u8,
        datagram: &[u8],
        icrc: Icrc,
    ) -> Result<(), PushError> {
        self.push_record(ring, src_port, tos, datagram, icrc, Extra::default())
    }

    /// Producer: as [`Inbox::push_with`], for a READ request whose
    /// responses may be placed where `hint` says
    /// ([`PlacingRun::place_read_and_push`]).
    pub fn push_hinted(
        &self,
        ring: usize,
        src_port: u16,
        tos: u8,
        datagram: &[u8],
        icrc: Icrc,
        hint: &ReadHint,
    ) -> Result<(), PushError> {
        let hint = Some(hint);
        let extra = Extra {
            hint,
            ..Extra::default()
        };
        self.push_record(ring, src_port, tos, datagram, icrc, extra)
    }

    /// Producer: as [`Inbox::push_with`], for a datagram whose bytes
    /// `at..at + len` are not in `datagram` (which has its whole length)
    /// but at `payload`: they are copied into the ring from there, one
    /// copy where building the datagram whole and pushing it took two.
    ///
    /// # Safety
    /// `payload` must be valid for reads of `len` bytes during the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn push_gathered(
        &self,
        ring: usize,
        src_port: u16,
        tos: u8,
        datagram: &[u8],
        at: usize,
        payload: *const u8,
        len: usize,
        icrc: Icrc,
    ) -> Result<(), PushError> {
        if at.checked_add(len).is_none_or(|end| end > datagram.len()) {
            return Err(PushError::Invalid);
        }
        let gap = Some(Gap {
            at,
            src: payload,
            len,
        });
        let extra = Extra {
            gap,
            ..Extra::default()
        };
        self.push_record(ring, src_port, tos, datagram, icrc, extra)
    }

    /// Append a record of `datagram`, with what `extra` says of it.
    pub(crate) fn push_record(
        &self,
        ring: usize,
        src_port: u16,
        tos: u8,
        datagram: &[u8],
        icrc: Icrc,
        extra: Extra<'_>,
    ) -> Result<(), PushError> {
        let Extra {
            placed,
            elide,
            gap,
            hint,
        } = extra;
        if self.is_closed() {
            return Err(PushError::Closed);
        }
        let elide = elide.filter(|&(at, n)| {
            placed.is_some() && icrc != Icrc::Unchecked && at + n <= datagram.len() && gap.is_none()
        });
        // A payload copied in from elsewhere starts on a cache line of the
        // ring, after a lead of up to ALIGN - 1 bytes (room for it is
        // asked for, and the record then takes what it needs).
        let align = gap.map(|g| g.at);
        let most = if align.is_some() { ALIGN - 1 } else { 0 };
        let body = record_body(
            datagram.len(),
            most,
            placed.is_some(),
            elide,
            hint.is_some(),
        );
        let Room {
            tail,
            skip,
            mut need,
            fits,
        } = self.room(ring, body)?;
        if !fits {
            return Err(PushError::Full);
        }
        let size = self.layout.ring_size as u64;
        let base = self.layout.data(ring);
        let mut at = tail;
        if skip > 0 {
            // The record does not fit before the end, or the ring is empty
            // well into its lap: mark the rest of the lap unused (records
            // are 8-aligned, so a header fits).
            self.map
                .write(base + (tail % size) as usize, &WRAP.to_le_bytes());
            at += skip;
        }
        let off = (at % size) as usize;
        let lead = align.map_or(0, |a| (ALIGN - (off + REC + a) % ALIGN) % ALIGN);
        if align.is_some() {
            // (Some: `room` took the largest lead.)
            need = record_body(datagram.len(), lead, placed.is_some(), None, hint.is_some())
                .map_or(need, |b| (REC + b) as u64);
        }
        let mut hdr = [0u8; REC];
        hdr[..4]
            .copy_from_slice(&(datagram.len() as u32 | (lead as u32) << LEAD_SHIFT).to_le_bytes());
        hdr[4..6].copy_from_slice(&src_port.to_le_bytes());
        hdr[6] = tos;
        hdr[7] = u8::from(placed.is_some())
            | icrc.flags()
            | if elide.is_some() { ELIDED } else { 0 }
            | if hint.is_some() { HINTED } else { 0 };
        self.map.write(base + off, &hdr);
        // What the record carries of the datagram: all of it, or (elided)
        // a word with the payload's offset and length, the bytes before
        // it and the bytes after it (the ICRC).
        let kept = match (elide, gap) {
            (None, None) => {
                self.map.write(base + off + REC, datagram);
                datagram.len()
            }
            (None, Some(g)) => {
                let body = base + off + REC + lead;
                self.map.write(body, &datagram[..g.at]);
                // SAFETY: `push_gathered`'s caller vouches for `g.src`
                // (`g.len` readable bytes); `g.at + g.len` is within the
                // datagram's length, so the record has room for them.
                unsafe { self.map.write_raw(body + g.at, g.src, g.len) };
                self.map
                    .write(body + g.at + g.len, &datagram[g.at + g.len..]);
                lead + datagram.len()
            }
            (Some((at, n)), _) => {
                let mut w = [0u8; 8];
                w[..4].copy_from_slice(&(at as u32).to_le_bytes());
                w[4..].copy_from_slice(&(n as u32).to_le_bytes());
                self.map.write(base + off + REC, &w);
                self.map.write(base + off + REC + 8, &datagram[..at]);
                self.map
                    .write(base + off + REC + 8 + at, &datagram[at + n..]);
                8 + datagram.len() - n
            }
        };
        let mut end = base + off + REC + pad8(kept);
        if let Some(at) = placed {
            self.map.write(end, &at.to_le_bytes());
            end += 8;
        }
        if let Some(h) = hint {
            self.map.write(end, &h.to_bytes());
        }
        // Release publishes the record. The store-load order that kicks
        // need (this tail before the consumer's sleep word is read) is
        // the fence in `kick`, once per batch: a sequentially consistent
        // store here waited for the record's bytes to leave the store
        // buffer, 13% of a sender's time in a 64 KiB stream (host, perf).
        self.tail(ring).store(at + need, Release);
        // The room of a next record like this one: its lines were last
        // read by the consumer's CPU, so each store into them waits for
        // the line to come over; start that now, while the next packet is
        // built. Only room the consumer has left (as last read: no more
        // than it has), never lines it may still be reading.
        let next = at + need;
        let free = size - (next - self.seen_head[ring].load(Relaxed).min(next));
        let noff = next % size;
        let n = need.min(free).min(size - noff) as usize;
        self.map.prefetch_write(base + noff as usize, n);
        let active = self.map.u64_at(OFF_ACTIVE);
        if active.load(SeqCst) & (1 << ring) == 0 {
            active.fetch_or(1 << ring, SeqCst);
        }
        Ok(())
    }

    /// Producer: where a record of a `len`-byte datagram (with a placed
    /// address, or not) would go in ring `ring`, and whether it fits now
    /// (the consumer only ever makes more room).
    fn room(&self, ring: usize, body: Option<usize>) -> Result<Room, PushError> {
        let Some(body) = body.filter(|_| ring < self.layout.rings) else {
            return Err(PushError::Invalid);
        };
        let size = self.layout.ring_size as u64;
        let tail = self.tail(ring).load(Relaxed);
        let need = (REC + body) as u64;
        let off = tail % size;
        let room = |head: u64| {
            let skip = if off + need > size || (head == tail && off >= EARLY_WRAP && need <= off) {
                // Past the end, or an empty ring past its first
                // EARLY_WRAP bytes: go back to its start, whose pages
                // are mapped and warm.
                size - off
            } else {
                0
            };
            Room {
                tail,
                skip,
                need,
                fits: tail - head + skip + need <= size,
            }
        };
        // The head as last read is good enough while it leaves room: the
        // consumer only ever moves it on. It is read again when it does
        // not, and, past EARLY_WRAP, every HEAD_REFRESH bytes pushed (the
        // ring may have emptied).
        let head = self.seen_head[ring].load(Relaxed);
        if self.consistent(head, tail) {
            let r = room(head);
            let read_at = self.head_read_at[ring].load(Relaxed);
            if r.fits && (off < EARLY_WRAP || head == tail || tail - read_at < HEAD_REFRESH) {
                return Ok(r);
            }
        }
        let head = self.head(ring).load(Acquire);
        if !self.consistent(head, tail) {
            return Err(PushError::Corrupt);
        }
        self.seen_head[ring].store(head, Relaxed);
        self.head_read_at[ring].store(tail, Relaxed);
        Ok(room(head))
    }

    /// Producer: whether a record of a `len`-byte datagram with a placed
    /// address fits in ring `ring` now.
    pub(crate) fn has_room_placed(&self, ring: usize, len: usize) -> Result<bool, PushError> {
        Ok(self
            .room(ring, record_body(len, 0, true, None, false))?
            .fits)
    }

    /// Producer: wake the consumer if it sleeps, or if its application
    /// may stop polling ([`Inbox::kick_me`]) or seems to have stopped
    /// (no poll within [`POLL_STALE`]): one eventfd write per sleep,
    /// however many senders kick. Returns whether this call wrote it (it
    /// will wake the consumer's thread).
    pub fn kick(&self) -> bool {
        self.kick_at(shm::monotonic_ns())
    }

    /// [`Inbox::kick`], judging at `now_ns` ([`monotonic_ns`], read by
    /// the caller) whether the consumer's application stopped polling.
    pub fn kick_at(&self, now_ns: u64) -> bool {
        let sleeping = self.map.u32_at(OFF_SLEEPING);
        // A plain load first: a compare-and-swap on every push would take
        // the word's cache line from the consumer, who reads it at every
        // post. The fence pairs with `sleep_begin` (a sequentially
        // consistent store of the word, then loads of the tails): either
        // this load sees ASLEEP or the consumer sees every datagram pushed
        // before it.
        std::sync::atomic::fence(SeqCst);
        let now = sleeping.load(SeqCst);
        if (now == ASLEEP
            || (now == LEFT && self.polled_before(now_ns, LEFT_GRACE))
            || (now == AWAKE && self.stopped_polling(now_ns)))
            && sleeping
                .compare_exchange(now, KICKED, SeqCst, SeqCst)
                .is_ok()
        {
            let _ = (&self.event).write(&1u64.to_ne_bytes());
            return true;
        }
        false
    }

    /// Where in ring `ring` the next record goes (bytes from the ring's
    /// start), as its producer left it.
    pub fn write_offset(&self, ring: usize) -> Option<usize> {
        (ring < self.layout.rings)
            .then(|| (self.tail(ring).load(SeqCst) % self.layout.ring_size as u64) as usize)
    }

    /// Producer in `ring`: whether the consumer has taken everything this
    /// producer wrote.
    pub fn taken(&self, ring: usize) -> bool {
        ring < self.layout.rings && self.head(ring).load(SeqCst) == self.tail(ring).load(SeqCst)
    }

    /// Whether the consumer's application said it polled, and not within
    /// [`POLL_STALE`]: its progress thread, which keeps off the
    /// inbox while the application polls and looks only now and then
    /// whether it still does, is then kicked rather than left to find the
    /// datagram at its next look.
    fn stopped_polling(&self, now_ns: u64) -> bool {
        let last = self.map.u64_at(OFF_LAST_POLL).load(Relaxed);
        last != 0 && now_ns.saturating_sub(last) > POLL_STALE.as_nanos() as u64
    }

    /// Whether the consumer's application last polled more than `grace`
    /// before `now_ns`, or never said it did.
    fn polled_before(&self, now_ns: u64, grace: std::time::Duration) -> bool {
        let last = self.map.u64_at(OFF_LAST_POLL).load(Relaxed);
        last == 0 || now_ns.saturating_sub(last) > grace.as_nanos() as u64
    }

    /// Producer, its kick refused: when [`Inbox::kick_at`] may write one
    /// ([`monotonic_ns`]), as the consumer's state and its application's
    /// last poll stand now; `None` if no kick will be due without a change
    /// of its state (asleep, kicked, or an application that never polled).
    pub fn kick_due(&self) -> Option<KickDue> {
        let last = self.map.u64_at(OFF_LAST_POLL).load(Relaxed);
        match self.map.u32_at(OFF_SLEEPING).load(SeqCst) {
            AWAKE if last != 0 => Some(KickDue {
                at: last.saturating_add(POLL_STALE.as_nanos() as u64 + 1),
                left: false,
            }),
            LEFT => Some(KickDue {
                at: last.saturating_add(LEFT_GRACE.as_nanos() as u64 + 1),
                left: true,
            }),
            _ => None,
        }
    }

    /// Consumer's application thread: it polled at `now_ns`
    /// ([`monotonic_ns`]).
    pub fn note_poll(&self, now_ns: u64) {
        self.map.u64_at(OFF_LAST_POLL).store(now_ns, Relaxed);
    }

    /// Consumer: take the next datagram into `buf` (at least
    /// [`MAX_DATAGRAM`] bytes), rings taken in turn.
    pub fn pop(&self, buf: &mut [u8]) -> Option<Popped> {
        self.pop_impl(buf, false)
    }

    /// Consumer: as [`Inbox::pop`], but the datagram goes to
    /// [`Popped::at`] in `buf` (0 to [`ALIGN`] - 1), where its bytes have
    /// the alignment they have in the ring, so that the copy moves whole
    /// cache lines, and a payload that its sender put on a line
    /// ([`Inbox::push_gathered`]) lands on one, for the copy into its MR
    /// too. For a `buf` of [`MAX_DATAGRAM`] + [`ALIGN`] bytes or more (a
    /// shorter one gets a datagram that would not fit there at 0).
    pub fn pop_aligned(&self, buf: &mut [u8]) -> Option<Popped> {
        self.pop_impl(buf, true)
    }

    fn pop_impl(&self, buf: &mut [u8], align: bool) -> Option<Popped> {
        let active = self.map.u64_at(OFF_ACTIVE).load(SeqCst);
        if active == 0 {
            return None;
        }
        // Only the rings marked active are looked at, from ring `start`
        // (the one after the ring served last) on, in turn: bit k of `todo`
        // is ring (start + k) % n.
        let n = self.layout.rings;
        let start = self.cursor.load(Relaxed) % n;
        let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        let active = active & mask;
        let mut todo = if start == 0 {
            active
        } else {
            ((active >> start) | (active << (n - start))) & mask
        };
        while todo != 0 {
            let k = todo.trailing_zeros() as usize;
            todo &= todo - 1;
            let ring = if start + k >= n {
                start + k - n
            } else {
                start + k
            };
            if let Some(p) = self.pop_ring(ring, buf, align) {
                self.cursor.store(ring + 1, Relaxed);
                return Some(p);
            }
        }
        None
    }

    fn pop_ring(&self, ring: usize, buf: &mut [u8], align: bool) -> Option<Popped> {
        let size = self.layout.ring_size as u64;
        let base = self.layout.data(ring);
        loop {
            let head = self.head(ring).load(Relaxed);
            let mut tail = self.seen_tail[ring].load(Relaxed);
            if head >= tail {
                tail = self.tail(ring).load(SeqCst);
                self.seen_tail[ring].store(tail, Relaxed);
                if head == tail {
                    return None;
                }
            }
            if !self.consistent(head, tail) {
                return self.discard(ring, tail);
            }
            let off = (head % size) as usize;
            let mut hdr = [0u8; REC];
            self.map.read(base + off, &mut hdr);
            let len = u32::from_le_bytes(hdr[..4].try_into().expect("4 bytes"));
            if len == WRAP {
                let next = head + (size - off as u64);
                if off == 0 || next > tail {
                    return self.discard(ring, tail);
                }
                self.head(ring).store(next, Release);
                continue;
            }
            // The lead before the datagram, and its length.
            let lead = (len >> LEAD_SHIFT) as usize;
            let len = (len & LEN_MASK) as usize;
            let placed = hdr[7] & 1 != 0;
            let icrc = Icrc::from_flags(hdr[7]);
            let body = off + REC;
            // An elided record: the payload's offset and length first.
            let elided = if hdr[7] & ELIDED != 0 {
                if body + 8 > size as usize || head + (REC + 8) as u64 > tail {
                    return self.discard(ring, tail);
                }
                let mut w = [0u8; 8];
                self.map.read(base + body, &mut w);
                let at = u32::from_le_bytes(w[..4].try_into().expect("4 bytes")) as usize;
                let n = u32::from_le_bytes(w[4..].try_into().expect("4 bytes")) as usize;
                Some((at, n))
            } else {
                None
            };
            let hinted = hdr[7] & HINTED != 0;
            let need = record_body(len, lead, placed, elided, hinted).map(|b| (REC + b) as u64);
            let Some(need) = need.filter(|&need| {
                len <= buf.len()
                    && off as u64 + need <= size
                    && head + need <= tail
                    && (elided.is_none() || (placed && icrc != Icrc::Unchecked))
            }) else {
                return self.discard(ring, tail);
            };
            // Where the datagram goes in `buf`: at the alignment it has in
            // the ring, if asked and it fits there.
            let at = match (align, elided) {
                (true, None) => {
                    let ring_addr = self.map.addr() + base + body + lead;
                    Some(ring_addr.wrapping_sub(buf.as_ptr() as usize) % ALIGN)
                        .filter(|a| a + len <= buf.len())
                        .unwrap_or(0)
                }
                _ => 0,
            };
            let kept = match elided {
                None => {
                    // After the lead.
                    self.map.read(base + body + lead, &mut buf[at..at + len]);
                    lead + len
                }
                Some((at, n)) => {
                    self.map.read(base + body + 8, &mut buf[..at]);
                    self.map.read(base + body + 8 + at, &mut buf[at + n..len]);
                    8 + len - n
                }
            };
            // The next record, if already published: its lines were
            // written by the producer's CPU, so each is a transfer between
            // caches; start them while this datagram is handled.
            let next = head + need;
            if next < tail {
                let noff = (next % size) as usize;
                let n = ((tail - next) as usize)
                    .min(PREFETCH)
                    .min(size as usize - noff);
                self.map.prefetch(base + noff, n);
            }
            let mut end = base + body + pad8(kept);
            let placed = placed.then(|| {
                let mut a = [0u8; 8];
                self.map.read(end, &mut a);
                end += 8;
                u64::from_le_bytes(a)
            });
            let hint = hinted.then(|| {
                let mut h = [0u8; HINT_LEN];
                self.map.read(end, &mut h);
                ReadHint::from_bytes(&h)
            });
            let src_port = u16::from_le_bytes([hdr[4], hdr[5]]);
            // Release: the record was read before the producer may reuse
            // its room. Nothing orders itself after this store (a producer
            // that reads an older head only finds less room, or kicks once
            // more than needed).
            self.head(ring).store(head + need, Release);
            return Some(Popped {
                ring,
                src_port,
                tos: hdr[6],
                len,
                placed,
                elided,
                icrc,
                at,
                hint,
            });
        }
    }

    /// A ring whose words make no sense: drop what it holds.
    fn discard(&self, ring: usize, tail: u64) -> Option<Popped> {
        self.dropped.fetch_add(1, Relaxed);
        if self.consistent(tail, tail) {
            self.head(ring).store(tail, SeqCst);
        }
        None
    }

    /// Consumer: records or rings discarded as inconsistent since the
    /// last call.
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Relaxed)
    }

    /// Fault in the part of ring `ring` that a conversation uses first
    /// (twice [`EARLY_WRAP`]), as its producer (`write`) or its consumer:
    /// called when a connection is set up, so that its first messages do
    /// not each take a page fault in both processes (in the TCG guest, a
    /// fault cost an iteration 150-450 µs in `ib_send_lat`'s first 600).
    pub fn warm(&self, ring: usize, write: bool) {
        if ring < self.layout.rings {
            let len = (2 * EARLY_WRAP as usize).min(self.layout.ring_size);
            self.map.populate(self.layout.data(ring), len, write);
        }
    }

    /// Consumer: whether any ring holds a datagram.
    /// Only the rings marked active are looked at, one step each: the
    /// application's every empty poll asks, and a walk over all the rings
    /// took 0.3 µs of each in the TCG guest.
    pub fn has_data(&self) -> bool {
        let n = self.layout.rings;
        let mask = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
        let mut active = self.map.u64_at(OFF_ACTIVE).load(SeqCst) & mask;
        while active != 0 {
            let r = active.trailing_zeros() as usize;
            active &= active - 1;
            if self.head(r).load(SeqCst) != self.tail(r).load(SeqCst) {
                return true;
            }
        }
        false
    }

    /// Consumer, about to wait on [`Inbox::event_fd`]: say so, so that
    /// producers kick. Returns false (and stays awake) if a datagram came
    /// in the meantime; then do not wait.
    pub fn sleep_begin(&self) -> bool {
        self.map.u32_at(OFF_SLEEPING).store(ASLEEP, SeqCst);
        if self.has_data() {
            self.sleep_end();
            return false;
        }
        true
    }

    /// Consumer's application thread: it may stop polling now, so
    /// producers should kick from here on although the consumer's
    /// progress thread is not asleep (it watches [`Inbox::event_fd`]
    /// meanwhile). Leaves a sleeping consumer's state alone. Returns false
    /// if a datagram is already waiting (it drew no kick): then wake the
    /// progress thread another way.
    pub fn kick_me(&self) -> bool {
        let sleeping = self.map.u32_at(OFF_SLEEPING);
        let _ = sleeping.compare_exchange(AWAKE, LEFT, SeqCst, SeqCst);
        !self.has_data()
    }

    /// Consumer's application thread: it posted or polled at `now_ns`
    /// ([`monotonic_ns`]), and takes what comes while it polls, so
    /// producers need not kick a progress thread that went to sleep on the
    /// inbox before: they kick once the application has neither posted nor
    /// polled for [`POLL_STALE`] (as for an awake consumer), once it says
    /// it may stop polling ([`Inbox::kick_me`]), or once it sleeps on a
    /// completion channel ([`Inbox::app_sleeps`]). The time is stored only
    /// if the one stored is `every_ns` old or older (each store takes the
    /// line from the producers that read it).
    pub fn app_active(&self, now_ns: u64, every_ns: u64) {
        let last = self.map.u64_at(OFF_LAST_POLL);
        if now_ns.saturating_sub(last.load(Relaxed)) >= every_ns {
            last.store(now_ns, Relaxed);
        }
        let sleeping = self.map.u32_at(OFF_SLEEPING);
        if sleeping.load(Relaxed) == ASLEEP {
            let _ = sleeping.compare_exchange(ASLEEP, AWAKE, SeqCst, SeqCst);
        }
    }

    /// Consumer's application thread: it is about to sleep on a completion
    /// channel, so producers kick the progress thread again if it sleeps
    /// on the inbox ([`Inbox::app_active`]). Returns false if a datagram is
    /// already waiting (it drew no kick): then wake the thread another way.
    pub fn app_sleeps(&self) -> bool {
        let sleeping = self.map.u32_at(OFF_SLEEPING);
        // Asleep already, kicked, or asking for kicks: nothing to undo.
        sleeping
            .compare_exchange(AWAKE, ASLEEP, SeqCst, SeqCst)
            .is_err()
            || !self.has_data()
    }

    /// Consumer's application thread: it polls (or posts) again, so
    /// producers need not kick: undoes [`Inbox::kick_me`], and leaves a
    /// sleeping consumer's state alone. One shared-memory load when there
    /// is nothing to undo.
    pub fn polling_again(&self) {
        let sleeping = self.map.u32_at(OFF_SLEEPING);
        if sleeping.load(Relaxed) == LEFT {
            let _ = sleeping.compare_exchange(LEFT, AWAKE, SeqCst, SeqCst);
        }
    }

    /// Consumer, done waiting: producers stop kicking. The eventfd is
    /// emptied every time: a producer that won the kick may write it only
    /// after this (so a wait may end early once; never late).
    pub fn sleep_end(&self) {
        self.map.u32_at(OFF_SLEEPING).store(AWAKE, SeqCst);
        let mut b = [0u8; 8];
        let _ = (&self.event).read(&mut b);
    }

    /// Consumer, done waiting, its wait having found the eventfd not
    /// readable: [`Inbox::sleep_end`] without the read (a system call that
    /// would find nothing). A producer that kicked since leaves the eventfd
    /// readable: the next wait on it ends at once, and reads it then.
    pub fn sleep_end_unkicked(&self) {
        self.map.u32_at(OFF_SLEEPING).store(AWAKE, SeqCst);
    }

    /// The fd that becomes readable when a producer kicks.
    pub fn event_fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }

    /// Bytes mapped.
    pub fn mapped_len(&self) -> usize {
        self.map.len()
    }
}
