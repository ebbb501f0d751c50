//! Device limits and path MTUs, with kernel rxe's values.
//!
//! The defaults are what `ibv_devinfo -v` reports for an `rdma_rxe` device on
//! Linux 6.1 (Debian 12, 6.1.0-56), which is what `rxe_init_device_param()` /
//! `rxe_init_port_param()` (`drivers/infiniband/sw/rxe/rxe.c`) copy out of
//! `rxe_param.h`. Applications size their queues from these numbers, so they
//! must be the kernel's, not merely "large enough".

/// `DEFAULT_MAX_VALUE` in `rxe_param.h` (`1 << 20`): the kernel's ceiling
/// for most object counts since Linux 5.15.
const RXE_DEFAULT_MAX_VALUE: u32 = 1 << 20;

/// Device and port limits, as `ibv_query_device` / `ibv_query_port` report
/// them.
///
/// [`Default`] gives kernel rxe's values (Linux 6.1); each field names the
/// `rxe_param.h` constant it mirrors. The engine enforces these limits where
/// kernel rxe does, so changing one changes behaviour, not only what is
/// reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Largest MR in bytes: `RXE_MAX_MR_SIZE` (`-1ull`, no limit).
    pub max_mr_size: u64,
    /// Supported page sizes as a bit mask: `RXE_PAGE_SIZE_CAP` (`0xfffff000`,
    /// every power of two from 4 KiB).
    pub page_size_cap: u64,
    /// IEEE vendor id: `RXE_VENDOR_ID` (`0xFFFFFF`, "no vendor", per IBTA
    /// A3.3.1). pyverbs and rdma-core tests key vendor-specific cases on it.
    pub vendor_id: u32,
    /// Vendor part id: 0 (`RXE_VENDOR_PART_ID` in older kernels; unset in 6.1).
    pub vendor_part_id: u32,
    /// Hardware version: 0 (`RXE_HW_VER` in older kernels; unset in 6.1).
    pub hw_ver: u32,
    /// Number of QPs: `RXE_MAX_QP` = `DEFAULT_MAX_VALUE - RXE_MIN_QP_INDEX`
    /// (1048560), because QPNs below 16 are reserved.
    pub max_qp: u32,
    /// Work requests per queue: `RXE_MAX_QP_WR` (`DEFAULT_MAX_VALUE`).
    pub max_qp_wr: u32,
    /// SGEs per send WR: `RXE_MAX_SGE` (32).
    pub max_send_sge: u32,
    /// SGEs per receive WR: `RXE_MAX_SGE` (32); the kernel uses one constant
    /// for both queues.
    pub max_recv_sge: u32,
    /// SGEs per RDMA READ: `RXE_MAX_SGE_RD` (32).
    pub max_sge_rd: u32,
    /// Number of CQs: `RXE_MAX_CQ` (`DEFAULT_MAX_VALUE`).
    pub max_cq: u32,
    /// Entries per CQ: ConnectX's 4194303, not kernel rxe's
    /// `(1 << RXE_MAX_LOG_CQE) - 1` (32767); see `default`.
    pub max_cqe: u32,
    /// Number of MRs: `RXE_MAX_MR` = `RXE_MAX_MR_INDEX - RXE_MIN_MR_INDEX`
    /// (524287); the MR and MW index spaces split `DEFAULT_MAX_VALUE` in two.
    pub max_mr: u32,
    /// Number of MWs: `RXE_MAX_MW` = `RXE_MAX_MW_INDEX - RXE_MIN_MW_INDEX`
    /// (524287).
    pub max_mw: u32,
    /// Number of PDs: `RXE_MAX_PD` (`DEFAULT_MAX_VALUE`).
    pub max_pd: u32,
    /// Number of AHs: `RXE_MAX_AH` (`(1 << 15) - 1`; AH indices are 15-bit).
    pub max_ah: u32,
    /// Outstanding READ/atomic requests per QP, as requester and as
    /// responder: `RXE_MAX_QP_RD_ATOM` (128). `rxe_qp_chk_attr` refuses a
    /// larger `max_rd_atomic`.
    pub max_qp_rd_atom: u32,
    /// Depth of READ/atomic initiation per QP: `RXE_MAX_QP_INIT_RD_ATOM` (128).
    pub max_qp_init_rd_atom: u32,
    /// READ/atomic responder resources for the whole device:
    /// `RXE_MAX_RES_RD_ATOM` (`0x3f000`).
    pub max_res_rd_atom: u32,
    /// Number of SRQs: `RXE_MAX_SRQ` = `DEFAULT_MAX_VALUE - RXE_MIN_SRQ_INDEX`
    /// (917503).
    pub max_srq: u32,
    /// Work requests per SRQ: `RXE_MAX_SRQ_WR` (`DEFAULT_MAX_VALUE`).
    pub max_srq_wr: u32,
    /// SGEs per SRQ WR: `RXE_MAX_SRQ_SGE` (27).
    pub max_srq_sge: u32,
    /// Inline bytes per send WR: `RXE_MAX_INLINE_DATA` (512: the room of
    /// `RXE_MAX_SGE` SGEs in a send WQE, `32 * sizeof(struct ib_sge)`).
    pub max_inline_data: u32,
    /// Largest message: `RXE_PORT_MAX_MSG_SZ`, 2^31 as in the newest
    /// kernel rxe (8 MiB up to Linux 6.13: `RxeRelease::max_msg_sz`,
    /// which `EngineConfig::set_release` applies). It is advertised; like
    /// the kernel, the engine does not refuse larger messages.
    pub max_msg_sz: u32,
    /// Multicast groups: `RXE_MAX_MCAST_GRP` (8192).
    pub max_mcast_grp: u32,
    /// QPs per multicast group: `RXE_MAX_MCAST_QP_ATTACH` (56).
    pub max_mcast_qp_attach: u32,
    /// `max_pkeys` of the device: `RXE_MAX_PKEYS` (64). The port's P_Key
    /// table itself has one entry, 0xffff (`RXE_PORT_PKEY_TBL_LEN` = 1).
    pub max_pkeys: u16,
    /// Unacknowledged PSNs a requester may have in flight:
    /// `RXE_MAX_UNACKED_PSNS` (128); `rxe_req.c` stops sending past it.
    pub max_unacked_psns: u32,
    /// GID table entries: `RXE_PORT_GID_TBL_LEN` (1024).
    pub gid_table_len: u32,
    /// Local CA ACK delay exponent: `RXE_LOCAL_CA_ACK_DELAY` (15).
    pub local_ca_ack_delay: u8,
}

