//! The engine: object tables, the verbs-level calls, and the I/O surface
//! (`handle_datagram`, `poll_transmit`, `poll_timeout`, `handle_timeout`).

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use wire::icrc::IpUdpInfo;
use wire::Psn;

use crate::caps::{DeviceCaps, Mtu};
use crate::counters::Counters;
use crate::cq::{Arm, Cq, CqPost};
use crate::error::{Error, Result};
use crate::mem::Memory;
use crate::mr::{AccessFlags, KeyTable, Mr, Mw, MwType};
use crate::qp::{ErrorCause, Qp, RecvWqe, SendWqe, UdTarget, WqeState};
use crate::qp_attr::{self, AhAttr, QpAttr, QpAttrMask, QpCap, QpState, QpType};
use crate::srq::Srq;
use crate::time::Instant;
use crate::wr::{RecvWr, SendFlags, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::{AhHandle, AsyncEvent, AsyncEventKind, CqHandle, EventObject, PdHandle, SrqHandle};

/// Address handle attributes (the same as a QP's primary path).
pub type AhAttrs = AhAttr;

/// Static configuration of one engine (one device, one port).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The port's GID table as IP addresses, in kernel rxe order (the driver
    /// builds it: link-local IPv6 first, then IPv4-mapped and global IPv6).
    /// `sgid_index` in address vectors indexes this table.
    pub gids: Vec<IpAddr>,
    /// Active MTU of the port.
    pub port_mtu: Mtu,
    /// Device limits reported by `query_device` and enforced by the engine.
    pub caps: DeviceCaps,
    /// QPNs are allocated from this inclusive range (kernel rxe starts at 0x11).
    pub qpn_range: (u32, u32),
    /// Seed for key bytes, so runs are reproducible.
    pub key_seed: u64,
    /// MR and MW key indices this engine allocates from (kernel rxe's
    /// ranges unless the device is shared between engines).
    pub key_space: crate::mr::KeySpace,
    /// The first QPN handed out (within `qpn_range`); a shared device
    /// moves it on each time a slot changes owner, so a late packet for
    /// the previous owner's QP finds no QP of the new one.
    pub qpn_first: Option<u32>,
    /// Congestion control: kernel rxe's none (the default) or ConnectX's
    /// ECN/CNP/DCQCN, with its parameters (`crate::cc`).
    pub cc: crate::cc::CcConfig,
    /// The kernel rxe release this device behaves as where releases
    /// differ (`crate::model::RxeRelease`). Set it with
    /// [`EngineConfig::set_release`], which also sets the limits that
    /// depend on it.
    pub release: crate::model::RxeRelease,
}

impl EngineConfig {
    /// One GID (the given address), MTU 1024 as on a 1500-byte netdev, kernel
    /// rxe's limits.
    pub fn new(ip: IpAddr) -> Self {
        EngineConfig {
            gids: vec![ip],
            port_mtu: Mtu::M1024,
            caps: DeviceCaps::default(),
            qpn_range: (0x11, 0x00ff_fffe),
            key_seed: 0x5eed,
            key_space: crate::mr::KeySpace::default(),
            qpn_first: None,
            cc: crate::cc::CcConfig::default(),
            release: crate::model::RxeRelease::default(),
        }
    }

    /// Behave as kernel rxe `release` (and report its `max_msg_sz`).
    pub fn set_release(&mut self, release: crate::model::RxeRelease) {
        self.release = release;
        self.caps.max_msg_sz = release.max_msg_sz();
    }
}

/// What [`Engine::qp_summaries`] reports of one QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpSummary {
    /// QP number.
    pub qpn: u32,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Current state.
    pub state: QpState,
    /// Remote QPN (connected QPs).
    pub dest_qpn: u32,
    /// Remote address (connected QPs with an address vector).
    pub peer: Option<IpAddr>,
    /// Next PSN the requester sends.
    pub sq_psn: u32,
    /// Oldest PSN not yet acknowledged (equal to `sq_psn` when nothing is
    /// outstanding).
    pub unacked_psn: u32,
    /// Next PSN the responder expects.
    pub rq_psn: u32,
    /// Send WRs not yet completed.
    pub send_wrs: usize,
    /// Receive WRs posted and not yet used.
    pub recv_wrs: usize,
    /// Why the QP is in ERR, in words.
    pub error: Option<String>,
    /// The QP's share of the device's counters (packets it sent and
    /// accepted, and the protocol events it caused). Drops before a packet
    /// reaches a QP (bad ICRC, malformed, unknown QPN) count only on the
    /// device.
    pub counters: Counters,
}

/// `struct ibv_qp_init_attr` as the engine needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// Protection domain of the QP.
    pub pd: PdHandle,
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// CQ of send completions.
    pub send_cq: CqHandle,
    /// CQ of receive completions.
    pub recv_cq: CqHandle,
    /// Shared receive queue, if the QP takes receives from one.
    pub srq: Option<SrqHandle>,
    /// Queue sizes; the engine may round them up, as `query_qp` reports.
    pub cap: QpCap,
    /// Every send WR completes, whatever its SIGNALED flag.
    pub sq_sig_all: bool,
}

/// `struct ibv_srq_init_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receive WRs the SRQ holds.
    pub max_wr: u32,
    /// SGEs per receive WR.
    pub max_sge: u32,
    /// SRQ_LIMIT_REACHED fires when fewer WRs than this remain (0: off).
    pub srq_limit: u32,
}

/// A received UDP datagram on port 4791.
#[derive(Debug, Clone, Copy)]
pub struct RxDatagram<'a> {
    /// Sender IP address.
    pub src: IpAddr,
    /// Our IP address the datagram was sent to.
    pub dst: IpAddr,
    /// Sender UDP port.
    pub src_port: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
    /// The IPv4 identification field when the driver saw the IP header (a
    /// capture, a raw socket, the simulator). `None` through a UDP socket,
    /// which hides it: the ICRC is then checked by solving for the ID
    /// (see `wire::icrc::solve_ipv4_id`).
    pub ipv4_id: Option<u16>,
    /// UDP payload: BTH .. ICRC.
    pub payload: &'a [u8],
    /// The IP header's ECN codepoint (low 2 bits of the IPv4 TOS or IPv6
    /// traffic class), if the driver knows it (`IP_RECVTOS`); `NotEct`
    /// otherwise. A ConnectX-like device answers `Ce` on a data packet
    /// with a CNP; a kernel-rxe-like one ignores it.
    pub ecn: wire::Ecn,
}

/// A datagram for the driver to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Addresses and ports; `ipv4_id` 0 and DF set, which is what Linux puts
    /// on a datagram from an unconnected UDP socket with DF (the ICRC covers them).
    pub info: IpUdpInfo,
    /// UDP payload including the ICRC.
    pub payload: Vec<u8>,
    /// ECN codepoint for the IP header: `NotEct` from a kernel-rxe-like
    /// device (TOS 0, what kernel rxe sends), `Ect0` on a ConnectX-like
    /// device's packets.
    pub ecn: wire::Ecn,
    /// DSCP for the IP header (the TOS byte is `dscp << 2 | ecn`): 0,
    /// except on CNPs (`cnp_dscp`, 48 by default).
    pub dscp: u8,
    /// The first transmission of a request packet: no packet with this
    /// PSN left the QP before (retransmissions, responses, ACKs and CNPs
    /// are not).
    pub fresh: bool,
    /// A fresh request packet whose work request was the last one posted
    /// to its send queue when the packet was built: nothing of the QP
    /// waited to go after it. A driver that may do the responder's work
    /// itself (placement, on the same host) does it only then: while
    /// work requests queue behind (a stream), the responder does it in
    /// parallel with the sender, which is faster than the sender alone.
    pub last_posted: bool,
    /// Whether its ICRC is written (always, unless the driver asked to
    /// write it itself: [`Engine::defer_icrc`]).
    pub icrc: bool,
    /// Payload bytes not copied into `payload` yet (only when the driver
    /// asked for that: [`Engine::defer_gather`]). Until
    /// [`Engine::fill_gathered`] (or the driver's own copy) writes them,
    /// `payload[at..at + len]` holds nothing of this packet.
    pub gathered: Option<Gathered>,
    /// An RC READ request's destination, where the responder of a driver
    /// that places responses may write them (only when the driver asked:
    /// [`Engine::hint_reads`]).
    pub read_dest: Option<ReadDest>,
}

/// [`Transmit::read_dest`]: the local memory the responses to a READ
/// request go to, one range of one MR that the engine checked (key,
/// protection domain, local write access, bounds) when it built the
/// request. The response at the request's PSN + k carries the bytes
/// `k * mtu..` of it (a full `mtu` but for the last). For a READ resumed
/// after partial responses, the rest it asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadDest {
    /// Its first byte in the memory backend.
    pub host: u64,
    /// Its length: what the request asks for.
    pub len: u64,
    /// The QP's path MTU.
    pub mtu: u32,
}

/// [`Transmit::gathered`]: the payload bytes `at..at + len` of a packet
/// are the `len` bytes at `addr` in the memory backend, a range of a
/// registered MR that the engine checked (key, protection domain, bounds)
/// and that [`Memory::direct`] said the driver may read itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gathered {
    /// Offset of the payload in the packet.
    pub at: usize,
    /// Payload length.
    pub len: usize,
    /// Where the payload is.
    pub addr: u64,
}

impl Transmit {
    /// Write the ICRC if it is not written yet. The payload must be whole
    /// (no [`Transmit::gathered`] left).
    pub fn write_icrc(&mut self) {
        debug_assert!(self.gathered.is_none(), "ICRC over a payload not gathered");
        if !self.icrc {
            wire::icrc::write(&self.info, &mut self.payload);
            self.icrc = true;
        }
    }
}

#[derive(Debug)]
pub(crate) struct Ah {
    pub pd: PdHandle,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The GRH flow label; a ConnectX-like device derives the UDP source
    /// port of UD sends from it ([`crate::model::ud_src_port`]).
    pub flow_label: u32,
}

