//! RoCEv2 congestion control: ECN marks in, CNPs out, and DCQCN pacing each
//! QP's transmissions, as NVIDIA ConnectX (mlx5) firmware does it; or none
//! of it, as kernel rxe.
//!
//! The facts (and their sources) are in the project's reference file
//! `connectx-congestion.md`; `docs/congestion.md` explains this module for
//! users. A device picks a [`CcModel`]:
//!
//! - [`CcModel::RxeLike`] (the default) is kernel rxe: every packet leaves
//!   Not-ECT (TOS 0), a CE mark on a received packet is ignored, and a
//!   received CNP is dropped (kernel `rxe_rcv` drops opcode 0x81 in
//!   `hdr_check`, since no QP type matches its transport bits, and counts
//!   nothing; we count it as `rp_cnp_ignored`). The bytes and times of
//!   everything sent are exactly what they were before this module.
//! - [`CcModel::Mlx5Like`]: packets leave ECT(0); the notification point
//!   (NP) answers a CE-marked data packet with a CNP to the QP that sent
//!   it, at most one per `min_time_between_cnps` per QP; the reaction point
//!   (RP) runs DCQCN per QP on the CNPs it receives, and the requester only
//!   sends when the QP's rate allows ([`Pacer`]); the engine's
//!   `poll_timeout` includes the next time a paced QP may send and the
//!   next DCQCN timer.
//!
//! Everything here is sans-IO: times come from the engine's callers.

use std::fmt;

use wire::cnp::{self, CnpRepr};
use wire::icrc::IpUdpInfo;
use wire::{Ecn, OpFlags, PacketRepr};

use crate::counters::count;
use crate::engine::{Ctx, Engine, RxDatagram, Transmit};
use crate::mem::Memory;
use crate::qp::Qp;
use crate::qp_attr::QpType;
use crate::time::Instant;

/// Which congestion behaviour a device has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CcModel {
    /// Kernel rxe: Not-ECT on everything, CE marks ignored, CNPs dropped
    /// (counted as `rp_cnp_ignored`). Byte-identical to rxe-emu without
    /// congestion control.
    #[default]
    RxeLike,
    /// NVIDIA ConnectX (mlx5) with ECN enabled for RP and NP (as
    /// `ROCE_CC_PRIO_MASK` = 255 in every mlxconfig dump): ECT(0) out, CNPs
    /// for CE-marked data packets, DCQCN on received CNPs.
    Mlx5Like,
}

impl CcModel {
    /// The name a device is given on the command line (`--like rxe`,
    /// `--like mlx5`).
    pub const fn name(self) -> &'static str {
        match self {
            CcModel::RxeLike => "rxe",
            CcModel::Mlx5Like => "mlx5",
        }
    }

    /// The model called `name` ([`CcModel::name`]).
    pub fn from_name(name: &str) -> Option<CcModel> {
        match name {
            "rxe" => Some(CcModel::RxeLike),
            "mlx5" => Some(CcModel::Mlx5Like),
            _ => None,
        }
    }
}

/// Bytes a datagram occupies on an Ethernet link besides its UDP payload:
/// Ethernet (14), IPv4 (20) and UDP (8) headers. Pacing and the
/// simulator's bottleneck count packets this way (an IPv6 packet is 20
/// bytes longer; the difference is ignored).
pub const WIRE_OVERHEAD: usize = 14 + 20 + 8;

/// The firmware default `rpg_max_rate` 0 means "port speed": the rate the
/// device reports, 4X EDR (libibverbs `query_port`: `active_width` 4X,
/// `active_speed` EDR), 100 Gb/s.
pub const DEFAULT_LINE_RATE_MBPS: u32 = 100_000;

/// DCQCN parameters and the rest of the device's congestion settings, by
/// their mlx5 names (sysfs `ecn/roce_rp/*`, `ecn/roce_np/*`; debugfs
/// `cc_params/rp_*`, `np_*`), with NVIDIA's firmware defaults (the
/// ConnectX-5 fw 16.35 mlxconfig dump, confirmed by isekai's and
/// conweave's "Mellanox parameters"). All are `u32`, as the firmware's
/// fields (`mlx5_ifc.h` `cong_control_r_roce_ecn_rp/np`) are. Rates are in
/// Mb/s, times in µs.
///
/// Read and write them by name with [`CcParams::get`] and
/// [`CcParams::set`]; [`CcParams::specs`] lists every name with its
/// default, range and meaning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CcParams {
    /// Ours: the port speed in Mb/s, the ceiling of every QP's rate and
    /// what `rpg_max_rate` 0 and `rate_to_set_on_first_cnp` 0 mean.
    pub line_rate_mbps: u32,
    /// Ours: the token bucket of each QP's pacer holds this many bytes, so
    /// an idle QP may send a burst this long at once (verbs'
    /// `ibv_qp_rate_limit_attr.max_burst_sz` plays this part on ConnectX;
    /// its firmware default is not documented).
    pub pacing_burst_bytes: u32,
    /// NP: µs a QP waits after sending a CNP before it sends another.
    pub min_time_between_cnps: u32,
    /// NP: DSCP of CNPs.
    pub cnp_dscp: u32,
    /// NP: 802.1p priority of CNPs (no effect over a UDP socket; kept so a
    /// CLI shows the whole NP table).
    pub cnp_802p_prio: u32,
    /// RP: clamp the target rate to the current rate at every cut (1), or
    /// only after an increase (0).
    pub clamp_tgt_rate: u32,
    /// RP: clamp also when a timer increase happened since the last cut.
    pub clamp_tgt_rate_after_time_inc: u32,
    /// RP: µs between timer rate-increase events.
    pub rpg_time_reset: u32,
    /// RP: units of 64 bytes sent between byte-counter increase events (0:
    /// none). See [`BYTE_RESET_UNIT`].
    pub rpg_byte_reset: u32,
    /// RP: increase events before additive increase (F).
    pub rpg_threshold: u32,
    /// RP: the rate ceiling in Mb/s; 0 is the port speed.
    pub rpg_max_rate: u32,
    /// RP: additive-increase step in Mb/s.
    pub rpg_ai_rate: u32,
    /// RP: hyper-increase step in Mb/s.
    pub rpg_hai_rate: u32,
    /// RP: α-to-rate shift: a cut takes `rate * α >> rpg_gd` (11: α/2).
    pub rpg_gd: u32,
    /// RP: one cut leaves at least this percentage of the rate (100: no cut).
    pub rpg_min_dec_fac: u32,
    /// RP: the rate floor in Mb/s.
    pub rpg_min_rate: u32,
    /// RP: current and target rate after the first CNP, Mb/s; 0 is the
    /// port speed.
    pub rate_to_set_on_first_cnp: u32,
    /// RP: α gain g in 1/1024: α ← g·α/1024 (+ 1024 − g after a CNP).
    pub dce_tcp_g: u32,
    /// RP: µs between α updates.
    pub dce_tcp_rtt: u32,
    /// RP: µs between rate-decrease checks.
    pub rate_reduce_monitor_period: u32,
    /// RP: α after the first CNP, in 1/1024.
    pub initial_alpha_value: u32,
}

