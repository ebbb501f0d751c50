//! QP attributes and the `modify_qp` state machine.
//!
//! The transition table is the QP state machine of IBTA Vol. 1 §10.3.1 and
//! the Modify QP verb (§11.2.4.2) as Linux encodes it in `qp_state_table`
//! (`drivers/infiniband/core/verbs.c`, checked by `ib_modify_qp_is_ok`), for
//! the QP types rxe has: RC, UC and UD. On top of it come the few rules the
//! uverbs and core layers add for a RoCE device, and the value checks of
//! `rxe_qp_chk_attr` (`drivers/infiniband/sw/rxe/rxe_qp.c`).
//!
//! Where the kernel only answers EINVAL, a refusal here names the attribute
//! by its `IBV_QP_*` name and the transition, so the message tells a person
//! what to change. Every accept/refuse decision was checked against Linux 6.1
//! rxe (see `matches_linux_6_1_measurements` in the tests).

use bitflags::bitflags;
use std::fmt;

use crate::caps::{DeviceCaps, Mtu};

/// `EINVAL`: what kernel rxe answers for every refused `modify_qp` except
/// [`QpAttrMask::RATE_LIMIT`].
pub const EINVAL: i32 = 22;

/// `EOPNOTSUPP`: what `rxe_modify_qp` answers for attribute bits outside the
/// standard set (`IB_QP_ATTR_STANDARD_BITS`), i.e. `IBV_QP_RATE_LIMIT`.
pub const EOPNOTSUPP: i32 = 95;

/// QP state (`enum ibv_qp_state`, IBTA §10.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// `IBV_QPS_RESET`: a new QP; nothing is sent or received.
    Reset,
    /// `IBV_QPS_INIT`: receive WRs may be posted, nothing is processed.
    Init,
    /// `IBV_QPS_RTR`: ready to receive.
    Rtr,
    /// `IBV_QPS_RTS`: ready to send.
    Rts,
    /// `IBV_QPS_SQD`: the send queue drains, then stops.
    Sqd,
    /// `IBV_QPS_SQE`: send queue error (UC/UD only); rxe never enters it.
    Sqe,
    /// `IBV_QPS_ERR`: every WR is flushed with an error.
    Err,
}

impl QpState {
    /// Every state, in `ibv_qp_state` order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The `ibv_qp_state` value (0..=6).
    pub fn ibv(self) -> u32 {
        self as u32
    }

    /// From an `ibv_qp_state` value; `None` for anything above 6, which
    /// uverbs refuses with EINVAL.
    pub fn from_ibv(v: u32) -> Option<QpState> {
        QpState::ALL.get(usize::try_from(v).ok()?).copied()
    }
}

impl fmt::Display for QpState {
    /// The IBTA short name: `RESET`, `INIT`, `RTR`, `RTS`, `SQD`, `SQE`, `ERR`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        })
    }
}

/// QP transport service type: kernel rxe's three (`rxe_qp_chk_init` also
/// takes GSI/SMI, which rxe-emu does not), plus the two halves of XRC
/// (IBTA Annex A14), which kernel rxe lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable Connected (`IBV_QPT_RC`).
    Rc,
    /// Unreliable Connected (`IBV_QPT_UC`).
    Uc,
    /// Unreliable Datagram (`IBV_QPT_UD`).
    Ud,
    /// XRC initiator (`IBV_QPT_XRC_SEND`, kernel `IB_QPT_XRC_INI`): sends
    /// RC-like requests to the XRC SRQ each WR names; receives nothing.
    XrcSend,
    /// XRC target (`IBV_QPT_XRC_RECV`, kernel `IB_QPT_XRC_TGT`): in an XRC
    /// domain, no PD or CQs; executes requests with the PD, receive
    /// queue and CQ of the XRC SRQ each request names.
    XrcRecv,
}

impl QpType {
    /// The QP types kernel rxe supports.
    pub const ALL: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

    /// The XRC QP types.
    pub const XRC: [QpType; 2] = [QpType::XrcSend, QpType::XrcRecv];

    /// The `ibv_qp_type` value.
    pub fn ibv(self) -> u32 {
        match self {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
            QpType::XrcSend => 9,
            QpType::XrcRecv => 10,
        }
    }

    /// From an `ibv_qp_type` value; `None` for types rxe-emu does not
    /// implement.
    pub fn from_ibv(v: u32) -> Option<QpType> {
        QpType::ALL
            .into_iter()
            .chain(QpType::XRC)
            .find(|t| t.ibv() == v)
    }

    /// Reliable: PSNs, ACKs, retransmission (RC and both XRC halves).
    pub fn is_reliable(self) -> bool {
        matches!(self, QpType::Rc | QpType::XrcSend | QpType::XrcRecv)
    }

    /// One of the XRC halves.
    pub fn is_xrc(self) -> bool {
        matches!(self, QpType::XrcSend | QpType::XrcRecv)
    }
}

impl fmt::Display for QpType {
    /// `RC`, `UC` or `UD`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::XrcSend => "XRC_SEND",
            QpType::XrcRecv => "XRC_RECV",
        })
    }
}

bitflags! {
    /// Which fields of a [`QpAttr`] a `modify_qp` sets (`enum
    /// ibv_qp_attr_mask`; the bit values are the ABI's).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`: move to `qp_state`.
        const STATE = 1 << 0;
        /// `IBV_QP_CUR_STATE`: the caller asserts the QP is in `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: raise SQ_DRAINED when SQD is reached.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`: remote READ/WRITE/atomic permission.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY` (UD).
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`: the primary path (`ah_attr`).
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`: the local ACK timeout exponent.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`: the first PSN the responder expects.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`: outstanding READ/atomic as requester.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`: the alternate path (never accepted on RoCE).
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`: the timer code sent in RNR NAKs.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`: the first PSN the requester sends.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`: READ/atomic responder resources.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`.
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`: queue sizes (never accepted by modify_qp).
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`.
        const DEST_QPN = 1 << 20;
        /// `IBV_QP_RATE_LIMIT`: packet pacing (raw packet QPs only).
        const RATE_LIMIT = 1 << 25;
    }
}

/// Every attribute bit with its ibv name, in bit order.
const MASK_NAMES: [(QpAttrMask, &str); 22] = [
    (QpAttrMask::STATE, "IBV_QP_STATE"),
    (QpAttrMask::CUR_STATE, "IBV_QP_CUR_STATE"),
    (
        QpAttrMask::EN_SQD_ASYNC_NOTIFY,
        "IBV_QP_EN_SQD_ASYNC_NOTIFY",
    ),
    (QpAttrMask::ACCESS_FLAGS, "IBV_QP_ACCESS_FLAGS"),
    (QpAttrMask::PKEY_INDEX, "IBV_QP_PKEY_INDEX"),
    (QpAttrMask::PORT, "IBV_QP_PORT"),
    (QpAttrMask::QKEY, "IBV_QP_QKEY"),
    (QpAttrMask::AV, "IBV_QP_AV"),
    (QpAttrMask::PATH_MTU, "IBV_QP_PATH_MTU"),
    (QpAttrMask::TIMEOUT, "IBV_QP_TIMEOUT"),
    (QpAttrMask::RETRY_CNT, "IBV_QP_RETRY_CNT"),
    (QpAttrMask::RNR_RETRY, "IBV_QP_RNR_RETRY"),
    (QpAttrMask::RQ_PSN, "IBV_QP_RQ_PSN"),
    (QpAttrMask::MAX_QP_RD_ATOMIC, "IBV_QP_MAX_QP_RD_ATOMIC"),
    (QpAttrMask::ALT_PATH, "IBV_QP_ALT_PATH"),
    (QpAttrMask::MIN_RNR_TIMER, "IBV_QP_MIN_RNR_TIMER"),
    (QpAttrMask::SQ_PSN, "IBV_QP_SQ_PSN"),
    (QpAttrMask::MAX_DEST_RD_ATOMIC, "IBV_QP_MAX_DEST_RD_ATOMIC"),
    (QpAttrMask::PATH_MIG_STATE, "IBV_QP_PATH_MIG_STATE"),
    (QpAttrMask::CAP, "IBV_QP_CAP"),
    (QpAttrMask::DEST_QPN, "IBV_QP_DEST_QPN"),
    (QpAttrMask::RATE_LIMIT, "IBV_QP_RATE_LIMIT"),
];

impl QpAttrMask {
    /// The ibv names of the set bits, in bit order, e.g.
    /// `["IBV_QP_AV", "IBV_QP_PATH_MTU"]`, so messages and logs speak the
    /// names a programmer wrote in the `ibv_modify_qp` call.
    pub fn names(self) -> Vec<&'static str> {
        MASK_NAMES
            .iter()
            .filter(|(bit, _)| self.contains(*bit))
            .map(|(_, name)| *name)
            .collect()
    }

    /// The names joined with ", ".
    fn list(self) -> String {
        self.names().join(", ")
    }

    /// The union of `bits`, usable in `const` tables.
    const fn union_of(bits: &[QpAttrMask]) -> QpAttrMask {
        let mut acc = 0;
        let mut i = 0;
        while i < bits.len() {
            acc |= bits[i].bits();
            i += 1;
        }
        QpAttrMask::from_bits_retain(acc)
    }
}

/// An address vector (`struct ibv_ah_attr` with its `struct
/// ibv_global_route` flattened in). On RoCE the GRH carries the IP
/// addresses, so `is_global` must be set (`rdma_check_ah_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// Destination GID: an IPv6 address, or `::ffff:a.b.c.d` for IPv4.
    pub dgid: [u8; 16],
    /// Index of the source GID in the port's GID table.
    pub sgid_index: u8,
    /// IPv6 flow label (20 bits); rxe also hashes it into the UDP source port.
    pub flow_label: u32,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP TOS / traffic class.
    pub traffic_class: u8,
    /// Service level; unused on RoCE.
    pub sl: u8,
    /// Port number; rxe has one port, number 1.
    pub port_num: u8,
    /// A GRH is present; required on RoCE.
    pub is_global: bool,
    /// Destination LID; unused on RoCE.
    pub dlid: u16,
    /// Source path bits; unused on RoCE.
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`); rxe ignores it.
    pub static_rate: u8,
}

/// Queue capacities (`struct ibv_qp_cap`), fixed at `create_qp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Send queue depth in WRs.
    pub max_send_wr: u32,
    /// Receive queue depth in WRs (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

/// Path migration state (`enum ibv_mig_state`) of IBTA automatic path
/// migration. RoCE has no alternate path, so rxe only stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MigState {
    /// `IBV_MIG_MIGRATED` (0): the initial state.
    #[default]
    Migrated,
    /// `IBV_MIG_REARM` (1).
    Rearm,
    /// `IBV_MIG_ARMED` (2).
    Armed,
}

