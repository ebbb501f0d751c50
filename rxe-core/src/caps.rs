//! Device limits and MTUs, with kernel rxe's values (`rxe_param.h`).

/// Device limits. The defaults are kernel rxe's (`rxe_param.h`, Linux 6.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// `RXE_MAX_MR_SIZE`.
    pub max_mr_size: u64,
    /// `RXE_PAGE_SIZE_CAP`.
    pub page_size_cap: u64,
    /// `RXE_VENDOR_ID` (0xFFFFFF).
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    /// `RXE_MAX_QP`.
    pub max_qp: u32,
    /// `RXE_MAX_QP_WR`.
    pub max_qp_wr: u32,
    /// `RXE_MAX_SGE`.
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    /// `RXE_MAX_SGE_RD`.
    pub max_sge_rd: u32,
    /// `RXE_MAX_CQ`.
    pub max_cq: u32,
    /// `RXE_MAX_CQE` (`(1 << 15) - 1`).
    pub max_cqe: u32,
    /// `RXE_MAX_MR`.
    pub max_mr: u32,
    /// `RXE_MAX_MW`.
    pub max_mw: u32,
    /// `RXE_MAX_PD`.
    pub max_pd: u32,
    /// `RXE_MAX_AH`.
    pub max_ah: u32,
    /// `RXE_MAX_QP_RD_ATOM`.
    pub max_qp_rd_atom: u32,
    /// `RXE_MAX_QP_INIT_RD_ATOM`.
    pub max_qp_init_rd_atom: u32,
    /// `RXE_MAX_RES_RD_ATOM`.
    pub max_res_rd_atom: u32,
    /// `RXE_MAX_SRQ`.
    pub max_srq: u32,
    /// `RXE_MAX_SRQ_WR`.
    pub max_srq_wr: u32,
    /// `RXE_MAX_SRQ_SGE`.
    pub max_srq_sge: u32,
    /// `RXE_MAX_INLINE_DATA`.
    pub max_inline_data: u32,
    /// `RXE_PORT_MAX_MSG_SZ` (8 MiB). Advertised; like the kernel, larger
    /// messages (up to 2^31) are not refused.
    pub max_msg_sz: u32,
    /// `RXE_MAX_MCAST_GRP`.
    pub max_mcast_grp: u32,
    /// `RXE_MAX_MCAST_QP_ATTACH`.
    pub max_mcast_qp_attach: u32,
    /// `RXE_PORT_PKEY_TBL_LEN`.
    pub max_pkeys: u16,
    /// `RXE_MAX_UNACKED_PSNS`.
    pub max_unacked_psns: u32,
    /// `RXE_PORT_GID_TBL_LEN`.
    pub gid_table_len: u32,
    /// `RXE_LOCAL_CA_ACK_DELAY`.
    pub local_ca_ack_delay: u8,
}

impl Default for DeviceCaps {
    fn default() -> Self {
        DeviceCaps {
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            vendor_id: 0x00ff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0x10000,
            max_qp_wr: 0x4000,
            max_send_sge: 32,
            max_recv_sge: 32,
            max_sge_rd: 32,
            max_cq: 0x20000,
            max_cqe: (1 << 15) - 1,
            max_mr: 0x10000,
            max_mw: 0x10000,
            max_pd: 0x10000,
            max_ah: 0x8000,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_res_rd_atom: 0x3f000,
            max_srq: 0x20000,
            max_srq_wr: 0x4000,
            max_srq_sge: 27,
            max_inline_data: 32 * 16,
            max_msg_sz: 0x80_0000,
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_pkeys: 64,
            max_unacked_psns: 128,
            gid_table_len: 1024,
            local_ca_ack_delay: 15,
        }
    }
}

/// IB path MTU (`enum ibv_mtu` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    M256 = 1,
    M512 = 2,
    M1024 = 3,
    M2048 = 4,
    M4096 = 5,
}

impl Mtu {
    /// Bytes of payload per packet.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// From the `ibv_mtu` value.
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

    /// The largest IB MTU that fits a netdev MTU, as kernel rxe computes
    /// it (`rxe_set_mtu` / `eth_mtu_int_to_enum`: netdev MTU minus the
    /// RoCEv2 overhead rxe reserves, 80 bytes), capped at 4096. `None` when
    /// not even 256 fits.
    pub fn for_netdev_mtu(netdev_mtu: u32) -> Option<Mtu> {
        let avail = netdev_mtu.checked_sub(80)?;
        [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512, Mtu::M256]
            .into_iter()
            .find(|m| m.bytes() <= avail)
    }
}

impl std::fmt::Display for Mtu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_mtu_rule() {
        assert_eq!(Mtu::for_netdev_mtu(1500), Some(Mtu::M1024));
        assert_eq!(Mtu::for_netdev_mtu(9000), Some(Mtu::M4096));
        assert_eq!(Mtu::for_netdev_mtu(65536), Some(Mtu::M4096));
        assert_eq!(Mtu::for_netdev_mtu(2128), Some(Mtu::M2048));
        assert_eq!(Mtu::for_netdev_mtu(2127), Some(Mtu::M1024));
        assert_eq!(Mtu::for_netdev_mtu(300), None);
        assert_eq!(Mtu::for_netdev_mtu(50), None);
        assert_eq!(Mtu::M256.bytes(), 256);
        assert_eq!(Mtu::M4096.bytes(), 4096);
        assert_eq!(Mtu::from_ibv(3), Some(Mtu::M1024));
        assert_eq!(Mtu::from_ibv(6), None);
    }
}