impl Default for CcParams {
    fn default() -> Self {
        let mut p = CcParams {
            line_rate_mbps: 0,
            pacing_burst_bytes: 0,
            min_time_between_cnps: 0,
            cnp_dscp: 0,
            cnp_802p_prio: 0,
            clamp_tgt_rate: 0,
            clamp_tgt_rate_after_time_inc: 0,
            rpg_time_reset: 0,
            rpg_byte_reset: 0,
            rpg_threshold: 0,
            rpg_max_rate: 0,
            rpg_ai_rate: 0,
            rpg_hai_rate: 0,
            rpg_gd: 0,
            rpg_min_dec_fac: 0,
            rpg_min_rate: 0,
            rate_to_set_on_first_cnp: 0,
            dce_tcp_g: 0,
            dce_tcp_rtt: 0,
            rate_reduce_monitor_period: 0,
            initial_alpha_value: 0,
        };
        for s in SPECS {
            *p.field_mut(s.name).expect("every spec names a field") = s.default;
        }
        p
    }
}

/// The byte-counter unit: `rpg_byte_reset` counts 64-byte units, as
/// google/isekai's DCQCN model does (`byte_reset * 64`), so the default
/// 32767 is about 2 MiB. mstflint's layout text says "Given in Bytes"
/// instead (32 KiB, which would make byte-counter increases ~64 times more
/// frequent); which one ConnectX firmware uses is unconfirmed.
pub const BYTE_RESET_UNIT: u64 = 64;

/// The upper bound of a parameter's range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Max {
    /// A fixed number.
    Value(u32),
    /// The device's `line_rate_mbps`.
    LineRate,
}

/// One parameter: name, default, range and meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    /// The mlx5 name (sysfs `ecn/roce_rp/` or `ecn/roce_np/`), or ours.
    pub name: &'static str,
    /// Default value.
    pub default: u32,
    /// Smallest accepted value.
    pub min: u32,
    /// Largest accepted value.
    pub max: Max,
    /// Unit and meaning, for people.
    pub what: &'static str,
}

const U32: Max = Max::Value(u32::MAX);

/// Every parameter. Ranges are NVIDIA DOCA's "DCQCN CC Parameters" table
/// where it could be read (`dce_tcp_g`, `dce_tcp_rtt`,
/// `initial_alpha_value`, `rpg_min_dec_fac`, `rpg_min_rate`,
/// `rate_reduce_monitor_period`); elsewhere the firmware field's width
/// (`mlx5_ifc.h`: 1 bit for the clamp flags, 6 for `cnp_dscp`, 3 for
/// `cnp_802p_prio`, 32 for the rest), except that periods start at 1 µs (0
/// would be a timer that fires forever) and `rpg_gd` stops at 31 (ours:
/// the range of the α-to-rate shift is unconfirmed; a shift of 21 or more
/// already makes every cut 0).
const SPECS: &[ParamSpec] = &[
    ParamSpec {
        name: "line_rate_mbps",
        default: DEFAULT_LINE_RATE_MBPS,
        min: 1,
        max: U32,
        what: "Mb/s; ours: port speed, the ceiling of every QP's rate",
    },
    ParamSpec {
        name: "pacing_burst_bytes",
        default: 16384,
        min: 1,
        max: U32,
        what: "bytes; ours: burst an idle QP may send at once",
    },
    ParamSpec {
        name: "min_time_between_cnps",
        default: 4,
        min: 0,
        max: U32,
        what: "us; NP: least time between two CNPs of one QP",
    },
    ParamSpec {
        name: "cnp_dscp",
        default: 48,
        min: 0,
        max: Max::Value(63),
        what: "NP: DSCP of CNPs",
    },
    ParamSpec {
        name: "cnp_802p_prio",
        default: 6,
        min: 0,
        max: Max::Value(7),
        what: "NP: 802.1p priority of CNPs (no effect over UDP)",
    },
    ParamSpec {
        name: "clamp_tgt_rate",
        default: 0,
        min: 0,
        max: Max::Value(1),
        what: "RP: 1 = target rate <- current rate at every cut",
    },
    ParamSpec {
        name: "clamp_tgt_rate_after_time_inc",
        default: 1,
        min: 0,
        max: Max::Value(1),
        what: "RP: 1 = clamp also after a timer increase",
    },
    ParamSpec {
        name: "rpg_time_reset",
        default: 300,
        min: 1,
        max: U32,
        what: "us; RP: period of timer increase events",
    },
    ParamSpec {
        name: "rpg_byte_reset",
        default: 32767,
        min: 0,
        max: U32,
        what: "64-byte units; RP: bytes between byte-counter increase events (0: off)",
    },
    ParamSpec {
        name: "rpg_threshold",
        default: 1,
        min: 0,
        max: U32,
        what: "RP: increase events before additive increase (F)",
    },
    ParamSpec {
        name: "rpg_max_rate",
        default: 0,
        min: 0,
        max: U32,
        what: "Mb/s; RP: rate ceiling, 0 = port speed",
    },
    ParamSpec {
        name: "rpg_ai_rate",
        default: 5,
        min: 0,
        max: U32,
        what: "Mb/s; RP: additive increase step",
    },
    ParamSpec {
        name: "rpg_hai_rate",
        default: 50,
        min: 0,
        max: U32,
        what: "Mb/s; RP: hyper increase step",
    },
    ParamSpec {
        name: "rpg_gd",
        default: 11,
        min: 0,
        max: Max::Value(31),
        what: "RP: alpha-to-rate shift, a cut is rate*alpha >> rpg_gd",
    },
    ParamSpec {
        name: "rpg_min_dec_fac",
        default: 50,
        min: 0,
        max: Max::Value(100),
        what: "%; RP: a cut keeps at least this share of the rate",
    },
    ParamSpec {
        name: "rpg_min_rate",
        default: 1,
        min: 1,
        max: Max::LineRate,
        what: "Mb/s; RP: rate floor",
    },
    ParamSpec {
        name: "rate_to_set_on_first_cnp",
        default: 0,
        min: 0,
        max: U32,
        what: "Mb/s; RP: current and target rate at the first CNP, 0 = port speed",
    },
    ParamSpec {
        name: "dce_tcp_g",
        default: 1019,
        min: 0,
        max: Max::Value(1023),
        what: "1/1024; RP: alpha gain",
    },
    ParamSpec {
        name: "dce_tcp_rtt",
        default: 1,
        min: 1,
        max: Max::Value(131_071),
        what: "us; RP: period of alpha updates",
    },
    ParamSpec {
        name: "rate_reduce_monitor_period",
        default: 4,
        min: 1,
        max: U32,
        what: "us; RP: period of rate-decrease checks",
    },
    ParamSpec {
        name: "initial_alpha_value",
        default: 1023,
        min: 1,
        max: Max::Value(1023),
        what: "1/1024; RP: alpha at the first CNP",
    },
];

