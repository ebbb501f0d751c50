//! Queue pair state shared by the requester, responder and completer.

use std::collections::VecDeque;
use std::net::IpAddr;

use wire::{Opcode, Psn};

use crate::caps::Mtu;
use crate::qp_attr::{QpAttr, QpCap, QpState, QpType};
use crate::time::Instant;
use crate::wr::{SendWr, Sge, WcStatus};
use crate::{CqHandle, PdHandle, SrqHandle};

/// Where a send WQE is in its life (kernel `enum wqe_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeState {
    /// Not started, or rewound by a retry.
    Posted,
    /// Some packets sent.
    Processing,
    /// All packets sent; waiting for the ACK or responses (RC).
    Pending,
    /// Finished (acknowledged, or needs no ACK); its completion is due in order.
    Done,
    /// Failed; completes with `status`, then the QP goes to the error state.
    Error,
}

/// The resolved destination of a UD WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UdTarget {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The UDP source port ([`crate::model::ud_src_port`]).
    pub src_port: u16,
    pub qpn: u32,
    pub qkey: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    /// Inline data, copied at post time.
    pub inline: Option<Vec<u8>>,
    pub state: WqeState,
    pub status: WcStatus,
    /// Message length in bytes.
    pub length: u32,
    pub first_psn: Psn,
    pub last_psn: Psn,
    /// Bytes already sent in the current pass (for READ: requested offset).
    pub offset: u32,
    pub ud: Option<UdTarget>,
    /// Whether it must produce a completion when successful.
    pub signaled: bool,
    /// Whether any packet of it was ever sent (PSNs assigned).
    pub started: bool,
    /// Why it failed, in words.
    pub error_reason: Option<String>,
}

impl SendWqe {
    /// PSNs this WQE occupies on an RC/UC QP.
    pub fn npsn(&self, mtu: u32) -> u32 {
        if self.wr.op.is_local() {
            0
        } else if self.wr.op.is_single_packet() {
            1
        } else {
            self.length.div_ceil(mtu).max(1)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
    pub length: u64,
}

/// A receive WQE the responder is filling.
#[derive(Debug, Clone)]
pub(crate) struct ActiveRecv {
    pub wqe: RecvWqe,
    /// Bytes placed so far.
    pub offset: u64,
}

/// An RDMA WRITE in progress at the responder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActiveWrite {
    pub rkey: u32,
    /// Next remote address to write.
    pub va: u64,
    /// Bytes still expected.
    pub resid: u32,
    /// Message length from the RETH.
    pub length: u32,
}

/// Responder resource for READ, atomics, ATOMIC WRITE and FLUSH (IBTA 9.7.5.1.1: duplicates are
/// answered from here), kept in a ring of `max_dest_rd_atomic` entries.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resource {
    Read {
        first_psn: Psn,
        last_psn: Psn,
        va: u64,
        rkey: u32,
        length: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
    /// An executed ATOMIC WRITE: a duplicate is acknowledged again, never
    /// written again (kernel `atomic_write_reply` with `res->replay`).
    AtomicWrite {
        psn: Psn,
    },
    /// An executed FLUSH: a duplicate is acknowledged again, not executed
    /// again (kernel `process_flush` with `res->replay`, oA19-14/15).
    Flush {
        psn: Psn,
    },
}

impl Resource {
    pub fn covers(&self, psn: Psn) -> bool {
        match *self {
            Resource::Read {
                first_psn,
                last_psn,
                ..
            } => psn.is_after_or_eq(first_psn) && psn.is_before_or_eq(last_psn),
            Resource::Atomic { psn: p, .. }
            | Resource::AtomicWrite { psn: p }
            | Resource::Flush { psn: p } => p == psn,
        }
    }
}

/// Why the QP left the operational states, for people reading traces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorCause(pub String);

#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    pub pd: PdHandle,
    pub send_cq: CqHandle,
    pub recv_cq: CqHandle,
    pub srq: Option<SrqHandle>,
    /// The XRC domain of an XRC_RECV (target) QP.
    pub xrcd: Option<crate::XrcdHandle>,
    pub cap: QpCap,
    pub sq_sig_all: bool,
    pub state: QpState,
    pub attr: QpAttr,
    /// UDP source port: `0xC000 | hash_32(qpn, 14)` like kernel rxe.
    pub src_port: u16,
    /// Path MTU in bytes (RC/UC: the modify_qp value; UD: the port MTU).
    pub mtu: u32,
    /// Local and remote IP of the connected path (RC/UC).
    pub path: Option<(IpAddr, IpAddr)>,
    pub error_cause: Option<ErrorCause>,

