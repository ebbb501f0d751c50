//! QP attributes and the modify_qp state machine.
//!
//! The transition table is IBTA 10.3.1 / 11.2.4.2 as Linux encodes it in
//! `qp_state_table` (`drivers/infiniband/core/verbs.c`, checked by
//! `ib_modify_qp_is_ok`), for the QP types rxe has: RC, UC and UD. A refused
//! call names the attribute that is missing or not allowed, where the kernel
//! only says EINVAL.

use bitflags::bitflags;
use std::fmt;

use crate::caps::{DeviceCaps, Mtu};

/// QP state (`enum ibv_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl QpState {
    /// `ibv_qp_state` value.
    pub fn ibv(self) -> u32 {
        self as u32
    }

    /// From the `ibv_qp_state` value.
    pub fn from_ibv(v: u32) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

impl fmt::Display for QpState {
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

/// QP transport type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    Rc,
    Uc,
    Ud,
}

impl QpType {
    /// `ibv_qp_type` value.
    pub fn ibv(self) -> u32 {
        match self {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        })
    }
}

bitflags! {
    /// `enum ibv_qp_attr_mask`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        const STATE = 1 << 0;
        const CUR_STATE = 1 << 1;
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        const ACCESS_FLAGS = 1 << 3;
        const PKEY_INDEX = 1 << 4;
        const PORT = 1 << 5;
        const QKEY = 1 << 6;
        const AV = 1 << 7;
        const PATH_MTU = 1 << 8;
        const TIMEOUT = 1 << 9;
        const RETRY_CNT = 1 << 10;
        const RNR_RETRY = 1 << 11;
        const RQ_PSN = 1 << 12;
        const MAX_QP_RD_ATOMIC = 1 << 13;
        const ALT_PATH = 1 << 14;
        const MIN_RNR_TIMER = 1 << 15;
        const SQ_PSN = 1 << 16;
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        const PATH_MIG_STATE = 1 << 18;
        const CAP = 1 << 19;
        const DEST_QPN = 1 << 20;
        const RATE_LIMIT = 1 << 25;
    }
}

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
    /// The ibv names of the set bits, in bit order.
    pub fn names(self) -> Vec<&'static str> {
        MASK_NAMES
            .iter()
            .filter(|(b, _)| self.contains(*b))
            .map(|(_, n)| *n)
            .collect()
    }

    fn list(self) -> String {
        let n = self.names();
        if n.is_empty() {
            "none".into()
        } else {
            n.join(", ")
        }
    }
}

/// An address vector (`struct ibv_ah_attr` with its GRH).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AhAttr {
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub sl: u8,
    pub port_num: u8,
    pub is_global: bool,
    pub dlid: u16,
    pub src_path_bits: u8,
    pub static_rate: u8,
}

/// Queue capacities (`struct ibv_qp_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// Path migration state (`enum ibv_mig_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MigState {
    #[default]
    Migrated,
    Rearm,
    Armed,
}

/// `struct ibv_qp_attr`, the fields rxe uses. `qp_access_flags` holds raw
/// `ibv_access_flags` bits.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct QpAttr {
    pub qp_state: Option<QpState>,
    pub cur_qp_state: Option<QpState>,
    pub path_mtu: Option<Mtu>,
    pub path_mig_state: MigState,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: bool,
    pub sq_draining: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// Why a modify_qp was refused. Every variant is EINVAL to a C caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModifyQpError {
    /// IBV_QP_STATE is set but `qp_state` is not.
    NoStateGiven,
    /// IBV_QP_CUR_STATE names a state the QP is not in.
    CurStateMismatch { given: QpState, actual: QpState },
    /// IBTA does not allow this transition for this QP type.
    IllegalTransition {
        qp_type: QpType,
        from: QpState,
        to: QpState,
    },
    /// A required attribute is missing.
    MissingAttribute {
        qp_type: QpType,
        from: QpState,
        to: QpState,
        missing: QpAttrMask,
        required: QpAttrMask,
    },
    /// An attribute that this transition does not take.
    ForbiddenAttribute {
        qp_type: QpType,
        from: QpState,
        to: QpState,
        forbidden: QpAttrMask,
        allowed: QpAttrMask,
    },
    /// An attribute value is outside what the device supports.
    ValueOutOfRange {
        attr: &'static str,
        value: u64,
        limit: u64,
        why: &'static str,
    },
}