impl MigState {
    /// The `ibv_mig_state` value.
    pub fn ibv(self) -> u32 {
        self as u32
    }

    /// From an `ibv_mig_state` value.
    pub fn from_ibv(v: u32) -> Option<MigState> {
        Some(match v {
            0 => MigState::Migrated,
            1 => MigState::Rearm,
            2 => MigState::Armed,
            _ => return None,
        })
    }
}

/// The attributes of `ibv_modify_qp` / `ibv_query_qp` (`struct
/// ibv_qp_attr`, the fields the engine uses). Only the fields whose bit is
/// in the accompanying [`QpAttrMask`] mean anything in a modify.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct QpAttr {
    /// Target state ([`QpAttrMask::STATE`]). `None` only when unset, or when
    /// the C caller's value was not a valid `ibv_qp_state`.
    pub qp_state: Option<QpState>,
    /// The state the caller believes the QP is in ([`QpAttrMask::CUR_STATE`]).
    pub cur_qp_state: Option<QpState>,
    /// Path MTU ([`QpAttrMask::PATH_MTU`]); `None` if not a valid `ibv_mtu`.
    pub path_mtu: Option<Mtu>,
    /// [`QpAttrMask::PATH_MIG_STATE`].
    pub path_mig_state: MigState,
    /// Q_Key of a UD QP ([`QpAttrMask::QKEY`]).
    pub qkey: u32,
    /// First expected request PSN ([`QpAttrMask::RQ_PSN`]; 24 bits are used).
    pub rq_psn: u32,
    /// First request PSN to send ([`QpAttrMask::SQ_PSN`]; 24 bits are used).
    pub sq_psn: u32,
    /// Remote QPN of a connected QP ([`QpAttrMask::DEST_QPN`]).
    pub dest_qp_num: u32,
    /// Raw `ibv_access_flags` bits ([`QpAttrMask::ACCESS_FLAGS`]).
    pub qp_access_flags: u32,
    /// Queue sizes ([`QpAttrMask::CAP`] in a modify; reported by query).
    pub cap: QpCap,
    /// Primary path ([`QpAttrMask::AV`]).
    pub ah_attr: AhAttr,
    /// Alternate path ([`QpAttrMask::ALT_PATH`]).
    pub alt_ah_attr: AhAttr,
    /// [`QpAttrMask::PKEY_INDEX`].
    pub pkey_index: u16,
    /// P_Key index of the alternate path.
    pub alt_pkey_index: u16,
    /// [`QpAttrMask::EN_SQD_ASYNC_NOTIFY`].
    pub en_sqd_async_notify: bool,
    /// Output of query only: the QP is in SQD and still draining.
    pub sq_draining: bool,
    /// [`QpAttrMask::MAX_QP_RD_ATOMIC`].
    pub max_rd_atomic: u8,
    /// [`QpAttrMask::MAX_DEST_RD_ATOMIC`].
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code, IBTA §9.7.5.2.8 ([`QpAttrMask::MIN_RNR_TIMER`]).
    pub min_rnr_timer: u8,
    /// [`QpAttrMask::PORT`].
    pub port_num: u8,
    /// ACK timeout exponent: 4.096 µs × 2^timeout, 0 = none
    /// ([`QpAttrMask::TIMEOUT`]).
    pub timeout: u8,
    /// Transport retries; 7 = forever ([`QpAttrMask::RETRY_CNT`]).
    pub retry_cnt: u8,
    /// RNR retries; 7 = forever ([`QpAttrMask::RNR_RETRY`]).
    pub rnr_retry: u8,
    /// Port of the alternate path.
    pub alt_port_num: u8,
    /// ACK timeout of the alternate path.
    pub alt_timeout: u8,
    /// Packet pacing in kbps ([`QpAttrMask::RATE_LIMIT`]; unsupported).
    pub rate_limit: u32,
}

/// Why a `modify_qp` is refused.
///
/// The kernel says only EINVAL (see [`ModifyQpError::errno`]); the
/// `Display` text names the attribute by its `IBV_QP_*` name and the
/// transition, and says what would be accepted instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModifyQpError {
    /// [`QpAttrMask::STATE`] or [`QpAttrMask::CUR_STATE`] is in the mask but
    /// its field (`qp_state` / `cur_qp_state`) holds no valid state. uverbs
    /// refuses an out-of-range state the same way.
    NoStateGiven,
    /// [`QpAttrMask::CUR_STATE`] names a state the QP is not in.
    CurStateMismatch {
        /// What the caller claimed.
        given: QpState,
        /// The state the QP is in.
        actual: QpState,
    },
    /// IBTA §10.3.1 has no such transition for this QP type
    /// (`qp_state_table[from][to].valid` is 0).
    IllegalTransition {
        /// The QP's type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// The transition requires attributes the mask lacks
    /// (`qp_state_table[..].req_param`).
    MissingAttribute {
        /// The QP's type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The required bits that are not in the mask.
        missing: QpAttrMask,
        /// Everything the transition requires.
        required: QpAttrMask,
    },
    /// The mask has attributes the transition does not take: outside
    /// `req_param | opt_param`, or never accepted on a RoCE rxe device
    /// (`IBV_QP_ALT_PATH`, `IBV_QP_RATE_LIMIT`, `IBV_QP_CAP`).
    ForbiddenAttribute {
        /// The QP's type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The offending bits.
        forbidden: QpAttrMask,
        /// What the transition does accept besides `IBV_QP_STATE`.
        allowed: QpAttrMask,
    },
    /// An attribute value is outside what the device or the IB field width
    /// allows (`rxe_qp_chk_attr` and friends).
    ValueOutOfRange {
        /// The `struct ibv_qp_attr` field, e.g. `"timeout"` or
        /// `"ah_attr.port_num"`.
        attr: &'static str,
        /// The value given.
        value: u64,
        /// The largest value accepted (for `is_global`/`port_num`-style
        /// fields, the one value accepted).
        limit: u64,
        /// Why, in words a person can act on.
        why: &'static str,
    },
    /// The QP is in SQD and its send queue is still draining; until it has
    /// drained only ERR may be entered (`__qp_chk_state` / `rxe_qp_chk_attr`
    /// in `rxe_qp.c`). See [`check_sqd_drain`].
    SqdDraining {
        /// The QP's type.
        qp_type: QpType,
        /// Requested state.
        to: QpState,
    },
}

impl ModifyQpError {
    /// The errno kernel rxe returns for this refusal: [`EOPNOTSUPP`] when
    /// the mask has `IBV_QP_RATE_LIMIT` (`rxe_modify_qp` refuses bits outside
    /// `IB_QP_ATTR_STANDARD_BITS` that way, measured on Linux 6.1),
    /// [`EINVAL`] for everything else.
    pub fn errno(&self) -> i32 {
        match self {
            ModifyQpError::ForbiddenAttribute { forbidden, .. }
                if forbidden.contains(QpAttrMask::RATE_LIMIT) =>
            {
                EOPNOTSUPP
            }
            _ => EINVAL,
        }
    }
}

/// "attribute X is" / "attributes X, Y are".
fn attribute_phrase(bits: QpAttrMask) -> String {
    if bits.names().len() == 1 {
        format!("attribute {} is", bits.list())
    } else {
        format!("attributes {} are", bits.list())
    }
}