    // ---- send queue, requester and completer ----
    pub sq: VecDeque<SendWqe>,
    /// Index into `sq` of the next WQE the requester works on.
    pub req_idx: usize,
    /// Next PSN to send.
    pub req_psn: Psn,
    /// The PSN after the last one ever sent since `sq_psn` was set: a
    /// packet at or after it is a first transmission.
    pub fresh_psn: Psn,
    /// Opcode of the last packet sent for the WQE in progress.
    pub req_opcode: Option<Opcode>,
    /// Packets sent since the last AckReq (kernel `noack_pkts`).
    pub noack_pkts: u32,
    /// Oldest PSN not yet acknowledged.
    pub comp_psn: Psn,
    /// Opcode of the last READ response accepted for the head WQE.
    pub comp_opcode: Option<Opcode>,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// This QP's share of the device's protocol counters.
    pub counters: crate::Counters,
    /// A retry is under way; further NAKs do not start another (kernel `started_retry`).
    pub started_retry: bool,
    pub retrans_deadline: Option<Instant>,
    pub rnr_deadline: Option<Instant>,
    /// This QP's key in the engine's timer index (its earliest deadline
    /// when last indexed).
    pub timer_key: Option<Instant>,
    /// RTS->SQD requested: finish the message in progress, start no new WQE.
    pub sq_draining: bool,
    /// Congestion control: DCQCN state, pacer, last CNP sent.
    pub cc: crate::cc::QpCc,

    // ---- receive queue and responder ----
    pub rq: VecDeque<RecvWqe>,
    pub resp_psn: Psn,
    /// Message sequence number of the last completed request (24 bits).
    pub msn: u32,
    /// Opcode of the last packet of a multi-packet request in progress.
    pub resp_opcode: Option<Opcode>,
    pub recv: Option<ActiveRecv>,
    pub write: Option<ActiveWrite>,
    /// A PSN sequence error NAK was sent for the current gap (one per gap).
    pub sent_psn_nak: bool,
    /// UC: drop packets until the next FIRST/ONLY (IBTA 9.8.3.2).
    pub drop_msg: bool,
    pub resources: VecDeque<Resource>,
    pub comm_est_sent: bool,
    /// The READ being answered, one response per `poll_transmit`.
    pub read_reply: Option<ReadReply>,
    /// Requests that arrived while a READ reply was under way; handled in
    /// order when it ends. Kernel rxe's responder likewise finishes a READ
    /// reply before it takes the next request, so a later WRITE cannot
    /// change the data a READ returns and no later ACK overtakes it.
    pub deferred: VecDeque<DeferredRequest>,
}

/// A READ reply in progress (kernel `read_reply` with `qp->resp.res`):
/// the responses are built one at a time as the driver polls for packets,
/// so the first leaves at once however long the READ is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadReply {
    /// The READ's first PSN (a replay that starts later uses MIDDLE/LAST).
    pub first_psn: Psn,
    /// PSN of this reply's first response.
    pub start_psn: Psn,
    pub rkey: u32,
    /// Remote address of this reply's first byte.
    pub va: u64,
    /// Bytes from `va`.
    pub len: u32,
    /// Responses built so far.
    pub sent: u32,
    /// MSN carried in the first and last responses' AETH.
    pub msn: u32,
}

/// The most requests held behind a READ reply; more are dropped (and
/// counted), and the requester retransmits them.
pub(crate) const MAX_DEFERRED: usize = 512;

/// A request datagram held behind a READ reply.
#[derive(Debug, Clone)]
pub(crate) struct DeferredRequest {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: Vec<u8>,
}

/// Kernel `hash_32(val, bits)`: multiply by the 32-bit golden ratio and keep
/// the top bits.
pub(crate) fn hash_32(val: u32, bits: u32) -> u32 {
    val.wrapping_mul(0x61C8_8647) >> (32 - bits)
}

/// UDP source port kernel rxe gives a QP when it is created (`rxe_qp.c`:
/// `0xc000 + (hash_32(qpn, 14) & 0x3fff)`). UD QPs and QP1 keep it: the
/// captures show QPN 1 on 55410 and QPN 0x19 (UD) on 58149.
pub fn rxe_src_port(qpn: u32) -> u16 {
    (0xC000 | (hash_32(qpn, 14) & 0x3fff)) as u16
}

/// IB core `rdma_calc_flow_label`: the flow label of a connection with no
/// label of its own.
pub fn calc_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = u64::from(lqpn) * u64::from(rqpn);
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xfffff) as u32
}

/// IB core `rdma_get_udp_sport`: the UDP source port of a connected (RC/UC)
/// QP once its address vector is set, derived from the flow label (or, when
/// it is 0, from both QPNs). The captures confirm it: QPN 0x11 talking to
/// QPN 0x11 sends from 49441, 0x12 to 0x12 from 49476.
pub fn connected_src_port(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label & 0xfffff == 0 {
        calc_flow_label(lqpn, rqpn)
    } else {
        flow_label & 0xfffff
    };
    let low = (fl & 0x3fff) ^ ((fl & 0xfc000) >> 14);
    (low | 0xC000) as u16
}

