//! The CM endpoint: every connection of one port, its timers, and what it
//! has to send and report. See the crate documentation.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use wire::cm::{
    self, pad_private_data, CmMad, CmMessage, DrepRepr, DreqRepr, MessageResponse, MraRepr,
    PathRepr, RejRepr, RejectReason, RepRepr, ReqRepr, RtuRepr, SidrRepRepr, SidrReqRepr,
    SidrStatus,
};
use wire::mad::MAD_LEN;

use crate::timing::{cm_ack_timeout, iba_time};

/// A 16-byte GID: over RoCEv2 an IPv6 address or an IPv4-mapped one.
pub type Gid = [u8; 16];

/// A connection, named by its local communication ID (kernel
/// `cm_id->local_id`), which is what the peer puts in its messages'
/// "remote comm ID".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// The states of kernel `enum ib_cm_state` that a connection can be in
/// (IDLE is the absence of the connection; LISTEN belongs to listeners).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Active: REQ sent, waiting for REP, REJ or MRA.
    ReqSent,
    /// Passive: REQ received, the consumer decides.
    ReqRcvd,
    /// Passive: REQ received and MRA sent (or promised).
    MraReqSent,
    /// Active: the peer sent an MRA for our REQ.
    MraReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received, the consumer readies its QP and sends RTU.
    RepRcvd,
    /// Active: REP received and MRA sent.
    MraRepSent,
    /// Passive: the peer sent an MRA for our REP.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received (left at once: this crate answers with DREP).
    DreqRcvd,
    /// Disconnected; the comm ID is kept so late messages are recognised.
    Timewait,
    /// Active SIDR: SIDR_REQ sent, waiting for the SIDR_REP.
    SidrReqSent,
    /// Passive SIDR: SIDR_REQ received, the consumer answers with
    /// [`Endpoint::sidr_reply`].
    SidrReqRcvd,
}

/// Which of our messages went unanswered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SentMessage {
    /// Our REQ (kernel `IB_CM_REQ_ERROR`).
    Req,
    /// Our REP (kernel `IB_CM_REP_ERROR`).
    Rep,
    /// Our DREQ (kernel `IB_CM_DREQ_ERROR`).
    Dreq,
    /// Our SIDR_REQ (kernel `IB_CM_SIDR_REQ_ERROR`).
    SidrReq,
}

/// What the endpoint reports to its consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A REQ for a listened service ID (kernel `IB_CM_REQ_RECEIVED`):
    /// answer with [`Endpoint::accept`] or [`Endpoint::reject`] (an
    /// unwanted ECE option: [`RejectReason::VENDOR_OPTION_NOT_SUPPORTED`]).
    ConnectRequest {
        /// The new passive connection.
        id: ConnId,
        /// The GID the REQ came from (where answers go).
        remote_gid: Gid,
        /// The whole REQ: QPN, PSN, paths, private data, ECE vendor ID
        /// (`req.vendor_id`).
        req: Box<ReqRepr>,
        /// The REQ's ECE options: its MAD header's attribute modifier
        /// (kernel `cm_format_req_event`: `ece.attr_mod`).
        ece_attr_mod: u32,
    },
    /// A REP for our REQ (kernel `IB_CM_REP_RECEIVED`): bring the QP to
    /// RTR/RTS, then call [`Endpoint::ready_to_use`].
    ConnectReply {
        /// The active connection.
        id: ConnId,
        /// The whole REP: QPN, PSN, private data, ECE vendor ID
        /// (`rep.vendor_id`).
        rep: Box<RepRepr>,
        /// The REP's ECE options: its MAD header's attribute modifier
        /// (kernel `cm_format_rep_event`: `ece.attr_mod`).
        ece_attr_mod: u32,
    },
    /// The connection is established: on the passive side an RTU arrived
    /// (kernel `IB_CM_RTU_RECEIVED`) or [`Endpoint::notify_established`]
    /// was called; on the active side the RTU was sent.
    Established {
        /// The connection.
        id: ConnId,
        /// The RTU's private data (passive side; zeros on the active side).
        private_data: Box<[u8; cm::rtu::PRIVATE_DATA_LEN]>,
    },
    /// The peer rejected (kernel `IB_CM_REJ_RECEIVED`, rdma_cm
    /// `RDMA_CM_EVENT_REJECTED`).
    Rejected {
        /// The connection (gone, or in TIMEWAIT for STALE_CONN and after REP).
        id: ConnId,
        /// Reason.
        reason: RejectReason,
        /// Additional reject information (`ari_length` bytes).
        ari: Vec<u8>,
        /// The REJ's private data.
        private_data: Box<[u8; cm::rej::PRIVATE_DATA_LEN]>,
    },
    /// Our REQ, REP or SIDR_REQ went unanswered through every retry
    /// (kernel `IB_CM_REQ_ERROR`/`IB_CM_REP_ERROR`/`IB_CM_SIDR_REQ_ERROR`,
    /// rdma_cm `RDMA_CM_EVENT_UNREACHABLE` with -ETIMEDOUT). The
    /// connection (or SIDR request) is gone.
    Unreachable {
        /// The connection.
        id: ConnId,
        /// Which message.
        message: SentMessage,
    },
    /// The connection is down (DREQ received and answered, DREP received,
    /// or our DREQ unanswered; rdma_cm `RDMA_CM_EVENT_DISCONNECTED`). It
    /// is in TIMEWAIT now.
    Disconnected {
        /// The connection.
        id: ConnId,
        /// The DREQ's private data if the peer disconnected.
        private_data: Option<Box<[u8; cm::dreq::PRIVATE_DATA_LEN]>>,
    },
    /// TIMEWAIT is over (kernel `IB_CM_TIMEWAIT_EXIT`); the comm ID is
    /// free and the id no longer valid.
    TimewaitExit {
        /// The connection.
        id: ConnId,
    },
    /// A SIDR_REQ for a listened service ID (kernel
    /// `IB_CM_SIDR_REQ_RECEIVED`): answer with [`Endpoint::sidr_reply`]
    /// (or [`Endpoint::destroy`], which answers status REJECT). Until
    /// then, copies of this SIDR_REQ (same request ID from the same GID)
    /// are dropped.
    SidrRequest {
        /// The passive SIDR id.
        id: ConnId,
        /// The GID the SIDR_REQ came from (where the SIDR_REP goes).
        remote_gid: Gid,
        /// The whole SIDR_REQ: service ID, P_Key, private data.
        req: Box<SidrReqRepr>,
    },
    /// The SIDR_REP for our SIDR_REQ (kernel `IB_CM_SIDR_REP_RECEIVED`).
    /// The SIDR id is gone. rdma_cm (`cma_sidr_rep_handler`) reports
    /// status 0 as `RDMA_CM_EVENT_ESTABLISHED` with `qpn` and `qkey`, and
    /// any other status as `RDMA_CM_EVENT_UNREACHABLE` with the status.
    SidrReply {
        /// The active SIDR id.
        id: ConnId,
        /// Status ([`SidrStatus::SUCCESS`] when `qpn`/`qkey` are valid).
        status: SidrStatus,
        /// The QPN serving the service ID.
        qpn: u32,
        /// The Q_Key to send to it with.
        qkey: u32,
        /// Additional information (its length's worth of bytes; e.g. a
        /// ClassPortInfo for REDIRECT).
        info: Vec<u8>,
        /// The SIDR_REP's private data.
        private_data: Box<[u8; cm::sidr_rep::PRIVATE_DATA_LEN]>,
    },
}

