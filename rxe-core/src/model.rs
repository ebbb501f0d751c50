//! What differs on the wire between a kernel-rxe-like and a ConnectX-like
//! (mlx5) device, besides congestion control (that is [`crate::cc`]).
//!
//! A device's [`CcModel`] picks one behaviour or the other. The rxe-like
//! answer is always what rxe-emu sent before this module existed, so a
//! kernel-rxe-like device stays byte-identical to kernel rxe. The sources
//! of each mlx5-like rule are cited where it is defined and collected in
//! `docs/connectx.md`.

use crate::cc::CcModel;
use crate::qp::hash_32;
use crate::qp_attr::{MigState, QpType};

/// Which kernel rxe a device behaves as where kernel releases differ
/// (`rxe-emu link add --like 6.1|6.12|7.2`). The reference kernels are
/// the ones the interop suite runs against: Debian 12's 6.1, Debian 13's
/// 6.12 and sid's 7.2. What differs, and since when, is listed in
/// `docs/kernels.md`; each difference is decided by one method here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RxeRelease {
    /// Linux 6.1 (Debian 12).
    V6_1,
    /// Linux 6.12 (Debian 13).
    V6_12,
    /// Linux 7.2 (Debian sid): the newest, and the default.
    #[default]
    V7_2,
}

impl RxeRelease {
    /// Every reference release, oldest first.
    pub const ALL: [RxeRelease; 3] = [RxeRelease::V6_1, RxeRelease::V6_12, RxeRelease::V7_2];

    /// `6.1`, `6.12`, `7.2`.
    pub const fn name(self) -> &'static str {
        match self {
            RxeRelease::V6_1 => "6.1",
            RxeRelease::V6_12 => "6.12",
            RxeRelease::V7_2 => "7.2",
        }
    }

    /// The release called `name` ([`RxeRelease::name`]).
    pub fn from_name(name: &str) -> Option<RxeRelease> {
        RxeRelease::ALL.into_iter().find(|r| r.name() == name)
    }

    /// FLUSH (opcode 0x1C) and ATOMIC WRITE (0x1D), their device capability
    /// bits and `IBV_ACCESS_FLUSH_*`: since Linux 6.2. A 6.1-like device
    /// refuses to post them and its responder drops them as opcodes it
    /// does not know.
    pub fn has_flush_and_atomic_write(self) -> bool {
        self >= RxeRelease::V6_12
    }

    /// The rkey of an MR registered without remote access: 0 up to 6.4
    /// (6.1 `rxe_mr_init`: `rkey = (access & IB_ACCESS_REMOTE) ? lkey :
    /// 0`), the lkey from 6.5.
    pub fn local_mr_rkey_is_lkey(self) -> bool {
        self >= RxeRelease::V6_12
    }

    /// The port's `max_msg_sz`: `RXE_PORT_MAX_MSG_SZ` 0x800000 (8 MiB) in
    /// 6.1, 2^31 since 6.14, and in Debian's 6.12 (6.12.117 reports 2^31:
    /// the change reached the 6.12 stable series; measured by the interop
    /// suite's `facts` run).
    pub fn max_msg_sz(self) -> u32 {
        if self >= RxeRelease::V6_12 {
            0x8000_0000
        } else {
            0x80_0000
        }
    }

    /// Whether `ibv_query_qp` reports the QP's state in `cur_qp_state`.
    /// 6.1 reports what `qp->attr.cur_qp_state` holds, which only a modify
    /// with `IBV_QP_CUR_STATE` sets: RESET (0) for every QP whose program
    /// never passed it (rxe-emu 6.1-like devices report RESET always).
    /// Filled in since 6.13, and in Debian's 6.12.117 (measured by the
    /// interop suite's `facts` run).
    pub fn query_qp_reports_cur_state(self) -> bool {
        self >= RxeRelease::V6_12
    }
}

/// What a device is like: kernel rxe of one release, or ConnectX
/// (`--like rxe|6.1|6.12|7.2|mlx5`). ConnectX-like devices take the
/// newest kernel rxe's answers where the congestion model and
/// [`bth_mig_req`]/[`ud_src_port`] do not decide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Like {
    /// Congestion control and ConnectX wire traits.
    pub cc: CcModel,
    /// The kernel rxe release whose verbs and wire behaviour it follows.
    pub release: RxeRelease,
}