impl fmt::Display for ModifyQpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModifyQpError::NoStateGiven => f.write_str(
                "modify_qp: IBV_QP_STATE or IBV_QP_CUR_STATE is in the mask but its field \
                 (qp_state / cur_qp_state) holds no valid state; set it to RESET, INIT, RTR, \
                 RTS, SQD, SQE or ERR, or clear the bit",
            ),
            ModifyQpError::CurStateMismatch { given, actual } => write!(
                f,
                "modify_qp: IBV_QP_CUR_STATE says {given} but the QP is in {actual}; \
                 query the QP or drop IBV_QP_CUR_STATE from the mask"
            ),
            ModifyQpError::IllegalTransition { qp_type, from, to } => {
                let targets: Vec<String> = legal_targets(*qp_type, *from)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                let article = if *qp_type == QpType::Rc { "an" } else { "a" };
                write!(
                    f,
                    "modify_qp {qp_type} {from}->{to}: IBTA does not allow this transition; \
                     from {from} {article} {qp_type} QP may go to {}",
                    targets.join(", ")
                )?;
                if *from == *to {
                    f.write_str(" (a mask without IBV_QP_STATE means staying in the same state)")?;
                }
                Ok(())
            }
            ModifyQpError::MissingAttribute {
                qp_type,
                from,
                to,
                missing,
                required,
            } => write!(
                f,
                "modify_qp {qp_type} {from}->{to}: required {} missing \
                 ({qp_type} {from}->{to} needs {})",
                attribute_phrase(*missing),
                required.list()
            ),
            ModifyQpError::ForbiddenAttribute {
                qp_type,
                from,
                to,
                forbidden,
                allowed,
            } => {
                write!(
                    f,
                    "modify_qp {qp_type} {from}->{to}: {} not allowed in this transition",
                    attribute_phrase(*forbidden)
                )?;
                if transition_masks(*qp_type, *from, *to).is_none() {
                    write!(f, " (nor is {from}->{to} a legal transition for {qp_type})")?;
                } else if allowed.is_empty() {
                    write!(
                        f,
                        " ({qp_type} {from}->{to} takes no attribute besides IBV_QP_STATE)"
                    )?;
                } else {
                    write!(
                        f,
                        " ({qp_type} {from}->{to} also accepts {})",
                        allowed.list()
                    )?;
                }
                if forbidden.contains(QpAttrMask::ALT_PATH) {
                    f.write_str(
                        "; RoCE has no alternate path: the kernel refuses IBV_QP_ALT_PATH \
                         on RoCE ports",
                    )?;
                }
                if forbidden.contains(QpAttrMask::RATE_LIMIT) {
                    f.write_str("; rxe has no packet pacing (EOPNOTSUPP)")?;
                }
                if forbidden.contains(QpAttrMask::CAP) {
                    f.write_str("; queue sizes are fixed at create_qp and cannot be modified")?;
                }
                if forbidden.contains(QpAttrMask::PORT)
                    && allowed.contains(QpAttrMask::AV)
                    && *to != QpState::Rtr
                {
                    f.write_str(
                        "; uverbs adds IBV_QP_PORT whenever IBV_QP_AV is set outside \
                         INIT->RTR, so this QP type cannot change its path here",
                    )?;
                }
                Ok(())
            }
            ModifyQpError::ValueOutOfRange {
                attr,
                value,
                limit,
                why,
            } => {
                if value > limit {
                    write!(
                        f,
                        "modify_qp: {attr} = {value} exceeds its limit {limit}: {why}"
                    )
                } else {
                    write!(f, "modify_qp: {attr} = {value} is not accepted: {why}")
                }
            }
            ModifyQpError::SqdDraining { qp_type, to } => write!(
                f,
                "modify_qp {qp_type} SQD->{to}: the send queue is still draining; wait for \
                 IBV_EVENT_SQ_DRAINED (or until query_qp reports sq_draining = 0), or move \
                 the QP to ERR"
            ),
        }
    }
}

impl std::error::Error for ModifyQpError {}

/// What one legal transition takes for one QP type: the
/// `req_param`/`opt_param` pair of Linux `qp_state_table`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransitionAttrs {
    /// Bits the mask must have (besides `IBV_QP_STATE`).
    pub required: QpAttrMask,
    /// Bits the mask may have.
    pub optional: QpAttrMask,
}

impl TransitionAttrs {
    /// A transition that takes nothing but `IBV_QP_STATE`.
    const BARE: TransitionAttrs = TransitionAttrs::new(QpAttrMask::empty(), QpAttrMask::empty());

    const fn new(required: QpAttrMask, optional: QpAttrMask) -> TransitionAttrs {
        TransitionAttrs { required, optional }
    }

    const fn required(bits: &[QpAttrMask]) -> TransitionAttrs {
        TransitionAttrs::new(QpAttrMask::union_of(bits), QpAttrMask::empty())
    }

    const fn optional(bits: &[QpAttrMask]) -> TransitionAttrs {
        TransitionAttrs::new(QpAttrMask::empty(), QpAttrMask::union_of(bits))
    }
}

/// One legal (from, to) pair and what it takes for RC, UC, UD and the XRC
/// initiator and target.
struct TableRow {
    from: QpState,
    to: QpState,
    rc: TransitionAttrs,
    uc: TransitionAttrs,
    ud: TransitionAttrs,
    xrc_ini: TransitionAttrs,
    xrc_tgt: TransitionAttrs,
}

impl TableRow {
    /// A transition that takes the same attributes for every type.
    const fn uniform(from: QpState, to: QpState, attrs: TransitionAttrs) -> TableRow {
        TableRow {
            from,
            to,
            rc: attrs,
            uc: attrs,
            ud: attrs,
            xrc_ini: attrs,
            xrc_tgt: attrs,
        }
    }

    fn for_type(&self, qp_type: QpType) -> TransitionAttrs {
        match qp_type {
            QpType::Rc => self.rc,
            QpType::Uc => self.uc,
            QpType::Ud => self.ud,
            QpType::XrcSend => self.xrc_ini,
            QpType::XrcRecv => self.xrc_tgt,
        }
    }
}