/// A MAD to send from QP1 to QP1 of `dst_gid` (UD SEND_ONLY, DETH Q_Key
/// [`wire::deth::GSI_QKEY`], P_Key index 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Destination GID.
    pub dst_gid: Gid,
    /// The 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

/// Why a consumer call was refused. Network input never produces one:
/// bad or unexpected MADs are dropped and counted, as the kernel does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmError {
    /// No connection has this id (never had, or it went back to IDLE).
    UnknownId(ConnId),
    /// The call is not valid in the connection's state (kernel -EINVAL).
    InvalidState {
        /// The connection.
        id: ConnId,
        /// Its state.
        state: State,
        /// The call.
        call: &'static str,
    },
    /// More private data than the message holds.
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes the message holds.
        max: usize,
    },
    /// Someone already listens on this service ID.
    ServiceIdInUse(u64),
    /// Nobody listens on this service ID.
    NotListening(u64),
    /// More additional information than a SIDR_REP holds.
    AdditionalInfoTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes the message holds (72).
        max: usize,
    },
}

impl core::fmt::Display for CmError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CmError::UnknownId(id) => write!(
                f,
                "no CM connection with comm ID {:#010x}: it never existed or has \
                 returned to IDLE (after a reject, a timeout or TIMEWAIT)",
                id.0
            ),
            CmError::InvalidState { id, state, call } => write!(
                f,
                "{call} is not allowed on CM connection {:#010x} in state {state:?}",
                id.0
            ),
            CmError::PrivateDataTooLong { len, max } => write!(
                f,
                "{len} bytes of private data do not fit: this CM message holds {max}"
            ),
            CmError::ServiceIdInUse(s) => {
                write!(f, "service ID {s:#018x} already has a listener")
            }
            CmError::NotListening(s) => write!(f, "no listener on service ID {s:#018x}"),
            CmError::AdditionalInfoTooLong { len, max } => write!(
                f,
                "{len} bytes of additional information do not fit: a SIDR_REP holds {max}"
            ),
        }
    }
}

impl std::error::Error for CmError {}

/// Endpoint-wide settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Our CA (node) GUID: REQ/REP "local CA GUID", the ARI of a timeout REJ.
    pub local_ca_guid: u64,
    /// The CA's ACK delay exponent (REP target ACK delay; 15 for rxe).
    pub ack_delay: u8,
    /// The upper 32 bits of our transaction IDs (kernel: the MAD agent's
    /// `hi_tid`; 2 in the captures).
    pub hi_tid: u32,
    /// XORed into allocated comm IDs so they are not guessable (kernel
    /// `cm.random_id_operand`).
    pub comm_id_operand: u32,
}

/// What [`Endpoint::connect`] puts into the REQ (kernel `struct
/// ib_cm_req_param`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// Service ID ([`wire::cma::ip_service_id`] for rdma_cm).
    pub service_id: u64,
    /// Our QPN.
    pub qpn: u32,
    /// Our starting PSN.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// How long the peer may take to answer (rdma_cm: 20).
    pub remote_cm_response_timeout: u8,
    /// How long we may take to answer (rdma_cm: 20).
    pub local_cm_response_timeout: u8,
    /// QP retry count.
    pub retry_count: u8,
    /// QP RNR retry count.
    pub rnr_retry_count: u8,
    /// Max CM retries (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// Path MTU code.
    pub path_mtu: u8,
    /// Partition key.
    pub pkey: u16,
    /// SRQ.
    pub srq: bool,
    /// Packet life time exponent of the path (rdma_cm over RoCE: 18).
    pub packet_life_time: u8,
    /// The primary path; its `remote_gid` is where the REQ goes. Its
    /// `local_ack_timeout` is replaced by `cm_ack_timeout(ack_delay,
    /// packet_life_time)`, as kernel `cm_format_req` does.
    pub primary_path: PathRepr,
    /// Consumer private data (at most 92 bytes; rdma_cm's starts with its
    /// `cma_hdr`).
    pub private_data: Vec<u8>,
    /// Enhanced Connection Establishment vendor ID, the REQ's 24-bit
    /// VendorID (kernel `ib_cm_req_param.ece.vendor_id`; 0 without ECE).
    pub ece_vendor_id: u32,
    /// ECE options, sent as the REQ's MAD attribute modifier (kernel
    /// `cm_format_mad_ece_hdr` with `ece.attr_mod`; 0 without ECE).
    pub ece_attr_mod: u32,
}

/// What [`Endpoint::accept`] puts into the REP (kernel `struct
/// ib_cm_rep_param`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our QPN.
    pub qpn: u32,
    /// Our starting PSN.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// Private data (at most 196 bytes).
    pub private_data: Vec<u8>,
    /// ECE vendor ID, the REP's 24-bit VendorID (kernel
    /// `ib_cm_rep_param.ece.vendor_id`; 0 without ECE).
    pub ece_vendor_id: u32,
    /// ECE options, sent as the REP's MAD attribute modifier (kernel
    /// `cm_format_rep`; 0 without ECE).
    pub ece_attr_mod: u32,
}

/// What [`Endpoint::sidr_request`] puts into the SIDR_REQ, and how it is
/// resent (kernel `struct ib_cm_sidr_req_param`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrParams {
    /// Service ID to resolve ([`wire::cma::ip_service_id`] with the UDP
    /// port space for rdma_cm).
    pub service_id: u64,
    /// Partition key of the path.
    pub pkey: u16,
    /// Where the SIDR_REQ goes.
    pub remote_gid: Gid,
    /// How long to wait for the SIDR_REP before resending (kernel
    /// `timeout_ms`; rdma_cm `cma_resolve_ib_udp` uses
    /// `1 << (CMA_CM_RESPONSE_TIMEOUT - 8)` ms, 4096 ms).
    pub timeout: Duration,
    /// How many times to resend (kernel `max_cm_retries`; rdma_cm: 15).
    pub max_cm_retries: u8,
    /// Private data (at most 216 bytes; rdma_cm's starts with its
    /// `cma_hdr`).
    pub private_data: Vec<u8>,
}

/// What [`Endpoint::sidr_reply_with`] puts into the SIDR_REP (kernel
/// `struct ib_cm_sidr_rep_param`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReplyParams {
    /// Status.
    pub status: SidrStatus,
    /// The QPN serving the service ID.
    pub qpn: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// Additional information (at most 72 bytes).
    pub info: Vec<u8>,
    /// Private data (at most 136 bytes).
    pub private_data: Vec<u8>,
    /// ECE vendor ID. Kernel `cm_format_sidr_rep` sends only bits 15-0
    /// (it writes `(vendor_id >> 8) & 0xff` into the 16-bit high field),
    /// and so does this endpoint.
    pub ece_vendor_id: u32,
    /// ECE options, sent as the MAD header's attribute modifier.
    pub ece_attr_mod: u32,
}

/// An outstanding REQ, REP, DREQ or SIDR_REQ, resent until answered (kernel
/// `cm_id_priv->msg` in the MAD layer's send list).
#[derive(Clone, Debug)]
struct Outstanding {
    what: SentMessage,
    mad: [u8; MAD_LEN],
    timeout: Duration,
    retries_left: u8,
    deadline: Instant,
}