impl Like {
    /// The names `--like` takes, for messages.
    pub const NAMES: &'static str = "rxe (kernel rxe 7.2), 6.1, 6.12, 7.2 or mlx5";

    /// The name it is given on the command line: `rxe` for the newest
    /// kernel rxe (the default), `6.1`/`6.12` for older ones, `mlx5`.
    pub fn name(self) -> &'static str {
        match (self.cc, self.release) {
            (CcModel::Mlx5Like, _) => "mlx5",
            (CcModel::RxeLike, r) if r == RxeRelease::default() => "rxe",
            (CcModel::RxeLike, r) => r.name(),
        }
    }

    /// The device called `name` ([`Like::name`]; `7.2` is `rxe`).
    pub fn from_name(name: &str) -> Option<Like> {
        match name {
            "rxe" => Some(Like::default()),
            "mlx5" => Some(Like {
                cc: CcModel::Mlx5Like,
                release: RxeRelease::default(),
            }),
            r => RxeRelease::from_name(r).map(|release| Like {
                cc: CcModel::RxeLike,
                release,
            }),
        }
    }
}

/// The lowest port of the RoCEv2 UDP source port range,
/// `IB_ROCE_UDP_ENCAP_VALID_PORT_MIN` (0xC000); the range ends at 0xFFFF.
pub const ROCE_SPORT_MIN: u16 = 0xC000;

/// IB core `rdma_flow_label_to_udp_sport` (`include/rdma/ib_verbs.h`;
/// rdma-core's `ibv_flow_label_to_udp_sport` is the same): the low 14 bits
/// of the 20-bit flow label XOR its top 6 bits, in 0xC000..=0xFFFF.
pub fn flow_label_to_udp_sport(flow_label: u32) -> u16 {
    let fl = flow_label & 0xf_ffff;
    let low = (fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14);
    ROCE_SPORT_MIN | low as u16
}

/// The BTH MigReq (M) bit of the packets a connected QP sends.
///
/// - Kernel rxe: always 0 (`rxe_req.c` `init_req_packet` and
///   `rxe_resp.c` `prepare_ack_packet` pass `migreq` 0 to `bth_init`).
/// - ConnectX: the driver puts every QP in the Migrated path-migration
///   state unless `IBV_QP_PATH_MIG_STATE` says otherwise (Linux
///   `drivers/infiniband/hw/mlx5/qp.c`: `pm_state = MLX5_QP_PM_MIGRATED`
///   when the mask lacks it), and IBTA has a QP in the Migrated state set
///   MigReq to 1 in every request and response it sends, as the software
///   HCAs qib and hfi1 do (`if (qp->s_mig_state == IB_MIG_MIGRATED)
///   bth0 |= IB_BTH_MIG_REQ`). No public ConnectX capture was found to
///   confirm the bit on the wire.
///
/// UD packets keep 0 on both models (qib and hfi1 set the bit only in the
/// connected-QP header path; what ConnectX does for UD is unconfirmed).
pub fn bth_mig_req(model: CcModel, qp_type: QpType, mig_state: MigState) -> bool {
    match model {
        CcModel::RxeLike => false,
        CcModel::Mlx5Like => qp_type != QpType::Ud && mig_state == MigState::Migrated,
    }
}