impl ModifyQpError {
    /// The errno C callers see.
    pub fn errno(&self) -> i32 {
        22
    }
}

impl fmt::Display for ModifyQpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModifyQpError::NoStateGiven => {
                write!(
                    f,
                    "modify_qp: IBV_QP_STATE is set in the mask but qp_state holds no state"
                )
            }
            ModifyQpError::CurStateMismatch { given, actual } => write!(
                f,
                "modify_qp: IBV_QP_CUR_STATE says {given} but the QP is in {actual}"
            ),
            ModifyQpError::IllegalTransition { qp_type, from, to } => write!(
                f,
                "modify_qp {qp_type} {from}->{to}: IBTA does not allow this transition \
                 (the path is RESET->INIT->RTR->RTS; any state may go to RESET or ERR)"
            ),
            ModifyQpError::MissingAttribute {
                qp_type,
                from,
                to,
                missing,
                required,
            } => write!(
                f,
                "modify_qp {qp_type} {from}->{to}: required attribute {} is missing \
                 ({qp_type} {from}->{to} needs {})",
                missing.list(),
                required.list()
            ),
            ModifyQpError::ForbiddenAttribute {
                qp_type,
                from,
                to,
                forbidden,
                allowed,
            } => write!(
                f,
                "modify_qp {qp_type} {from}->{to}: attribute {} is not allowed in this transition \
                 (it accepts {})",
                forbidden.list(),
                allowed.list()
            ),
            ModifyQpError::ValueOutOfRange {
                attr,
                value,
                limit,
                why,
            } => write!(
                f,
                "modify_qp: {attr} = {value} is out of range (limit {limit}): {why}"
            ),
        }
    }
}

impl std::error::Error for ModifyQpError {}

use QpAttrMask as M;