#[derive(Clone, Debug)]
struct Conn {
    state: State,
    remote_id: u32,
    remote_gid: Gid,
    remote_ca_guid: u64,
    remote_qpn: u32,
    local_qpn: u32,
    tid: u64,
    /// Kernel `cm_id_priv->timeout_ms` as a duration.
    timeout: Duration,
    max_cm_retries: u8,
    /// Kernel `av.timeout`: the local ACK timeout of the path, which
    /// sets the TIMEWAIT length.
    av_timeout: u8,
    outstanding: Option<Outstanding>,
    timewait_until: Option<Instant>,
    /// The MRA we sent, for duplicates of the REQ/REP it answers.
    mra: Option<[u8; MAD_LEN]>,
    /// The RTU's private data, for duplicate REPs (kernel keeps it too).
    rtu_private_data: [u8; cm::rtu::PRIVATE_DATA_LEN],
    /// The DREP we sent, for duplicate DREQs in TIMEWAIT.
    drep: Option<[u8; MAD_LEN]>,
    /// Destroyed by the consumer: no more events.
    destroyed: bool,
}

/// A SIDR request, active or passive (kernel: a `cm_id` in
/// `IB_CM_SIDR_REQ_SENT` or `IB_CM_SIDR_REQ_RCVD`). It has no TIMEWAIT:
/// it is gone once answered, timed out or destroyed.
#[derive(Clone, Debug)]
struct Sidr {
    state: State,
    remote_gid: Gid,
    /// The request ID on the wire: ours when active, the requester's when
    /// passive (kernel `cm_id.remote_id`, with the source address the key
    /// of `cm.remote_sidr_table`).
    request_id: u32,
    service_id: u64,
    tid: u64,
    /// Active: the SIDR_REQ, resent until the SIDR_REP.
    outstanding: Option<Outstanding>,
}

/// The Communication Manager of one port. See the crate documentation.
#[derive(Debug)]
pub struct Endpoint {
    config: Config,
    conns: BTreeMap<u32, Conn>,
    /// SIDR requests by local ID (allocated from the same space as
    /// connections' comm IDs, as the kernel's `cm_id`s are).
    sidrs: BTreeMap<u32, Sidr>,
    listeners: BTreeSet<u64>,
    next_id: u32,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    dropped: u64,
}

fn too_long(len: usize, max: usize) -> CmError {
    CmError::PrivateDataTooLong { len, max }
}

impl Endpoint {
    /// A new endpoint without connections or listeners.
    pub fn new(config: Config) -> Endpoint {
        Endpoint {
            config,
            conns: BTreeMap::new(),
            sidrs: BTreeMap::new(),
            listeners: BTreeSet::new(),
            next_id: 0,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            dropped: 0,
        }
    }

    /// The state of a connection or SIDR request (`None` once it is back
    /// to IDLE).
    pub fn state(&self, id: ConnId) -> Option<State> {
        self.conns
            .get(&id.0)
            .map(|c| c.state)
            .or_else(|| self.sidrs.get(&id.0).map(|s| s.state))
    }

    /// Connections not yet back to IDLE (TIMEWAIT included), and SIDR
    /// requests not yet answered.
    pub fn connection_count(&self) -> usize {
        self.conns.len() + self.sidrs.len()
    }