/// Everything but the QP table: what the requester, responder and completer
/// touch while they hold one `&mut Qp`.
pub(crate) struct Ctx<M> {
    pub mem: M,
    pub keys: KeyTable,
    pub cqs: FxHashMap<CqHandle, Cq>,
    pub srqs: FxHashMap<SrqHandle, Srq>,
    pub ahs: FxHashMap<AhHandle, Ah>,
    pub out: VecDeque<Transmit>,
    /// Packet buffers handed back by the driver (`Engine::recycle`), for
    /// the next packets: no allocation and no zeroing per packet.
    pub spare: crate::tx::Spare,
    /// QPs with a READ reply under way, served in turn by `poll_transmit`
    /// once `out` is empty.
    pub read_ready: VecDeque<u32>,
    pub events: VecDeque<AsyncEvent>,
    /// Explanations of QP state changes, kept only while tracing.
    pub notes: VecDeque<String>,
    /// Times a QP entered ERR so far (a fault, or a modify).
    pub qp_errors: u64,
    pub tracing: bool,
    /// Request packets and responses leave without their ICRC
    /// ([`Engine::defer_icrc`]).
    pub defer_icrc: bool,
    /// Request payloads of one local range are left for the driver to
    /// copy ([`Engine::defer_gather`]).
    pub defer_gather: bool,
    /// READ requests say where their responses go ([`Engine::hint_reads`]).
    pub hint_reads: bool,
    pub notify: VecDeque<CqHandle>,
    pub counters: Counters,
    pub cfg: EngineConfig,
}

/// The transport engine of one device. See the crate documentation.
pub struct Engine<M: Memory> {
    pub(crate) qps: FxHashMap<u32, Qp>,
    /// Every QP's earliest deadline, ordered: `poll_timeout` and
    /// `handle_timeout` cost O(log n), not a scan of all QPs. Updated at the
    /// end of each entry point that can change a QP's deadlines.
    timers: std::collections::BTreeSet<(Instant, u32)>,
    pub(crate) ctx: Ctx<M>,
    pds: FxHashMap<PdHandle, u32>,
    next_handle: u32,
    next_qpn: u32,
    /// Multicast groups and the UD QPs attached to each.
    pub(crate) mcast: crate::mcast::Groups,
    /// XRC domains and how many XRC SRQs and target QPs use each.
    xrcds: FxHashMap<crate::XrcdHandle, u32>,
}

/// The IP address a GID stands for on RoCEv2: IPv4-mapped GIDs are IPv4,
/// and so are the link-local GIDs [`derived_link_local`] makes for IPv4
/// addresses (`fe80::AA:ff:feBB:CCDD` is `AA.BB.CC.DD`), because rxe-emu
/// devices bound to an IPv4 address list one at GID index 0 (as kernel rxe
/// lists the netdev's link-local address there) and programs that pick
/// index 0 must reach the device through it.
pub fn gid_to_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let g = gid;
    let link_local_v4 = g[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0]
        && g[8..10] == [0, 0]
        && g[11] == 0xff
        && g[12] == 0xfe;
    if link_local_v4 {
        return IpAddr::V4(Ipv4Addr::new(g[10], g[13], g[14], g[15]));
    }
    IpAddr::V6(v6)
}

/// The IPv6 link-local address rxe-emu lists at GID index 0 for a device
/// bound to `addr` when no netdev gives it one: the EUI-64 address of the
/// locally administered MAC `02:00:a:b:c:d` (IPv4 `a.b.c.d`) or
/// `02:01:` + the low four bytes (IPv6). [`gid_to_ip`] maps the IPv4 form
/// back to its address, so it carries traffic between rxe-emu devices; the
/// IPv6 form only reaches the device itself ([`Engine`] routes its own
/// GIDs to its address).
pub fn derived_link_local(addr: IpAddr) -> Ipv6Addr {
    let (marker, b) = match addr {
        IpAddr::V4(v) => (0x0000u16, v.octets()),
        IpAddr::V6(v) => {
            let o = v.octets();
            (0x01, [o[12], o[13], o[14], o[15]])
        }
    };
    // EUI-64 of 02:MM:b0:b1:b2:b3: flip the universal/local bit (02 -> 00)
    // and insert ff:fe in the middle.
    Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        marker,
        u16::from_be_bytes([b[0], 0xff]),
        u16::from_be_bytes([0xfe, b[1]]),
        u16::from_be_bytes([b[2], b[3]]),
    )
}

/// The address packets for `ip` go to (or come from): the device's own
/// derived link-local GID ([`derived_link_local`]) is the device's
/// address, which owns the socket; any other address is itself.
fn route(gids: &[IpAddr], ip: IpAddr) -> IpAddr {
    gids.iter()
        .copied()
        .find(|g| IpAddr::V6(derived_link_local(*g)) == ip)
        .unwrap_or(ip)
}

/// The GID table kernel rxe builds for a netdev with this address (Linux
/// 6.1, RoCE v2 entries only): the IPv6 link-local address first, then the
/// address itself (IPv4-mapped for IPv4). A device on an IPv6 link-local
/// address has only that entry. Loopback and other addresses without a
/// netdev link-local get one derived (EUI-64) from a locally administered
/// MAC made from the address, so index 1 is the IPv4 GID as on kernel rxe
/// (`ibv_rc_pingpong -g 1`, `perftest -x 1`). The link-local entry of an
/// IPv4 address encodes it, so it carries traffic between rxe-emu devices
/// as the IPv4 GID does ([`gid_to_ip`]); kernel rxe peers do not
/// know it.
pub fn gid_table(addr: IpAddr) -> Vec<IpAddr> {
    if let IpAddr::V6(v6) = addr {
        if v6.segments()[0] & 0xffc0 == 0xfe80 {
            return vec![addr];
        }
    }
    vec![IpAddr::V6(derived_link_local(addr)), addr]
}

/// The GID of an IP address (IPv4 addresses are IPv4-mapped).
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl<M> Ctx<M> {
    /// Record an explanation for a trace (formatted only while tracing).
    pub fn note(&mut self, text: impl FnOnce() -> String) {
        if self.tracing {
            self.notes.push_back(text());
        }
    }

    pub fn event(&mut self, kind: AsyncEventKind, object: EventObject, reason: String) {
        self.events.push_back(AsyncEvent {
            kind,
            object,
            reason,
        });
    }

    /// Post a completion to a CQ, raising the notification or the CQ error.
    pub fn post_cq(&mut self, cq: CqHandle, wc: WorkCompletion, solicited: bool) {
        let Some(c) = self.cqs.get_mut(&cq) else {
            return;
        };
        match c.post(wc, solicited) {
            CqPost::Posted { notify } => {
                if notify {
                    self.notify.push_back(cq);
                }
            }
            CqPost::Overrun { first } => {
                self.counters.cq_overflow += 1;
                if first {
                    let reason = format!(
                        "CQ {} with {} entries is full: a completion for QP {:#x} (wr_id {}) was lost; \
                         poll it more often or create it larger",
                        cq.0, c.cqe, wc.qp_num, wc.wr_id
                    );
                    self.event(AsyncEventKind::CqErr, EventObject::Cq(cq), reason);
                }
            }
        }
    }
}

impl<M: Memory> Engine<M> {
    /// A new engine owning the memory backend.
    pub fn new(cfg: EngineConfig, mem: M) -> Self {
        let seed = cfg.key_seed;
        let (lo, hi) = cfg.qpn_range;
        let next_qpn = cfg
            .qpn_first
            .filter(|q| (lo..=hi).contains(q))
            .unwrap_or(lo);
        Engine {
            qps: FxHashMap::default(),
            timers: std::collections::BTreeSet::new(),
            ctx: Ctx {
                mem,
                keys: KeyTable::with_space(seed, cfg.key_space)
                    .with_local_rkey_zero(!cfg.release.local_mr_rkey_is_lkey()),
                cqs: FxHashMap::default(),
                srqs: FxHashMap::default(),
                ahs: FxHashMap::default(),
                out: VecDeque::new(),
                spare: crate::tx::Spare::default(),
                events: VecDeque::new(),
                notify: VecDeque::new(),
                read_ready: VecDeque::new(),
                notes: VecDeque::new(),
                qp_errors: 0,
                tracing: false,
                defer_icrc: false,
                defer_gather: false,
                hint_reads: false,
                counters: Counters::default(),
                cfg,
            },
            pds: FxHashMap::default(),
            next_handle: 1,
            next_qpn,
            mcast: crate::mcast::Groups::default(),
            xrcds: FxHashMap::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.ctx.cfg
    }

    /// The memory backend.
    pub fn mem(&self) -> &M {
        &self.ctx.mem
    }

    /// The memory backend, mutably (to fill buffers in tests).
    pub fn mem_mut(&mut self) -> &mut M {
        &mut self.ctx.mem
    }

    /// Protocol counters.
    pub fn counters(&self) -> &Counters {
        &self.ctx.counters
    }

    /// The congestion-control model and parameters.
    pub fn cc_config(&self) -> &crate::cc::CcConfig {
        &self.ctx.cfg.cc
    }

    /// Choose the congestion-control model. QPs keep their DCQCN state;
    /// what changes is how packets are sent and received from now on.
    pub fn set_cc_model(&mut self, model: crate::cc::CcModel) {
        self.ctx.cfg.cc.model = model;
    }

    /// Set one congestion-control parameter by its mlx5 name (e.g.
    /// `set_cc_param("rpg_ai_rate", 5)`); see `CcParams::specs` for the
    /// names, defaults and ranges. Takes effect at the next event of each
    /// QP.
    pub fn set_cc_param(
        &mut self,
        name: &str,
        value: u64,
    ) -> std::result::Result<(), crate::cc::CcParamError> {
        self.ctx.cfg.cc.params.set(name, value)
    }

    /// Replace every congestion-control parameter at once (a driver that
    /// was told the whole set, e.g. by `rxe-emu cc set`). Takes effect at
    /// the next event of each QP, as [`Engine::set_cc_param`] does.
    pub fn set_cc_params(&mut self, params: crate::cc::CcParams) {
        self.ctx.cfg.cc.params = params;
    }

    /// A QP's congestion state: its current and target rate, DCQCN's α
    /// and stages, and whether the pacer holds it back. `None` for an
    /// unknown QP.
    pub fn qp_cc(&self, qpn: u32) -> Option<crate::cc::QpCcState> {
        self.qps
            .get(&qpn)
            .map(|q| q.cc.state(&self.ctx.cfg.cc.params))
    }

    fn handle(&mut self) -> u32 {
        let h = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1).max(1);
        h
    }

    // ------------------------------------------------------------------
    // PD, MR, MW, AH

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> Result<PdHandle> {
        if self.pds.len() as u32 >= self.ctx.cfg.caps.max_pd {
            return Err(Error::NoMemory(format!(
                "the device allows {} protection domains",
                self.ctx.cfg.caps.max_pd
            )));
        }
        let pd = PdHandle(self.handle());
        self.pds.insert(pd, 0);
        Ok(pd)
    }

    /// Whether PD `pd` exists (`ibv_import_pd` checks the handle).
    pub fn has_pd(&self, pd: PdHandle) -> bool {
        self.pds.contains_key(&pd)
    }