/// Why [`CcParams::set`] refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CcParamError {
    /// No parameter has this name.
    Unknown(String),
    /// The value is outside the parameter's range.
    OutOfRange {
        /// The parameter.
        name: &'static str,
        /// What was asked.
        value: u64,
        /// Smallest accepted.
        min: u32,
        /// Largest accepted.
        max: u32,
    },
}

impl fmt::Display for CcParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CcParamError::Unknown(n) => write!(
                f,
                "no congestion-control parameter is called {n:?} (known: {})",
                SPECS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            ),
            CcParamError::OutOfRange {
                name,
                value,
                min,
                max,
            } => write!(f, "{name} = {value} is outside {min}..={max}"),
        }
    }
}

impl std::error::Error for CcParamError {}

impl CcParams {
    /// Every parameter's name, default, range and meaning.
    pub fn specs() -> &'static [ParamSpec] {
        SPECS
    }

    fn field_mut(&mut self, name: &str) -> Option<&mut u32> {
        Some(match name {
            "line_rate_mbps" => &mut self.line_rate_mbps,
            "pacing_burst_bytes" => &mut self.pacing_burst_bytes,
            "min_time_between_cnps" => &mut self.min_time_between_cnps,
            "cnp_dscp" => &mut self.cnp_dscp,
            "cnp_802p_prio" => &mut self.cnp_802p_prio,
            "clamp_tgt_rate" => &mut self.clamp_tgt_rate,
            "clamp_tgt_rate_after_time_inc" => &mut self.clamp_tgt_rate_after_time_inc,
            "rpg_time_reset" => &mut self.rpg_time_reset,
            "rpg_byte_reset" => &mut self.rpg_byte_reset,
            "rpg_threshold" => &mut self.rpg_threshold,
            "rpg_max_rate" => &mut self.rpg_max_rate,
            "rpg_ai_rate" => &mut self.rpg_ai_rate,
            "rpg_hai_rate" => &mut self.rpg_hai_rate,
            "rpg_gd" => &mut self.rpg_gd,
            "rpg_min_dec_fac" => &mut self.rpg_min_dec_fac,
            "rpg_min_rate" => &mut self.rpg_min_rate,
            "rate_to_set_on_first_cnp" => &mut self.rate_to_set_on_first_cnp,
            "dce_tcp_g" => &mut self.dce_tcp_g,
            "dce_tcp_rtt" => &mut self.dce_tcp_rtt,
            "rate_reduce_monitor_period" => &mut self.rate_reduce_monitor_period,
            "initial_alpha_value" => &mut self.initial_alpha_value,
            _ => return None,
        })
    }

    /// The value of parameter `name`, or `None` for an unknown name.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.clone().field_mut(name).map(|v| *v)
    }

    /// Set parameter `name` (e.g. `set("rpg_ai_rate", 5)`), within its
    /// range ([`CcParams::specs`]). `rpg_min_rate`'s upper bound is
    /// `line_rate_mbps`.
    pub fn set(&mut self, name: &str, value: u64) -> Result<(), CcParamError> {
        let spec = SPECS
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| CcParamError::Unknown(name.to_string()))?;
        let max = match spec.max {
            Max::Value(v) => v,
            Max::LineRate => self.line_rate_mbps,
        };
        let ok = u32::try_from(value)
            .ok()
            .filter(|v| (spec.min..=max).contains(v));
        let (Some(v), Some(field)) = (ok, self.field_mut(name)) else {
            return Err(CcParamError::OutOfRange {
                name: spec.name,
                value,
                min: spec.min,
                max,
            });
        };
        *field = v;
        Ok(())
    }

    /// The defaults with `overrides` set in the order given, each checked
    /// as [`CcParams::set`] checks it. Give them in [`CcParams::specs`]
    /// order ([`CcParams::overrides`] does): `line_rate_mbps` then comes
    /// before `rpg_min_rate`, whose range depends on it.
    pub fn with_overrides<'a>(
        overrides: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> Result<CcParams, CcParamError> {
        let mut p = CcParams::default();
        for (name, value) in overrides {
            p.set(name, value)?;
        }
        Ok(p)
    }

    /// The parameters that differ from their defaults, in
    /// [`CcParams::specs`] order.
    pub fn overrides(&self) -> Vec<(&'static str, u32)> {
        SPECS
            .iter()
            .filter_map(|s| {
                let v = self.get(s.name)?;
                (v != s.default).then_some((s.name, v))
            })
            .collect()
    }

    /// Name/value pairs, in [`CcParams::specs`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u32)> + '_ {
        SPECS
            .iter()
            .map(|s| (s.name, self.get(s.name).unwrap_or(s.default)))
    }

    /// The rate ceiling in bits per second: `rpg_max_rate`, or the line
    /// rate when it is 0 or above it.
    pub fn max_rate_bps(&self) -> u64 {
        let line = u64::from(self.line_rate_mbps.max(1));
        let max = match u64::from(self.rpg_max_rate) {
            0 => line,
            m => m.min(line),
        };
        max * 1_000_000
    }

    /// Rates after the first CNP, bits per second.
    fn first_cnp_rate_bps(&self) -> u64 {
        match u64::from(self.rate_to_set_on_first_cnp) {
            0 => self.max_rate_bps(),
            r => (r * 1_000_000).min(self.max_rate_bps()),
        }
    }

    fn min_rate_bps(&self) -> u64 {
        (u64::from(self.rpg_min_rate.max(1)) * 1_000_000).min(self.max_rate_bps())
    }
}

/// A device's congestion behaviour: the model and its parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CcConfig {
    /// Kernel rxe's (default) or ConnectX's.
    pub model: CcModel,
    /// DCQCN and NP parameters (used by [`CcModel::Mlx5Like`]).
    pub params: CcParams,
}

const US: u64 = 1_000;

fn after_us(t: Instant, us: u32) -> Instant {
    Instant(t.0.saturating_add(u64::from(us.max(1)) * US))
}