    /// MADs dropped so far: unparsable, unmatched or duplicate without an
    /// answer (kernel counts them in `cm_recv_duplicates` or traces).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Accept REQs and SIDR_REQs for `service_id` (kernel `ib_cm_listen`,
    /// exact match).
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listeners.insert(service_id) {
            return Err(CmError::ServiceIdInUse(service_id));
        }
        Ok(())
    }

    /// Stop accepting REQs for `service_id`; existing connections stay.
    pub fn unlisten(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listeners.remove(&service_id) {
            return Err(CmError::NotListening(service_id));
        }
        Ok(())
    }

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest deadline: a retransmission or the end of a TIMEWAIT.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self
            .conns
            .values()
            .flat_map(|c| [c.outstanding.as_ref().map(|o| o.deadline), c.timewait_until]);
        let sidrs = self
            .sidrs
            .values()
            .map(|s| s.outstanding.as_ref().map(|o| o.deadline));
        conns.chain(sidrs).flatten().min()
    }

    /// A fresh local comm ID (kernel `cm_alloc_id_priv`: a cyclic counter
    /// XORed with a random operand; never 0, never one in use).
    fn alloc_id(&mut self) -> u32 {
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            let id = self.next_id ^ self.config.comm_id_operand;
            if id != 0 && !self.conns.contains_key(&id) && !self.sidrs.contains_key(&id) {
                return id;
            }
        }
    }

    /// Kernel `cm_form_tid`: the agent's `hi_tid` above the comm ID as the
    /// kernel stores it (a big-endian value read as a little-endian host
    /// integer: the captures show TID 0x0000_0002_0cc8_5b4f for comm ID
    /// 0x4f5b_c80c).
    fn form_tid(&self, local_id: u32) -> u64 {
        u64::from(self.config.hi_tid) << 32 | u64::from(u32::from_le_bytes(local_id.to_be_bytes()))
    }

    fn conn_mut(&mut self, id: ConnId) -> Result<&mut Conn, CmError> {
        self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))
    }

    fn push(&mut self, dst_gid: Gid, mad: [u8; MAD_LEN]) {
        self.transmits.push_back(Transmit { dst_gid, mad });
    }

    fn event(&mut self, local_id: u32, event: Event) {
        if self.conns.get(&local_id).is_some_and(|c| !c.destroyed) {
            self.events.push_back(event);
        }
    }

    /// Send `mad` and keep resending it every `conn.timeout`, at most
    /// `conn.max_cm_retries` more times (kernel `ib_post_send_mad` with
    /// `msg->timeout_ms`/`msg->retries`).
    fn send_outstanding(
        &mut self,
        now: Instant,
        local_id: u32,
        what: SentMessage,
        mad: [u8; MAD_LEN],
    ) {
        if let Some(c) = self.conns.get_mut(&local_id) {
            c.outstanding = Some(Outstanding {
                what,
                mad,
                timeout: c.timeout,
                retries_left: c.max_cm_retries,
                deadline: now + c.timeout,
            });
            let dst = c.remote_gid;
            self.push(dst, mad);
        }
    }

    /// Kernel `cm_enter_timewait`: stop resending, wait
    /// `cm_convert_to_ms(av.timeout)`, then IDLE.
    fn enter_timewait(&mut self, now: Instant, local_id: u32) {
        if let Some(c) = self.conns.get_mut(&local_id) {
            c.state = State::Timewait;
            c.outstanding = None;
            c.timewait_until = Some(now + iba_time(c.av_timeout));
        }
    }

    /// Send a REQ (kernel `ib_send_cm_req`): the connection enters
    /// REQ_SENT, and the REQ is resent every 2 × packet life time + remote
    /// CM response timeout (`cm_convert_to_ms` each) until a REP, REJ or
    /// MRA, at most `max_cm_retries` times, then [`Event::Unreachable`].
    /// ECE goes as kernel `cm_format_req` sends it: the vendor ID in the
    /// REQ, the options in the MAD header's attribute modifier.
    pub fn connect(&mut self, now: Instant, params: &ConnectParams) -> Result<ConnId, CmError> {
        let private_data = pad_private_data(&params.private_data)
            .map_err(|_| too_long(params.private_data.len(), cm::req::PRIVATE_DATA_LEN))?;
        let local_id = self.alloc_id();
        let av_timeout = cm_ack_timeout(self.config.ack_delay, params.packet_life_time);
        let primary_path = PathRepr {
            local_ack_timeout: av_timeout,
            ..params.primary_path
        };
        let req = ReqRepr {
            local_comm_id: local_id,
            vendor_id: params.ece_vendor_id & 0x00ff_ffff,
            service_id: params.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: 0,
            local_qpn: params.qpn & 0x00ff_ffff,
            responder_resources: params.responder_resources,
            local_eecn: 0,
            initiator_depth: params.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: params.remote_cm_response_timeout,
            transport_type: 0,
            end_to_end_flow_control: false,
            starting_psn: params.starting_psn & 0x00ff_ffff,
            local_cm_response_timeout: params.local_cm_response_timeout,
            retry_count: params.retry_count,
            pkey: params.pkey,
            path_mtu: params.path_mtu,
            rdc_exists: false,
            rnr_retry_count: params.rnr_retry_count,
            max_cm_retries: params.max_cm_retries,
            srq: params.srq,
            extended_transport_type: 0,
            primary_path,
            alternate_path: PathRepr::default(),
            sap_supported: false,
            private_data,
        };
        let tid = self.form_tid(local_id);
        let timeout =
            iba_time(params.packet_life_time) * 2 + iba_time(params.remote_cm_response_timeout);
        self.conns.insert(
            local_id,
            Conn {
                state: State::ReqSent,
                remote_id: 0,
                remote_gid: primary_path.remote_gid,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: req.local_qpn,
                tid,
                timeout,
                max_cm_retries: params.max_cm_retries,
                av_timeout,
                outstanding: None,
                timewait_until: None,
                mra: None,
                rtu_private_data: [0; cm::rtu::PRIVATE_DATA_LEN],
                drep: None,
                destroyed: false,
            },
        );
        let mad = CmMad {
            transaction_id: tid,
            attribute_modifier: params.ece_attr_mod,
            message: CmMessage::Req(req),
        };
        self.send_outstanding(now, local_id, SentMessage::Req, mad.to_bytes());
        Ok(ConnId(local_id))
    }

    /// Send a SIDR_REQ (kernel `ib_send_cm_sidr_req`): the id enters
    /// SIDR_REQ_SENT, and the SIDR_REQ is resent every `params.timeout`,
    /// at most `params.max_cm_retries` times, until a SIDR_REP
    /// ([`Event::SidrReply`]); then [`Event::Unreachable`] with
    /// [`SentMessage::SidrReq`]. The request ID is the id's comm ID, the
    /// TID formed from it as for a REQ, and the MAD header's attribute
    /// modifier is 0 (kernel `cm_format_sidr_req` carries no ECE).
    pub fn sidr_request(&mut self, now: Instant, params: &SidrParams) -> Result<ConnId, CmError> {
        let private_data = pad_private_data(&params.private_data)
            .map_err(|_| too_long(params.private_data.len(), cm::sidr_req::PRIVATE_DATA_LEN))?;
        let local_id = self.alloc_id();
        let tid = self.form_tid(local_id);
        let mad = CmMad {
            transaction_id: tid,
            attribute_modifier: 0,
            message: CmMessage::SidrReq(SidrReqRepr {
                request_id: local_id,
                pkey: params.pkey,
                service_id: params.service_id,
                private_data,
            }),
        }
        .to_bytes();
        self.sidrs.insert(
            local_id,
            Sidr {
                state: State::SidrReqSent,
                remote_gid: params.remote_gid,
                request_id: local_id,
                service_id: params.service_id,
                tid,
                outstanding: Some(Outstanding {
                    what: SentMessage::SidrReq,
                    mad,
                    timeout: params.timeout,
                    retries_left: params.max_cm_retries,
                    deadline: now + params.timeout,
                }),
            },
        );
        self.push(params.remote_gid, mad);
        Ok(ConnId(local_id))
    }

    /// Answer a SIDR_REQ ([`Event::SidrRequest`]) with a SIDR_REP of
    /// `status`, `qpn` and `qkey` (kernel `ib_send_cm_sidr_rep`; rdma_cm's
    /// `rdma_accept` sends [`SidrStatus::SUCCESS`], `rdma_reject`
    /// [`SidrStatus::REJECT`]). The SIDR id is gone afterwards.
    pub fn sidr_reply(
        &mut self,
        id: ConnId,
        status: SidrStatus,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.sidr_reply_with(
            id,
            &SidrReplyParams {
                status,
                qpn,
                qkey,
                info: Vec::new(),
                private_data: private_data.to_vec(),
                ece_vendor_id: 0,
                ece_attr_mod: 0,
            },
        )
    }

    /// [`sidr_reply`](Self::sidr_reply) with every field of the SIDR_REP:
    /// additional information and ECE (kernel `cm_format_sidr_rep`).
    pub fn sidr_reply_with(&mut self, id: ConnId, params: &SidrReplyParams) -> Result<(), CmError> {
        let private_data = pad_private_data(&params.private_data)
            .map_err(|_| too_long(params.private_data.len(), cm::sidr_rep::PRIVATE_DATA_LEN))?;
        let info = pad_private_data(&params.info).map_err(|_| CmError::AdditionalInfoTooLong {
            len: params.info.len(),
            max: cm::sidr_rep::INFO_LEN,
        })?;
        let state = self.state(id).ok_or(CmError::UnknownId(id))?;
        if state != State::SidrReqRcvd {
            return Err(CmError::InvalidState {
                id,
                state,
                call: "sidr_reply",
            });
        }
        let Some(s) = self.sidrs.remove(&id.0) else {
            return Err(CmError::UnknownId(id));
        };
        let mad = sidr_rep_mad(
            s.tid,
            params.ece_attr_mod,
            SidrRepRepr {
                request_id: s.request_id,
                status: params.status,
                info_length: params.info.len() as u8,
                vendor_id: params.ece_vendor_id & 0xffff,
                qpn: params.qpn & 0x00ff_ffff,
                service_id: s.service_id,
                qkey: params.qkey,
                info,
                private_data,
            },
        );
        self.push(s.remote_gid, mad);
        Ok(())
    }

    /// Answer a REQ with a REP (kernel `ib_send_cm_rep`): REP_SENT, the
    /// REP resent every `cm_convert_to_ms(REQ local CM response timeout)`
    /// at most the REQ's max CM retries times, until RTU (or
    /// [`notify_established`](Self::notify_established)). ECE goes as in
    /// [`connect`](Self::connect) (kernel `cm_format_rep`).
    pub fn accept(
        &mut self,
        now: Instant,
        id: ConnId,
        params: &AcceptParams,
    ) -> Result<(), CmError> {
        let private_data = pad_private_data(&params.private_data)
            .map_err(|_| too_long(params.private_data.len(), cm::rep::PRIVATE_DATA_LEN))?;
        let guid = self.config.local_ca_guid;
        let ack_delay = self.config.ack_delay;
        let c = self.conn_mut(id)?;
        if !matches!(c.state, State::ReqRcvd | State::MraReqSent) {
            return Err(CmError::InvalidState {
                id,
                state: c.state,
                call: "accept",
            });
        }
        let rep = RepRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: params.qpn & 0x00ff_ffff,
            local_eecn: 0,
            vendor_id: params.ece_vendor_id & 0x00ff_ffff,
            starting_psn: params.starting_psn & 0x00ff_ffff,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            target_ack_delay: ack_delay,
            failover_accepted: params.failover_accepted,
            end_to_end_flow_control: params.flow_control,
            rnr_retry_count: params.rnr_retry_count,
            srq: params.srq,
            local_ca_guid: guid,
            private_data,
        };
        c.state = State::RepSent;
        c.local_qpn = rep.local_qpn;
        c.mra = None;
        let mad = CmMad {
            transaction_id: c.tid,
            attribute_modifier: params.ece_attr_mod,
            message: CmMessage::Rep(rep),
        };
        self.send_outstanding(now, id.0, SentMessage::Rep, mad.to_bytes());
        Ok(())
    }

    /// Acknowledge a REQ (passive, REQ_RCVD) or REP (active, REP_RCVD)
    /// that will take long to answer (kernel `ib_send_cm_mra`): the peer
    /// then waits `service_timeout` + its path's ACK timeout. With
    /// `delayed`, the MRA is only sent when the peer retransmits (kernel
    /// `IB_CM_MRA_FLAG_DELAY`, which rdma_cm uses).
    pub fn send_mra(
        &mut self,
        id: ConnId,
        service_timeout: u8,
        delayed: bool,
    ) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        let (next, msg) = match c.state {
            State::ReqRcvd => (State::MraReqSent, MessageResponse::Req),
            State::RepRcvd => (State::MraRepSent, MessageResponse::Rep),
            state => {
                return Err(CmError::InvalidState {
                    id,
                    state,
                    call: "send_mra",
                })
            }
        };
        let mad = CmMad {
            transaction_id: c.tid,
            attribute_modifier: 0,
            message: CmMessage::Mra(MraRepr {
                local_comm_id: id.0,
                remote_comm_id: c.remote_id,
                message_mraed: msg,
                service_timeout,
                private_data: [0; cm::mra::PRIVATE_DATA_LEN],
            }),
        }
        .to_bytes();
        c.state = next;
        c.mra = Some(mad);
        let dst = c.remote_gid;
        if !delayed {
            self.push(dst, mad);
        }
        Ok(())
    }

    /// Kernel `cm_format_rej`'s choice of local comm ID and "message
    /// rejected" for a REJ sent from `state`.
    fn rej_for(
        &self,
        local_id: u32,
        c: &Conn,
        reason: RejectReason,
        ari: &[u8],
        private_data: [u8; cm::rej::PRIVATE_DATA_LEN],
    ) -> [u8; MAD_LEN] {
        let (local_comm_id, message_rejected) = match c.state {
            State::ReqRcvd => (0, MessageResponse::Req),
            State::MraReqSent => (local_id, MessageResponse::Req),
            State::RepRcvd | State::MraRepSent => (local_id, MessageResponse::Rep),
            _ => (local_id, MessageResponse::Other),
        };
        let ari_len = ari.len().min(cm::rej::ARI_LEN);
        let mut ari_buf = [0u8; cm::rej::ARI_LEN];
        ari_buf[..ari_len].copy_from_slice(&ari[..ari_len]);
        CmMad {
            transaction_id: c.tid,
            attribute_modifier: 0,
            message: CmMessage::Rej(RejRepr {
                local_comm_id,
                remote_comm_id: c.remote_id,
                message_rejected,
                reason,
                ari_length: ari_len as u8,
                ari: ari_buf,
                private_data,
            }),
        }
        .to_bytes()
    }

    /// Reject (kernel `ib_send_cm_rej`): before RTU, on either side. From
    /// REP_SENT/MRA_REP_RCVD the connection enters TIMEWAIT, otherwise it
    /// returns to IDLE (and the id becomes invalid). Refusing the peer's
    /// ECE options is a reject with reason
    /// [`RejectReason::VENDOR_OPTION_NOT_SUPPORTED`], as rdma_cm's
    /// `rdma_reject` sends it; the REJ itself carries no ECE (kernel
    /// `cm_format_rej` leaves the attribute modifier 0).
    pub fn reject(
        &mut self,
        now: Instant,
        id: ConnId,
        reason: RejectReason,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = pad_private_data(private_data)
            .map_err(|_| too_long(private_data.len(), cm::rej::PRIVATE_DATA_LEN))?;
        self.reject_with_ari(now, id, reason, &[], pd, "reject")
    }

    fn reject_with_ari(
        &mut self,
        now: Instant,
        id: ConnId,
        reason: RejectReason,
        ari: &[u8],
        pd: [u8; cm::rej::PRIVATE_DATA_LEN],
        call: &'static str,
    ) -> Result<(), CmError> {
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId(id))?;
        let timewait = match c.state {
            State::ReqSent
            | State::MraReqRcvd
            | State::ReqRcvd
            | State::MraReqSent
            | State::RepRcvd
            | State::MraRepSent => false,
            State::RepSent | State::MraRepRcvd => true,
            state => return Err(CmError::InvalidState { id, state, call }),
        };
        let mad = self.rej_for(id.0, c, reason, ari, pd);
        let dst = c.remote_gid;
        self.push(dst, mad);
        if timewait {
            self.enter_timewait(now, id.0);
        } else {
            self.conns.remove(&id.0);
        }
        Ok(())
    }

    /// Send the RTU (kernel `ib_send_cm_rtu`) once the QP is ready:
    /// REP_RCVD → ESTABLISHED. Duplicate REPs are answered with this RTU
    /// again.
    pub fn ready_to_use(&mut self, id: ConnId, private_data: &[u8]) -> Result<(), CmError> {
        let pd: [u8; cm::rtu::PRIVATE_DATA_LEN] = pad_private_data(private_data)
            .map_err(|_| too_long(private_data.len(), cm::rtu::PRIVATE_DATA_LEN))?;
        let c = self.conn_mut(id)?;
        if !matches!(c.state, State::RepRcvd | State::MraRepSent) {
            return Err(CmError::InvalidState {
                id,
                state: c.state,
                call: "ready_to_use",
            });
        }
        c.state = State::Established;
        c.rtu_private_data = pd;
        c.mra = None;
        let mad = rtu_mad(id.0, c);
        let dst = c.remote_gid;
        self.push(dst, mad);
        self.event(
            id.0,
            Event::Established {
                id,
                private_data: Box::new([0; cm::rtu::PRIVATE_DATA_LEN]),
            },
        );
        Ok(())
    }

    /// The QP saw traffic before the RTU (kernel `ib_cm_notify` with
    /// `IB_EVENT_COMM_EST`, `cm_establish`): REP_SENT → ESTABLISHED.
    pub fn notify_established(&mut self, id: ConnId) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        if !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            return Err(CmError::InvalidState {
                id,
                state: c.state,
                call: "notify_established",
            });
        }
        c.state = State::Established;
        c.outstanding = None;
        self.event(
            id.0,
            Event::Established {
                id,
                private_data: Box::new([0; cm::rtu::PRIVATE_DATA_LEN]),
            },
        );
        Ok(())
    }

    /// Send a DREQ (kernel `ib_send_cm_dreq`): ESTABLISHED → DREQ_SENT,
    /// resent like the REQ/REP until a DREP; if none comes the
    /// connection enters TIMEWAIT anyway and [`Event::Disconnected`] is
    /// reported (kernel `IB_CM_DREQ_ERROR`).
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = pad_private_data(private_data)
            .map_err(|_| too_long(private_data.len(), cm::dreq::PRIVATE_DATA_LEN))?;
        let tid = self.form_tid(id.0);
        let c = self.conn_mut(id)?;
        if c.state != State::Established {
            return Err(CmError::InvalidState {
                id,
                state: c.state,
                call: "disconnect",
            });
        }
        c.state = State::DreqSent;
        let mad = CmMad {
            transaction_id: tid,
            attribute_modifier: 0,
            message: CmMessage::Dreq(DreqRepr {
                local_comm_id: id.0,
                remote_comm_id: c.remote_id,
                remote_qpn: c.remote_qpn,
                private_data: pd,
            }),
        };
        self.send_outstanding(now, id.0, SentMessage::Dreq, mad.to_bytes());
        Ok(())
    }

    /// The consumer is done with the connection (kernel `cm_destroy_id`):
    /// no more events for it. What the peer is told depends on the state,
    /// as in the kernel: REQ_SENT → REJ TIMEOUT with our CA GUID as ARI
    /// (rdmacm_req_to_host.pcap shows it); other states before RTU → REJ
    /// CONSUMER_DEFINED; ESTABLISHED → DREQ (then TIMEWAIT); DREQ_SENT →
    /// TIMEWAIT at once. The comm ID is kept until TIMEWAIT ends.
    ///
    /// A SIDR id is forgotten at once: in SIDR_REQ_SENT the SIDR_REQ is no
    /// longer resent; in SIDR_REQ_RCVD the requester is answered with
    /// status REJECT (kernel `cm_reject_sidr_req`).
    pub fn destroy(&mut self, now: Instant, id: ConnId) -> Result<(), CmError> {
        if let Some(s) = self.sidrs.remove(&id.0) {
            if s.state == State::SidrReqRcvd {
                let mad = sidr_rep_mad(
                    s.tid,
                    0,
                    SidrRepRepr {
                        request_id: s.request_id,
                        status: SidrStatus::REJECT,
                        info_length: 0,
                        vendor_id: 0,
                        qpn: 0,
                        service_id: s.service_id,
                        qkey: 0,
                        info: [0; cm::sidr_rep::INFO_LEN],
                        private_data: [0; cm::sidr_rep::PRIVATE_DATA_LEN],
                    },
                );
                self.push(s.remote_gid, mad);
            }
            return Ok(());
        }
        let state = self.conn_mut(id)?.state;
        let no_pd = [0; cm::rej::PRIVATE_DATA_LEN];
        match state {
            State::ReqSent | State::MraReqRcvd => {
                let guid = self.config.local_ca_guid.to_be_bytes();
                self.reject_with_ari(now, id, RejectReason::TIMEOUT, &guid, no_pd, "destroy")?;
            }
            State::ReqRcvd
            | State::MraReqSent
            | State::RepRcvd
            | State::MraRepSent
            | State::RepSent
            | State::MraRepRcvd => {
                self.reject_with_ari(
                    now,
                    id,
                    RejectReason::CONSUMER_DEFINED,
                    &[],
                    no_pd,
                    "destroy",
                )?;
            }
            State::Established => self.disconnect(now, id, &[])?,
            State::DreqSent => self.enter_timewait(now, id.0),
            State::DreqRcvd | State::Timewait | State::SidrReqSent | State::SidrReqRcvd => {}
        }
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.destroyed = true;
        }
        Ok(())
    }

    /// Fire every timer due at `now`: retransmissions, retries running
    /// out (kernel `cm_process_send_error`), TIMEWAIT ends.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.handle_sidr_timeout(now);
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.outstanding.as_ref().is_some_and(|o| o.deadline <= now)
                    || c.timewait_until.is_some_and(|t| t <= now)
            })
            .map(|(id, _)| *id)
            .collect();
        for local_id in due {
            let id = ConnId(local_id);
            let Some(c) = self.conns.get_mut(&local_id) else {
                continue;
            };
            if c.timewait_until.is_some_and(|t| t <= now) {
                self.event(local_id, Event::TimewaitExit { id });
                self.conns.remove(&local_id);
                continue;
            }
            let Some(o) = c.outstanding.as_mut() else {
                continue;
            };
            if o.retries_left > 0 {
                o.retries_left -= 1;
                o.deadline = now + o.timeout;
                let (dst, mad) = (c.remote_gid, o.mad);
                self.push(dst, mad);
                continue;
            }
            let what = o.what;
            c.outstanding = None;
            match what {
                SentMessage::Req | SentMessage::Rep | SentMessage::SidrReq => {
                    self.event(local_id, Event::Unreachable { id, message: what });
                    self.conns.remove(&local_id);
                }
                SentMessage::Dreq => {
                    self.enter_timewait(now, local_id);
                    self.event(
                        local_id,
                        Event::Disconnected {
                            id,
                            private_data: None,
                        },
                    );
                }
            }
        }
    }

    /// The SIDR half of [`handle_timeout`](Self::handle_timeout): resend
    /// each due SIDR_REQ, or give up on it (kernel
    /// `cm_process_send_error` in `IB_CM_SIDR_REQ_SENT`).
    fn handle_sidr_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .sidrs
            .iter()
            .filter(|(_, s)| s.outstanding.as_ref().is_some_and(|o| o.deadline <= now))
            .map(|(id, _)| *id)
            .collect();
        for local_id in due {
            let Some(s) = self.sidrs.get_mut(&local_id) else {
                continue;
            };
            let Some(o) = s.outstanding.as_mut() else {
                continue;
            };
            if o.retries_left > 0 {
                o.retries_left -= 1;
                o.deadline = now + o.timeout;
                let (dst, mad) = (s.remote_gid, o.mad);
                self.push(dst, mad);
                continue;
            }
            self.sidrs.remove(&local_id);
            self.events.push_back(Event::Unreachable {
                id: ConnId(local_id),
                message: SentMessage::SidrReq,
            });
        }
    }

    /// Take in a MAD received on QP1 from `src_gid`. Anything that is not
    /// a CM message we can match is dropped (and counted), never an error:
    /// the network cannot make the consumer's calls fail.
    pub fn handle_mad(&mut self, now: Instant, src_gid: Gid, mad: &[u8]) {
        let Ok(m) = CmMad::parse(mad) else {
            self.dropped += 1;
            return;
        };
        let tid = m.transaction_id;
        let attr_mod = m.attribute_modifier;
        match m.message {
            CmMessage::Req(req) => self.on_req(now, src_gid, tid, attr_mod, req),
            CmMessage::Mra(mra) => self.on_mra(now, mra),
            CmMessage::Rej(rej) => self.on_rej(now, rej),
            CmMessage::Rep(rep) => self.on_rep(src_gid, tid, attr_mod, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(rtu),
            CmMessage::Dreq(dreq) => self.on_dreq(now, src_gid, tid, dreq),
            CmMessage::Drep(drep) => self.on_drep(now, drep),
            CmMessage::SidrReq(req) => self.on_sidr_req(src_gid, tid, req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(rep),
        }
    }

    /// The connection whose local ID is `local` and whose remote ID is
    /// `remote` (kernel `cm_acquire_id`).
    fn find(&self, local: u32, remote: u32) -> Option<u32> {
        self.conns
            .get(&local)
            .filter(|c| c.remote_id == remote)
            .map(|_| local)
    }

    /// Kernel `cm_issue_rej`: a REJ for a message no connection of ours
    /// owns, its comm IDs swapped from the received message, same TID.
    fn issue_rej(
        &mut self,
        dst: Gid,
        tid: u64,
        received: (u32, u32),
        reason: RejectReason,
        msg: MessageResponse,
    ) {
        let mad = CmMad {
            transaction_id: tid,
            attribute_modifier: 0,
            message: CmMessage::Rej(RejRepr {
                local_comm_id: received.1,
                remote_comm_id: received.0,
                message_rejected: msg,
                reason,
                ari_length: 0,
                ari: [0; cm::rej::ARI_LEN],
                private_data: [0; cm::rej::PRIVATE_DATA_LEN],
            }),
        };
        self.push(dst, mad.to_bytes());
    }

    /// Kernel `cm_req_handler`, `cm_match_req`, `cm_dup_req_handler`.
    fn on_req(&mut self, now: Instant, src_gid: Gid, tid: u64, attr_mod: u32, req: ReqRepr) {
        // A REQ we already have a connection for (same remote comm ID and
        // CA GUID: `cm_insert_remote_id`) is a duplicate.
        let dup = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.remote_id == req.local_comm_id && c.remote_ca_guid == req.local_ca_guid
            })
            .map(|(id, _)| *id);
        if let Some(local_id) = dup {
            let Some(c) = self.conns.get(&local_id) else {
                return;
            };
            match c.state {
                State::MraReqSent => {
                    if let Some(mra) = c.mra {
                        self.push(src_gid, mra);
                    }
                }
                State::Timewait => {
                    let mad = self.rej_for(
                        local_id,
                        c,
                        RejectReason::STALE_CONN,
                        &[],
                        [0; cm::rej::PRIVATE_DATA_LEN],
                    );
                    self.push(src_gid, mad);
                }
                // REQ_RCVD: the consumer has not answered yet. REP_SENT and
                // later: our REP is resent by its own timer. Both drop it.
                _ => self.dropped += 1,
            }
            return;
        }
        // Same remote QPN from the same GID on a live connection: the peer
        // lost its state (`cm_insert_remote_qpn`): REJ STALE_CONN, and
        // the old connection is disconnected.
        let stale = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.remote_gid == src_gid
                    && c.remote_qpn == req.local_qpn
                    && c.remote_id != 0
                    && c.state != State::Timewait
            })
            .map(|(id, c)| (*id, c.state));
        if let Some((old, state)) = stale {
            self.issue_rej(
                src_gid,
                tid,
                (req.local_comm_id, 0),
                RejectReason::STALE_CONN,
                MessageResponse::Req,
            );
            if state == State::Established {
                // Cannot fail: the connection is ESTABLISHED and the
                // private data empty.
                let _ = self.disconnect(now, ConnId(old), &[]);
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.issue_rej(
                src_gid,
                tid,
                (req.local_comm_id, 0),
                RejectReason::INVALID_SERVICE_ID,
                MessageResponse::Req,
            );
            return;
        }
        let local_id = self.alloc_id();
        // The passive side's path: packet life time = REQ local ACK
        // timeout - 1 (`cm_format_path_from_req`), av.timeout = life + 1.
        let life = req.primary_path.local_ack_timeout.saturating_sub(1);
        self.conns.insert(
            local_id,
            Conn {
                state: State::ReqRcvd,
                remote_id: req.local_comm_id,
                remote_gid: src_gid,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                local_qpn: 0,
                tid,
                timeout: iba_time(req.local_cm_response_timeout),
                max_cm_retries: req.max_cm_retries,
                av_timeout: life.saturating_add(1).min(31),
                outstanding: None,
                timewait_until: None,
                mra: None,
                rtu_private_data: [0; cm::rtu::PRIVATE_DATA_LEN],
                drep: None,
                destroyed: false,
            },
        );
        self.event(
            local_id,
            Event::ConnectRequest {
                id: ConnId(local_id),
                remote_gid: src_gid,
                req: Box::new(req),
                ece_attr_mod: attr_mod,
            },
        );
    }

    /// Kernel `cm_mra_handler`: the peer needs time; wait
    /// `service timeout + av.timeout` (each `cm_convert_to_ms`) before
    /// resending (`ib_modify_mad`).
    fn on_mra(&mut self, now: Instant, mra: MraRepr) {
        // Kernel `cm_acquire_mraed_id`: an MRA for our REQ comes before we
        // know the peer's comm ID.
        let remote = match mra.message_mraed {
            MessageResponse::Req => 0,
            MessageResponse::Rep | MessageResponse::Other => mra.local_comm_id,
        };
        let Some(local_id) = self.find(mra.remote_comm_id, remote) else {
            self.dropped += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&local_id) else {
            return;
        };
        let next = match (c.state, mra.message_mraed) {
            (State::ReqSent, MessageResponse::Req) => State::MraReqRcvd,
            (State::RepSent, MessageResponse::Rep) => State::MraRepRcvd,
            _ => {
                self.dropped += 1;
                return;
            }
        };
        let timeout = iba_time(mra.service_timeout) + iba_time(c.av_timeout);
        if let Some(o) = c.outstanding.as_mut() {
            o.timeout = timeout;
            o.deadline = now + timeout;
        }
        c.state = next;
    }

    /// Kernel `cm_rej_handler` with `cm_acquire_rejected_id`'s matching.
    fn on_rej(&mut self, now: Instant, rej: RejRepr) {
        let found = if rej.reason == RejectReason::TIMEOUT {
            let mut guid = [0u8; 8];
            guid.copy_from_slice(&rej.ari[..8]);
            let guid = u64::from_be_bytes(guid);
            self.conns
                .iter()
                .find(|(_, c)| {
                    c.remote_id == rej.local_comm_id && c.remote_ca_guid == guid && c.remote_id != 0
                })
                .map(|(id, _)| *id)
        } else if rej.message_rejected == MessageResponse::Req {
            self.find(rej.remote_comm_id, 0)
        } else {
            self.find(rej.remote_comm_id, rej.local_comm_id)
        };
        let Some(local_id) = found else {
            self.dropped += 1;
            return;
        };
        let Some(c) = self.conns.get(&local_id) else {
            return;
        };
        let timewait = match c.state {
            State::ReqSent
            | State::MraReqRcvd
            | State::RepSent
            | State::MraRepRcvd
            | State::ReqRcvd
            | State::MraReqSent => rej.reason == RejectReason::STALE_CONN,
            State::DreqSent | State::RepRcvd | State::MraRepSent | State::Established => true,
            State::DreqRcvd | State::Timewait | State::SidrReqSent | State::SidrReqRcvd => {
                self.dropped += 1;
                return;
            }
        };
        let event = Event::Rejected {
            id: ConnId(local_id),
            reason: rej.reason,
            ari: rej.ari_bytes().to_vec(),
            private_data: Box::new(rej.private_data),
        };
        self.event(local_id, event);
        if timewait {
            self.enter_timewait(now, local_id);
        } else {
            self.conns.remove(&local_id);
        }
    }

    /// Kernel `cm_rep_handler` and `cm_dup_rep_handler`.
    fn on_rep(&mut self, src_gid: Gid, tid: u64, attr_mod: u32, rep: RepRepr) {
        if let Some(local_id) = self.find(rep.remote_comm_id, 0) {
            let Some(c) = self.conns.get(&local_id) else {
                return;
            };
            if !matches!(c.state, State::ReqSent | State::MraReqRcvd) {
                self.dropped += 1;
                return;
            }
            // Another connection already has this remote QPN from this GID:
            // stale (`cm_insert_remote_qpn`), REJ STALE_CONN for the REP.
            let stale = self.conns.iter().any(|(id, o)| {
                *id != local_id
                    && o.remote_gid == src_gid
                    && o.remote_qpn == rep.local_qpn
                    && o.state != State::Timewait
            });
            if stale {
                self.issue_rej(
                    src_gid,
                    tid,
                    (rep.local_comm_id, rep.remote_comm_id),
                    RejectReason::STALE_CONN,
                    MessageResponse::Rep,
                );
                return;
            }
            let Some(c) = self.conns.get_mut(&local_id) else {
                return;
            };
            c.state = State::RepRcvd;
            c.remote_id = rep.local_comm_id;
            c.remote_ca_guid = rep.local_ca_guid;
            c.remote_qpn = rep.local_qpn;
            c.av_timeout = cm_ack_timeout(rep.target_ack_delay, c.av_timeout.saturating_sub(1));
            c.outstanding = None;
            self.event(
                local_id,
                Event::ConnectReply {
                    id: ConnId(local_id),
                    rep: Box::new(rep),
                    ece_attr_mod: attr_mod,
                },
            );
            return;
        }
        // Not a REP for a REQ in flight: a duplicate of one we answered?
        let Some(local_id) = self.find(rep.remote_comm_id, rep.local_comm_id) else {
            self.dropped += 1;
            return;
        };
        let Some(c) = self.conns.get(&local_id) else {
            return;
        };
        match c.state {
            State::Established => {
                let mad = rtu_mad(local_id, c);
                self.push(src_gid, mad);
            }
            State::MraRepSent => {
                if let Some(mra) = c.mra {
                    self.push(src_gid, mra);
                }
            }
            _ => self.dropped += 1,
        }
    }

    /// Kernel `cm_rtu_handler`.
    fn on_rtu(&mut self, rtu: RtuRepr) {
        let Some(local_id) = self.find(rtu.remote_comm_id, rtu.local_comm_id) else {
            self.dropped += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&local_id) else {
            return;
        };
        if !matches!(c.state, State::RepSent | State::MraRepRcvd) {
            self.dropped += 1;
            return;
        }
        c.state = State::Established;
        c.outstanding = None;
        self.event(
            local_id,
            Event::Established {
                id: ConnId(local_id),
                private_data: Box::new(rtu.private_data),
            },
        );
    }

    /// Kernel `cm_dreq_handler`, then rdma_cm's immediate DREP
    /// (`cma_ib_handler` on `IB_CM_DREQ_RECEIVED`).
    fn on_dreq(&mut self, now: Instant, src_gid: Gid, tid: u64, dreq: DreqRepr) {
        let drep = |local: u32, remote: u32| {
            CmMad {
                transaction_id: tid,
                attribute_modifier: 0,
                message: CmMessage::Drep(DrepRepr {
                    local_comm_id: local,
                    remote_comm_id: remote,
                    private_data: [0; cm::drep::PRIVATE_DATA_LEN],
                }),
            }
            .to_bytes()
        };
        let Some(local_id) = self.find(dreq.remote_comm_id, dreq.local_comm_id) else {
            // `cm_issue_drep`: a DREP for a connection we do not know, so
            // the peer's disconnect completes.
            self.push(src_gid, drep(dreq.remote_comm_id, dreq.local_comm_id));
            return;
        };
        let Some(c) = self.conns.get_mut(&local_id) else {
            return;
        };
        if c.local_qpn != dreq.remote_qpn {
            self.dropped += 1;
            return;
        }
        match c.state {
            State::RepSent | State::MraRepRcvd | State::Established | State::DreqSent => {}
            State::Timewait => {
                if let Some(m) = c.drep {
                    self.push(src_gid, m);
                }
                return;
            }
            _ => {
                self.dropped += 1;
                return;
            }
        }
        c.state = State::DreqRcvd;
        c.outstanding = None;
        let mad = drep(local_id, dreq.local_comm_id);
        c.drep = Some(mad);
        self.push(src_gid, mad);
        self.enter_timewait(now, local_id);
        self.event(
            local_id,
            Event::Disconnected {
                id: ConnId(local_id),
                private_data: Some(Box::new(dreq.private_data)),
            },
        );
    }

    /// Kernel `cm_sidr_req_handler`: a copy of a SIDR_REQ still pending
    /// (same request ID from the same GID; the kernel keys
    /// `cm.remote_sidr_table` on the request ID and the sender's address)
    /// is dropped; a SIDR_REQ for a service nobody listens on is answered
    /// at once with status UNSUPPORTED; any other is the consumer's.
    /// Once answered, a SIDR_REQ is forgotten: a later copy (the SIDR_REP
    /// was lost) is a new request, as in the kernel.
    fn on_sidr_req(&mut self, src_gid: Gid, tid: u64, req: SidrReqRepr) {
        let dup = self.sidrs.values().any(|s| {
            s.state == State::SidrReqRcvd
                && s.request_id == req.request_id
                && s.remote_gid == src_gid
        });
        if dup {
            self.dropped += 1;
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            let mad = sidr_rep_mad(
                tid,
                0,
                SidrRepRepr {
                    request_id: req.request_id,
                    status: SidrStatus::UNSUPPORTED,
                    info_length: 0,
                    vendor_id: 0,
                    qpn: 0,
                    service_id: req.service_id,
                    qkey: 0,
                    info: [0; cm::sidr_rep::INFO_LEN],
                    private_data: [0; cm::sidr_rep::PRIVATE_DATA_LEN],
                },
            );
            self.push(src_gid, mad);
            return;
        }
        let local_id = self.alloc_id();
        self.sidrs.insert(
            local_id,
            Sidr {
                state: State::SidrReqRcvd,
                remote_gid: src_gid,
                request_id: req.request_id,
                service_id: req.service_id,
                tid,
                outstanding: None,
            },
        );
        self.events.push_back(Event::SidrRequest {
            id: ConnId(local_id),
            remote_gid: src_gid,
            req: Box::new(req),
        });
    }

    /// Kernel `cm_sidr_rep_handler`: the SIDR_REP names our id by the
    /// request ID (`cm_acquire_id(request_id, 0)`); it must be in
    /// SIDR_REQ_SENT. Late copies find nothing and are dropped.
    fn on_sidr_rep(&mut self, rep: SidrRepRepr) {
        let pending = self
            .sidrs
            .get(&rep.request_id)
            .is_some_and(|s| s.state == State::SidrReqSent);
        if !pending {
            self.dropped += 1;
            return;
        }
        self.sidrs.remove(&rep.request_id);
        self.events.push_back(Event::SidrReply {
            id: ConnId(rep.request_id),
            status: rep.status,
            qpn: rep.qpn,
            qkey: rep.qkey,
            info: rep.info_bytes().to_vec(),
            private_data: Box::new(rep.private_data),
        });
    }

    /// Kernel `cm_drep_handler`.
    fn on_drep(&mut self, now: Instant, drep: DrepRepr) {
        let Some(local_id) = self.find(drep.remote_comm_id, drep.local_comm_id) else {
            self.dropped += 1;
            return;
        };
        let Some(c) = self.conns.get(&local_id) else {
            return;
        };
        if !matches!(c.state, State::DreqSent | State::DreqRcvd) {
            self.dropped += 1;
            return;
        }
        self.enter_timewait(now, local_id);
        self.event(
            local_id,
            Event::Disconnected {
                id: ConnId(local_id),
                private_data: None,
            },
        );
    }
}

/// A SIDR_REP MAD (kernel `cm_format_sidr_rep`: the SIDR_REQ's TID, ECE
/// options in the attribute modifier).
fn sidr_rep_mad(tid: u64, attr_mod: u32, rep: SidrRepRepr) -> [u8; MAD_LEN] {
    CmMad {
        transaction_id: tid,
        attribute_modifier: attr_mod,
        message: CmMessage::SidrRep(rep),
    }
    .to_bytes()
}

/// The RTU of a connection (kernel `cm_format_rtu`: the connection's TID).
fn rtu_mad(local_id: u32, c: &Conn) -> [u8; MAD_LEN] {
    CmMad {
        transaction_id: c.tid,
        attribute_modifier: 0,
        message: CmMessage::Rtu(RtuRepr {
            local_comm_id: local_id,
            remote_comm_id: c.remote_id,
            private_data: c.rtu_private_data,
        }),
    }
    .to_bytes()
}