impl Default for DeviceCaps {
    /// Kernel rxe's limits, Linux 6.1 (measured with `ibv_devinfo -v`).
    fn default() -> Self {
        let mr_index_max = RXE_DEFAULT_MAX_VALUE >> 1;
        DeviceCaps {
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: 0x00ff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: RXE_DEFAULT_MAX_VALUE - 16,
            max_qp_wr: RXE_DEFAULT_MAX_VALUE,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_sge_rd: 32,
            max_cq: RXE_DEFAULT_MAX_VALUE,
            // Deliberately not kernel rxe's 2^15 - 1 but ConnectX's
            // 2^22 - 1: libfabric's ofi_rxm asks for 256 entries per peer
            // of FI_UNIVERSE_SIZE (default 1024), 262144, and on kernel
            // rxe fails unless FI_UNIVERSE_SIZE <= 127. A CQ's entries are
            // only allocated as completions arrive, so a large limit
            // costs nothing.
            max_cqe: (1 << 22) - 1,
            max_mr: mr_index_max - 1,
            max_mw: RXE_DEFAULT_MAX_VALUE - (mr_index_max + 1),
            max_pd: RXE_DEFAULT_MAX_VALUE,
            max_ah: (1 << 15) - 1,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_res_rd_atom: 0x3f000,
            max_srq: RXE_DEFAULT_MAX_VALUE - 0x0002_0001,
            max_srq_wr: RXE_DEFAULT_MAX_VALUE,
            max_srq_sge: 27,
            max_inline_data: 32 * 16,
            max_msg_sz: crate::model::RxeRelease::V7_2.max_msg_sz(),
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_pkeys: 64,
            max_unacked_psns: 128,
            gid_table_len: 1024,
            local_ca_ack_delay: 15,
        }
    }
}