/// The reaction point's DCQCN state of one QP (§4 of the facts file),
/// created by the QP's first CNP. Rates in bits per second; α in 1/1024.
///
/// The three per-QP timers of the firmware (α update every `dce_tcp_rtt`,
/// rate-decrease check every `rate_reduce_monitor_period`, rate increase
/// every `rpg_time_reset`) are kept as times, not as engine timers where
/// that changes nothing: α is brought up to date whenever it is read (an
/// update without a CNP in its period only decays it); the decrease check
/// is a deadline only while a CNP waits for it (without one the check does
/// nothing); the increase timer stops once an increase would change
/// neither rate (the target is at the ceiling and the current rate cannot
/// move), and restarts at the next cut. The result is the same as firing
/// every timer, without waking a driver every microsecond.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dcqcn {
    /// Current rate (RC): what the pacer sends at.
    pub rc: u64,
    /// Target rate (RT).
    pub rt: u64,
    /// α, 10-bit fixed point (1023 ≈ 1).
    pub alpha: u32,
    /// Timer increase events since the last cut (T).
    pub t: u32,
    /// Byte-counter increase events since the last cut (BC).
    pub bc: u32,
    /// Bytes sent since the last byte-counter event.
    byte_count: u64,
    /// A CNP arrived in the current α period.
    alpha_cnp: bool,
    /// A CNP arrived since the last rate-decrease check.
    decrease_cnp: bool,
    /// The first CNP: the decrease checks fall on `origin + k·period`.
    origin: Instant,
    /// End of the current α period.
    alpha_next: Instant,
    /// The decrease check that will act (set while `decrease_cnp`).
    decrease_due: Option<Instant>,
    /// The next timer increase event, while increases can change a rate.
    increase_due: Option<Instant>,
}

/// What [`Engine::qp_cc`](crate::Engine::qp_cc) reports of a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCcState {
    /// The rate the QP sends at now, bits per second.
    pub current_rate_bps: u64,
    /// DCQCN's target rate, bits per second.
    pub target_rate_bps: u64,
    /// α in 1/1024 (0 before the first CNP).
    pub alpha: u32,
    /// Timer increase events since the last cut.
    pub timer_stage: u32,
    /// Byte-counter increase events since the last cut.
    pub byte_stage: u32,
    /// Whether any CNP has reached this QP (before it: line rate).
    pub reacting: bool,
    /// The next time the pacer lets the QP send, if it is waiting.
    pub paced_until: Option<Instant>,
}

impl Dcqcn {
    /// The first CNP of a QP (isekai `HandleRxPacket`): α = initial, RC =
    /// RT = `rate_to_set_on_first_cnp`, the three timers start, and both
    /// CNP flags are left clear, so this CNP causes no cut of its own.
    /// (HPCC's "Mellanox DCQCN" model leaves the decrease flag set and
    /// cuts once at the first check; which ConnectX does is unconfirmed.)
    pub fn first_cnp(p: &CcParams, now: Instant) -> Dcqcn {
        let r = p.first_cnp_rate_bps();
        let mut d = Dcqcn {
            rc: r,
            rt: r,
            alpha: p.initial_alpha_value.min(1023),
            t: 0,
            bc: 0,
            byte_count: 0,
            alpha_cnp: false,
            decrease_cnp: false,
            origin: now,
            alpha_next: after_us(now, p.dce_tcp_rtt),
            decrease_due: None,
            increase_due: Some(after_us(now, p.rpg_time_reset)),
        };
        d.stop_increase_if_idle(p);
        d
    }

    /// A later CNP: catch α up to `now`, then raise both flags (§4 step 3).
    pub fn cnp(&mut self, p: &CcParams, now: Instant) {
        self.update_alpha(p, now);
        self.alpha_cnp = true;
        if !self.decrease_cnp {
            self.decrease_cnp = true;
            // The first check strictly after now.
            let period = u64::from(p.rate_reduce_monitor_period.max(1)) * US;
            let k = now.0.saturating_sub(self.origin.0) / period + 1;
            self.decrease_due = Some(Instant(
                self.origin.0.saturating_add(k.saturating_mul(period)),
            ));
        }
    }

    /// Apply every α update whose period ended at or before `until` (§4
    /// step 4): α ← g·α/1024 + (1024 − g) if a CNP came in the period,
    /// else g·α/1024; capped at 1023.
    pub fn update_alpha(&mut self, p: &CcParams, until: Instant) {
        let period = u64::from(p.dce_tcp_rtt.max(1)) * US;
        let g = p.dce_tcp_g.min(1023);
        while self.alpha_next <= until {
            if !self.alpha_cnp && self.alpha == 0 {
                // Nothing changes any more: skip to the first period end after `until`.
                let k = (until.0 - self.alpha_next.0) / period + 1;
                self.alpha_next = Instant(self.alpha_next.0.saturating_add(k * period));
                break;
            }
            let decayed = g * self.alpha / 1024;
            self.alpha = if self.alpha_cnp {
                (decayed + 1024 - g).min(1023)
            } else {
                decayed
            };
            self.alpha_cnp = false;
            self.alpha_next = Instant(self.alpha_next.0.saturating_add(period));
        }
    }

    /// The rate-decrease check, when a CNP came since the last one (§4
    /// step 5, isekai `HandleRateDecreaseTimer`): clamp, cut, floor, reset
    /// the increase stages and restart the increase timer.
    pub fn decrease(&mut self, p: &CcParams, now: Instant) {
        let clamp = p.clamp_tgt_rate != 0
            || self.bc > 0
            || (p.clamp_tgt_rate_after_time_inc != 0 && self.t > 0);
        if clamp {
            self.rt = self.rc;
        }
        let by_alpha = (u128::from(self.rc) * u128::from(self.alpha)) >> p.rpg_gd.min(127);
        let by_fac = u128::from(self.rc) * u128::from(100 - p.rpg_min_dec_fac.min(100)) / 100;
        let cut = by_alpha.min(by_fac) as u64;
        self.rc = self.rc.saturating_sub(cut).max(p.min_rate_bps());
        self.decrease_cnp = false;
        self.decrease_due = None;
        self.t = 0;
        self.bc = 0;
        self.byte_count = 0;
        self.increase_due = Some(after_us(now, p.rpg_time_reset));
        self.stop_increase_if_idle(p);
    }

    /// One rate-increase event (§4 step 6, isekai `IncreaseRate`): the
    /// stage is judged on T and BC as they were before this event (the
    /// caller counts the event afterwards). Hyper increase when both
    /// exceed F, additive when either reaches it, fast recovery otherwise;
    /// RT is capped at the ceiling, and RC ← (RC + RT) / 2. (The DCQCN
    /// author's simulator also scales the hyper step and halves RT in some
    /// cases; nothing says ConnectX does, so neither is done.)
    pub fn increase(&mut self, p: &CcParams) {
        let f = p.rpg_threshold;
        if self.t.min(self.bc) > f {
            self.rt = self
                .rt
                .saturating_add(u64::from(p.rpg_hai_rate) * 1_000_000);
        } else if self.t.max(self.bc) >= f {
            self.rt = self.rt.saturating_add(u64::from(p.rpg_ai_rate) * 1_000_000);
        }
        self.rt = self.rt.min(p.max_rate_bps());
        self.rc = ((u128::from(self.rc) + u128::from(self.rt)) / 2) as u64;
    }