/// Required and optional attributes of one transition, or None if it is
/// illegal (Linux `qp_state_table`).
pub fn transition_masks(
    qp_type: QpType,
    from: QpState,
    to: QpState,
) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpState::*;
    use QpType::*;
    let none = M::empty();
    let r = match (from, to) {
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) => match qp_type {
            Ud => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
            Rc | Uc => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        },
        (Init, Init) => match qp_type {
            Ud => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
            Rc | Uc => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        },
        (Init, Rtr) => match qp_type {
            Ud => (none, M::PKEY_INDEX | M::QKEY),
            Uc => (
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Rc => (
                M::AV
                    | M::PATH_MTU
                    | M::DEST_QPN
                    | M::RQ_PSN
                    | M::MAX_DEST_RD_ATOMIC
                    | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
        },
        (Rtr, Rts) => match qp_type {
            Ud => (M::SQ_PSN, M::CUR_STATE | M::QKEY | M::RATE_LIMIT),
            Uc => (
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE | M::RATE_LIMIT,
            ),
            Rc => (
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE
                    | M::RATE_LIMIT,
            ),
        },
        (Rts, Rts) | (Sqd, Rts) => match qp_type {
            Ud => (none, M::CUR_STATE | M::QKEY | M::RATE_LIMIT),
            Uc => (
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::RATE_LIMIT,
            ),
            Rc => (
                none,
                M::CUR_STATE
                    | M::ACCESS_FLAGS
                    | M::ALT_PATH
                    | M::PATH_MIG_STATE
                    | M::MIN_RNR_TIMER
                    | M::RATE_LIMIT,
            ),
        },
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match qp_type {
            Ud => (none, M::PKEY_INDEX | M::QKEY),
            Uc => (
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Rc => (
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
        },
        (Sqe, Rts) => match qp_type {
            Rc => return None,
            Uc => (none, M::CUR_STATE | M::ACCESS_FLAGS),
            Ud => (none, M::CUR_STATE | M::QKEY),
        },
        _ => return None,
    };
    Some(r)
}

/// Check a modify_qp against the transition table (Linux
/// `ib_modify_qp_is_ok`) and return the next state. Without IBV_QP_STATE the
/// transition is current -> current. IBV_QP_STATE itself is always allowed,
/// and IBV_QP_CAP is accepted anywhere (rxe ignores a resize it cannot do).
pub fn validate_transition(
    qp_type: QpType,
    cur: QpState,
    mask: QpAttrMask,
    attr: &QpAttr,
) -> Result<QpState, ModifyQpError> {
    let next = if mask.contains(M::STATE) {
        attr.qp_state.ok_or(ModifyQpError::NoStateGiven)?
    } else {
        cur
    };
    if mask.contains(M::CUR_STATE) {
        if let Some(given) = attr.cur_qp_state {
            // Kernel: a CUR_STATE other than SQD/SQE->RTS-style hints must match.
            if given != cur {
                return Err(ModifyQpError::CurStateMismatch { given, actual: cur });
            }
        }
    }
    let (required, optional) =
        transition_masks(qp_type, cur, next).ok_or(ModifyQpError::IllegalTransition {
            qp_type,
            from: cur,
            to: next,
        })?;
    let given = mask - M::STATE;
    let missing = required - given;
    if !missing.is_empty() {
        return Err(ModifyQpError::MissingAttribute {
            qp_type,
            from: cur,
            to: next,
            missing,
            required,
        });
    }
    let allowed = required | optional | M::CAP;
    let forbidden = given - allowed;
    if !forbidden.is_empty() {
        return Err(ModifyQpError::ForbiddenAttribute {
            qp_type,
            from: cur,
            to: next,
            forbidden,
            allowed: required | optional,
        });
    }
    Ok(next)
}

fn range(
    attr: &'static str,
    value: u64,
    limit: u64,
    why: &'static str,
) -> Result<(), ModifyQpError> {
    if value > limit {
        Err(ModifyQpError::ValueOutOfRange {
            attr,
            value,
            limit,
            why,
        })
    } else {
        Ok(())
    }
}

/// Value checks of kernel `rxe_qp_chk_attr` plus the IB field widths. Only
/// attributes present in `mask` are checked.
pub fn check_values(
    mask: QpAttrMask,
    attr: &QpAttr,
    caps: &DeviceCaps,
    port_mtu: Mtu,
) -> Result<(), ModifyQpError> {
    if mask.contains(M::PORT) && attr.port_num != 1 {
        return Err(ModifyQpError::ValueOutOfRange {
            attr: "port_num",
            value: u64::from(attr.port_num),
            limit: 1,
            why: "the device has one port, number 1",
        });
    }
    if mask.contains(M::PKEY_INDEX) {
        range(
            "pkey_index",
            u64::from(attr.pkey_index),
            u64::from(caps.max_pkeys) - 1,
            "outside the P_Key table",
        )?;
    }
    if mask.contains(M::PATH_MTU) {
        let m = attr.path_mtu.ok_or(ModifyQpError::ValueOutOfRange {
            attr: "path_mtu",
            value: 0,
            limit: port_mtu as u64,
            why: "IBV_QP_PATH_MTU is set but no MTU is given",
        })?;
        range(
            "path_mtu",
            m as u64,
            port_mtu as u64,
            "larger than the port's active MTU",
        )?;
    }
    if mask.contains(M::TIMEOUT) {
        range(
            "timeout",
            u64::from(attr.timeout),
            31,
            "the ACK timeout is a 5-bit exponent",
        )?;
    }
    if mask.contains(M::RETRY_CNT) {
        range(
            "retry_cnt",
            u64::from(attr.retry_cnt),
            7,
            "a 3-bit count (7 = retry forever)",
        )?;
    }
    if mask.contains(M::RNR_RETRY) {
        range(
            "rnr_retry",
            u64::from(attr.rnr_retry),
            7,
            "a 3-bit count (7 = retry forever)",
        )?;
    }
    if mask.contains(M::MIN_RNR_TIMER) {
        range(
            "min_rnr_timer",
            u64::from(attr.min_rnr_timer),
            31,
            "a 5-bit RNR timer code",
        )?;
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) {
        range(
            "max_rd_atomic",
            u64::from(attr.max_rd_atomic),
            u64::from(caps.max_qp_rd_atom),
            "more outstanding READ/atomic requests than the device supports",
        )?;
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC) {
        range(
            "max_dest_rd_atomic",
            u64::from(attr.max_dest_rd_atomic),
            u64::from(caps.max_qp_rd_atom),
            "more responder resources than the device supports",
        )?;
    }
    if mask.contains(M::AV) {
        range(
            "ah_attr.sgid_index",
            u64::from(attr.ah_attr.sgid_index),
            u64::from(caps.gid_table_len) - 1,
            "outside the GID table",
        )?;
    }
    if mask.contains(M::CAP) {
        range(
            "cap.max_send_wr",
            u64::from(attr.cap.max_send_wr),
            u64::from(caps.max_qp_wr),
            "too deep",
        )?;
        range(
            "cap.max_recv_wr",
            u64::from(attr.cap.max_recv_wr),
            u64::from(caps.max_qp_wr),
            "too deep",
        )?;
        range(
            "cap.max_send_sge",
            u64::from(attr.cap.max_send_sge),
            u64::from(caps.max_send_sge),
            "too many SGEs",
        )?;
        range(
            "cap.max_recv_sge",
            u64::from(attr.cap.max_recv_sge),
            u64::from(caps.max_recv_sge),
            "too many SGEs",
        )?;
        range(
            "cap.max_inline_data",
            u64::from(attr.cap.max_inline_data),
            u64::from(caps.max_inline_data),
            "too much inline data",
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use QpState::*;

    const TYPES: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];
    const STATES: [QpState; 7] = [Reset, Init, Rtr, Rts, Sqd, Sqe, Err];

    fn attr(to: QpState) -> QpAttr {
        QpAttr {
            qp_state: Some(to),
            ..QpAttr::default()
        }
    }

    #[test]
    fn every_legal_transition_with_exact_required_mask_passes() {
        let mut legal = 0;
        for t in TYPES {
            for from in STATES {
                for to in STATES {
                    if let Some((req, opt)) = transition_masks(t, from, to) {
                        legal += 1;
                        assert_eq!(
                            validate_transition(t, from, M::STATE | req, &attr(to)),
                            Ok(to)
                        );
                        assert_eq!(
                            validate_transition(t, from, M::STATE | req | opt, &attr(to)),
                            Ok(to)
                        );
                        for bit in req.iter() {
                            let e = validate_transition(t, from, M::STATE | (req - bit), &attr(to))
                                .unwrap_err();
                            assert!(matches!(e, ModifyQpError::MissingAttribute { .. }));
                            assert!(e.to_string().contains(bit.names()[0]), "{e}");
                        }
                        let extra = M::all() - req - opt - M::STATE - M::CAP - M::CUR_STATE;
                        for bit in extra.iter() {
                            let e = validate_transition(t, from, M::STATE | req | bit, &attr(to))
                                .unwrap_err();
                            assert!(
                                matches!(e, ModifyQpError::ForbiddenAttribute { .. }),
                                "{t} {from}->{to} {e}"
                            );
                            assert!(e.to_string().contains(bit.names()[0]), "{e}");
                        }
                    }
                }
            }
        }
        assert!(legal > 40);
    }

    #[test]
    fn illegal_transitions() {
        for (t, from, to) in [
            (QpType::Rc, Reset, Rts),
            (QpType::Rc, Init, Rts),
            (QpType::Rc, Rtr, Sqd),
            (QpType::Ud, Reset, Rtr),
            (QpType::Rc, Sqe, Rts),
            (QpType::Uc, Err, Rts),
            (QpType::Rc, Rtr, Init),
        ] {
            let e = validate_transition(t, from, M::STATE, &attr(to)).unwrap_err();
            assert_eq!(
                e,
                ModifyQpError::IllegalTransition {
                    qp_type: t,
                    from,
                    to
                }
            );
            assert!(e.to_string().contains(&format!("{from}->{to}")));
        }
        for s in STATES {
            assert_eq!(
                validate_transition(QpType::Rc, s, M::STATE, &attr(Err)),
                Ok(Err)
            );
            assert_eq!(
                validate_transition(QpType::Uc, s, M::STATE, &attr(Reset)),
                Ok(Reset)
            );
        }
    }

    #[test]
    fn message_lists_what_is_needed() {
        let e = validate_transition(QpType::Rc, Init, M::STATE | M::AV, &attr(Rtr)).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("IBV_QP_PATH_MTU")
                && s.contains("IBV_QP_MIN_RNR_TIMER")
                && s.contains("RC INIT->RTR"),
            "{s}"
        );
        assert_eq!(e.errno(), 22);
    }

    #[test]
    fn no_state_means_same_state() {
        assert_eq!(
            validate_transition(QpType::Rc, Rts, M::MIN_RNR_TIMER, &QpAttr::default()),
            Ok(Rts)
        );
        assert!(
            validate_transition(QpType::Rc, Rtr, M::MIN_RNR_TIMER, &QpAttr::default()).is_err()
        );
        let e = validate_transition(QpType::Rc, Rts, M::STATE, &QpAttr::default()).unwrap_err();
        assert_eq!(e, ModifyQpError::NoStateGiven);
    }

    #[test]
    fn value_checks() {
        let caps = DeviceCaps::default();
        let ok = |m: QpAttrMask, a: QpAttr| check_values(m, &a, &caps, Mtu::M1024);
        assert!(ok(
            M::TIMEOUT,
            QpAttr {
                timeout: 31,
                ..QpAttr::default()
            }
        )
        .is_ok());
        assert!(ok(
            M::TIMEOUT,
            QpAttr {
                timeout: 32,
                ..QpAttr::default()
            }
        )
        .is_err());
        assert!(ok(
            M::RETRY_CNT,
            QpAttr {
                retry_cnt: 8,
                ..QpAttr::default()
            }
        )
        .is_err());
        assert!(ok(
            M::RNR_RETRY,
            QpAttr {
                rnr_retry: 8,
                ..QpAttr::default()
            }
        )
        .is_err());
        assert!(ok(
            M::MIN_RNR_TIMER,
            QpAttr {
                min_rnr_timer: 32,
                ..QpAttr::default()
            }
        )
        .is_err());
        assert!(ok(
            M::PORT,
            QpAttr {
                port_num: 2,
                ..QpAttr::default()
            }
        )
        .is_err());
        assert!(ok(
            M::PKEY_INDEX,
            QpAttr {
                pkey_index: 64,
                ..QpAttr::default()
            }
        )
        .is_err());
        let e = ok(
            M::PATH_MTU,
            QpAttr {
                path_mtu: Some(Mtu::M4096),
                ..QpAttr::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("path_mtu"), "{e}");
        assert!(ok(
            M::PATH_MTU,
            QpAttr {
                path_mtu: Some(Mtu::M1024),
                ..QpAttr::default()
            }
        )
        .is_ok());
        assert!(ok(
            M::MAX_QP_RD_ATOMIC,
            QpAttr {
                max_rd_atomic: 129,
                ..QpAttr::default()
            }
        )
        .is_err());
        assert!(ok(
            M::MAX_DEST_RD_ATOMIC,
            QpAttr {
                max_dest_rd_atomic: 200,
                ..QpAttr::default()
            }
        )
        .is_err());
        // Attributes not in the mask are not checked.
        assert!(ok(
            M::empty(),
            QpAttr {
                timeout: 99,
                ..QpAttr::default()
            }
        )
        .is_ok());
    }

    fn any_state() -> impl Strategy<Value = QpState> {
        (0u32..7).prop_map(|v| QpState::from_ibv(v).unwrap())
    }

    proptest! {
        #[test]
        fn never_panics_and_ok_implies_required(t in 0usize..3, cur in any_state(), to in any_state(), bits in any::<u32>()) {
            let t = TYPES[t];
            let mask = QpAttrMask::from_bits_truncate(bits);
            let a = attr(to);
            if let Ok(next) = validate_transition(t, cur, mask, &a) {
                let (req, _) = transition_masks(t, cur, next).unwrap();
                prop_assert!(mask.contains(req));
            }
            let _ = check_values(mask, &a, &DeviceCaps::default(), Mtu::M1024);
        }
    }
}