impl Qp {
    pub fn new(qpn: u32, init: &crate::engine::QpInitAttr, port_mtu: Mtu) -> Self {
        let crate::engine::QpInitAttr {
            pd,
            qp_type,
            send_cq,
            recv_cq,
            srq,
            cap,
            sq_sig_all,
        } = *init;
        Qp {
            qpn,
            qp_type,
            pd,
            send_cq,
            recv_cq,
            srq,
            xrcd: None,
            cap,
            sq_sig_all,
            state: QpState::Reset,
            attr: QpAttr {
                qp_state: Some(QpState::Reset),
                path_mtu: Some(port_mtu),
                port_num: 1,
                cap,
                ..QpAttr::default()
            },
            src_port: rxe_src_port(qpn),
            mtu: port_mtu.bytes(),
            path: None,
            error_cause: None,
            sq: VecDeque::new(),
            req_idx: 0,
            req_psn: Psn::new(0),
            fresh_psn: Psn::new(0),
            req_opcode: None,
            noack_pkts: 0,
            comp_psn: Psn::new(0),
            comp_opcode: None,
            retry_cnt: 0,
            rnr_retry: 0,
            counters: crate::Counters::default(),
            started_retry: false,
            retrans_deadline: None,
            rnr_deadline: None,
            timer_key: None,
            sq_draining: false,
            cc: crate::cc::QpCc::default(),
            rq: VecDeque::new(),
            resp_psn: Psn::new(0),
            msn: 0,
            resp_opcode: None,
            recv: None,
            write: None,
            sent_psn_nak: false,
            drop_msg: false,
            resources: VecDeque::new(),
            comm_est_sent: false,
            read_reply: None,
            deferred: VecDeque::new(),
        }
    }

    /// Whether the requester may transmit (RTS, or SQD while draining).
    pub fn can_send(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
    }

    /// Whether the responder accepts packets (IBTA: RTR and later, not ERR).
    pub fn can_receive(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// Retransmission timeout: 4.096 µs × 2^timeout; 0 means infinite.
    pub fn retrans_timeout_ns(&self) -> Option<u64> {
        match self.attr.timeout {
            0 => None,
            t => Some(4096u64 << u32::from(t.min(31))),
        }
    }

    /// Whether any sent PSN is unacknowledged (RC).
    pub fn has_outstanding(&self) -> bool {
        self.req_psn != self.comp_psn
    }

    pub fn reset_retry_counters(&mut self) {
        self.retry_cnt = self.attr.retry_cnt;
        self.rnr_retry = self.attr.rnr_retry;
        self.started_retry = false;
    }

    /// Whether another READ/atomic/ATOMIC WRITE may start: fewer than
    /// `max_rd_atomic` of them in flight.
    pub fn rd_atomic_room(&self) -> bool {
        let max = u32::from(self.attr.max_rd_atomic);
        // Fewer WQEs started than the bound: no need to count them. The
        // requester asks at each response while READs wait behind the
        // ones in flight; a scan of the started WQEs each time was 3% of
        // host ib_read_bw's requester (perf, 2026-11-29).
        (self.req_idx as u32) < max || self.rd_atomic_in_flight() < max
    }

    /// Count of READ/atomic/ATOMIC WRITE WQEs sent and not yet completed:
    /// they hold responder resources at the peer, bounded by `max_rd_atomic`.
    pub fn rd_atomic_in_flight(&self) -> u32 {
        self.sq
            .iter()
            .take(self.req_idx)
            .filter(|w| {
                w.wr.op.needs_rd_atomic()
                    && matches!(w.state, WqeState::Processing | WqeState::Pending)
            })
            .count() as u32
    }

    /// Back to RESET: every queue and counter is cleared (IBTA 10.3.1).
    pub fn reset(&mut self) {
        self.sq.clear();
        self.rq.clear();
        self.req_idx = 0;
        self.req_opcode = None;
        self.noack_pkts = 0;
        self.comp_opcode = None;
        self.started_retry = false;
        self.retrans_deadline = None;
        self.rnr_deadline = None;
        self.sq_draining = false;
        self.msn = 0;
        self.resp_opcode = None;
        self.recv = None;
        self.write = None;
        self.sent_psn_nak = false;
        self.drop_msg = false;
        self.resources.clear();
        self.read_reply = None;
        self.deferred.clear();
        self.comm_est_sent = false;
        self.error_cause = None;
        self.path = None;
        self.cc = crate::cc::QpCc::default();
    }

    /// The earliest time the engine must come back to this QP:
    /// retransmission, RNR, pacing or DCQCN timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        [self.retrans_deadline, self.rnr_deadline, self.cc.deadline()]
            .into_iter()
            .flatten()
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn src_ports_match_kernel_captures() {
        // UD and QP1 keep the port chosen at creation.
        assert_eq!(rxe_src_port(1), 55410);
        assert_eq!(rxe_src_port(0x19), 58149);
        // Connected QPs (rc_send_recv, rc_send_multi, ... uc_write).
        for (qpn, port) in [
            (17, 49441),
            (18, 49476),
            (19, 49513),
            (20, 49552),
            (21, 49593),
            (22, 49636),
            (23, 49681),
            (24, 49728),
            (27, 49881),
            (28, 49936),
        ] {
            assert_eq!(connected_src_port(0, qpn, qpn), port, "QPN {qpn}");
        }
    }
}
