//! Building outgoing packets.

use std::net::IpAddr;

use wire::aeth::AethRepr;
use wire::atomic::{AtomicAckRepr, AtomicEthRepr};
use wire::bth::BthRepr;
use wire::deth::DethRepr;
use wire::feth::FethRepr;
use wire::icrc::IpUdpInfo;
use wire::ieth::IethRepr;
use wire::immdt::ImmDtRepr;
use wire::reth::RethRepr;
use wire::xrceth::XrcEthRepr;
use wire::{Opcode, PacketRepr, Psn, ROCEV2_UDP_PORT};

use crate::engine::{Ctx, Gathered, Transmit};

/// Default P_Key (full membership), as kernel rxe sends.
pub(crate) const DEFAULT_PKEY: u16 = 0xffff;

/// The largest payload of one packet (MTU 4096).
const MAX_PAYLOAD: usize = 4096;
static ZEROS: [u8; MAX_PAYLOAD] = [0; MAX_PAYLOAD];

/// Everything of a packet but its payload bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Headers {
    pub opcode: Opcode,
    pub dest_qpn: u32,
    pub psn: Psn,
    pub ack_req: bool,
    pub solicited: bool,
    pub reth: Option<RethRepr>,
    /// The FETH of a FLUSH.
    pub feth: Option<FethRepr>,
    pub atomic: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack: Option<AtomicAckRepr>,
    pub deth: Option<DethRepr>,
    pub immdt: Option<u32>,
    pub ieth: Option<u32>,
    /// The target XRC SRQ of a request from an XRC_SEND QP.
    pub xrc_srqn: Option<u32>,
}

impl Headers {
    pub fn new(opcode: Opcode, dest_qpn: u32, psn: Psn) -> Self {
        Headers {
            opcode,
            dest_qpn,
            psn,
            ack_req: false,
            solicited: false,
            reth: None,
            feth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            deth: None,
            immdt: None,
            ieth: None,
            xrc_srqn: None,
        }
    }
}

/// Where a packet goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    /// The QP is an XRC one: the engine's RC opcodes go out as their XRC
    /// twins, requests with an XRCETH (IBTA A14).
    pub xrc: bool,
    /// The BTH MigReq bit ([`crate::model::bth_mig_req`]).
    pub mig_req: bool,
}