    /// Stop the increase timer when another increase would change nothing
    /// (RT at the ceiling, and (RC + RT) / 2 = RC); the next cut restarts it.
    fn stop_increase_if_idle(&mut self, p: &CcParams) {
        let max = p.max_rate_bps();
        if self.rt >= max && (self.rc + self.rt) / 2 == self.rc {
            self.increase_due = None;
        }
    }

    /// The next DCQCN timer that changes something.
    pub fn deadline(&self) -> Option<Instant> {
        match (self.decrease_due, self.increase_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Fire the next due timer at or before `now`, returning its time, or
    /// `None`. Order at one instant: α updates, then the decrease check,
    /// then the increase timer (a cut restarts the increase timer, so the
    /// two never both act at one instant).
    pub fn fire_next(&mut self, p: &CcParams, now: Instant) -> Option<Instant> {
        let t = self.deadline().filter(|t| *t <= now)?;
        self.update_alpha(p, t);
        if self.decrease_due == Some(t) {
            self.decrease(p, t);
        } else {
            self.increase(p);
            self.t = self.t.saturating_add(1);
            self.increase_due = Some(after_us(t, p.rpg_time_reset));
            self.stop_increase_if_idle(p);
        }
        Some(t)
    }

    /// `bytes` more sent: byte-counter increase events (isekai
    /// `SentBytes`; the event is judged before BC counts it).
    pub fn sent(&mut self, p: &CcParams, bytes: u64) {
        let unit = u64::from(p.rpg_byte_reset) * BYTE_RESET_UNIT;
        if unit == 0 {
            return;
        }
        self.byte_count += bytes;
        while self.byte_count >= unit {
            self.increase(p);
            self.byte_count -= unit;
            self.bc = self.bc.saturating_add(1);
        }
        self.stop_increase_if_idle(p);
    }
}

/// A token bucket at the QP's current rate: the requester may send while
/// the bucket holds a token (a packet may take it below zero); the bucket
/// holds at most `pacing_burst_bytes`. Kept in bit·nanoseconds so no
/// fraction of a bit is lost between refills.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pacer {
    /// Bits × 10^9.
    tokens: i128,
    /// The last refill; `None` before the first (a full bucket).
    last: Option<Instant>,
}

const NS_PER_S: i128 = 1_000_000_000;

impl Pacer {
    fn cap(p: &CcParams) -> i128 {
        i128::from(p.pacing_burst_bytes.max(1)) * 8 * NS_PER_S
    }

    /// Add what `rate_bps` earned since the last refill.
    pub fn refill(&mut self, p: &CcParams, now: Instant, rate_bps: u64) {
        let cap = Self::cap(p);
        self.tokens = match self.last {
            None => cap,
            Some(l) if now > l => {
                let earned = i128::from(now.0 - l.0) * i128::from(rate_bps);
                self.tokens.saturating_add(earned).min(cap)
            }
            Some(_) => self.tokens,
        };
        if self.last.is_none_or(|l| now > l) {
            self.last = Some(now);
        }
    }

    /// Whether a packet may leave now (after a refill).
    pub fn may_send(&self) -> bool {
        self.tokens > 0
    }

    /// A packet of `bytes` on the wire left.
    pub fn charge(&mut self, bytes: u64) {
        self.tokens -= i128::from(bytes) * 8 * NS_PER_S;
    }

    /// When the bucket holds a token again at `rate_bps`.
    pub fn ready_at(&self, now: Instant, rate_bps: u64) -> Instant {
        if self.tokens > 0 {
            return now;
        }
        let wait = (-self.tokens) / i128::from(rate_bps.max(1)) + 1;
        Instant(
            now.0
                .saturating_add(u64::try_from(wait).unwrap_or(u64::MAX)),
        )
    }
}

/// A QP's congestion state: the RP's DCQCN (after its first CNP), its
/// pacer, and the NP's last CNP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct QpCc {
    pub rp: Option<Dcqcn>,
    pub pacer: Pacer,
    /// When this QP last sent a CNP (NP pacing is per QP: the interval's
    /// scope is undocumented for ConnectX; lumina tests per port, per IP
    /// pair and per destination IP; the issue asks for per QP).
    pub last_cnp: Option<Instant>,
    /// The requester waits for the pacer until then.
    pub pace_until: Option<Instant>,
}

impl QpCc {
    /// The rate the QP sends at: DCQCN's RC, or the ceiling before any CNP.
    pub fn rate_bps(&self, p: &CcParams) -> u64 {
        self.rp.as_ref().map_or(p.max_rate_bps(), |d| d.rc)
    }