    /// Free a protection domain; refused while objects use it.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<()> {
        let users = *self
            .pds
            .get(&pd)
            .ok_or_else(|| Error::NotFound(format!("PD {}", pd.0)))?;
        if users > 0 {
            return Err(Error::Busy(format!(
                "PD {} is still used by {users} QP/MR/MW/AH/SRQ object(s)",
                pd.0
            )));
        }
        self.pds.remove(&pd);
        Ok(())
    }

    fn pd_ref(&mut self, pd: PdHandle, delta: i32) -> Result<()> {
        let u = self
            .pds
            .get_mut(&pd)
            .ok_or_else(|| Error::NotFound(format!("PD {}", pd.0)))?;
        *u = u.saturating_add_signed(delta);
        Ok(())
    }

    /// Register `length` bytes at `addr` (an address the memory backend
    /// understands). Returns the MR with its lkey and rkey.
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<Mr> {
        self.reg_mr_iova(pd, addr, length, None, access)
    }

    /// Register `length` bytes at host address `addr` that peers and SGEs
    /// name by the I/O virtual address `iova` (`ibv_reg_mr_iova2`); `None`
    /// means the host address itself (or 0 with `ZERO_BASED`).
    pub fn reg_mr_iova(
        &mut self,
        pd: PdHandle,
        addr: u64,
        length: u64,
        iova: Option<u64>,
        access: AccessFlags,
    ) -> Result<Mr> {
        if let Some(v) = iova {
            if v.checked_add(length).is_none() {
                return Err(Error::Invalid("iova + length overflows".into()));
            }
        }
        self.pd_ref(pd, 0)?;
        // IBTA 10.6.3.1 / kernel ib_check_mr_access: remote write or atomic
        // access needs local write.
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::Invalid(
                "IBV_ACCESS_REMOTE_WRITE and IBV_ACCESS_REMOTE_ATOMIC require IBV_ACCESS_LOCAL_WRITE".into(),
            ));
        }
        refuse_flush_access(self.ctx.cfg.release, access)?;
        if length > self.ctx.cfg.caps.max_mr_size {
            return Err(Error::Invalid(format!(
                "length {length} exceeds the largest MR ({} bytes)",
                self.ctx.cfg.caps.max_mr_size
            )));
        }
        if addr.checked_add(length).is_none() {
            return Err(Error::Invalid("addr + length overflows".into()));
        }
        if self.ctx.keys.mr_count() as u32 >= self.ctx.cfg.caps.max_mr {
            return Err(Error::NoMemory(format!(
                "the device allows {} MRs",
                self.ctx.cfg.caps.max_mr
            )));
        }
        let mr = self
            .ctx
            .keys
            .reg_mr(pd, addr, length, access)
            .cloned()
            .ok_or_else(|| Error::NoMemory("no free MR index".into()))?;
        let mr = match iova {
            Some(v) if !access.contains(AccessFlags::ZERO_BASED) => {
                self.ctx.keys.set_iova(mr.lkey, v).cloned().unwrap_or(mr)
            }
            _ => mr,
        };
        self.pd_ref(pd, 1)?;
        Ok(mr)
    }

    /// Re-register an MR in place (`ibv_rereg_mr`): move it to `pd`, grant
    /// it `access`, or point it at other memory (`range`: host address,
    /// length and optional iova, as for [`Engine::reg_mr_iova`]). Its keys
    /// stay the same, as on kernel rxe. Work already posted keeps the
    /// addresses it names, so a receive posted on the old range now fails
    /// with a local protection error. Nothing changes if any check fails.
    /// Deviation: kernel rxe (6.1) supports only PD and access changes; a
    /// user-space device can move the translation too, but not under a
    /// bound memory window (`Busy`).
    pub fn rereg_mr(
        &mut self,
        lkey: u32,
        pd: Option<PdHandle>,
        range: Option<(u64, u64, Option<u64>)>,
        access: Option<AccessFlags>,
    ) -> Result<Mr> {
        let old = self
            .ctx
            .keys
            .mr(lkey)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("MR {lkey:#x}")))?;
        if let Some(p) = pd {
            self.pd_ref(p, 0)?;
        }
        let access = access.unwrap_or(old.access);
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::Invalid(
                "IBV_ACCESS_REMOTE_WRITE and IBV_ACCESS_REMOTE_ATOMIC require IBV_ACCESS_LOCAL_WRITE".into(),
            ));
        }
        refuse_flush_access(self.ctx.cfg.release, access)?;
        let zero_based = access.contains(AccessFlags::ZERO_BASED);
        let (host_addr, length, iova) = match range {
            Some((addr, length, iova)) => {
                if old.bound_windows > 0 {
                    return Err(Error::Busy(format!(
                        "MR {lkey:#x} has {} memory window(s) bound; its translation cannot change",
                        old.bound_windows
                    )));
                }
                if length > self.ctx.cfg.caps.max_mr_size {
                    return Err(Error::Invalid(format!(
                        "length {length} exceeds the largest MR ({} bytes)",
                        self.ctx.cfg.caps.max_mr_size
                    )));
                }
                let iova = match (zero_based, iova) {
                    (true, _) => 0,
                    (false, Some(v)) => v,
                    (false, None) => addr,
                };
                if addr.checked_add(length).is_none() || iova.checked_add(length).is_none() {
                    return Err(Error::Invalid("address + length overflows".into()));
                }
                (addr, length, iova)
            }
            None => {
                if zero_based != old.access.contains(AccessFlags::ZERO_BASED) {
                    return Err(Error::Invalid(
                        "IBV_ACCESS_ZERO_BASED can change only with the translation".into(),
                    ));
                }
                (old.host_addr, old.length, old.iova)
            }
        };
        let new_pd = pd.unwrap_or(old.pd);
        let mr = self
            .ctx
            .keys
            .mr_mut(lkey)
            .ok_or_else(|| Error::NotFound(format!("MR {lkey:#x}")))?;
        mr.pd = new_pd;
        mr.access = access;
        mr.host_addr = host_addr;
        mr.length = length;
        mr.iova = iova;
        let mr = mr.clone();
        if new_pd != old.pd {
            self.pd_ref(new_pd, 1)?;
            self.pd_ref(old.pd, -1)?;
        }
        Ok(mr)
    }

    /// Deregister an MR by its lkey.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<()> {
        let mr = self.ctx.keys.dereg_mr(lkey).map_err(Error::Busy)?;
        self.pd_ref(mr.pd, -1)
    }

    /// Look up an MR by key.
    pub fn mr(&self, key: u32) -> Option<&Mr> {
        self.ctx.keys.mr(key)
    }

    /// Allocate a memory window; returns its rkey.
    pub fn alloc_mw(&mut self, pd: PdHandle, mw_type: MwType) -> Result<u32> {
        self.pd_ref(pd, 0)?;
        if self.ctx.keys.mw_count() as u32 >= self.ctx.cfg.caps.max_mw {
            return Err(Error::NoMemory(format!(
                "the device allows {} MWs",
                self.ctx.cfg.caps.max_mw
            )));
        }
        let k = self
            .ctx
            .keys
            .alloc_mw(pd, mw_type)
            .ok_or_else(|| Error::NoMemory("no free MW index".into()))?;
        self.pd_ref(pd, 1)?;
        Ok(k)
    }

    /// Free a memory window, named by the rkey it was allocated with (its
    /// index; a type 2 bind may have changed the key byte since).
    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<()> {
        let pd = self
            .ctx
            .keys
            .mw_any_key(rkey)
            .map(|w| w.pd)
            .ok_or_else(|| Error::NotFound(format!("memory window {rkey:#x}")))?;
        self.ctx.keys.dealloc_mw(rkey).map_err(Error::Invalid)?;
        self.pd_ref(pd, -1)
    }

    /// Look up a memory window by rkey.
    pub fn mw(&self, rkey: u32) -> Option<&Mw> {
        self.ctx.keys.mw(rkey)
    }

    /// Bind a type 1 window (`ibv_bind_mw`). Returns the window's rkey.
    /// Unlike a BIND_MW work request this takes effect at once.
    pub fn bind_mw_type1(
        &mut self,
        qpn: u32,
        mw_rkey: u32,
        bind: &crate::wr::MwBindInfo,
    ) -> Result<u32> {
        let qp = self
            .qps
            .get(&qpn)
            .ok_or_else(|| Error::NotFound(format!("QP {qpn:#x}")))?;
        match self.ctx.keys.mw(mw_rkey) {
            Some(w) if w.mw_type == MwType::Type1 => {}
            Some(_) => {
                return Err(Error::Invalid(
                    "ibv_bind_mw takes type 1 windows; bind type 2 with a BIND_MW work request"
                        .into(),
                ))
            }
            None => return Err(Error::NotFound(format!("memory window {mw_rkey:#x}"))),
        }
        let pd = qp.pd;
        self.ctx
            .keys
            .bind_mw(mw_rkey, mw_rkey as u8, pd, None, bind)
            .map_err(|e| Error::Invalid(e.0))
    }

    /// Create an address handle.
    pub fn create_ah(&mut self, pd: PdHandle, attr: &AhAttrs) -> Result<AhHandle> {
        self.pd_ref(pd, 0)?;
        let src = *self
            .ctx
            .cfg
            .gids
            .get(attr.sgid_index as usize)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "sgid_index {} is outside the GID table ({} entries)",
                    attr.sgid_index,
                    self.ctx.cfg.gids.len()
                ))
            })?;
        let (src, dst) = (
            route(&self.ctx.cfg.gids, src),
            route(&self.ctx.cfg.gids, gid_to_ip(attr.dgid)),
        );
        if src.is_ipv4() != dst.is_ipv4() {
            return Err(Error::Invalid(format!(
                "source GID {src} and destination GID {dst} are of different IP versions"
            )));
        }
        let h = AhHandle(self.handle());
        self.ctx.ahs.insert(
            h,
            Ah {
                pd,
                src,
                dst,
                flow_label: attr.flow_label,
            },
        );
        self.pd_ref(pd, 1)?;
        Ok(h)
    }

    /// Destroy an address handle.
    pub fn destroy_ah(&mut self, ah: AhHandle) -> Result<()> {
        let a = self
            .ctx
            .ahs
            .remove(&ah)
            .ok_or_else(|| Error::NotFound(format!("AH {}", ah.0)))?;
        self.pd_ref(a.pd, -1)
    }

    // ------------------------------------------------------------------
    // CQ

    /// Create a completion queue with room for `cqe` completions.
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqHandle> {
        let max = self.ctx.cfg.caps.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(Error::Invalid(format!(
                "cqe {cqe} must be between 1 and {max}"
            )));
        }
        if self.ctx.cqs.len() as u32 >= self.ctx.cfg.caps.max_cq {
            return Err(Error::NoMemory(format!(
                "the device allows {} CQs",
                self.ctx.cfg.caps.max_cq
            )));
        }
        let h = CqHandle(self.handle());
        self.ctx.cqs.insert(h, Cq::new(cqe));
        Ok(h)
    }

    /// Resize a CQ; refused if it would hold fewer than its current entries.
    pub fn resize_cq(&mut self, cq: CqHandle, cqe: u32) -> Result<()> {
        let max = self.ctx.cfg.caps.max_cqe;
        let c = self
            .ctx
            .cqs
            .get_mut(&cq)
            .ok_or_else(|| Error::NotFound(format!("CQ {}", cq.0)))?;
        if cqe == 0 || cqe > max || (cqe as usize) < c.entries.len() {
            return Err(Error::Invalid(format!(
                "cqe {cqe} must be between the {} entries it holds and {max}",
                c.entries.len().max(1)
            )));
        }
        c.cqe = cqe;
        Ok(())
    }

    /// Destroy a CQ; refused while a QP uses it.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<()> {
        let c = self
            .ctx
            .cqs
            .get(&cq)
            .ok_or_else(|| Error::NotFound(format!("CQ {}", cq.0)))?;
        if c.users > 0 {
            return Err(Error::Busy(format!(
                "CQ {} is still used by {} QP(s)",
                cq.0, c.users
            )));
        }
        self.ctx.cqs.remove(&cq);
        Ok(())
    }

    /// Take up to `max` completions, oldest first. After an overrun, the
    /// completions that made it in are returned first, then an error.
    pub fn poll_cq(&mut self, cq: CqHandle, max: usize) -> Result<Vec<WorkCompletion>> {
        let mut out = Vec::new();
        self.poll_cq_into(cq, max, &mut out)?;
        Ok(out)
    }

    /// As [`Engine::poll_cq`], appending to `out` (a vector the caller
    /// reuses: no allocation per poll). Returns how many were appended.
    pub fn poll_cq_into(
        &mut self,
        cq: CqHandle,
        max: usize,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<usize> {
        let c = self
            .ctx
            .cqs
            .get_mut(&cq)
            .ok_or_else(|| Error::NotFound(format!("CQ {}", cq.0)))?;
        if c.entries.is_empty() && c.overrun {
            return Err(Error::CqOverrun(format!(
                "CQ {} overflowed and lost completions; destroy it and its QPs",
                cq.0
            )));
        }
        let n = max.min(c.entries.len());
        out.extend(c.entries.drain(..n));
        Ok(n)
    }

    /// Number of completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqHandle) -> usize {
        self.ctx.cqs.get(&cq).map_or(0, |c| c.entries.len())
    }

    /// Arm a CQ for one notification (`ibv_req_notify_cq`). If a matching
    /// completion is already waiting it does not fire retroactively; as in
    /// verbs, the caller polls after arming.
    pub fn req_notify_cq(&mut self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        let c = self
            .ctx
            .cqs
            .get_mut(&cq)
            .ok_or_else(|| Error::NotFound(format!("CQ {}", cq.0)))?;
        c.arm = if solicited_only {
            Arm::Solicited
        } else {
            Arm::Next
        };
        Ok(())
    }

    /// Whether the CQ is armed for a notification that has not fired.
    pub fn cq_armed(&self, cq: CqHandle) -> bool {
        self.ctx
            .cqs
            .get(&cq)
            .is_some_and(|c| c.arm != crate::cq::Arm::None)
    }

    /// Leave the ICRC of the packets built from now on to the driver:
    /// their last four bytes are zero and [`Transmit::icrc`] is false until
    /// [`Transmit::write_icrc`] fills them. A driver that hands most
    /// packets to a peer on the same host that does not check them
    /// (`local_link::Icrc::Unwritten`) computes it only for those that
    /// leave by UDP or meet fault injection or a tracer. CNPs are always
    /// complete.
    pub fn defer_icrc(&mut self, on: bool) {
        self.ctx.defer_icrc = on;
    }

    /// Leave the payload of a request packet that comes from one range of
    /// one MR to the driver, when [`Memory::direct`] allows it and the
    /// ICRC is deferred too ([`Engine::defer_icrc`]): the packet is built
    /// without those bytes and says where they are
    /// ([`Transmit::gathered`]). A driver that copies most packets once
    /// more anyway (into a shared-memory ring) then copies their payload
    /// once, from the MR, instead of twice. Before anything else looks at
    /// such a packet's bytes (a socket, a tracer, fault injection, its
    /// ICRC), [`Engine::fill_gathered`] must complete it, and before the
    /// MR may go: while the engine is borrowed, as in one flush of what
    /// [`Engine::poll_transmit`] returns.
    pub fn defer_gather(&mut self, on: bool) {
        self.ctx.defer_gather = on;
    }

    /// Say, with each RC READ request whose responses go to one range of
    /// one MR, where that is ([`Transmit::read_dest`]): for a driver whose
    /// peers on the same host may write the responses' payloads there
    /// themselves, as kernel rxe's loopback runs the requester's completer
    /// in the responder's context. Memory it names is written only while
    /// the READ is outstanding; the driver must keep anything else from
    /// writing it once the work request may have ended otherwise (the QP
    /// leaving RTS, the MR deregistered).
    pub fn hint_reads(&mut self, on: bool) {
        self.ctx.hint_reads = on;
    }

    /// Copy the payload [`Engine::defer_gather`] left out of `t` into it.
    /// Nothing to do for a whole packet.
    pub fn fill_gathered(
        &self,
        t: &mut Transmit,
    ) -> std::result::Result<(), crate::mem::MemoryFault> {
        let Some(g) = t.gathered else {
            return Ok(());
        };
        let Some(dst) = t.payload.get_mut(g.at..g.at + g.len) else {
            return Err(crate::mem::MemoryFault {
                addr: g.addr,
                len: g.len,
            });
        };
        self.ctx.mem.read(g.addr, dst)?;
        t.gathered = None;
        Ok(())
    }

    /// Explain QP state changes from now on ([`Engine::poll_note`]), for
    /// `rxe-emu trace`; off by default (nothing is formatted then).
    pub fn set_tracing(&mut self, on: bool) {
        self.ctx.tracing = on;
        if !on {
            self.ctx.notes.clear();
        }
    }

    /// The next explanation of a QP state change, e.g. `QP 0x11: RTR ->
    /// RTS`, or `QP 0x11 -> ERR: ...; 3 WRs flushed`.
    pub fn poll_note(&mut self) -> Option<String> {
        self.ctx.notes.pop_front()
    }

    /// The next CQ whose armed notification fired.
    pub fn poll_cq_notification(&mut self) -> Option<CqHandle> {
        self.ctx.notify.pop_front()
    }

    /// The device is gone (its driver lost the network or its daemon):
    /// raise `DEVICE_FATAL` with `reason`, move every QP to ERR (their
    /// work requests complete with WR_FLUSH_ERR) and stop every timer.
    pub fn fail_device(&mut self, reason: &str) {
        let qpns: Vec<u32> = self.qps.keys().copied().collect();
        for qpn in qpns {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                if qp.state != QpState::Err {
                    crate::req::enter_error(
                        qp,
                        &mut self.ctx,
                        Some(format!("device failed: {reason}")),
                    );
                }
                qp.retrans_deadline = None;
                qp.rnr_deadline = None;
            }
            self.reindex(qpn);
        }
        self.ctx.event(
            AsyncEventKind::DeviceFatal,
            EventObject::Device,
            format!("the device failed: {reason}"),
        );
    }

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.ctx.events.pop_front()
    }

    // ------------------------------------------------------------------
    // SRQ

    /// Create a shared receive queue.
    pub fn create_srq(&mut self, pd: PdHandle, attr: SrqAttr) -> Result<SrqHandle> {
        self.pd_ref(pd, 0)?;
        let caps = &self.ctx.cfg.caps;
        if attr.max_wr == 0 || attr.max_wr > caps.max_srq_wr {
            return Err(Error::Invalid(format!(
                "SRQ max_wr {} must be between 1 and {}",
                attr.max_wr, caps.max_srq_wr
            )));
        }
        if attr.max_sge == 0 || attr.max_sge > caps.max_srq_sge {
            return Err(Error::Invalid(format!(
                "SRQ max_sge {} must be between 1 and {}",
                attr.max_sge, caps.max_srq_sge
            )));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(Error::Invalid(format!(
                "srq_limit {} exceeds max_wr {}",
                attr.srq_limit, attr.max_wr
            )));
        }
        if self.ctx.srqs.len() as u32 >= caps.max_srq {
            return Err(Error::NoMemory(format!(
                "the device allows {} SRQs",
                caps.max_srq
            )));
        }
        let h = SrqHandle(self.handle());
        self.ctx.srqs.insert(
            h,
            Srq {
                pd,
                xrc: None,
                queue: VecDeque::new(),
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                limit: attr.srq_limit,
                users: 0,
            },
        );
        self.pd_ref(pd, 1)?;
        Ok(h)
    }

    /// Arm the SRQ limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn modify_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> Result<()> {
        let s = self
            .ctx
            .srqs
            .get_mut(&srq)
            .ok_or_else(|| Error::NotFound(format!("SRQ {}", srq.0)))?;
        if limit > s.max_wr {
            return Err(Error::Invalid(format!(
                "srq_limit {limit} exceeds max_wr {}",
                s.max_wr
            )));
        }
        s.limit = limit;
        Ok(())
    }

    /// Resize an SRQ (`ibv_modify_srq` with `IBV_SRQ_MAX_WR`); refused
    /// below the WQEs it holds or its armed limit, as kernel rxe's
    /// `rxe_srq_chk_attr` refuses them.
    pub fn resize_srq(&mut self, srq: SrqHandle, max_wr: u32) -> Result<()> {
        let cap = self.ctx.cfg.caps.max_srq_wr;
        let s = self
            .ctx
            .srqs
            .get_mut(&srq)
            .ok_or_else(|| Error::NotFound(format!("SRQ {}", srq.0)))?;
        if max_wr == 0 || max_wr > cap {
            return Err(Error::Invalid(format!(
                "SRQ max_wr {max_wr} must be between 1 and {cap}"
            )));
        }
        if (max_wr as usize) < s.queue.len() || max_wr < s.limit {
            return Err(Error::Invalid(format!(
                "SRQ max_wr {max_wr} is below the {} WQEs it holds or its limit {}",
                s.queue.len(),
                s.limit
            )));
        }
        s.max_wr = max_wr;
        Ok(())
    }

    /// Query an SRQ: (max_wr, max_sge, limit, WQEs queued).
    pub fn query_srq(&self, srq: SrqHandle) -> Result<(SrqAttr, usize)> {
        let s = self
            .ctx
            .srqs
            .get(&srq)
            .ok_or_else(|| Error::NotFound(format!("SRQ {}", srq.0)))?;
        Ok((
            SrqAttr {
                max_wr: s.max_wr,
                max_sge: s.max_sge,
                srq_limit: s.limit,
            },
            s.queue.len(),
        ))
    }

    /// Destroy an SRQ; refused while a QP uses it.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<()> {
        let s = self
            .ctx
            .srqs
            .get(&srq)
            .ok_or_else(|| Error::NotFound(format!("SRQ {}", srq.0)))?;
        if s.users > 0 {
            return Err(Error::Busy(format!(
                "SRQ {} is still used by {} QP(s)",
                srq.0, s.users
            )));
        }
        let (pd, xrc) = (s.pd, s.xrc);
        self.ctx.srqs.remove(&srq);
        if let Some((x, cq)) = xrc {
            if let Some(u) = self.xrcds.get_mut(&x) {
                *u = u.saturating_sub(1);
            }
            if let Some(c) = self.ctx.cqs.get_mut(&cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        self.pd_ref(pd, -1)
    }

    // ------------------------------------------------------------------
    // XRC (IBTA Annex A14)

    /// Open an XRC domain (`ibv_open_xrcd`).
    pub fn alloc_xrcd(&mut self) -> Result<crate::XrcdHandle> {
        let h = crate::XrcdHandle(self.handle());
        self.xrcds.insert(h, 0);
        Ok(h)
    }

    /// Close an XRC domain: EBUSY while XRC SRQs or target QPs use it.
    pub fn dealloc_xrcd(&mut self, xrcd: crate::XrcdHandle) -> Result<()> {
        match self.xrcds.get(&xrcd) {
            None => Err(Error::NotFound(format!("XRCD {}", xrcd.0))),
            Some(&n) if n > 0 => Err(Error::Busy(format!(
                "XRCD {} is still used by {n} XRC SRQ(s) or XRC_RECV QP(s)",
                xrcd.0
            ))),
            Some(_) => {
                self.xrcds.remove(&xrcd);
                Ok(())
            }
        }
    }

    /// Create an XRC SRQ (`ibv_create_srq_ex` with `IBV_SRQT_XRC`): its
    /// receives serve every XRC_RECV QP of `xrcd` whose requests name its
    /// number, and complete on `cq`; RDMA to those QPs uses `pd`.
    pub fn create_xrc_srq(
        &mut self,
        pd: PdHandle,
        xrcd: crate::XrcdHandle,
        cq: CqHandle,
        attr: SrqAttr,
    ) -> Result<SrqHandle> {
        if !self.xrcds.contains_key(&xrcd) {
            return Err(Error::NotFound(format!("XRCD {}", xrcd.0)));
        }
        if !self.ctx.cqs.contains_key(&cq) {
            return Err(Error::NotFound(format!("CQ {}", cq.0)));
        }
        let h = self.create_srq(pd, attr)?;
        if h.0 > wire::xrceth::SRQN_MASK {
            let _ = self.destroy_srq(h);
            return Err(Error::NoMemory(
                "no SRQ number fits the XRCETH's 24 bits".into(),
            ));
        }
        if let Some(s) = self.ctx.srqs.get_mut(&h) {
            s.xrc = Some((xrcd, cq));
        }
        if let Some(c) = self.ctx.cqs.get_mut(&cq) {
            c.users += 1;
        }
        if let Some(u) = self.xrcds.get_mut(&xrcd) {
            *u += 1;
        }
        Ok(h)
    }

    /// The number peers put in the XRCETH to reach this SRQ
    /// (`ibv_get_srq_num`).
    pub fn srq_num(&self, srq: SrqHandle) -> Result<u32> {
        match self.ctx.srqs.get(&srq) {
            Some(s) if s.xrc.is_some() => Ok(srq.0),
            Some(_) => Err(Error::Invalid(format!(
                "SRQ {} is not an XRC SRQ: only those have a number",
                srq.0
            ))),
            None => Err(Error::NotFound(format!("SRQ {}", srq.0))),
        }
    }

    /// Create an XRC_RECV (target) QP in `xrcd`: no PD, CQs or queues of
    /// its own (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_XRCD`).
    pub fn create_xrc_recv_qp(&mut self, xrcd: crate::XrcdHandle) -> Result<u32> {
        if !self.xrcds.contains_key(&xrcd) {
            return Err(Error::NotFound(format!("XRCD {}", xrcd.0)));
        }
        if self.qps.len() as u32 >= self.ctx.cfg.caps.max_qp {
            return Err(Error::NoMemory(format!(
                "the device allows {} QPs",
                self.ctx.cfg.caps.max_qp
            )));
        }
        let qpn = self.alloc_qpn()?;
        let init = QpInitAttr {
            pd: PdHandle(0),
            qp_type: QpType::XrcRecv,
            send_cq: CqHandle(0),
            recv_cq: CqHandle(0),
            srq: None,
            cap: QpCap::default(),
            sq_sig_all: false,
        };
        let mut qp = Qp::new(qpn, &init, self.ctx.cfg.port_mtu);
        qp.xrcd = Some(xrcd);
        if let Some(u) = self.xrcds.get_mut(&xrcd) {
            *u += 1;
        }
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    /// Post a receive WR to an SRQ.
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: RecvWr) -> Result<()> {
        let s = self
            .ctx
            .srqs
            .get_mut(&srq)
            .ok_or_else(|| Error::NotFound(format!("SRQ {}", srq.0)))?;
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(Error::Invalid(format!(
                "{} SGEs exceed the SRQ's max_sge {}",
                wr.sg_list.len(),
                s.max_sge
            )));
        }
        if s.queue.len() >= s.max_wr as usize {
            return Err(Error::NoMemory(format!(
                "SRQ {} is full ({} WRs)",
                srq.0, s.max_wr
            )));
        }
        let length = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        s.queue.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges: wr.sg_list,
            length,
        });
        Ok(())
    }

    // ------------------------------------------------------------------
    // QP

    /// Create a queue pair; returns its QPN. The QP starts in RESET.
    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<u32> {
        if init.qp_type == QpType::XrcRecv {
            return Err(Error::Invalid(
                "an XRC_RECV QP belongs to an XRC domain: create it with create_xrc_recv_qp".into(),
            ));
        }
        self.pd_ref(init.pd, 0)?;
        let caps = self.ctx.cfg.caps.clone();
        for cq in [init.send_cq, init.recv_cq] {
            if !self.ctx.cqs.contains_key(&cq) {
                return Err(Error::NotFound(format!("CQ {}", cq.0)));
            }
        }
        let c = init.cap;
        if c.max_send_wr == 0 || c.max_send_wr > caps.max_qp_wr {
            return Err(Error::Invalid(format!(
                "max_send_wr {} must be between 1 and {}",
                c.max_send_wr, caps.max_qp_wr
            )));
        }
        if c.max_send_sge > caps.max_send_sge {
            return Err(Error::Invalid(format!(
                "max_send_sge {} exceeds {}",
                c.max_send_sge, caps.max_send_sge
            )));
        }
        if c.max_inline_data > caps.max_inline_data {
            return Err(Error::Invalid(format!(
                "max_inline_data {} exceeds {}",
                c.max_inline_data, caps.max_inline_data
            )));
        }
        if init.qp_type == QpType::XrcSend {
            // An XRC initiator only sends (IBTA A14.3.3).
            if init.srq.is_some() {
                return Err(Error::Invalid(
                    "an XRC_SEND QP receives nothing: it takes no SRQ".into(),
                ));
            }
        } else if let Some(srq) = init.srq {
            let s = self
                .ctx
                .srqs
                .get(&srq)
                .ok_or_else(|| Error::NotFound(format!("SRQ {}", srq.0)))?;
            if s.pd != init.pd {
                return Err(Error::Invalid("the SRQ belongs to another PD".into()));
            }
            if s.xrc.is_some() {
                return Err(Error::Invalid("an XRC SRQ serves XRC_RECV QPs only".into()));
            }
        } else {
            if c.max_recv_wr == 0 || c.max_recv_wr > caps.max_qp_wr {
                return Err(Error::Invalid(format!(
                    "max_recv_wr {} must be between 1 and {}",
                    c.max_recv_wr, caps.max_qp_wr
                )));
            }
            if c.max_recv_sge > caps.max_recv_sge {
                return Err(Error::Invalid(format!(
                    "max_recv_sge {} exceeds {}",
                    c.max_recv_sge, caps.max_recv_sge
                )));
            }
        }
        if self.qps.len() as u32 >= caps.max_qp {
            return Err(Error::NoMemory(format!(
                "the device allows {} QPs",
                caps.max_qp
            )));
        }
        let qpn = self.alloc_qpn()?;
        let qp = Qp::new(qpn, &init, self.ctx.cfg.port_mtu);
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.ctx.cqs.get_mut(&cq) {
                c.users += 1;
            }
        }
        if let Some(s) = init.srq.and_then(|s| self.ctx.srqs.get_mut(&s)) {
            s.users += 1;
        }
        self.pd_ref(init.pd, 1)?;
        self.qps.insert(qpn, qp);
        Ok(qpn)
    }

    fn alloc_qpn(&mut self) -> Result<u32> {
        let (lo, hi) = self.ctx.cfg.qpn_range;
        let span = u64::from(hi - lo) + 1;
        for _ in 0..span.min(1 << 24) {
            let q = self.next_qpn;
            self.next_qpn = if q >= hi { lo } else { q + 1 };
            if !self.qps.contains_key(&q) {
                return Ok(q);
            }
        }
        Err(Error::NoMemory("no free QP number".into()))
    }

    /// Destroy a QP. Outstanding work is discarded without completions, as
    /// with `ibv_destroy_qp`; windows bound to it become invalid.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        if !self.qps.contains_key(&qpn) {
            return Err(Error::NotFound(format!("QP {qpn:#x}")));
        }
        let groups = self.mcast.of_qp(qpn);
        if !groups.is_empty() {
            // Kernel uverbs refuses too (uverbs_free_qp: EBUSY while the
            // QP's mcast list is not empty); a process that exits is
            // detached by its driver (detach_all_mcast).
            return Err(Error::Busy(format!(
                "QP {qpn:#x} is still attached to {} multicast group(s) (first {}): detach it first",
                groups.len(),
                std::net::Ipv6Addr::from(groups[0])
            )));
        }
        let qp = self
            .qps
            .remove(&qpn)
            .ok_or_else(|| Error::NotFound(format!("QP {qpn:#x}")))?;
        if let Some(t) = qp.timer_key {
            self.timers.remove(&(t, qpn));
        }
        if let Some(x) = qp.xrcd {
            // An XRC target owns no PD, CQ or SRQ (it borrows its SRQ's for
            // each request): only its domain counts it.
            if let Some(u) = self.xrcds.get_mut(&x) {
                *u = u.saturating_sub(1);
            }
            return Ok(());
        }
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.ctx.cqs.get_mut(&cq) {
                c.users = c.users.saturating_sub(1);
            }
        }
        if let Some(s) = qp.srq.and_then(|s| self.ctx.srqs.get_mut(&s)) {
            s.users = s.users.saturating_sub(1);
        }
        self.ctx.keys.invalidate_windows_of_qp(qpn);
        self.pd_ref(qp.pd, -1)
    }

    // ------------------------------------------------------------------
    // Multicast

    /// Attach UD QP `qpn` to the multicast group `gid` (`ibv_attach_mcast`).
    /// `Ok(true)` when the group is new on this device: the driver must
    /// start receiving the group's address. Attaching twice is a no-op.
    pub fn attach_mcast(&mut self, qpn: u32, gid: [u8; 16]) -> Result<bool> {
        let qp = self
            .qps
            .get(&qpn)
            .ok_or_else(|| Error::NotFound(format!("QP {qpn:#x}")))?;
        if qp.qp_type != QpType::Ud {
            return Err(Error::Invalid(format!(
                "QP {qpn:#x} is {:?}: only UD QPs join multicast groups",
                qp.qp_type
            )));
        }
        let ip = gid_to_ip(gid);
        // The device's address (GID 0 may be the link-local GID derived
        // from an IPv4 address: route() maps it back).
        let gids = &self.ctx.cfg.gids;
        let local = gids.first().map(|g| route(gids, *g));
        if local.is_some_and(|l| l.is_ipv4() != ip.is_ipv4()) {
            return Err(Error::Invalid(format!(
                "multicast group {ip} and the device's address {} are of different IP versions",
                local.map_or(String::new(), |l| l.to_string())
            )));
        }
        self.mcast.attach(&self.ctx.cfg.caps, qpn, gid)
    }

    /// Detach `qpn` from `gid` (`ibv_detach_mcast`). `Ok(true)` when the
    /// group has no member left: the driver may stop receiving it.
    pub fn detach_mcast(&mut self, qpn: u32, gid: [u8; 16]) -> Result<bool> {
        if !self.qps.contains_key(&qpn) {
            return Err(Error::NotFound(format!("QP {qpn:#x}")));
        }
        self.mcast.detach(qpn, gid)
    }

    /// Detach `qpn` from every group, as the kernel does for a process that
    /// exits; returns the groups left without members.
    pub fn detach_all_mcast(&mut self, qpn: u32) -> Vec<[u8; 16]> {
        self.mcast.detach_all(qpn)
    }

    /// The groups QP `qpn` is attached to.
    pub fn qp_mcast_groups(&self, qpn: u32) -> Vec<[u8; 16]> {
        self.mcast.of_qp(qpn)
    }

    /// Every multicast group with a member on this device.
    pub fn mcast_groups(&self) -> Vec<[u8; 16]> {
        self.mcast.gids()
    }

    /// QPNs of all QPs.
    pub fn qp_numbers(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.qps.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Current state of a QP.
    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(&qpn).map(|q| q.state)
    }

    /// Why a QP is in the error state, in words (None if it is not, or was
    /// moved there by modify_qp without a failure).
    pub fn qp_error_reason(&self, qpn: u32) -> Option<&str> {
        self.qps
            .get(&qpn)
            .and_then(|q| q.error_cause.as_ref().map(|c| c.0.as_str()))
    }

    /// QP `qpn`'s share of the device's counters (see [`QpSummary::counters`]).
    pub fn qp_counters(&self, qpn: u32) -> Option<Counters> {
        self.qps.get(&qpn).map(|q| q.counters.clone())
    }

    /// A one-line view of every QP, ordered by QPN: for `rxe-emu qp show`
    /// and for people debugging a stuck connection.
    pub fn qp_summaries(&self) -> Vec<QpSummary> {
        let mut v: Vec<QpSummary> = self
            .qps
            .values()
            .map(|q| QpSummary {
                qpn: q.qpn,
                qp_type: q.qp_type,
                state: q.state,
                dest_qpn: q.attr.dest_qp_num,
                peer: q.path.map(|(_, remote)| remote),
                sq_psn: q.req_psn.value(),
                unacked_psn: q.comp_psn.value(),
                rq_psn: q.resp_psn.value(),
                send_wrs: q.sq.len(),
                recv_wrs: q.rq.len(),
                error: q.error_cause.as_ref().map(|c| c.0.clone()),
                counters: q.counters.clone(),
            })
            .collect();
        v.sort_by_key(|s| s.qpn);
        v
    }

    /// Whether QP `qpn` still has work whose completion its owner will
    /// poll for: send WRs not yet completed, or receive WRs posted (on
    /// its RQ or its SRQ). A driver uses it to guess, after a poll that
    /// returned this QP's completion, whether the application keeps
    /// polling (ib_send_lat waits for its next receive) or now waits for
    /// something else (ib_write_lat watches memory for the peer's WRITE).
    pub fn qp_awaits_completions(&self, qpn: u32) -> bool {
        let Some(q) = self.qps.get(&qpn) else {
            return false;
        };
        let srq_wrs = q
            .srq
            .and_then(|h| self.ctx.srqs.get(&h))
            .is_some_and(|s| !s.queue.is_empty());
        !q.sq.is_empty() || !q.rq.is_empty() || srq_wrs
    }

    /// How many times a QP entered ERR (a fault of its requester or
    /// responder, or `modify_qp`): a driver that publishes
    /// [`Engine::write_target`] looks at its QPs again when this changes
    /// (a fault may happen in any call).
    pub fn qp_errors(&self) -> u64 {
        self.ctx.qp_errors
    }

    /// The responder of RC QP `qpn`, if it would execute an RDMA WRITE
    /// ONLY or FIRST at its next expected PSN now, without anything before it: the
    /// QP is in RTR or RTS, allows remote writes, and has no message, READ
    /// reply or held request in progress. Returns its PD and that PSN. A
    /// driver publishes this so that a sender on the same host may write
    /// such a packet's payload into our memory itself (kernel rxe's
    /// loopback does the responder's work in the sender's context); the
    /// packet then still comes here and is checked as any other.
    pub fn write_target(&self, qpn: u32) -> Option<(PdHandle, Psn)> {
        self.placeable_responder(qpn, |w| w.is_none_or(|w| w.resid == 0))
    }

    /// The responder of RC QP `qpn`, if it is in the middle of an RDMA
    /// WRITE message (its FIRST taken, bytes left) that it would go on
    /// executing: as [`Engine::write_target`] but for the WRITE in
    /// progress. Returns its PD and the PSN it expects next. A driver
    /// publishes this after a FIRST so that a sender on the same host that
    /// placed that FIRST may place the rest of the message.
    pub fn write_continuing(&self, qpn: u32) -> Option<(PdHandle, Psn)> {
        self.placeable_responder(qpn, |w| w.is_some_and(|w| w.resid > 0))
    }

    /// Whether RC QP `qpn`'s responder would take a request at `psn` (24
    /// bits) as new, not as a duplicate: it is in RTR or RTS (or SQD) and
    /// expects that PSN next. Returns the QP it answers (its destination
    /// QP). A driver whose peers on this host say where a READ's
    /// responses go ([`Engine::hint_reads`]) keeps that only for a READ
    /// taken as new: a duplicate is answered again, maybe after the first
    /// answer completed the READ.
    pub fn takes_new_request(&self, qpn: u32, psn: u32) -> Option<u32> {
        let q = self.qps.get(&qpn)?;
        let new = q.qp_type == QpType::Rc
            && matches!(q.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
            && q.resp_psn.value() == psn & 0x00ff_ffff;
        new.then_some(q.attr.dest_qp_num)
    }

    /// RC QP `qpn`'s PD and next expected PSN, if it is in RTR or RTS,
    /// allows remote writes, has no SEND, READ reply or held request in
    /// progress, drops no message, and its WRITE in progress (if any)
    /// satisfies `write`.
    fn placeable_responder(
        &self,
        qpn: u32,
        write: impl FnOnce(Option<crate::qp::ActiveWrite>) -> bool,
    ) -> Option<(PdHandle, Psn)> {
        let q = self.qps.get(&qpn)?;
        let ready = q.qp_type == QpType::Rc
            && matches!(q.state, QpState::Rtr | QpState::Rts)
            && AccessFlags::from_bits_truncate(q.attr.qp_access_flags)
                .contains(AccessFlags::REMOTE_WRITE)
            && q.recv.is_none()
            && write(q.write)
            && q.read_reply.is_none()
            && q.deferred.is_empty()
            && !q.drop_msg;
        ready.then_some((q.pd, q.resp_psn))
    }

    /// `ibv_query_qp`: current attributes and creation attributes.
    pub fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr)> {
        let q = self
            .qps
            .get(&qpn)
            .ok_or_else(|| Error::NotFound(format!("QP {qpn:#x}")))?;
        let mut a = q.attr;
        a.qp_state = Some(q.state);
        a.cur_qp_state = Some(if self.ctx.cfg.release.query_qp_reports_cur_state() {
            q.state
        } else {
            QpState::Reset
        });
        a.sq_draining = q.sq_draining;
        a.sq_psn = q.req_psn.value();
        a.rq_psn = q.resp_psn.value();
        a.cap = q.cap;
        Ok((
            a,
            QpInitAttr {
                pd: q.pd,
                qp_type: q.qp_type,
                send_cq: q.send_cq,
                recv_cq: q.recv_cq,
                srq: q.srq,
                cap: q.cap,
                sq_sig_all: q.sq_sig_all,
            },
        ))
    }

    /// `ibv_modify_qp`. Transitions and attribute masks are checked against
    /// IBTA (see [`qp_attr::validate_transition`]); a refusal names the
    /// missing or forbidden attribute.
    pub fn modify_qp(
        &mut self,
        now: Instant,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<()> {
        let before = self.qps.get(&qpn).map(|q| q.state);
        let r = self.modify_qp_inner(now, qpn, attr, mask);
        let after = self.qps.get(&qpn).map(|q| q.state);
        if let (Some(b), Some(a)) = (before, after) {
            if a != b {
                self.ctx
                    .note(|| format!("QP {qpn:#x}: {b:?} -> {a:?} (modify_qp)"));
            }
        }
        self.reindex(qpn);
        r
    }

    fn modify_qp_inner(
        &mut self,
        now: Instant,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<()> {
        let port_mtu = self.ctx.cfg.port_mtu;
        let caps = self.ctx.cfg.caps.clone();
        let qp = self
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| Error::NotFound(format!("QP {qpn:#x}")))?;
        let next = qp_attr::validate_transition(qp.qp_type, qp.state, mask, attr)?;
        qp_attr::check_sqd_drain(qp.qp_type, qp.state, mask, next, qp.sq_draining)?;
        qp_attr::check_values(mask, attr, &caps, port_mtu)?;
        if mask.contains(QpAttrMask::AV) {
            let src = *self
                .ctx
                .cfg
                .gids
                .get(attr.ah_attr.sgid_index as usize)
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "IBV_QP_AV: sgid_index {} is outside the GID table ({} entries)",
                        attr.ah_attr.sgid_index,
                        self.ctx.cfg.gids.len()
                    ))
                })?;
            let (src, dst) = (
                route(&self.ctx.cfg.gids, src),
                route(&self.ctx.cfg.gids, gid_to_ip(attr.ah_attr.dgid)),
            );
            if src.is_ipv4() != dst.is_ipv4() {
                return Err(Error::Invalid(format!(
                    "IBV_QP_AV: source GID {src} and destination GID {dst} are of different IP versions"
                )));
            }
            qp.path = Some((src, dst));
            qp.attr.ah_attr = attr.ah_attr;
        }
        if mask.contains(QpAttrMask::ALT_PATH) {
            qp.attr.alt_ah_attr = attr.alt_ah_attr;
            qp.attr.alt_pkey_index = attr.alt_pkey_index;
            qp.attr.alt_port_num = attr.alt_port_num;
            qp.attr.alt_timeout = attr.alt_timeout;
        }
        if mask.contains(QpAttrMask::PATH_MTU) {
            if let Some(m) = attr.path_mtu {
                qp.attr.path_mtu = Some(m);
                if qp.qp_type != QpType::Ud {
                    qp.mtu = m.min(port_mtu).bytes();
                }
            }
        }
        macro_rules! copy {
            ($($bit:ident => $f:ident),*) => {$(
                if mask.contains(QpAttrMask::$bit) { qp.attr.$f = attr.$f; }
            )*};
        }
        copy!(ACCESS_FLAGS => qp_access_flags, PKEY_INDEX => pkey_index, PORT => port_num,
              QKEY => qkey, TIMEOUT => timeout, RETRY_CNT => retry_cnt, RNR_RETRY => rnr_retry,
              MAX_QP_RD_ATOMIC => max_rd_atomic, MIN_RNR_TIMER => min_rnr_timer,
              MAX_DEST_RD_ATOMIC => max_dest_rd_atomic, PATH_MIG_STATE => path_mig_state,
              DEST_QPN => dest_qp_num, EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify,
              RATE_LIMIT => rate_limit);
        if mask.contains(QpAttrMask::CAP) {
            qp.attr.cap = attr.cap;
        }
        if mask.contains(QpAttrMask::SQ_PSN) {
            qp.req_psn = Psn::new(attr.sq_psn);
            qp.fresh_psn = qp.req_psn;
            qp.comp_psn = qp.req_psn;
            qp.attr.sq_psn = attr.sq_psn;
        }
        if mask.contains(QpAttrMask::RQ_PSN) {
            qp.resp_psn = Psn::new(attr.rq_psn);
            qp.attr.rq_psn = attr.rq_psn;
        }
        if mask.intersects(QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY) {
            qp.reset_retry_counters();
        }
        if qp.qp_type != QpType::Ud && mask.intersects(QpAttrMask::AV | QpAttrMask::DEST_QPN) {
            qp.src_port = crate::qp::connected_src_port(
                qp.attr.ah_attr.flow_label,
                qp.qpn,
                qp.attr.dest_qp_num,
            );
        }
        let prev = qp.state;
        qp.state = next;
        qp.attr.qp_state = Some(next);
        match (prev, next) {
            (_, QpState::Reset) => {
                qp.reset();
                // Deviation from kernel rxe, as ConnectX (mlx4/mlx5
                // providers' cq_clean on RESET): completions of this QP
                // still in its CQs are discarded, so a QP reset after an
                // error and reused never hands its new work the old flushes.
                let qpn = qp.qpn;
                for h in [qp.send_cq, qp.recv_cq] {
                    if let Some(cq) = self.ctx.cqs.get_mut(&h) {
                        cq.entries.retain(|wc| wc.qp_num != qpn);
                    }
                }
            }
            (p, QpState::Err) if p != QpState::Err => {
                crate::req::enter_error(qp, &mut self.ctx, None);
            }
            (QpState::Rts, QpState::Sqd) => {
                qp.sq_draining = true;
                crate::req::check_drained(qp, &mut self.ctx);
            }
            (_, QpState::Rts) => {
                if prev != QpState::Rts {
                    qp.reset_retry_counters();
                }
                qp.sq_draining = false;
                crate::req::run(qp, &mut self.ctx, now);
            }
            _ => {}
        }
        Ok(())
    }

    /// Post a send work request.
    pub fn post_send(&mut self, now: Instant, qpn: u32, wr: SendWr) -> Result<()> {
        self.post_send_list(now, qpn, std::iter::once(wr))
            .map_err(|(_, e)| e)
    }

    /// Post a list of send work requests (`ibv_post_send`'s chain) as
    /// kernel rxe does: every one is queued before the requester runs, so
    /// the packets of each but the last are built with work waiting behind
    /// them ([`Transmit::last_posted`] is false). Stops at the first that
    /// is refused: the ones before it stay posted (and are sent), and the
    /// error comes with its index in the list.
    pub fn post_send_list(
        &mut self,
        now: Instant,
        qpn: u32,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        let r = self.post_send_list_inner(now, qpn, wrs);
        self.reindex(qpn);
        r
    }

    fn post_send_list_inner(
        &mut self,
        now: Instant,
        qpn: u32,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> std::result::Result<(), (usize, Error)> {
        let qp = self
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| (0, Error::NotFound(format!("QP {qpn:#x}"))))?;
        let mut posted = 0;
        let mut refused = None;
        for wr in wrs {
            match validate_send(qp, &mut self.ctx, wr) {
                Ok(wqe) => {
                    qp.sq.push_back(wqe);
                    posted += 1;
                }
                Err(e) => {
                    refused = Some((posted, e));
                    break;
                }
            }
        }
        if posted > 0 {
            match qp.state {
                QpState::Err | QpState::Sqe => crate::req::flush_send_queue(qp, &mut self.ctx),
                _ => crate::req::run(qp, &mut self.ctx, now),
            }
        }
        refused.map_or(Ok(()), Err)
    }

    /// Post a receive work request to a QP's own receive queue.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<()> {
        let qp = self
            .qps
            .get_mut(&qpn)
            .ok_or_else(|| Error::NotFound(format!("QP {qpn:#x}")))?;
        if qp.qp_type.is_xrc() {
            return Err(Error::Invalid(format!(
                "QP {qpn:#x} is {}: XRC receives are posted to an XRC SRQ",
                qp.qp_type
            )));
        }
        if qp.srq.is_some() {
            return Err(Error::Invalid(format!(
                "QP {qpn:#x} uses an SRQ; post receives with post_srq_recv"
            )));
        }
        if qp.state == QpState::Reset {
            return Err(Error::Invalid(format!(
                "QP {qpn:#x} is in RESET; move it to INIT before posting receives"
            )));
        }
        if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
            return Err(Error::Invalid(format!(
                "{} SGEs exceed the QP's max_recv_sge {}",
                wr.sg_list.len(),
                qp.cap.max_recv_sge
            )));
        }
        if qp.rq.len() >= qp.cap.max_recv_wr as usize {
            return Err(Error::NoMemory(format!(
                "receive queue of QP {qpn:#x} is full ({} WRs)",
                qp.cap.max_recv_wr
            )));
        }
        let length = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        qp.rq.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges: wr.sg_list,
            length,
        });
        if qp.state == QpState::Err {
            crate::resp::flush_recv_queue(qp, &mut self.ctx);
        }
        Ok(())
    }

    // ------------------------------------------------------------------
    // I/O

    /// Feed one received datagram.
    pub fn handle_datagram(&mut self, now: Instant, dg: &RxDatagram<'_>) {
        if let Some(qpn) = crate::recv::handle(self, now, dg, true) {
            self.reindex(qpn);
        }
    }

    /// Feed one received datagram whose ICRC the driver knows to be right
    /// without checking it: a process of this host built it and handed it
    /// over through memory, with nothing (no fault injection) changing it
    /// since. Everything else is checked as by
    /// [`Engine::handle_datagram`]; only the ICRC pass over the whole
    /// packet is saved (kernel rxe checks it on loopback too, where it
    /// cannot fail either).
    pub fn handle_intact_datagram(&mut self, now: Instant, dg: &RxDatagram<'_>) {
        if let Some(qpn) = crate::recv::handle(self, now, dg, false) {
            self.reindex(qpn);
        }
    }

    /// Hand back a sent packet's bytes (`Transmit::payload`) for the
    /// packets still to come. Optional: a driver that drops them instead
    /// costs an allocation per packet, nothing else. Its bytes are
    /// overwritten before they are sent again.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.ctx.spare.put(buf);
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        loop {
            if let Some(t) = self.ctx.out.pop_front() {
                return Some(t);
            }
            // Nothing queued: build the next response of a READ reply,
            // one QP after another. When a reply ends, the requests that
            // waited behind it are handled (they may queue packets,
            // completions and events, or start another READ reply).
            let qpn = self.ctx.read_ready.pop_front()?;
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if crate::resp::continue_read(qp, &mut self.ctx) {
                self.ctx.read_ready.push_back(qpn);
            } else {
                crate::resp::resume_deferred(qp, &mut self.ctx);
                self.reindex(qpn);
            }
        }
    }

    /// The driver could not send a datagram (counted as `send_err`; the
    /// transport recovers as from a loss).
    pub fn note_send_error(&mut self) {
        self.ctx.counters.send_err += 1;
    }

    /// The driver discarded `n` packets that arrived malformed before
    /// they reached the engine (an inconsistent shared-memory ring):
    /// counted as `rcvd_malformed`.
    pub fn note_malformed(&mut self, n: u64) {
        self.ctx.counters.rcvd_malformed += n;
    }

    /// Number of datagrams built and waiting to be sent. READ replies
    /// under way build theirs as `poll_transmit` asks, and are not counted.
    pub fn pending_transmits(&self) -> usize {
        self.ctx.out.len()
    }

    /// Whether `poll_transmit` has anything to give.
    pub fn has_transmit(&self) -> bool {
        !self.ctx.out.is_empty() || !self.ctx.read_ready.is_empty()
    }

    /// Whether the driver has anything to take from the engine: what
    /// [`Engine::has_transmit`] says, an asynchronous event, a CQ
    /// notification or a trace note. A driver that flushes after every
    /// call may skip a flush when this is false.
    pub fn has_output(&self) -> bool {
        let c = &self.ctx;
        self.has_transmit() || !(c.events.is_empty() && c.notify.is_empty() && c.notes.is_empty())
    }

    /// The earliest deadline at which `handle_timeout` must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|(t, _)| *t)
    }

    /// Fire every deadline at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .timers
            .range(..=(now, u32::MAX))
            .map(|(_, q)| *q)
            .collect();
        for qpn in due {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                crate::comp::on_timeout(qp, &mut self.ctx, now);
                crate::cc::on_timeout(qp, &mut self.ctx, now);
            }
            self.reindex(qpn);
        }
    }

    /// Bring QP `qpn`'s entry of the timer index up to date.
    pub(crate) fn reindex(&mut self, qpn: u32) {
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        let (old, new) = (q.timer_key, q.next_deadline());
        if old == new {
            return;
        }
        q.timer_key = new;
        if let Some(t) = old {
            self.timers.remove(&(t, qpn));
        }
        if let Some(t) = new {
            self.timers.insert((t, qpn));
        }
    }

    /// Whether the timer index agrees with every QP's deadlines (a check
    /// for tests and simulators; O(number of QPs)).
    pub fn timer_index_consistent(&self) -> bool {
        let want: std::collections::BTreeSet<(Instant, u32)> = self
            .qps
            .iter()
            .filter_map(|(n, q)| q.next_deadline().map(|t| (t, *n)))
            .collect();
        want == self.timers
    }
}