/// Build a packet with `payload_len` bytes filled by `fill`, compute its ICRC
/// and queue it. `fill` gets the payload area and may fail (a local
/// protection error); then nothing is queued. It may instead leave the
/// area unwritten and return where the bytes are ([`Gathered`]), which it
/// does only under [`Ctx::defer_gather`] (see [`gathers`]).
pub(crate) fn emit<M, E>(
    ctx: &mut Ctx<M>,
    route: Route,
    h: &Headers,
    payload_len: usize,
    fill: impl FnOnce(&mut Ctx<M>, &mut [u8]) -> Result<Option<u64>, E>,
) -> Result<(), EmitError<E>> {
    if payload_len > MAX_PAYLOAD {
        return Err(EmitError::Build(wire::Error::Malformed));
    }
    let (opcode, xrceth) = if route.xrc {
        let x = h
            .opcode
            .to_xrc()
            .ok_or(EmitError::Build(wire::Error::UnknownOpcode(h.opcode.0)))?;
        let has_eth = x
            .info()
            .is_some_and(|i| i.flags.contains(wire::OpFlags::XRCETH));
        let eth = match (has_eth, h.xrc_srqn) {
            (true, Some(srqn)) => Some(XrcEthRepr { srqn }),
            (true, None) => return Err(EmitError::Build(wire::Error::Malformed)),
            (false, _) => None,
        };
        (x, eth)
    } else {
        (h.opcode, None)
    };
    let repr = PacketRepr {
        bth: BthRepr {
            opcode,
            solicited: h.solicited,
            mig_req: route.mig_req,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn: h.dest_qpn,
            ack_req: h.ack_req,
            psn: h.psn,
        },
        rdeth: None,
        deth: h.deth,
        xrceth,
        reth: h.reth,
        feth: h.feth,
        atomic: h.atomic,
        aeth: h.aeth,
        atomic_ack: h.atomic_ack,
        immdt: h.immdt.map(|imm| ImmDtRepr { imm }),
        ieth: h.ieth.map(|rkey| IethRepr { rkey }),
        payload: &ZEROS[..payload_len],
    };
    // Every byte is written below: headers, pad and ICRC's place by
    // `emit_headers`, the payload by `fill` (the zeros stand for its
    // length), the ICRC last. A failed `fill` queues nothing.
    let mut buf = ctx.spare.take(repr.buffer_len());
    repr.emit_headers(&mut buf).map_err(EmitError::Build)?;
    let hl = repr.header_len();
    let gathered = fill(ctx, &mut buf[hl..hl + payload_len])
        .map_err(EmitError::Fill)?
        .map(|addr| Gathered {
            at: hl,
            len: payload_len,
            addr,
        });
    let info = IpUdpInfo {
        src: route.src,
        dst: route.dst,
        src_port: route.src_port,
        dst_port: ROCEV2_UDP_PORT,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    };
    let icrc = !ctx.defer_icrc;
    debug_assert!(
        gathered.is_none() || !icrc,
        "a gathered payload needs a deferred ICRC"
    );
    if icrc {
        wire::icrc::write(&info, &mut buf);
    }
    ctx.counters.sent_pkts += 1;
    // A ConnectX-like device marks its packets ECN-capable: ECT(0), the
    // codepoint of the ToS 106 (DSCP 26 | ECT(0)) that public mlx5 setups
    // configure. Whether ConnectX firmware itself sets ECT when ECN is on,
    // and which ECT, is unconfirmed (nothing suggests ECT(1)). Every
    // packet of the QP gets it, acknowledgements too, as the QP's traffic
    // class applies to all of them. Kernel rxe: Not-ECT (TOS 0).
    let ecn = match ctx.cfg.cc.model {
        crate::cc::CcModel::RxeLike => wire::Ecn::NotEct,
        crate::cc::CcModel::Mlx5Like => wire::Ecn::Ect0,
    };
    ctx.out.push_back(Transmit {
        info,
        payload: buf,
        ecn,
        dscp: 0,
        fresh: false,
        last_posted: false,
        icrc,
        gathered,
        read_dest: None,
    });
    Ok(())
}

/// Whether a payload of `len` bytes at `addr` is left to the driver
/// ([`crate::Engine::defer_gather`]): asked for, the ICRC deferred too
/// (it covers the payload), the memory readable by the driver, and worth
/// it (a short payload is copied at once).
pub(crate) fn gathers<M: crate::mem::Memory>(ctx: &Ctx<M>, addr: u64, len: usize) -> bool {
    may_gather(ctx, len) && ctx.mem.direct(addr, len)
}

/// [`gathers`] but for the memory's say: whether looking where a payload
/// of `len` bytes is can be worth it.
pub(crate) fn may_gather<M>(ctx: &Ctx<M>, len: usize) -> bool {
    ctx.defer_gather && ctx.defer_icrc && len >= MIN_GATHERED
}

/// Payloads shorter than this are copied into the packet at once.
const MIN_GATHERED: usize = 256;

/// Packet buffers for reuse, in two sizes so that an acknowledgement does
/// not take (and a full packet then regrow) a buffer of a full packet.
#[derive(Default)]
pub(crate) struct Spare {
    small: Vec<Vec<u8>>,
    large: Vec<Vec<u8>>,
}

/// A buffer of at most this many bytes is "small".
const SMALL: usize = 256;
/// Buffers kept of each size: enough for a burst of a send queue's
/// packets between two flushes of the driver.
const KEEP: usize = 64;

impl Spare {
    /// A buffer of `len` bytes whose contents are unspecified (the caller
    /// writes them all).
    pub(crate) fn take(&mut self, len: usize) -> Vec<u8> {
        let pool = if len <= SMALL {
            &mut self.small
        } else {
            &mut self.large
        };
        let mut buf = pool.pop().unwrap_or_default();
        if buf.len() >= len {
            buf.truncate(len);
        } else {
            buf.resize(len, 0);
        }
        buf
    }

    pub(crate) fn put(&mut self, buf: Vec<u8>) {
        let pool = if buf.capacity() <= SMALL {
            &mut self.small
        } else {
            &mut self.large
        };
        if pool.len() < KEEP {
            pool.push(buf);
        }
    }
}

/// Why a packet could not be emitted.
#[derive(Debug)]
pub(crate) enum EmitError<E> {
    Build(wire::Error),
    Fill(E),
}