/// An IB path MTU, with the `enum ibv_mtu` / `enum ib_mtu` values.
///
/// The derived order is the order of sizes, so `min`/`max`/`<=` compare
/// MTUs the way `rxe_qp_chk_attr` compares the enum values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// `IBV_MTU_256`.
    M256 = 1,
    /// `IBV_MTU_512`.
    M512 = 2,
    /// `IBV_MTU_1024`: what rxe picks on a 1500-byte netdev.
    M1024 = 3,
    /// `IBV_MTU_2048`.
    M2048 = 4,
    /// `IBV_MTU_4096`: the largest IB MTU, and rxe's port `max_mtu`
    /// (`RXE_PORT_MAX_MTU`).
    M4096 = 5,
}

/// What rxe reserves for headers when it derives the IB MTU from the netdev
/// MTU: `RXE_MAX_HDR_LENGTH` (80 bytes, `rxe_hdr.h`), used by
/// `eth_mtu_int_to_enum()` in `rxe_param.h`.
const RXE_MAX_HDR_LENGTH: u32 = 80;

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096];

    /// Payload bytes per packet (`ib_mtu_enum_to_int`).
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The `ibv_mtu` value (1..=5).
    pub fn ibv(self) -> u32 {
        self as u32
    }

    /// From an `ibv_mtu` value; `None` for anything but 1..=5, so a caller
    /// can refuse a bad `path_mtu` instead of guessing.
    pub fn from_ibv(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::M256,
            2 => Mtu::M512,
            3 => Mtu::M1024,
            4 => Mtu::M2048,
            5 => Mtu::M4096,
            _ => return None,
        })
    }

    /// The largest IB MTU whose packets fit a netdev MTU: the largest of
    /// 256..4096 that is `<= netdev_mtu - 80` (`eth_mtu_int_to_enum()` in
    /// `rxe_param.h`). `None` when not even 256 fits (netdev MTU below 336).
    ///
    /// The kernel does not fail there: `rxe_set_mtu()` (`rxe.c`) falls back
    /// to 256, measured as `active_mtu: 256` on a 300-byte netdev with Linux
    /// 6.1. Use [`Mtu::active_for_netdev_mtu`] to get exactly that.
    pub fn for_netdev_mtu(netdev_mtu: u32) -> Option<Mtu> {
        let room = netdev_mtu.checked_sub(RXE_MAX_HDR_LENGTH)?;
        Mtu::ALL.into_iter().rev().find(|m| m.bytes() <= room)
    }

    /// The port's `active_mtu` exactly as kernel rxe sets it for a netdev
    /// MTU (`rxe_set_mtu()` in `rxe.c`): [`Mtu::for_netdev_mtu`], or 256 when
    /// nothing fits. The port's `max_mtu` stays 4096 either way.
    pub fn active_for_netdev_mtu(netdev_mtu: u32) -> Mtu {
        Mtu::for_netdev_mtu(netdev_mtu).unwrap_or(Mtu::M256)
    }
}