/// The UDP source port of a UD send through an address handle.
///
/// - Kernel rxe: the QP's own port, chosen when it was created
///   (`qp_port`, [`crate::qp::rxe_src_port`]), whatever the AH.
/// - ConnectX: the port lives in the address handle. rdma-core's mlx5
///   provider (`providers/mlx5/verbs.c` `mlx5_ah_set_udp_sport`) derives
///   it from the AH's flow label when that is not 0
///   ([`flow_label_to_udp_sport`]) and otherwise draws it at random in
///   0xC000..=0xFFFF. rxe-emu draws nothing: without a flow label the
///   port is `0xC000 | hash_32(ah, 14)` of the AH's handle, spread over the
///   same range and the same from run to run.
pub fn ud_src_port(model: CcModel, qp_port: u16, ah_handle: u32, ah_flow_label: u32) -> u16 {
    match model {
        CcModel::RxeLike => qp_port,
        CcModel::Mlx5Like if ah_flow_label & 0xf_ffff != 0 => {
            flow_label_to_udp_sport(ah_flow_label)
        }
        CcModel::Mlx5Like => ROCE_SPORT_MIN | hash_32(ah_handle, 14) as u16,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn like_names() {
        use super::{Like, RxeRelease};
        for n in ["rxe", "6.1", "6.12", "mlx5"] {
            assert_eq!(Like::from_name(n).unwrap().name(), n);
        }
        assert_eq!(Like::from_name("7.2"), Like::from_name("rxe"));
        assert!(Like::from_name("6.2").is_none() && Like::from_name("").is_none());
        assert_eq!(Like::default().release, RxeRelease::V7_2);
        let v61 = RxeRelease::V6_1;
        assert!(!v61.has_flush_and_atomic_write() && !v61.local_mr_rkey_is_lkey());
        assert_eq!(v61.max_msg_sz(), 0x80_0000);
        assert_eq!(RxeRelease::V6_12.max_msg_sz(), 1 << 31);
        assert_eq!(RxeRelease::V7_2.max_msg_sz(), 1 << 31);
        assert!(!v61.query_qp_reports_cur_state());
        assert!(RxeRelease::V6_12.query_qp_reports_cur_state());
        assert!(RxeRelease::V6_12.has_flush_and_atomic_write());
    }

    use super::*;

    #[test]
    fn flow_label_port_by_hand() {
        // fl = 0x12345: low 14 bits 0x2345, top 6 bits 0x12345 >> 14 = 4;
        // 0x2345 ^ 4 = 0x2341, | 0xC000 = 0xE341.
        assert_eq!(flow_label_to_udp_sport(0x12345), 0xE341);
        // fl = 1: 0xC001. fl = 0xFFFFF: 0x3FFF ^ 0x3F = 0x3FC0 -> 0xFFC0.
        assert_eq!(flow_label_to_udp_sport(1), 0xC001);
        assert_eq!(flow_label_to_udp_sport(0xF_FFFF), 0xFFC0);
        // Bits above the 20-bit label are ignored.
        assert_eq!(flow_label_to_udp_sport(0xFFF1_2345), 0xE341);
    }

    #[test]
    fn connected_port_is_the_same_rule() {
        // The RC/UC rule (rdma_get_udp_sport) with a flow label is this
        // function, on both models (kernel rxe and mlx5 qp.c both call it).
        for fl in [1u32, 0x12345, 0xF_FFFF, 0xABCDE] {
            assert_eq!(
                crate::qp::connected_src_port(fl, 17, 18),
                flow_label_to_udp_sport(fl)
            );
        }
    }

    #[test]
    fn mig_req_per_model() {
        use CcModel::*;
        for t in [QpType::Rc, QpType::Uc, QpType::XrcSend, QpType::XrcRecv] {
            assert!(!bth_mig_req(RxeLike, t, MigState::Migrated));
            assert!(bth_mig_req(Mlx5Like, t, MigState::Migrated));
            assert!(!bth_mig_req(Mlx5Like, t, MigState::Rearm));
            assert!(!bth_mig_req(Mlx5Like, t, MigState::Armed));
        }
        assert!(!bth_mig_req(Mlx5Like, QpType::Ud, MigState::Migrated));
    }

    #[test]
    fn ud_port_per_model() {
        use CcModel::*;
        // rxe-like: the QP's port whatever the AH.
        assert_eq!(ud_src_port(RxeLike, 58149, 7, 0x12345), 58149);
        assert_eq!(ud_src_port(RxeLike, 58149, 7, 0), 58149);
        // mlx5-like with a flow label: from the label (see above).
        assert_eq!(ud_src_port(Mlx5Like, 58149, 7, 0x12345), 0xE341);
        // mlx5-like without: 0xC000 | hash_32(handle, 14). By hand:
        // 7 * 0x61C88647 = 0x2_AC7B_ABF1, mod 2^32 0xAC7BABF1; >> 18 = 0x2B1E.
        assert_eq!(ud_src_port(Mlx5Like, 58149, 7, 0), 0xEB1E);
        // Distinct AHs mostly get distinct ports; all are in the range.
        let ports: std::collections::HashSet<u16> =
            (1..=64).map(|h| ud_src_port(Mlx5Like, 0, h, 0)).collect();
        assert!(ports.len() >= 60, "{}", ports.len());
        assert!(ports.iter().all(|&p| p >= ROCE_SPORT_MIN));
    }
}