/// The IBTA QP state machine as Linux `qp_state_table` (`verbs.c`) has it,
/// for RC, UC and UD. Every (from, to) pair not listed is illegal. Note what
/// the kernel leaves out: RESET->ERR, RTR->RTR, SQE->SQE, and every bit not
/// named here (`IBV_QP_CAP`; `IBV_QP_RATE_LIMIT`, which is for raw packet
/// QPs only).
const QP_STATE_TABLE: [TableRow; 22] = {
    use QpAttrMask as A;
    use QpState::*;
    use TransitionAttrs as T;
    [
        TableRow::uniform(Reset, Reset, T::BARE),
        TableRow {
            from: Reset,
            to: Init,
            rc: T::required(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            uc: T::required(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            ud: T::required(&[A::PKEY_INDEX, A::PORT, A::QKEY]),
            xrc_ini: T::required(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            xrc_tgt: T::required(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
        },
        TableRow::uniform(Init, Reset, T::BARE),
        TableRow::uniform(Init, Err, T::BARE),
        TableRow {
            from: Init,
            to: Init,
            rc: T::optional(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            uc: T::optional(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            ud: T::optional(&[A::PKEY_INDEX, A::PORT, A::QKEY]),
            xrc_ini: T::optional(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
            xrc_tgt: T::optional(&[A::PKEY_INDEX, A::PORT, A::ACCESS_FLAGS]),
        },
        TableRow {
            from: Init,
            to: Rtr,
            rc: T::new(
                QpAttrMask::union_of(&[
                    A::AV,
                    A::PATH_MTU,
                    A::DEST_QPN,
                    A::RQ_PSN,
                    A::MAX_DEST_RD_ATOMIC,
                    A::MIN_RNR_TIMER,
                ]),
                QpAttrMask::union_of(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            ),
            uc: T::new(
                QpAttrMask::union_of(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN]),
                QpAttrMask::union_of(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            ),
            ud: T::optional(&[A::PKEY_INDEX, A::QKEY]),
            xrc_ini: T::new(
                QpAttrMask::union_of(&[A::AV, A::PATH_MTU, A::DEST_QPN, A::RQ_PSN]),
                QpAttrMask::union_of(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            ),
            xrc_tgt: T::new(
                QpAttrMask::union_of(&[
                    A::AV,
                    A::PATH_MTU,
                    A::DEST_QPN,
                    A::RQ_PSN,
                    A::MAX_DEST_RD_ATOMIC,
                    A::MIN_RNR_TIMER,
                ]),
                QpAttrMask::union_of(&[A::ALT_PATH, A::ACCESS_FLAGS, A::PKEY_INDEX]),
            ),
        },
        TableRow::uniform(Rtr, Reset, T::BARE),
        TableRow::uniform(Rtr, Err, T::BARE),
        TableRow {
            from: Rtr,
            to: Rts,
            rc: T::new(
                QpAttrMask::union_of(&[
                    A::TIMEOUT,
                    A::RETRY_CNT,
                    A::RNR_RETRY,
                    A::SQ_PSN,
                    A::MAX_QP_RD_ATOMIC,
                ]),
                QpAttrMask::union_of(&[
                    A::CUR_STATE,
                    A::ALT_PATH,
                    A::ACCESS_FLAGS,
                    A::MIN_RNR_TIMER,
                    A::PATH_MIG_STATE,
                ]),
            ),
            uc: T::new(
                A::SQ_PSN,
                QpAttrMask::union_of(&[
                    A::CUR_STATE,
                    A::ALT_PATH,
                    A::ACCESS_FLAGS,
                    A::PATH_MIG_STATE,
                ]),
            ),
            ud: T::new(A::SQ_PSN, QpAttrMask::union_of(&[A::CUR_STATE, A::QKEY])),
            xrc_ini: T::new(
                QpAttrMask::union_of(&[
                    A::TIMEOUT,
                    A::RETRY_CNT,
                    A::RNR_RETRY,
                    A::SQ_PSN,
                    A::MAX_QP_RD_ATOMIC,
                ]),
                QpAttrMask::union_of(&[
                    A::CUR_STATE,
                    A::ALT_PATH,
                    A::ACCESS_FLAGS,
                    A::PATH_MIG_STATE,
                ]),
            ),
            xrc_tgt: T::new(
                QpAttrMask::union_of(&[A::TIMEOUT, A::SQ_PSN]),
                QpAttrMask::union_of(&[
                    A::CUR_STATE,
                    A::ALT_PATH,
                    A::ACCESS_FLAGS,
                    A::MIN_RNR_TIMER,
                    A::PATH_MIG_STATE,
                ]),
            ),
        },
        TableRow::uniform(Rts, Reset, T::BARE),
        TableRow::uniform(Rts, Err, T::BARE),
        TableRow {
            from: Rts,
            to: Rts,
            rc: T::optional(&[
                A::CUR_STATE,
                A::ACCESS_FLAGS,
                A::ALT_PATH,
                A::PATH_MIG_STATE,
                A::MIN_RNR_TIMER,
            ]),
            uc: T::optional(&[
                A::CUR_STATE,
                A::ACCESS_FLAGS,
                A::ALT_PATH,
                A::PATH_MIG_STATE,
            ]),
            ud: T::optional(&[A::CUR_STATE, A::QKEY]),
            xrc_ini: T::optional(&[
                A::CUR_STATE,
                A::ACCESS_FLAGS,
                A::ALT_PATH,
                A::PATH_MIG_STATE,
            ]),
            xrc_tgt: T::optional(&[
                A::CUR_STATE,
                A::ACCESS_FLAGS,
                A::ALT_PATH,
                A::PATH_MIG_STATE,
                A::MIN_RNR_TIMER,
            ]),
        },
        TableRow::uniform(Rts, Sqd, T::optional(&[A::EN_SQD_ASYNC_NOTIFY])),
        TableRow::uniform(Sqd, Reset, T::BARE),
        TableRow::uniform(Sqd, Err, T::BARE),
        TableRow {
            from: Sqd,
            to: Rts,
            rc: T::optional(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
            uc: T::optional(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PATH_MIG_STATE,
            ]),
            ud: T::optional(&[A::CUR_STATE, A::QKEY]),
            xrc_ini: T::optional(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PATH_MIG_STATE,
            ]),
            xrc_tgt: T::optional(&[
                A::CUR_STATE,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
        },
        TableRow {
            from: Sqd,
            to: Sqd,
            rc: T::optional(&[
                A::PORT,
                A::AV,
                A::TIMEOUT,
                A::RETRY_CNT,
                A::RNR_RETRY,
                A::MAX_QP_RD_ATOMIC,
                A::MAX_DEST_RD_ATOMIC,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
            uc: T::optional(&[
                A::AV,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::PATH_MIG_STATE,
            ]),
            ud: T::optional(&[A::PKEY_INDEX, A::QKEY]),
            xrc_ini: T::optional(&[
                A::PORT,
                A::AV,
                A::TIMEOUT,
                A::RETRY_CNT,
                A::RNR_RETRY,
                A::MAX_QP_RD_ATOMIC,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::PATH_MIG_STATE,
            ]),
            xrc_tgt: T::optional(&[
                A::PORT,
                A::AV,
                A::TIMEOUT,
                A::MAX_DEST_RD_ATOMIC,
                A::ALT_PATH,
                A::ACCESS_FLAGS,
                A::PKEY_INDEX,
                A::MIN_RNR_TIMER,
                A::PATH_MIG_STATE,
            ]),
        },
        TableRow::uniform(Sqe, Reset, T::BARE),
        TableRow::uniform(Sqe, Err, T::BARE),
        // The kernel marks SQE->RTS valid for every type but lists
        // attributes only for UC and UD; an RC QP never enters SQE.
        TableRow {
            from: Sqe,
            to: Rts,
            rc: T::BARE,
            uc: T::optional(&[A::CUR_STATE, A::ACCESS_FLAGS]),
            ud: T::optional(&[A::CUR_STATE, A::QKEY]),
            xrc_ini: T::BARE,
            xrc_tgt: T::BARE,
        },
        TableRow::uniform(Err, Reset, T::BARE),
        TableRow::uniform(Err, Err, T::BARE),
    ]
};

/// Bits no transition accepts on a RoCE rxe device although the table
/// lists them: `_ib_modify_qp` (`verbs.c`) bans alternate paths on RoCE
/// ports ("the core code can only handle alternate paths and APM for IB").
const REFUSED_ON_ROCE: QpAttrMask = QpAttrMask::ALT_PATH;

/// What `from -> to` takes for `qp_type` according to the kernel table, or
/// `None` if the transition is illegal (IBTA §10.3.1, Linux
/// `qp_state_table`).
///
/// This is the table as the kernel has it. [`validate_transition`] also
/// refuses `IBV_QP_ALT_PATH` (RoCE) and applies the uverbs `IBV_QP_AV`
/// rule, so not every optional bit here is usable on rxe.
pub fn transition_masks(qp_type: QpType, from: QpState, to: QpState) -> Option<TransitionAttrs> {
    QP_STATE_TABLE
        .iter()
        .find(|row| row.from == from && row.to == to)
        .map(|row| row.for_type(qp_type))
}

/// The states `from` may move to, in `ibv_qp_state` order.
fn legal_targets(qp_type: QpType, from: QpState) -> Vec<QpState> {
    QpState::ALL
        .into_iter()
        .filter(|to| transition_masks(qp_type, from, *to).is_some())
        .collect()
}

/// Check a `modify_qp` mask against the IBTA state machine and return the
/// state the QP moves to.
///
/// This is `ib_modify_qp_is_ok()` with `qp_state_table` (`verbs.c`) as
/// rxe calls it from `rxe_qp_chk_attr` (`rxe_qp.c`), plus the rules the
/// kernel's uverbs and core layers apply on the way:
///
/// - Without `IBV_QP_STATE` the transition is current -> current, as in the
///   kernel, so e.g. a bare `IBV_QP_MIN_RNR_TIMER` works in RTS but not in
///   RTR (there is no RTR->RTR).
/// - `IBV_QP_CUR_STATE` is accepted only where the table lists it (into RTS)
///   and only if it names the state the QP is in. The kernel trusts the
///   caller instead and checks the table from the claimed state (Linux 6.1
///   lets a UD QP in RTS pass `CUR_STATE = SQE`); refusing a wrong claim
///   keeps the engine from, say, entering RTS from RESET.
/// - `IBV_QP_RATE_LIMIT` is refused first, with errno EOPNOTSUPP as
///   `rxe_modify_qp` does.
/// - `IBV_QP_ALT_PATH` is refused in every transition: `_ib_modify_qp` bans
///   alternate paths on RoCE ports.
/// - When `IBV_QP_AV` is set and the transition is not into RTR, uverbs
///   (`modify_qp` in `uverbs_cmd.c`) adds `IBV_QP_PORT` to the mask, so a
///   UC QP cannot change its AV in SQD->SQD (measured on Linux 6.1).
///
/// Only the mask and the state fields of `attr` are looked at; values are
/// [`check_values`]'s job.
pub fn validate_transition(
    qp_type: QpType,
    cur: QpState,
    mask: QpAttrMask,
    attr: &QpAttr,
) -> Result<QpState, ModifyQpError> {
    let next = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state.ok_or(ModifyQpError::NoStateGiven)?
    } else {
        cur
    };
    if mask.contains(QpAttrMask::CUR_STATE) {
        let given = attr.cur_qp_state.ok_or(ModifyQpError::NoStateGiven)?;
        if given != cur {
            return Err(ModifyQpError::CurStateMismatch { given, actual: cur });
        }
    }
    let table = transition_masks(qp_type, cur, next);
    let accepted = table.map_or(QpAttrMask::empty(), |t| {
        (t.required | t.optional) - REFUSED_ON_ROCE
    });
    if mask.contains(QpAttrMask::RATE_LIMIT) {
        return Err(ModifyQpError::ForbiddenAttribute {
            qp_type,
            from: cur,
            to: next,
            forbidden: QpAttrMask::RATE_LIMIT,
            allowed: accepted,
        });
    }
    let table = table.ok_or(ModifyQpError::IllegalTransition {
        qp_type,
        from: cur,
        to: next,
    })?;
    let mut given = mask - QpAttrMask::STATE;
    if given.contains(QpAttrMask::AV) && next != QpState::Rtr {
        given |= QpAttrMask::PORT;
    }
    let missing = table.required - given;
    if !missing.is_empty() {
        return Err(ModifyQpError::MissingAttribute {
            qp_type,
            from: cur,
            to: next,
            missing,
            required: table.required,
        });
    }
    let forbidden = given - accepted;
    if !forbidden.is_empty() {
        return Err(ModifyQpError::ForbiddenAttribute {
            qp_type,
            from: cur,
            to: next,
            forbidden,
            allowed: accepted,
        });
    }
    Ok(next)
}

/// Refuse leaving SQD while the send queue still drains: kernel rxe
/// (`__qp_chk_state` in 6.4+, `rxe_qp_chk_attr` before) lets a draining SQD
/// QP go only to ERR, IBTA §10.3.1 (SQD). `sq_draining` is the QP's
/// own flag (what `query_qp` reports), which [`validate_transition`] does
/// not see. Call it after `validate_transition` with the state it returned.
pub fn check_sqd_drain(
    qp_type: QpType,
    cur: QpState,
    mask: QpAttrMask,
    next: QpState,
    sq_draining: bool,
) -> Result<(), ModifyQpError> {
    if mask.contains(QpAttrMask::STATE)
        && cur == QpState::Sqd
        && sq_draining
        && next != QpState::Err
    {
        return Err(ModifyQpError::SqdDraining { qp_type, to: next });
    }
    Ok(())
}

/// `Err(ValueOutOfRange)` when `value > limit`.
fn at_most(
    attr: &'static str,
    value: u64,
    limit: u64,
    why: &'static str,
) -> Result<(), ModifyQpError> {
    if value > limit {
        return Err(ModifyQpError::ValueOutOfRange {
            attr,
            value,
            limit,
            why,
        });
    }
    Ok(())
}

/// `Err(ValueOutOfRange)` unless `value < len` (an index into a table of
/// `len` entries). An empty table refuses every index.
fn index_below(
    attr: &'static str,
    value: u64,
    len: u64,
    why: &'static str,
) -> Result<(), ModifyQpError> {
    if value >= len {
        return Err(ModifyQpError::ValueOutOfRange {
            attr,
            value,
            limit: len.saturating_sub(1),
            why,
        });
    }
    Ok(())
}

/// The one port rxe has (`RXE_NUM_PORT`; `rdma_is_port_valid` accepts 1).
const RXE_PORT: u64 = 1;

/// Check attribute values the way kernel rxe does (`rxe_qp_chk_attr` in
/// `rxe_qp.c`, and `rdma_check_ah_attr` / uverbs before it), plus the IB
/// field widths. Only attributes whose bit is in `mask` are checked.
///
/// Kernel checks (Linux 6.1 refuses these with EINVAL):
/// - `port_num` and `ah_attr.port_num` must be 1 (`rdma_is_port_valid`);
/// - `ah_attr.is_global` must be set: RoCE addresses live in the GRH
///   (`rdma_check_ah_attr`);
/// - `path_mtu` must be a valid `ibv_mtu` no larger than `port_mtu`;
/// - `timeout <= 31`, `max_rd_atomic <= caps.max_qp_rd_atom`;
/// - `cap` within `caps` (`rxe_qp_chk_cap`; unreachable through
///   [`validate_transition`], which refuses `IBV_QP_CAP` like the kernel).
///
/// Stricter than Linux 6.1, which accepts these unchecked (measured): the
/// IB field widths `retry_cnt <= 7`, `rnr_retry <= 7`, `min_rnr_timer <= 31`
/// (IBTA §9.7.5.2.8); `max_dest_rd_atomic <= caps.max_qp_rd_atom`;
/// `pkey_index < caps.max_pkeys`; `ah_attr.sgid_index <
/// caps.gid_table_len` (the kernel answers ENODATA for an empty GID entry).
///
/// `port_mtu` is what `path_mtu` is compared with. Kernel rxe compares with
/// the port's `max_mtu`, which is always 4096, so it accepts a 4096 path MTU
/// on a 1500-byte netdev (measured); pass [`Mtu::M4096`] for that
/// behaviour, or the active MTU to be strict.
pub fn check_values(
    mask: QpAttrMask,
    attr: &QpAttr,
    caps: &DeviceCaps,
    port_mtu: Mtu,
) -> Result<(), ModifyQpError> {
    use QpAttrMask as A;
    if mask.contains(A::AV) {
        let ah = &attr.ah_attr;
        if u64::from(ah.port_num) != RXE_PORT {
            return Err(ModifyQpError::ValueOutOfRange {
                attr: "ah_attr.port_num",
                value: u64::from(ah.port_num),
                limit: RXE_PORT,
                why: "rxe has a single port, number 1",
            });
        }
        if !ah.is_global {
            return Err(ModifyQpError::ValueOutOfRange {
                attr: "ah_attr.is_global",
                value: 0,
                limit: 1,
                why: "RoCE needs a GRH: set is_global = 1 with dgid and sgid_index \
                      (the destination and source IP addresses)",
            });
        }
        index_below(
            "ah_attr.sgid_index",
            u64::from(ah.sgid_index),
            u64::from(caps.gid_table_len),
            "outside the port's GID table; list it with ibv_devinfo -v or \
             show_gids",
        )?;
    }
    if mask.contains(A::PORT) && u64::from(attr.port_num) != RXE_PORT {
        return Err(ModifyQpError::ValueOutOfRange {
            attr: "port_num",
            value: u64::from(attr.port_num),
            limit: RXE_PORT,
            why: "rxe has a single port, number 1",
        });
    }
    if mask.contains(A::PKEY_INDEX) {
        index_below(
            "pkey_index",
            u64::from(attr.pkey_index),
            u64::from(caps.max_pkeys),
            "outside the P_Key table; rxe's only P_Key, 0xffff, is at index 0",
        )?;
    }
    if mask.contains(A::CAP) {
        let cap = &attr.cap;
        at_most(
            "cap.max_send_wr",
            u64::from(cap.max_send_wr),
            u64::from(caps.max_qp_wr),
            "deeper than the device's max_qp_wr",
        )?;
        at_most(
            "cap.max_send_sge",
            u64::from(cap.max_send_sge),
            u64::from(caps.max_send_sge),
            "more SGEs than the device's max_sge",
        )?;
        at_most(
            "cap.max_recv_wr",
            u64::from(cap.max_recv_wr),
            u64::from(caps.max_qp_wr),
            "deeper than the device's max_qp_wr",
        )?;
        at_most(
            "cap.max_recv_sge",
            u64::from(cap.max_recv_sge),
            u64::from(caps.max_recv_sge),
            "more SGEs than the device's max_sge",
        )?;
        at_most(
            "cap.max_inline_data",
            u64::from(cap.max_inline_data),
            u64::from(caps.max_inline_data),
            "more inline data than rxe's send WQE holds",
        )?;
    }
    if mask.contains(A::PATH_MTU) {
        let mtu = attr.path_mtu.ok_or(ModifyQpError::ValueOutOfRange {
            attr: "path_mtu",
            value: 0,
            limit: u64::from(port_mtu.bytes()),
            why: "IBV_QP_PATH_MTU is set but path_mtu is not a valid ibv_mtu \
                  (IBV_MTU_256..IBV_MTU_4096)",
        })?;
        at_most(
            "path_mtu",
            u64::from(mtu.bytes()),
            u64::from(port_mtu.bytes()),
            "larger than the port MTU; use the active_mtu that ibv_query_port reports",
        )?;
    }
    if mask.contains(A::MAX_QP_RD_ATOMIC) {
        at_most(
            "max_rd_atomic",
            u64::from(attr.max_rd_atomic),
            u64::from(caps.max_qp_rd_atom),
            "more outstanding READ/atomic requests than the device's max_qp_rd_atom",
        )?;
    }
    if mask.contains(A::TIMEOUT) {
        at_most(
            "timeout",
            u64::from(attr.timeout),
            31,
            "the ACK timeout is a 5-bit exponent (4.096 us * 2^timeout, 0 = none)",
        )?;
    }
    if mask.contains(A::RETRY_CNT) {
        at_most(
            "retry_cnt",
            u64::from(attr.retry_cnt),
            7,
            "the retry count is 3 bits wide (7 = retry forever)",
        )?;
    }
    if mask.contains(A::RNR_RETRY) {
        at_most(
            "rnr_retry",
            u64::from(attr.rnr_retry),
            7,
            "the RNR retry count is 3 bits wide (7 = retry forever)",
        )?;
    }
    if mask.contains(A::MIN_RNR_TIMER) {
        at_most(
            "min_rnr_timer",
            u64::from(attr.min_rnr_timer),
            31,
            "the RNR NAK timer is a 5-bit code (IBTA 9.7.5.2.8; 12 = 0.64 ms)",
        )?;
    }
    if mask.contains(A::MAX_DEST_RD_ATOMIC) {
        at_most(
            "max_dest_rd_atomic",
            u64::from(attr.max_dest_rd_atomic),
            u64::from(caps.max_qp_rd_atom),
            "more READ/atomic responder resources than the device's max_qp_rd_atom",
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use QpAttrMask as M;
    // `Err` below is the QP state; results use `Result::Err`.
    use QpState::*;

    /// An attr whose state fields are filled in, as a caller would.
    fn to_state(from: QpState, to: QpState) -> QpAttr {
        QpAttr {
            qp_state: Some(to),
            cur_qp_state: Some(from),
            ..QpAttr::default()
        }
    }

    /// Every legal (type, from, to) with the kernel's masks.
    fn legal() -> Vec<(QpType, QpState, QpState, TransitionAttrs)> {
        let mut v = Vec::new();
        for t in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    if let Some(a) = transition_masks(t, from, to) {
                        v.push((t, from, to, a));
                    }
                }
            }
        }
        v
    }

    /// The optional bits rxe really accepts for a transition.
    fn usable_optional(from_table: TransitionAttrs, to: QpState) -> QpAttrMask {
        let mut opt = from_table.optional - REFUSED_ON_ROCE;
        let all = from_table.required | from_table.optional;
        if to != Rtr && !all.contains(M::PORT) {
            opt -= M::AV;
        }
        opt
    }

    /// The XRC columns of kernel `qp_state_table`: the initiator needs no
    /// responder attributes, the target no requester ones.
    #[test]
    fn xrc_columns_follow_the_kernel_table() {
        use QpType::{XrcRecv, XrcSend};
        let req = |t, f, to| transition_masks(t, f, to).unwrap().required;
        assert_eq!(
            req(XrcSend, Init, Rtr),
            M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
        );
        assert_eq!(
            req(XrcRecv, Init, Rtr),
            M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER
        );
        assert_eq!(
            req(XrcSend, Rtr, Rts),
            M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
        );
        assert_eq!(req(XrcRecv, Rtr, Rts), M::TIMEOUT | M::SQ_PSN);
        for t in QpType::XRC {
            assert_eq!(QpType::from_ibv(t.ibv()), Some(t));
            assert!(t.is_reliable() && t.is_xrc());
            assert_eq!(
                req(t, Reset, Init),
                M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
            );
            // The target's RTR mask with the initiator's RTS attributes is refused.
            let e = validate_transition(
                XrcRecv,
                Rtr,
                M::STATE | M::TIMEOUT | M::SQ_PSN | M::RETRY_CNT,
                &to_state(Rtr, Rts),
            );
            assert!(e.is_err());
        }
        assert_eq!(QpType::XrcSend.to_string(), "XRC_SEND");
    }

    #[test]
    fn table_has_the_kernel_shape() {
        // 22 legal (from, to) pairs for each of the three types.
        assert_eq!(legal().len(), 66);
        for t in QpType::ALL {
            for s in QpState::ALL {
                assert!(transition_masks(t, s, Reset).is_some(), "{t} {s}->RESET");
                assert_eq!(
                    transition_masks(t, s, Err).is_some(),
                    s != Reset,
                    "{t} {s}->ERR"
                );
            }
        }
    }

    #[test]
    fn every_legal_transition_with_exact_required_mask_passes() {
        for (t, from, to, a) in legal() {
            let attr = to_state(from, to);
            assert_eq!(
                validate_transition(t, from, M::STATE | a.required, &attr),
                Ok(to),
                "{t} {from}->{to}"
            );
            let all = M::STATE | a.required | usable_optional(a, to);
            assert_eq!(
                validate_transition(t, from, all, &attr),
                Ok(to),
                "{t} {from}->{to} with every optional bit"
            );
        }
    }

    #[test]
    fn removing_each_required_bit_gives_missing_attribute_naming_it() {
        let mut checked = 0;
        for (t, from, to, a) in legal() {
            for bit in a.required.iter() {
                let e = validate_transition(
                    t,
                    from,
                    M::STATE | (a.required - bit),
                    &to_state(from, to),
                )
                .unwrap_err();
                assert_eq!(
                    e,
                    ModifyQpError::MissingAttribute {
                        qp_type: t,
                        from,
                        to,
                        missing: bit,
                        required: a.required
                    }
                );
                assert!(e.to_string().contains(bit.names()[0]), "{e}");
                assert_eq!(e.errno(), EINVAL);
                checked += 1;
            }
        }
        // RESET->INIT 3*3, INIT->RTR 6+4, RTR->RTS 5+1+1.
        assert_eq!(checked, 26);
    }

    #[test]
    fn adding_each_non_allowed_bit_gives_forbidden_attribute_naming_it() {
        for (t, from, to, a) in legal() {
            let allowed = (a.required | a.optional) - REFUSED_ON_ROCE;
            for bit in (M::all() - M::STATE - allowed).iter() {
                let e =
                    validate_transition(t, from, M::STATE | a.required | bit, &to_state(from, to))
                        .unwrap_err();
                match &e {
                    ModifyQpError::ForbiddenAttribute {
                        forbidden,
                        allowed: said,
                        ..
                    } => {
                        assert!(forbidden.contains(bit), "{t} {from}->{to}: {e}");
                        assert_eq!(*said, allowed);
                    }
                    other => panic!("{t} {from}->{to} +{:?}: {other}", bit.names()),
                }
                assert!(e.to_string().contains(bit.names()[0]), "{e}");
            }
        }
    }

    #[test]
    fn illegal_transitions_are_refused() {
        for (t, from, to) in [
            (QpType::Rc, Reset, Rts),
            (QpType::Rc, Reset, Rtr),
            (QpType::Ud, Reset, Rtr),
            (QpType::Rc, Init, Rts),
            (QpType::Uc, Init, Sqd),
            (QpType::Rc, Rtr, Sqd),
            (QpType::Rc, Rtr, Init),
            (QpType::Ud, Rts, Rtr),
            (QpType::Rc, Rts, Init),
            (QpType::Uc, Sqd, Sqe),
            (QpType::Ud, Err, Rts),
            (QpType::Rc, Err, Init),
            (QpType::Uc, Sqe, Sqd),
            // Linux has no RESET->ERR (measured: EINVAL for RC, UC and UD).
            (QpType::Rc, Reset, Err),
            (QpType::Ud, Reset, Err),
        ] {
            let e = validate_transition(t, from, M::STATE, &to_state(from, to)).unwrap_err();
            assert_eq!(
                e,
                ModifyQpError::IllegalTransition {
                    qp_type: t,
                    from,
                    to
                }
            );
            let s = e.to_string();
            assert!(s.contains(&format!("{t} {from}->{to}")), "{s}");
            assert_eq!(e.errno(), EINVAL);
        }
        let e = validate_transition(QpType::Rc, Init, M::STATE, &to_state(Init, Rts)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "modify_qp RC INIT->RTS: IBTA does not allow this transition; \
             from INIT an RC QP may go to RESET, INIT, RTR, ERR"
        );
    }

    #[test]
    fn any_state_may_go_to_reset_and_all_but_reset_to_err() {
        for t in QpType::ALL {
            for s in QpState::ALL {
                assert_eq!(
                    validate_transition(t, s, M::STATE, &to_state(s, Reset)),
                    Ok(Reset)
                );
                let to_err = validate_transition(t, s, M::STATE, &to_state(s, Err));
                assert_eq!(to_err.is_ok(), s != Reset, "{t} {s}->ERR");
                // Nothing but STATE is taken on the way out.
                assert!(
                    validate_transition(t, s, M::STATE | M::QKEY, &to_state(s, Reset)).is_err()
                );
            }
        }
    }

    #[test]
    fn missing_attribute_message() {
        let e = validate_transition(
            QpType::Rc,
            Init,
            M::STATE
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
            &to_state(Init, Rtr),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "modify_qp RC INIT->RTR: required attribute IBV_QP_AV is missing (RC INIT->RTR needs \
             IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_RQ_PSN, IBV_QP_MIN_RNR_TIMER, \
             IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_DEST_QPN)"
        );
        let e = validate_transition(QpType::Rc, Init, M::STATE | M::AV, &to_state(Init, Rtr))
            .unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("required attributes IBV_QP_PATH_MTU, IBV_QP_RQ_PSN"),
            "{s}"
        );
        assert!(s.contains(" are missing"), "{s}");
    }

    #[test]
    fn forbidden_attribute_messages() {
        let e = validate_transition(
            QpType::Ud,
            Reset,
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY | M::ACCESS_FLAGS,
            &to_state(Reset, Init),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "modify_qp UD RESET->INIT: attribute IBV_QP_ACCESS_FLAGS is not allowed in this \
             transition (UD RESET->INIT also accepts IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY)"
        );
        let e = validate_transition(QpType::Rc, Rtr, M::STATE | M::QKEY, &to_state(Rtr, Err))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("takes no attribute besides IBV_QP_STATE"),
            "{e}"
        );
    }

    #[test]
    fn alt_path_cap_and_rate_limit_are_never_accepted() {
        let rtr = transition_masks(QpType::Rc, Init, Rtr).unwrap();
        let base = M::STATE | rtr.required;
        let attr = to_state(Init, Rtr);
        // IBV_QP_ALT_PATH is in the kernel table but banned on RoCE.
        assert!(rtr.optional.contains(M::ALT_PATH));
        let e = validate_transition(QpType::Rc, Init, base | M::ALT_PATH, &attr).unwrap_err();
        assert!(
            e.to_string().contains("IBV_QP_ALT_PATH") && e.to_string().contains("RoCE"),
            "{e}"
        );
        assert_eq!(e.errno(), EINVAL);
        // IBV_QP_CAP is in no transition.
        let e = validate_transition(QpType::Rc, Init, base | M::CAP, &attr).unwrap_err();
        assert!(e.to_string().contains("IBV_QP_CAP"), "{e}");
        assert_eq!(e.errno(), EINVAL);
        // IBV_QP_RATE_LIMIT is EOPNOTSUPP, even on an otherwise bad call.
        let e = validate_transition(QpType::Ud, Init, base | M::RATE_LIMIT, &attr).unwrap_err();
        assert!(e.to_string().contains("IBV_QP_RATE_LIMIT"), "{e}");
        assert_eq!(e.errno(), EOPNOTSUPP);
        let e = validate_transition(
            QpType::Rc,
            Reset,
            M::STATE | M::RATE_LIMIT,
            &to_state(Reset, Rts),
        )
        .unwrap_err();
        assert_eq!(e.errno(), EOPNOTSUPP);
        assert!(
            e.to_string()
                .contains("nor is RESET->RTS a legal transition for RC"),
            "{e}"
        );
    }

    #[test]
    fn av_outside_rtr_implies_port() {
        let attr = to_state(Sqd, Sqd);
        // RC SQD->SQD takes IBV_QP_PORT, so IBV_QP_AV alone is fine.
        assert_eq!(
            validate_transition(QpType::Rc, Sqd, M::STATE | M::AV, &attr),
            Ok(Sqd)
        );
        // UC SQD->SQD lists IBV_QP_AV but not IBV_QP_PORT: uverbs adds the
        // port and the kernel refuses (measured on Linux 6.1).
        let e = validate_transition(QpType::Uc, Sqd, M::STATE | M::AV, &attr).unwrap_err();
        match &e {
            ModifyQpError::ForbiddenAttribute { forbidden, .. } => assert_eq!(*forbidden, M::PORT),
            other => panic!("{other}"),
        }
        assert!(e.to_string().contains("uverbs adds IBV_QP_PORT"), "{e}");
        // Into RTR the AV does not bring the port along.
        let rtr = transition_masks(QpType::Uc, Init, Rtr).unwrap();
        assert_eq!(
            validate_transition(
                QpType::Uc,
                Init,
                M::STATE | rtr.required,
                &to_state(Init, Rtr)
            ),
            Ok(Rtr)
        );
    }

    #[test]
    fn no_state_bit_means_same_state() {
        let none = QpAttr::default();
        assert_eq!(
            validate_transition(QpType::Rc, Rts, M::MIN_RNR_TIMER, &none),
            Ok(Rts)
        );
        assert_eq!(
            validate_transition(QpType::Ud, Rts, M::QKEY, &none),
            Ok(Rts)
        );
        assert_eq!(
            validate_transition(QpType::Rc, Rts, M::empty(), &none),
            Ok(Rts)
        );
        assert_eq!(
            validate_transition(QpType::Rc, Reset, M::empty(), &none),
            Ok(Reset)
        );
        assert_eq!(
            validate_transition(QpType::Uc, Init, M::ACCESS_FLAGS, &none),
            Ok(Init)
        );
        // There is no RTR->RTR: in RTR every modify must name a state.
        let e = validate_transition(QpType::Rc, Rtr, M::empty(), &none).unwrap_err();
        assert!(matches!(
            e,
            ModifyQpError::IllegalTransition {
                from: Rtr,
                to: Rtr,
                ..
            }
        ));
        assert!(e.to_string().contains("without IBV_QP_STATE"), "{e}");
        // IBV_QP_STATE with no state in the field.
        assert_eq!(
            validate_transition(QpType::Rc, Rts, M::STATE, &none),
            Result::Err(ModifyQpError::NoStateGiven)
        );
        assert!(ModifyQpError::NoStateGiven
            .to_string()
            .contains("IBV_QP_STATE"));
    }

    #[test]
    fn cur_state_must_be_listed_and_true() {
        let mut a = to_state(Rts, Rts);
        assert_eq!(
            validate_transition(QpType::Rc, Rts, M::STATE | M::CUR_STATE, &a),
            Ok(Rts)
        );
        // SQE->RTS with CUR_STATE is fine for UD.
        a = to_state(Sqe, Rts);
        assert_eq!(
            validate_transition(QpType::Ud, Sqe, M::STATE | M::CUR_STATE, &a),
            Ok(Rts)
        );
        // A claim that is not the QP's state.
        let e = validate_transition(QpType::Ud, Rts, M::STATE | M::CUR_STATE, &a).unwrap_err();
        assert_eq!(
            e,
            ModifyQpError::CurStateMismatch {
                given: Sqe,
                actual: Rts
            }
        );
        assert!(
            e.to_string().contains("says SQE but the QP is in RTS"),
            "{e}"
        );
        // The bit set with nothing in the field.
        a.cur_qp_state = None;
        assert_eq!(
            validate_transition(QpType::Ud, Rts, M::STATE | M::CUR_STATE, &a),
            Result::Err(ModifyQpError::NoStateGiven)
        );
        // CUR_STATE is only listed for transitions into RTS.
        let a = to_state(Init, Init);
        let e = validate_transition(QpType::Rc, Init, M::CUR_STATE, &a).unwrap_err();
        assert!(
            matches!(
                e,
                ModifyQpError::ForbiddenAttribute {
                    forbidden: M::CUR_STATE,
                    ..
                }
            ),
            "{e}"
        );
    }

    /// The outcome of each case of a modify_qp probe run against kernel
    /// rxe on Linux 6.1.0-56 (shared/tools/rxe-vm), as (type, current
    /// state, mask, target, accepted).
    #[test]
    fn matches_linux_6_1_measurements() {
        let t_all = QpType::ALL;
        let init_req = |t| transition_masks(t, Reset, Init).unwrap().required;
        let rtr_req = |t| transition_masks(t, Init, Rtr).unwrap().required;
        for t in t_all {
            let cases: [(QpState, QpAttrMask, Option<QpState>, bool); 14] = [
                (Reset, M::STATE, Some(Err), false),
                (Reset, M::STATE, Some(Reset), true),
                (Reset, M::empty(), None, true),
                (Reset, M::STATE | init_req(t) | M::CAP, Some(Init), false),
                (Init, M::empty(), None, true),
                (
                    Init,
                    M::STATE | rtr_req(t) | M::RATE_LIMIT,
                    Some(Rtr),
                    false,
                ),
                (Init, M::STATE | rtr_req(t) | M::ALT_PATH, Some(Rtr), false),
                (Rtr, M::empty(), None, false),
                (Rts, M::STATE | M::CUR_STATE, Some(Rts), true),
                (Rts, M::empty(), None, true),
                (Rts, M::STATE, Some(Sqd), true),
                (Sqd, M::STATE, Some(Rts), true),
                (Sqd, M::STATE | M::AV, Some(Sqd), t == QpType::Rc),
                (Sqd, M::STATE | M::AV | M::PORT, Some(Sqd), t == QpType::Rc),
            ];
            for (from, mask, to, accepted) in cases {
                let attr = QpAttr {
                    qp_state: to,
                    cur_qp_state: Some(from),
                    ..QpAttr::default()
                };
                let r = validate_transition(t, from, mask, &attr);
                assert_eq!(r.is_ok(), accepted, "{t} {from} {:?}: {r:?}", mask.names());
            }
        }
        // RC only: a bare IBV_QP_QKEY on RESET->INIT is refused.
        let m = M::STATE | init_req(QpType::Rc) | M::QKEY;
        assert!(validate_transition(QpType::Rc, Reset, m, &to_state(Reset, Init)).is_err());
    }

    #[test]
    fn sqd_drain_rule() {
        let m = M::STATE;
        assert_eq!(check_sqd_drain(QpType::Rc, Sqd, m, Err, true), Ok(()));
        let e = check_sqd_drain(QpType::Rc, Sqd, m, Rts, true).unwrap_err();
        assert_eq!(
            e,
            ModifyQpError::SqdDraining {
                qp_type: QpType::Rc,
                to: Rts
            }
        );
        assert!(e.to_string().contains("still draining"), "{e}");
        assert_eq!(e.errno(), EINVAL);
        assert!(check_sqd_drain(QpType::Uc, Sqd, m, Reset, true).is_err());
        assert!(check_sqd_drain(QpType::Uc, Sqd, m, Sqd, true).is_err());
        assert_eq!(check_sqd_drain(QpType::Rc, Sqd, m, Rts, false), Ok(()));
        assert_eq!(check_sqd_drain(QpType::Rc, Rts, m, Sqd, true), Ok(()));
        assert_eq!(
            check_sqd_drain(QpType::Rc, Sqd, M::ACCESS_FLAGS, Sqd, true),
            Ok(())
        );
    }

    fn refused(mask: QpAttrMask, attr: QpAttr, caps: &DeviceCaps, port_mtu: Mtu, field: &str) {
        match check_values(mask, &attr, caps, port_mtu) {
            Result::Err(e @ ModifyQpError::ValueOutOfRange { .. }) => {
                let s = e.to_string();
                assert!(s.contains(field), "{s}");
                assert_eq!(e.errno(), EINVAL);
            }
            other => panic!("{:?} {field}: {other:?}", mask.names()),
        }
    }

    #[test]
    fn value_checks_each_fire_and_accept_their_limit() {
        let caps = DeviceCaps::default();
        let m1024 = Mtu::M1024;
        let ok = |mask: QpAttrMask, attr: QpAttr| check_values(mask, &attr, &caps, m1024);
        let d = QpAttr::default;
        let av = |ah: AhAttr| QpAttr { ah_attr: ah, ..d() };
        let good_ah = AhAttr {
            port_num: 1,
            is_global: true,
            sgid_index: 1,
            ..AhAttr::default()
        };

        assert_eq!(ok(M::PORT, QpAttr { port_num: 1, ..d() }), Ok(()));
        refused(
            M::PORT,
            QpAttr { port_num: 0, ..d() },
            &caps,
            m1024,
            "port_num = 0",
        );
        refused(
            M::PORT,
            QpAttr { port_num: 2, ..d() },
            &caps,
            m1024,
            "port_num = 2",
        );

        assert_eq!(
            ok(
                M::PKEY_INDEX,
                QpAttr {
                    pkey_index: 63,
                    ..d()
                }
            ),
            Ok(())
        );
        refused(
            M::PKEY_INDEX,
            QpAttr {
                pkey_index: 64,
                ..d()
            },
            &caps,
            m1024,
            "pkey_index",
        );

        assert_eq!(ok(M::AV, av(good_ah)), Ok(()));
        refused(
            M::AV,
            av(AhAttr {
                port_num: 2,
                ..good_ah
            }),
            &caps,
            m1024,
            "ah_attr.port_num",
        );
        refused(
            M::AV,
            av(AhAttr {
                is_global: false,
                ..good_ah
            }),
            &caps,
            m1024,
            "is_global",
        );
        let small_gids = DeviceCaps {
            gid_table_len: 2,
            ..DeviceCaps::default()
        };
        refused(
            M::AV,
            av(AhAttr {
                sgid_index: 2,
                ..good_ah
            }),
            &small_gids,
            m1024,
            "sgid_index",
        );
        assert_eq!(
            check_values(M::AV, &av(good_ah), &small_gids, m1024),
            Ok(())
        );

        assert_eq!(
            ok(
                M::PATH_MTU,
                QpAttr {
                    path_mtu: Some(Mtu::M1024),
                    ..d()
                }
            ),
            Ok(())
        );
        refused(
            M::PATH_MTU,
            QpAttr {
                path_mtu: Some(Mtu::M2048),
                ..d()
            },
            &caps,
            m1024,
            "path_mtu = 2048 exceeds its limit 1024",
        );
        refused(
            M::PATH_MTU,
            QpAttr {
                path_mtu: None,
                ..d()
            },
            &caps,
            m1024,
            "not a valid ibv_mtu",
        );
        // Kernel behaviour: compare with max_mtu (4096).
        assert_eq!(
            check_values(
                M::PATH_MTU,
                &QpAttr {
                    path_mtu: Some(Mtu::M4096),
                    ..d()
                },
                &caps,
                Mtu::M4096
            ),
            Ok(())
        );

        for (bit, field, limit, set) in [
            (
                M::TIMEOUT,
                "timeout",
                31u8,
                (|a: &mut QpAttr, v| a.timeout = v) as fn(&mut QpAttr, u8),
            ),
            (M::RETRY_CNT, "retry_cnt", 7, |a, v| a.retry_cnt = v),
            (M::RNR_RETRY, "rnr_retry", 7, |a, v| a.rnr_retry = v),
            (M::MIN_RNR_TIMER, "min_rnr_timer", 31, |a, v| {
                a.min_rnr_timer = v
            }),
            (M::MAX_QP_RD_ATOMIC, "max_rd_atomic", 128, |a, v| {
                a.max_rd_atomic = v
            }),
            (M::MAX_DEST_RD_ATOMIC, "max_dest_rd_atomic", 128, |a, v| {
                a.max_dest_rd_atomic = v
            }),
        ] {
            let mut a = d();
            set(&mut a, limit);
            assert_eq!(ok(bit, a), Ok(()), "{field} = {limit}");
            set(&mut a, limit + 1);
            refused(
                bit,
                a,
                &caps,
                m1024,
                &format!("{field} = {} exceeds its limit {limit}", limit + 1),
            );
            // Not in the mask: not checked.
            assert_eq!(ok(M::empty(), a), Ok(()));
        }

        let cap = QpCap {
            max_send_wr: caps.max_qp_wr,
            max_recv_wr: caps.max_qp_wr,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_inline_data: 512,
        };
        assert_eq!(ok(M::CAP, QpAttr { cap, ..d() }), Ok(()));
        for (field, over) in [
            (
                "cap.max_send_wr",
                QpCap {
                    max_send_wr: caps.max_qp_wr + 1,
                    ..cap
                },
            ),
            (
                "cap.max_recv_wr",
                QpCap {
                    max_recv_wr: caps.max_qp_wr + 1,
                    ..cap
                },
            ),
            (
                "cap.max_send_sge",
                QpCap {
                    max_send_sge: 33,
                    ..cap
                },
            ),
            (
                "cap.max_recv_sge",
                QpCap {
                    max_recv_sge: 33,
                    ..cap
                },
            ),
            (
                "cap.max_inline_data",
                QpCap {
                    max_inline_data: 513,
                    ..cap
                },
            ),
        ] {
            refused(M::CAP, QpAttr { cap: over, ..d() }, &caps, m1024, field);
        }
    }

    #[test]
    fn value_messages_read_well() {
        let caps = DeviceCaps::default();
        let e = check_values(
            M::TIMEOUT,
            &QpAttr {
                timeout: 32,
                ..QpAttr::default()
            },
            &caps,
            Mtu::M1024,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "modify_qp: timeout = 32 exceeds its limit 31: the ACK timeout is a 5-bit exponent \
             (4.096 us * 2^timeout, 0 = none)"
        );
        let e = check_values(M::PORT, &QpAttr::default(), &caps, Mtu::M1024).unwrap_err();
        assert_eq!(
            e.to_string(),
            "modify_qp: port_num = 0 is not accepted: rxe has a single port, number 1"
        );
    }

    #[test]
    fn empty_tables_refuse_every_index_without_panicking() {
        let caps = DeviceCaps {
            max_pkeys: 0,
            gid_table_len: 0,
            ..DeviceCaps::default()
        };
        let a = QpAttr {
            ah_attr: AhAttr {
                port_num: 1,
                is_global: true,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        assert!(check_values(M::PKEY_INDEX, &a, &caps, Mtu::M256).is_err());
        assert!(check_values(M::AV, &a, &caps, Mtu::M256).is_err());
    }

    #[test]
    fn names_and_codes() {
        assert_eq!(
            M::AV.union(M::PATH_MTU).names(),
            ["IBV_QP_AV", "IBV_QP_PATH_MTU"]
        );
        assert_eq!(M::all().names().len(), 22);
        assert!(M::empty().names().is_empty());
        for (bit, name) in MASK_NAMES {
            assert_eq!(bit.bits().count_ones(), 1);
            assert!(name.starts_with("IBV_QP_"));
        }
        assert_eq!(M::all().bits(), 0x021f_ffff);
        let shown: Vec<String> = QpState::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"]);
        for s in QpState::ALL {
            assert_eq!(QpState::from_ibv(s.ibv()), Some(s));
        }
        assert_eq!(QpState::from_ibv(7), None);
        for t in QpType::ALL {
            assert_eq!(QpType::from_ibv(t.ibv()), Some(t));
        }
        assert_eq!(QpType::from_ibv(1), None);
        assert_eq!(QpType::Uc.to_string(), "UC");
        for m in [MigState::Migrated, MigState::Rearm, MigState::Armed] {
            assert_eq!(MigState::from_ibv(m.ibv()), Some(m));
        }
        assert_eq!(MigState::from_ibv(3), None);
    }

    fn any_state() -> impl Strategy<Value = QpState> {
        proptest::sample::select(QpState::ALL.to_vec())
    }

    fn any_type() -> impl Strategy<Value = QpType> {
        proptest::sample::select(QpType::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn ok_implies_required_and_allowed_and_never_panics(
            t in any_type(),
            cur in any_state(),
            to in proptest::option::of(any_state()),
            claimed in proptest::option::of(any_state()),
            bits in any::<u32>(),
            values in any::<[u8; 8]>(),
            mtu in proptest::option::of(proptest::sample::select(Mtu::ALL.to_vec())),
            pkeys in any::<u16>(),
            gids in 0u32..4,
        ) {
            let mask = QpAttrMask::from_bits_truncate(bits);
            let attr = QpAttr {
                qp_state: to,
                cur_qp_state: claimed,
                path_mtu: mtu,
                timeout: values[0],
                retry_cnt: values[1],
                rnr_retry: values[2],
                min_rnr_timer: values[3],
                max_rd_atomic: values[4],
                max_dest_rd_atomic: values[5],
                port_num: values[6],
                pkey_index: u16::from(values[7]),
                ah_attr: AhAttr { port_num: values[6], sgid_index: values[7], is_global: values[0] & 1 == 1, ..AhAttr::default() },
                ..QpAttr::default()
            };
            if let Ok(next) = validate_transition(t, cur, mask, &attr) {
                let table = transition_masks(t, cur, next);
                prop_assert!(table.is_some());
                if let Some(a) = table {
                    prop_assert!(mask.contains(a.required));
                    prop_assert!((mask - M::STATE).difference(a.required | a.optional).is_empty());
                    prop_assert!(!mask.intersects(M::ALT_PATH | M::CAP | M::RATE_LIMIT));
                }
                prop_assert_eq!(next, if mask.contains(M::STATE) { to.unwrap_or(cur) } else { cur });
            }
            let caps = DeviceCaps { max_pkeys: pkeys, gid_table_len: gids, ..DeviceCaps::default() };
            if check_values(mask, &attr, &caps, mtu.unwrap_or(Mtu::M256)).is_ok() {
                prop_assert!(!mask.contains(M::TIMEOUT) || attr.timeout <= 31);
                prop_assert!(!mask.contains(M::PORT) || attr.port_num == 1);
            }
            let _ = check_sqd_drain(t, cur, mask, to.unwrap_or(cur), values[0] & 2 == 2);
        }
    }
}