    /// The earliest time something must happen for this QP.
    pub fn deadline(&self) -> Option<Instant> {
        let d = self.rp.as_ref().and_then(Dcqcn::deadline);
        match (d, self.pace_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A CNP for this QP arrived.
    pub fn on_cnp(&mut self, p: &CcParams, now: Instant) {
        let rate = self.rate_bps(p);
        self.pacer.refill(p, now, rate);
        match self.rp.as_mut() {
            Some(d) => d.cnp(p, now),
            None => self.rp = Some(Dcqcn::first_cnp(p, now)),
        }
        self.repace(p, now);
    }

    /// Fire the DCQCN timers due at or before `now`, refilling the pacer
    /// at the old rate up to each rate change.
    pub fn on_timer(&mut self, p: &CcParams, now: Instant) {
        loop {
            let rate = self.rate_bps(p);
            let Some(d) = self.rp.as_mut() else { break };
            let Some(t) = d.deadline().filter(|t| *t <= now) else {
                break;
            };
            self.pacer.refill(p, t, rate);
            if let Some(d) = self.rp.as_mut() {
                d.fire_next(p, now);
            }
        }
        if let Some(d) = self.rp.as_mut() {
            d.update_alpha(p, now);
        }
        self.repace(p, now);
    }

    /// If the requester waits for the pacer, recompute when at the current
    /// rate (a rate change moves it).
    fn repace(&mut self, p: &CcParams, now: Instant) {
        if self.pace_until.is_some() {
            let rate = self.rate_bps(p);
            self.pacer.refill(p, now, rate);
            self.pace_until = Some(self.pacer.ready_at(now, rate));
        }
    }

    /// Whether the requester may send a packet now; if not, `pace_until`
    /// says when it may.
    pub fn may_send(&mut self, p: &CcParams, now: Instant) -> bool {
        let rate = self.rate_bps(p);
        self.pacer.refill(p, now, rate);
        if self.pacer.may_send() {
            self.pace_until = None;
            true
        } else {
            self.pace_until = Some(self.pacer.ready_at(now, rate));
            false
        }
    }

    /// A packet of `wire_bytes` left (already allowed by `may_send`).
    pub fn sent(&mut self, p: &CcParams, wire_bytes: u64) {
        self.pacer.charge(wire_bytes);
        if let Some(d) = self.rp.as_mut() {
            d.sent(p, wire_bytes);
        }
    }

    /// Whether the NP may send a CNP now (and if so, remember it).
    pub fn take_cnp_slot(&mut self, p: &CcParams, now: Instant) -> bool {
        let gap = u64::from(p.min_time_between_cnps) * US;
        match self.last_cnp {
            Some(l) if now.0 < l.0.saturating_add(gap) => false,
            _ => {
                self.last_cnp = Some(now);
                true
            }
        }
    }

    /// The public view.
    pub fn state(&self, p: &CcParams) -> QpCcState {
        QpCcState {
            current_rate_bps: self.rate_bps(p),
            target_rate_bps: self.rp.as_ref().map_or(p.max_rate_bps(), |d| d.rt),
            alpha: self.rp.as_ref().map_or(0, |d| d.alpha),
            timer_stage: self.rp.as_ref().map_or(0, |d| d.t),
            byte_stage: self.rp.as_ref().map_or(0, |d| d.bc),
            reacting: self.rp.is_some(),
            paced_until: self.pace_until,
        }
    }
}

// ---------------------------------------------------------------------
// The engine's side: what the receive path, the requester and the timers
// call.

/// Whether the requester may send a packet of `qp` now. Always on a
/// kernel-rxe-like device; on a ConnectX-like one the pacer decides and,
/// if not, sets the QP's deadline to when it may.
pub(crate) fn may_send<M>(qp: &mut Qp, ctx: &Ctx<M>, now: Instant) -> bool {
    match ctx.cfg.cc.model {
        CcModel::RxeLike => true,
        CcModel::Mlx5Like => qp.cc.may_send(&ctx.cfg.cc.params, now),
    }
}

/// After the requester tried to send: if a packet was queued (the queue
/// held `before` datagrams), charge it to the pacer and DCQCN's byte
/// counter. Only requester packets are paced: responses (ACKs, READ
/// responses, atomic responses) leave at once (ConnectX paces a QP's READ
/// responses too; not done here).
pub(crate) fn sent<M>(qp: &mut Qp, ctx: &Ctx<M>, before: usize) {
    if ctx.cfg.cc.model == CcModel::RxeLike || ctx.out.len() <= before {
        return;
    }
    if let Some(t) = ctx.out.back() {
        let bytes = (t.payload.len() + WIRE_OVERHEAD) as u64;
        qp.cc.sent(&ctx.cfg.cc.params, bytes);
    }
}

/// The QP's DCQCN timers and pacer at `now` (from `handle_timeout`).
pub(crate) fn on_timeout<M: Memory>(qp: &mut Qp, ctx: &mut Ctx<M>, now: Instant) {
    qp.cc.on_timer(&ctx.cfg.cc.params, now);
    if qp.cc.pace_until.is_some_and(|t| t <= now) {
        qp.cc.pace_until = None;
        crate::req::run(qp, ctx, now);
    }
}

/// A datagram whose ICRC checked and whose first byte is 0x81. Returns
/// the QP whose state changed. Kernel-rxe-like: dropped, as kernel rxe
/// drops it (no QP type takes transport 100), and counted as
/// `rp_cnp_ignored`. ConnectX-like: DCQCN of the QP it names, if that QP
/// exists, is past INIT, and (connected QPs) the CNP comes from its peer.
pub(crate) fn on_cnp<M: Memory>(
    eng: &mut Engine<M>,
    now: Instant,
    dg: &RxDatagram<'_>,
) -> Option<u32> {
    let ctx = &mut eng.ctx;
    let Ok(c) = CnpRepr::parse(dg.payload) else {
        ctx.counters.rcvd_malformed += 1;
        return None;
    };
    if ctx.cfg.cc.model == CcModel::RxeLike || c.pkey & 0x7fff != 0x7fff {
        ctx.counters.rp_cnp_ignored += 1;
        return None;
    }
    let qp = match eng.qps.get_mut(&c.dest_qpn) {
        Some(qp)
            if qp.can_receive()
                && (qp.qp_type == QpType::Ud || qp.path == Some((dg.dst, dg.src))) =>
        {
            qp
        }
        _ => {
            ctx.counters.rp_cnp_ignored += 1;
            return None;
        }
    };
    count!(ctx, qp, rp_cnp_handled);
    qp.cc.on_cnp(&ctx.cfg.cc.params, now);
    let qpn = qp.qpn;
    ctx.note(|| format!("QP {qpn:#x}: CNP from {}: DCQCN reacts", dg.src));
    Some(qpn)
}

/// The notification point: `pkt` reached `qp` with ECN CE on a
/// ConnectX-like device. A data packet (anything but an ACK, NAK or atomic
/// ACK) is counted and, unless the QP sent a CNP less than
/// `min_time_between_cnps` ago, answered with a CNP to the QP that sent
/// it: the connected peer QP, or a UD packet's source QP.
///
/// The CNP (§1 of the facts file): BECN 1, PSN 0, P_Key 0xffff, 16 zero
/// bytes; IP DSCP `cnp_dscp` and Not-ECT (unconfirmed for ConnectX; a
/// Not-ECT CNP cannot itself be marked), UDP source port the QP's own
/// (unconfirmed), destination port 4791. It is not a transport packet, so
/// `sent_pkts` does not count it; `np_cnp_sent` does.
pub(crate) fn notification_point<M>(
    qp: &mut Qp,
    ctx: &mut Ctx<M>,
    now: Instant,
    pkt: &PacketRepr<'_>,
    dg: &RxDatagram<'_>,
) {
    let is_ack = pkt.aeth.is_some()
        && !pkt
            .bth
            .opcode
            .info()
            .is_some_and(|i| i.flags.contains(OpFlags::READ));
    if is_ack {
        return;
    }
    count!(ctx, qp, np_ecn_marked_roce_packets);
    if !qp.cc.take_cnp_slot(&ctx.cfg.cc.params, now) {
        return;
    }
    let dest_qpn = match (qp.qp_type, pkt.deth) {
        (QpType::Ud, Some(d)) => d.src_qpn,
        _ => qp.attr.dest_qp_num,
    };
    let mut payload = vec![0u8; cnp::HEADER_LEN];
    if CnpRepr::new(dest_qpn).emit(&mut payload).is_err() {
        return;
    }
    let info = IpUdpInfo {
        src: dg.dst,
        dst: dg.src,
        src_port: qp.src_port,
        dst_port: wire::ROCEV2_UDP_PORT,
        ipv4_id: 0,
        ipv4_flags_frag: 0x4000,
    };
    wire::icrc::write(&info, &mut payload);
    let dscp = (ctx.cfg.cc.params.cnp_dscp & 0x3f) as u8;
    ctx.out.push_back(Transmit {
        info,
        payload,
        ecn: Ecn::NotEct,
        dscp,
        fresh: false,
        last_posted: false,
        icrc: true,
        gathered: None,
        read_dest: None,
    });
    count!(ctx, qp, np_cnp_sent);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    fn us(n: u64) -> Instant {
        Instant(n * 1000)
    }

    fn params() -> CcParams {
        let mut p = CcParams::default();
        p.set("line_rate_mbps", 10_000).unwrap();
        p
    }

    #[test]
    fn models_have_names_and_overrides_replay_onto_the_defaults() {
        for m in [CcModel::RxeLike, CcModel::Mlx5Like] {
            assert_eq!(CcModel::from_name(m.name()), Some(m));
        }
        assert_eq!(CcModel::from_name("cx5"), None);
        assert!(CcParams::default().overrides().is_empty());
        let mut p = CcParams::default();
        p.set("rpg_min_rate", 500).unwrap();
        p.set("line_rate_mbps", 1000).unwrap();
        p.set("rpg_ai_rate", 5).unwrap(); // the default: not an override
        let o = p.overrides();
        assert_eq!(o, vec![("line_rate_mbps", 1000), ("rpg_min_rate", 500)]);
        let back = CcParams::with_overrides(o.iter().map(|(k, v)| (*k, u64::from(*v)))).unwrap();
        assert_eq!(back, p);
        // Checked in order: a floor above the line rate is refused.
        let bad = [("line_rate_mbps", 100), ("rpg_min_rate", 500)];
        assert!(matches!(
            CcParams::with_overrides(bad),
            Err(CcParamError::OutOfRange {
                name: "rpg_min_rate",
                ..
            })
        ));
    }

    #[test]
    fn defaults_are_nvidias() {
        let p = CcParams::default();
        let want = [
            ("min_time_between_cnps", 4),
            ("cnp_dscp", 48),
            ("cnp_802p_prio", 6),
            ("clamp_tgt_rate", 0),
            ("clamp_tgt_rate_after_time_inc", 1),
            ("rpg_time_reset", 300),
            ("rpg_byte_reset", 32767),
            ("rpg_threshold", 1),
            ("rpg_max_rate", 0),
            ("rpg_ai_rate", 5),
            ("rpg_hai_rate", 50),
            ("rpg_gd", 11),
            ("rpg_min_dec_fac", 50),
            ("rpg_min_rate", 1),
            ("rate_to_set_on_first_cnp", 0),
            ("dce_tcp_g", 1019),
            ("dce_tcp_rtt", 1),
            ("rate_reduce_monitor_period", 4),
            ("initial_alpha_value", 1023),
            ("line_rate_mbps", 100_000),
        ];
        for (n, v) in want {
            assert_eq!(p.get(n), Some(v), "{n}");
        }
        assert_eq!(p.iter().count(), SPECS.len());
        assert_eq!(p.max_rate_bps(), 100_000 * MB);
        assert_eq!(CcConfig::default().model, CcModel::RxeLike);
    }

    #[test]
    fn set_by_name_checks_names_and_ranges() {
        let mut p = CcParams::default();
        p.set("rpg_ai_rate", 7).unwrap();
        assert_eq!(p.rpg_ai_rate, 7);
        assert!(matches!(p.set("rpg_ai", 5), Err(CcParamError::Unknown(_))));
        for (n, bad) in [
            ("dce_tcp_g", 1024),
            ("dce_tcp_rtt", 0),
            ("dce_tcp_rtt", 131_072),
            ("initial_alpha_value", 0),
            ("rpg_min_dec_fac", 101),
            ("cnp_dscp", 64),
            ("clamp_tgt_rate", 2),
            ("rate_reduce_monitor_period", 0),
            ("rpg_time_reset", u64::from(u32::MAX) + 1),
        ] {
            let e = p.set(n, bad).unwrap_err();
            assert!(matches!(e, CcParamError::OutOfRange { .. }), "{n}");
            assert!(e.to_string().contains(n), "{e}");
        }
        // rpg_min_rate is bounded by the line rate.
        p.set("line_rate_mbps", 1000).unwrap();
        assert!(p.set("rpg_min_rate", 1001).is_err());
        p.set("rpg_min_rate", 1000).unwrap();
        assert_eq!(p.get("nope"), None);
        // rpg_max_rate 0 is the line rate; above it, the line rate.
        p.set("rpg_max_rate", 400).unwrap();
        assert_eq!(p.max_rate_bps(), 400 * MB);
        p.set("rpg_max_rate", 5000).unwrap();
        assert_eq!(p.max_rate_bps(), 1000 * MB);
    }

    #[test]
    fn alpha_updates_by_hand() {
        // g = 1019: with a CNP, α ← 1019·α/1024 + 5; without, 1019·α/1024.
        let p = params();
        let mut d = Dcqcn::first_cnp(&p, us(0));
        assert_eq!((d.alpha, d.rc, d.rt), (1023, 10_000 * MB, 10_000 * MB));
        // Periods end at 1, 2, 3 µs. No CNP: 1023 → 1018 → 1013 → 1008.
        d.update_alpha(&p, us(3));
        assert_eq!(d.alpha, 1008);
        // 1019·1008/1024 = 1003.07 → 1003, + 5 = 1008: a CNP each period
        // holds α near 1.
        d.cnp(&p, Instant(3_500));
        d.update_alpha(&p, us(4));
        assert_eq!(d.alpha, 1008);
        // g = 1019 from α = 100: 99.51 → 99 (floor).
        d.alpha = 100;
        d.update_alpha(&p, us(5));
        assert_eq!(d.alpha, 99);
        // Long idle: α decays to 0 and stays there without looping forever.
        d.update_alpha(&p, Instant(u64::MAX / 2));
        assert_eq!(d.alpha, 0);
    }

    #[test]
    fn first_cnp_then_a_cut_by_hand() {
        let p = params();
        let mut d = Dcqcn::first_cnp(&p, us(0));
        // The first CNP itself does not cut, and no check is pending.
        assert_eq!(d.decrease_due, None);
        // At the first CNP RC = RT = the ceiling: increases change nothing,
        // so the increase timer is off.
        assert_eq!(d.increase_due, None);
        // A second CNP at 5 µs: the check at 8 µs (origin 0, period 4) cuts.
        d.cnp(&p, us(5));
        assert_eq!(d.deadline(), Some(us(8)));
        assert_eq!(d.fire_next(&p, us(7)), None, "not yet");
        assert_eq!(d.fire_next(&p, us(8)), Some(us(8)));
        // α at 8 µs: 1023 → 1018 (1) → 1013 (2) → 1008 (3) → 1003 (4)
        // → 998 (5) → 993+5 = 998 (6, the CNP's period) → 993 (7) → 988 (8).
        assert_eq!(d.alpha, 988);
        // Cut: min(RC·988 >> 11, RC·50/100) = 10e9·988/2048 = 4824218750.
        // No increase happened, so RT stays (no clamp).
        assert_eq!(d.rc, 10_000 * MB - 4_824_218_750);
        assert_eq!(d.rt, 10_000 * MB);
        assert_eq!((d.t, d.bc), (0, 0));
        // The increase timer restarted at the cut.
        assert_eq!(d.deadline(), Some(us(308)));
    }

    #[test]
    fn min_dec_fac_and_min_rate_bound_a_cut() {
        let mut p = params();
        p.set("rpg_gd", 0).unwrap(); // α·RC: a cut of ~100 %
        let mut d = Dcqcn::first_cnp(&p, us(0));
        d.cnp(&p, us(1));
        d.fire_next(&p, us(4));
        // rpg_min_dec_fac 50: at most half.
        assert_eq!(d.rc, 5_000 * MB);
        p.set("rpg_min_dec_fac", 100).unwrap(); // cuts disabled
        d.cnp(&p, us(5));
        d.fire_next(&p, us(8));
        assert_eq!(d.rc, 5_000 * MB);
        p.set("rpg_min_dec_fac", 0).unwrap();
        p.set("rpg_min_rate", 3000).unwrap();
        d.cnp(&p, us(9));
        d.fire_next(&p, us(12));
        assert_eq!(d.rc, 3_000 * MB, "floored at rpg_min_rate");
    }

    #[test]
    fn increase_stages_by_hand() {
        let mut p = params();
        p.set("rpg_byte_reset", 0).unwrap(); // timer only
        let mut d = Dcqcn::first_cnp(&p, us(0));
        d.rc = 2_000 * MB;
        d.rt = 4_000 * MB;
        d.increase_due = Some(us(300));
        // Event 1 (T = 0 < F = 1): fast recovery, RC = 3000.
        d.fire_next(&p, us(300));
        assert_eq!((d.rc, d.rt, d.t), (3_000 * MB, 4_000 * MB, 1));
        // Event 2 (T = 1 = F): additive, RT = 4005, RC = (3000 + 4005)/2.
        d.fire_next(&p, us(600));
        assert_eq!((d.rc, d.rt, d.t), (3_502_500_000, 4_005 * MB, 2));
        // Still additive while BC = 0: hyper needs min(T, BC) > F.
        d.fire_next(&p, us(900));
        assert_eq!(d.rt, 4_010 * MB);
        // Byte counter: with BC = 2 and T = 3, min = 2 > 1: hyper, +50.
        p.set("rpg_byte_reset", 1).unwrap(); // 64 bytes
        d.sent(&p, 64); // judged at BC 0, T 3: additive, RT 4015
        assert_eq!((d.rt, d.bc), (4_015 * MB, 1));
        d.sent(&p, 64); // BC 1: min(3, 1) = 1, not > 1: additive, 4020
        d.sent(&p, 64); // BC 2: min(3, 2) = 2 > 1: hyper, 4070
        assert_eq!((d.rt, d.bc), (4_070 * MB, 3));
        // RT is capped at the ceiling, and the timer stops at the fixed point.
        d.rt = 9_990 * MB;
        d.rc = 9_999_999_999;
        d.fire_next(&p, us(1200));
        assert_eq!(d.rt, 10_000 * MB);
        assert_eq!(d.rc, 9_999_999_999, "(RC + RT) / 2 rounds down");
        assert_eq!(d.increase_due, None, "nothing can change any more");
    }

    #[test]
    fn clamp_rules() {
        let p = params();
        let mut d = Dcqcn::first_cnp(&p, us(0));
        d.rc = 1_000 * MB;
        d.rt = 8_000 * MB;
        d.alpha = 1024 - 1; // held by a CNP per period below
                            // No increase since the last cut: RT stays.
        d.cnp(&p, us(1));
        d.fire_next(&p, us(4));
        assert_eq!(d.rt, 8_000 * MB);
        // A timer increase since the cut, clamp_tgt_rate_after_time_inc 1:
        // RT ← RC before the cut.
        d.t = 1;
        let rc = d.rc;
        d.cnp(&p, us(5));
        d.fire_next(&p, us(8));
        assert_eq!(d.rt, rc);
        // ... not with it off (and no byte increase).
        let mut p2 = p.clone();
        p2.set("clamp_tgt_rate_after_time_inc", 0).unwrap();
        d.rt = 8_000 * MB;
        d.t = 1;
        d.cnp(&p2, us(9));
        d.fire_next(&p2, us(12));
        assert_eq!(d.rt, 8_000 * MB);
        // A byte-counter increase always clamps.
        d.bc = 1;
        let rc = d.rc;
        d.cnp(&p2, us(13));
        d.fire_next(&p2, us(16));
        assert_eq!(d.rt, rc);
    }

    #[test]
    fn pacer_sends_at_the_rate() {
        let mut p = params();
        p.set("pacing_burst_bytes", 1).unwrap();
        let mut q = QpCc::default();
        // 1000-byte packets at 10 Gb/s: one per 800 ns.
        let mut sent = 0;
        let mut t = Instant(0);
        while t < us(80) {
            if q.may_send(&p, t) {
                q.sent(&p, 1000);
                sent += 1;
            } else {
                t = q.pace_until.unwrap();
            }
        }
        assert_eq!(sent, 100, "t = 0, 800 ns, ... 79.2 µs");
        // After a CNP and a cut, the pacer follows RC.
        q.on_cnp(&p, us(80));
        q.on_cnp(&p, us(81));
        q.on_timer(&p, us(84));
        let rc = q.rate_bps(&p);
        assert!(rc < 6_000 * MB && rc > 4_000 * MB, "{rc}");
        assert!(q.state(&p).reacting);
    }

    #[test]
    fn cnp_pacing_per_qp() {
        let p = params();
        let mut q = QpCc::default();
        assert!(q.take_cnp_slot(&p, us(10)));
        assert!(!q.take_cnp_slot(&p, Instant(13_999)));
        assert!(q.take_cnp_slot(&p, us(14)));
    }
}