impl std::fmt::Display for Mtu {
    /// The size in bytes, as `ibv_devinfo` prints it (e.g. `1024`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_mtu_rule_matches_rxe() {
        // Linux 6.1 on a 1500-byte netdev reports active_mtu 1024.
        assert_eq!(Mtu::for_netdev_mtu(1500), Some(Mtu::M1024));
        assert_eq!(Mtu::for_netdev_mtu(9000), Some(Mtu::M4096));
        assert_eq!(Mtu::for_netdev_mtu(65536), Some(Mtu::M4096));
        // Boundaries: 2048 + 80 fits 2048 (measured: 2128 -> 2048, 2127 -> 1024).
        assert_eq!(Mtu::for_netdev_mtu(2128), Some(Mtu::M2048));
        assert_eq!(Mtu::for_netdev_mtu(2127), Some(Mtu::M1024));
        assert_eq!(Mtu::for_netdev_mtu(4176), Some(Mtu::M4096));
        assert_eq!(Mtu::for_netdev_mtu(4175), Some(Mtu::M2048));
        assert_eq!(Mtu::for_netdev_mtu(336), Some(Mtu::M256));
        assert_eq!(Mtu::for_netdev_mtu(335), None);
        assert_eq!(Mtu::for_netdev_mtu(300), None);
        assert_eq!(Mtu::for_netdev_mtu(80), None);
        assert_eq!(Mtu::for_netdev_mtu(50), None);
        assert_eq!(Mtu::for_netdev_mtu(0), None);
        assert_eq!(Mtu::for_netdev_mtu(u32::MAX), Some(Mtu::M4096));
    }

    #[test]
    fn active_mtu_falls_back_to_256_like_rxe_set_mtu() {
        // Measured: a 300-byte netdev gives active_mtu 256 on Linux 6.1.
        assert_eq!(Mtu::active_for_netdev_mtu(300), Mtu::M256);
        assert_eq!(Mtu::active_for_netdev_mtu(0), Mtu::M256);
        assert_eq!(Mtu::active_for_netdev_mtu(1500), Mtu::M1024);
        assert_eq!(Mtu::active_for_netdev_mtu(65536), Mtu::M4096);
    }

    #[test]
    fn mtu_values() {
        let bytes: Vec<u32> = Mtu::ALL.iter().map(|m| m.bytes()).collect();
        assert_eq!(bytes, [256, 512, 1024, 2048, 4096]);
        for m in Mtu::ALL {
            assert_eq!(Mtu::from_ibv(m.ibv()), Some(m));
        }
        assert_eq!(Mtu::from_ibv(0), None);
        assert_eq!(Mtu::from_ibv(6), None);
        assert!(Mtu::M256 < Mtu::M4096);
        assert_eq!(Mtu::M2048.to_string(), "2048");
    }

    #[test]
    fn defaults_are_what_linux_6_1_rxe_reports() {
        // `ibv_devinfo -v` on rxe0, Linux 6.1.0-56-amd64 (shared/tools/rxe-vm),
        // but max_msg_sz, which is 7.2's (the newest, the default release;
        // the interop suite compares each release's figures).
        let c = DeviceCaps::default();
        assert_eq!(c.max_mr_size, 0xffff_ffff_ffff_ffff);
        assert_eq!(c.page_size_cap, 0xffff_f000);
        assert_eq!(c.vendor_id, 0xff_ffff);
        assert_eq!((c.vendor_part_id, c.hw_ver), (0, 0));
        assert_eq!(c.max_qp, 1_048_560);
        assert_eq!(c.max_qp_wr, 1_048_576);
        assert_eq!((c.max_send_sge, c.max_recv_sge, c.max_sge_rd), (32, 32, 32));
        assert_eq!(c.max_cq, 1_048_576);
        assert_eq!(c.max_cqe, 4_194_303);
        assert_eq!(c.max_mr, 524_287);
        assert_eq!(c.max_pd, 1_048_576);
        assert_eq!(c.max_qp_rd_atom, 128);
        assert_eq!(c.max_res_rd_atom, 258_048);
        assert_eq!(c.max_qp_init_rd_atom, 128);
        assert_eq!(c.max_mw, 524_287);
        assert_eq!(c.max_mcast_grp, 8192);
        assert_eq!(c.max_mcast_qp_attach, 56);
        assert_eq!(c.max_ah, 32_767);
        assert_eq!(c.max_srq, 917_503);
        assert_eq!(c.max_srq_wr, 1_048_576);
        assert_eq!(c.max_srq_sge, 27);
        assert_eq!(c.max_pkeys, 64);
        assert_eq!(c.local_ca_ack_delay, 15);
        assert_eq!(c.max_msg_sz, 1 << 31);
        assert_eq!(crate::RxeRelease::V6_1.max_msg_sz(), 0x80_0000);
        assert_eq!(c.gid_table_len, 1024);
        assert_eq!(c.max_inline_data, 512);
        assert_eq!(c.max_unacked_psns, 128);
    }
}