/// Kernel rxe registers `IBV_ACCESS_FLUSH_PERSISTENT` only over
/// persistent-memory pages (`rxe_mr_fill_pages_from_sgt`: "Unable to
/// register persistent access to non-pmem device", -EINVAL). No memory
/// this engine is given is persistent, so it is always refused, with
/// EINVAL; `IBV_ACCESS_FLUSH_GLOBAL` is accepted. Before 6.2 neither
/// flag existed: the core refused both as unknown access bits (EINVAL).
fn refuse_flush_access(release: crate::model::RxeRelease, access: AccessFlags) -> Result<()> {
    let flush = AccessFlags::FLUSH_GLOBAL | AccessFlags::FLUSH_PERSISTENT;
    if !release.has_flush_and_atomic_write() && access.intersects(flush) {
        return Err(Error::Invalid(format!(
            "IBV_ACCESS_FLUSH_GLOBAL/PERSISTENT: unknown to kernel rxe {} (FLUSH came in 6.2)",
            release.name()
        )));
    }
    if access.contains(AccessFlags::FLUSH_PERSISTENT) {
        return Err(Error::Invalid(
            "IBV_ACCESS_FLUSH_PERSISTENT needs persistent memory (pmem), and this memory is not"
                .into(),
        ));
    }
    Ok(())
}

/// Check a send WR against the QP, as kernel `validate_send_wr` and
/// `rxe_post_send` do, and turn it into a WQE.
fn validate_send<M: Memory>(qp: &Qp, ctx: &mut Ctx<M>, wr: SendWr) -> Result<SendWqe> {
    use crate::wr::SendOp;
    let qpn = qp.qpn;
    if matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr) {
        return Err(Error::Invalid(format!(
            "QP {qpn:#x} is in {}; post sends only once it is in RTS",
            qp.state
        )));
    }
    let allowed = match qp.qp_type {
        QpType::Rc => true,
        QpType::Uc => matches!(
            wr.op,
            SendOp::Send
                | SendOp::SendWithImm { .. }
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaWriteWithImm { .. }
                | SendOp::LocalInv { .. }
                | SendOp::BindMw { .. }
        ),
        QpType::Ud => matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }),
        // XRC has RC's operations but FLUSH and ATOMIC WRITE (Annex A14
        // predates A19; wire::Opcode::to_xrc has no twin for them); a
        // target QP sends nothing.
        QpType::XrcSend => !matches!(wr.op, SendOp::AtomicWrite { .. } | SendOp::Flush { .. }),
        QpType::XrcRecv => false,
    };
    if matches!(wr.op, SendOp::AtomicWrite { .. } | SendOp::Flush { .. })
        && !ctx.cfg.release.has_flush_and_atomic_write()
    {
        return Err(Error::Invalid(format!(
            "opcode {} is unknown to kernel rxe {} (FLUSH and ATOMIC WRITE came in 6.2)",
            wr.op.name(),
            ctx.cfg.release.name()
        )));
    }
    if qp.qp_type == QpType::XrcSend && wr.xrc_remote_srqn.is_none() {
        return Err(Error::Invalid(
            "a WR on an XRC_SEND QP must name the remote XRC SRQ (remote_srqn)".into(),
        ));
    }
    if !allowed {
        return Err(Error::Invalid(format!(
            "opcode {} is not supported on a {} QP",
            wr.op.name(),
            qp.qp_type
        )));
    }
    if wr.sg_list.len() > qp.cap.max_send_sge as usize {
        return Err(Error::Invalid(format!(
            "{} SGEs exceed the QP's max_send_sge {}",
            wr.sg_list.len(),
            qp.cap.max_send_sge
        )));
    }
    let live = qp.sq.len();
    if live >= qp.cap.max_send_wr as usize {
        return Err(Error::NoMemory(format!(
            "send queue of QP {qpn:#x} is full ({} WRs outstanding)",
            qp.cap.max_send_wr
        )));
    }
    let length64: u64 = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    if length64 > u64::from(u32::MAX >> 1) {
        return Err(Error::Invalid(format!(
            "message length {length64} exceeds 2^31 - 1 bytes"
        )));
    }
    // A FLUSH moves no local data: its length is the RETH's, which is also
    // what its completion reports (kernel make_send_cqe: `wqe->dma.length`,
    // which the rxe provider's wr_flush sets to the flush length).
    let length = match wr.op {
        SendOp::Flush { length, .. } => length,
        _ => length64 as u32,
    };
    if wr.op.is_atomic() {
        let addr = match wr.op {
            SendOp::AtomicCmpSwp { remote_addr, .. }
            | SendOp::AtomicFetchAdd { remote_addr, .. } => remote_addr,
            _ => 0,
        };
        if addr & 7 != 0 {
            return Err(Error::Invalid(format!(
                "atomic remote address {addr:#x} is not 8-byte aligned"
            )));
        }
        if length < 8 {
            return Err(Error::Invalid(format!(
                "atomic operations need an 8-byte local buffer; the SGEs hold {length}"
            )));
        }
    }
    if matches!(wr.op, SendOp::AtomicWrite { .. }) && length != 8 {
        // Kernel rxe sends `wqe->dma.length` bytes with no check (its
        // provider's ibv_wr_atomic_write always sets 8); an ATOMIC WRITE
        // of any other length is meaningless, so it is refused here.
        return Err(Error::Invalid(format!(
            "ATOMIC_WRITE writes exactly 8 bytes; the WR's data holds {length}"
        )));
    }
    let mut inline = None;
    if wr.flags.contains(SendFlags::INLINE) && wr.op.carries_payload() {
        // The 8 bytes of an ATOMIC WRITE are the operation's operand, which
        // the rxe provider copies into the WQE whatever max_inline_data is.
        let operand = matches!(wr.op, SendOp::AtomicWrite { .. });
        if length > qp.cap.max_inline_data && !operand {
            return Err(Error::Invalid(format!(
                "inline data of {length} bytes exceeds the QP's max_inline_data {}",
                qp.cap.max_inline_data
            )));
        }
        // IBTA 10.8.3.1: inline data is copied at post time; lkeys are ignored.
        let mut data = vec![0u8; length as usize];
        let mut off = 0usize;
        for s in &wr.sg_list {
            let end = off + s.length as usize;
            ctx.mem
                .read(s.addr, &mut data[off..end])
                .map_err(|e| Error::Invalid(format!("inline data cannot be read: {e}")))?;
            off = end;
        }
        inline = Some(data);
    }
    let mut ud = None;
    if qp.qp_type == QpType::Ud {
        let d = wr.ud.ok_or_else(|| {
            Error::Invalid(
                "a UD send needs a destination (address handle, remote QPN, Q_Key)".into(),
            )
        })?;
        let ah = ctx
            .ahs
            .get(&d.ah)
            .ok_or_else(|| Error::Invalid(format!("address handle {} does not exist", d.ah.0)))?;
        if ah.pd != qp.pd {
            return Err(Error::Invalid(
                "the address handle belongs to another PD than the QP".into(),
            ));
        }
        // IBTA 10.2.5: a Q_Key with the high bit set means "use the QP's Q_Key".
        let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
            qp.attr.qkey
        } else {
            d.remote_qkey
        };
        ud = Some(UdTarget {
            src: ah.src,
            dst: ah.dst,
            src_port: crate::model::ud_src_port(
                ctx.cfg.cc.model,
                qp.src_port,
                d.ah.0,
                ah.flow_label,
            ),
            qpn: d.remote_qpn & 0x00ff_ffff,
            qkey,
        });
    }
    let signaled = qp.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
    Ok(SendWqe {
        wr,
        inline,
        state: WqeState::Posted,
        status: WcStatus::Success,
        length,
        first_psn: Psn::new(0),
        last_psn: Psn::new(0),
        offset: 0,
        ud,
        signaled,
        started: false,
        error_reason: None,
    })
}

/// A flushed completion for a WR of the send queue.
pub(crate) fn flushed_send_wc(qp: &Qp, wqe: &SendWqe) -> WorkCompletion {
    WorkCompletion::new(
        wqe.wr.wr_id,
        WcStatus::WrFlushErr,
        wqe.wr.op.wc_opcode(),
        qp.qpn,
    )
}

/// A flushed completion for a receive WR.
pub(crate) fn flushed_recv_wc(qp: &Qp, wr_id: u64) -> WorkCompletion {
    let mut wc = WorkCompletion::new(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qp.qpn);
    wc.wc_flags = WcFlags::empty();
    wc
}

/// Record why the QP failed (first cause wins).
pub(crate) fn set_cause(qp: &mut Qp, why: String) {
    if qp.error_cause.is_none() {
        qp.error_cause = Some(ErrorCause(why));
    }
}
