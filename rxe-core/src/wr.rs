//! Work requests in, work completions out.
//!
//! The numeric values of the enums and flags are those of libibverbs
//! (`enum ibv_wc_status`, `enum ibv_wc_opcode`, `enum ibv_send_flags`, ...), so
//! the C ABI can pass them through unchanged.

use bitflags::bitflags;
use std::fmt;

use crate::mr::AccessFlags;
use crate::AhHandle;

/// One scatter/gather element: `length` bytes at `addr`, covered by the MR `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address (in the MR's address space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR covering the range.
    pub lkey: u32,
}

bitflags! {
    /// `enum ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for all prior WRs to complete before starting (IBTA 10.8.3.3).
        const FENCE = 1;
        /// Generate a completion even when the QP is not `sq_sig_all`.
        const SIGNALED = 2;
        /// Set the solicited-event bit on the last packet.
        const SOLICITED = 4;
        /// The data is copied from the SGEs at post time; lkeys are not checked.
        const INLINE = 8;
        /// IP checksum offload (UD, ignored: RoCEv2 has no such offload here).
        const IP_CSUM = 16;
    }
}

/// The parameters of a memory-window bind (`struct ibv_mw_bind_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBindInfo {
    /// lkey of the MR the window is bound to.
    pub mr_lkey: u32,
    /// First address of the window, in the MR's address space.
    pub addr: u64,
    /// Length of the window; 0 unbinds.
    pub length: u64,
    /// Remote access the window grants.
    pub access: AccessFlags,
}

/// `IBV_FLUSH_GLOBAL`: FETH placement type bit, global visibility.
pub const FLUSH_GLOBAL: u8 = 1;
/// `IBV_FLUSH_PERSISTENT`: FETH placement type bit, persistence.
pub const FLUSH_PERSISTENT: u8 = 2;
/// `IBV_FLUSH_RANGE`: FETH selectivity, the RETH's range.
pub const FLUSH_RANGE: u8 = 0;
/// `IBV_FLUSH_MR`: FETH selectivity, the whole memory region.
pub const FLUSH_MR: u8 = 1;

/// What a send work request does, with its operation-specific fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// `IBV_WR_SEND` / `IBV_WC_SEND`.
    Send,
    /// `imm` is the 32-bit value carried in ImmDt, as it appears on the wire
    /// read big-endian.
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// Send and invalidate `rkey` at the responder (IBTA 9.4.1.1 SEND with Invalidate).
    SendWithInv {
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE` / `IBV_WC_RDMA_WRITE`.
    RdmaWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`: a WRITE that also consumes a receive at the peer.
    RdmaWriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// `IBV_WR_RDMA_READ` / `IBV_WC_RDMA_READ`.
    RdmaRead {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: 8 aligned bytes; the original value lands in the SGE.
    AtomicCmpSwp {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to compare with.
        compare: u64,
        /// Value to store if equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: 8 aligned bytes; the original value lands in the SGE.
    AtomicFetchAdd {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Value to add (wrapping).
        add: u64,
    },
    /// `IBV_WR_ATOMIC_WRITE` (IBTA 1.5 Annex A19, kernel rxe since Linux
    /// 6.2): store 8 bytes at `remote_addr` (8-byte aligned) as one
    /// indivisible write. The 8 bytes are the WR's data: its SGEs, or with
    /// [`SendFlags::INLINE`] the inline data copied at post time (how
    /// `ibv_wr_atomic_write` hands over its `atomic_wr` buffer); they must
    /// total exactly 8 bytes. Needs `IBV_ACCESS_REMOTE_WRITE` at the
    /// responder and counts against `max_rd_atomic` like a READ. Completes
    /// as [`WcOpcode::AtomicWrite`] with `byte_len` 8.
    AtomicWrite {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// `IBV_WR_FLUSH` (IBTA 1.5 Annex A19, kernel rxe since Linux 6.2,
    /// rdma-core's `ibv_wr_flush`): make earlier writes to a remote
    /// region visible (`placement` [`FLUSH_GLOBAL`]) or persistent
    /// ([`FLUSH_PERSISTENT`]). `selectivity` [`FLUSH_RANGE`] names
    /// `length` bytes at `remote_addr`, [`FLUSH_MR`] the whole region of
    /// `rkey`. RC only; no local data (SGEs are ignored). One packet,
    /// answered by an empty READ RESPONSE ONLY; it does not count against
    /// `max_rd_atomic` (kernel `rxe_requester`). Completes as
    /// [`WcOpcode::Flush`].
    Flush {
        /// Remote address (RETH VA).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Bytes to flush (RETH DMA length); the rxe provider keeps the
        /// low 32 bits of `ibv_wr_flush`'s `size_t`.
        length: u32,
        /// FETH placement type (`enum ibv_placement_type` bits).
        placement: u8,
        /// FETH selectivity level (`enum ibv_selectivity_level`).
        selectivity: u8,
    },
    /// Invalidate a local key (a type 2 memory window).
    LocalInv {
        /// The key to invalidate.
        rkey: u32,
    },
    /// Bind a type 2 memory window; the window's key becomes
    /// `(mw_rkey & !0xff) | new_key`.
    BindMw {
        /// Current rkey of the window.
        mw_rkey: u32,
        /// New key byte.
        new_key: u8,
        /// What to bind: MR, range and access.
        bind: MwBindInfo,
    },
}

impl SendOp {
    /// `ibv_wr_opcode` value.
    pub fn ibv_opcode(&self) -> u32 {
        match self {
            SendOp::RdmaWrite { .. } => 0,
            SendOp::RdmaWriteWithImm { .. } => 1,
            SendOp::Send => 2,
            SendOp::SendWithImm { .. } => 3,
            SendOp::RdmaRead { .. } => 4,
            SendOp::AtomicCmpSwp { .. } => 5,
            SendOp::AtomicFetchAdd { .. } => 6,
            SendOp::LocalInv { .. } => 7,
            SendOp::BindMw { .. } => 8,
            SendOp::SendWithInv { .. } => 9,
            SendOp::Flush { .. } => 14,
            SendOp::AtomicWrite { .. } => 15,
        }
    }

    /// The opcode reported in the requester's completion.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpSwp { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::Flush { .. } => WcOpcode::Flush,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
        }
    }

    /// READ, CMP_SWP and FETCH_ADD: operations answered with data, for
    /// which a response past their PSNs means a lost response (kernel
    /// `WR_ATOMIC_OR_READ_MASK`). ATOMIC WRITE is not one of them.
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. } | SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }

    /// Operations that use a responder resource and count against
    /// `max_rd_atomic`: READ, the atomics and ATOMIC WRITE (kernel
    /// `rxe_requester` calls `check_init_depth` for `RXE_READ_OR_ATOMIC_MASK
    /// | RXE_ATOMIC_WRITE_MASK`).
    pub fn needs_rd_atomic(&self) -> bool {
        self.is_read_or_atomic() || matches!(self, SendOp::AtomicWrite { .. })
    }

    /// Operations of one packet whatever their length: the atomics,
    /// ATOMIC WRITE and FLUSH.
    pub fn is_single_packet(&self) -> bool {
        self.is_atomic() || matches!(self, SendOp::AtomicWrite { .. } | SendOp::Flush { .. })
    }

    /// CMP_SWP and FETCH_ADD, which carry an AtomicETH and are answered by
    /// an ATOMIC ACKNOWLEDGE. (ATOMIC WRITE is not: see
    /// [`SendOp::AtomicWrite`].)
    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }

    /// Operations executed locally by the requester, never sent.
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::LocalInv { .. } | SendOp::BindMw { .. })
    }

    /// Operations that move SGE data onto the wire.
    pub fn carries_payload(&self) -> bool {
        matches!(
            self,
            SendOp::Send
                | SendOp::SendWithImm { .. }
                | SendOp::SendWithInv { .. }
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaWriteWithImm { .. }
                | SendOp::AtomicWrite { .. }
        )
    }

    /// A short name for messages, as rdma-core's `ibv_wr_opcode_str` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            SendOp::Send => "SEND",
            SendOp::SendWithImm { .. } => "SEND_WITH_IMM",
            SendOp::SendWithInv { .. } => "SEND_WITH_INV",
            SendOp::RdmaWrite { .. } => "RDMA_WRITE",
            SendOp::RdmaWriteWithImm { .. } => "RDMA_WRITE_WITH_IMM",
            SendOp::RdmaRead { .. } => "RDMA_READ",
            SendOp::AtomicCmpSwp { .. } => "ATOMIC_CMP_AND_SWP",
            SendOp::AtomicFetchAdd { .. } => "ATOMIC_FETCH_AND_ADD",
            SendOp::AtomicWrite { .. } => "ATOMIC_WRITE",
            SendOp::Flush { .. } => "FLUSH",
            SendOp::LocalInv { .. } => "LOCAL_INV",
            SendOp::BindMw { .. } => "BIND_MW",
        }
    }
}

/// Destination of a UD send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Address handle of the destination.
    pub ah: AhHandle,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// When the high bit is set the QP's own Q_Key is used (IBTA 10.2.5).
    pub remote_qkey: u32,
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Scatter/gather list.
    pub sg_list: Vec<Sge>,
    /// SIGNALED, FENCE, SOLICITED, INLINE.
    pub flags: SendFlags,
    /// Required for UD QPs, ignored otherwise.
    pub ud: Option<UdDest>,
    /// The remote XRC SRQ number (`wr.qp_type.xrc.remote_srqn`,
    /// `ibv_wr_set_xrc_srqn`): required for XRC_SEND QPs, ignored otherwise.
    pub xrc_remote_srqn: Option<u32>,
}

impl SendWr {
    /// A signalled WR with no UD destination: the common case in tests.
    pub fn new(wr_id: u64, op: SendOp, sg_list: Vec<Sge>) -> Self {
        SendWr {
            wr_id,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud: None,
            xrc_remote_srqn: None,
        }
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Scatter/gather list.
    pub sg_list: Vec<Sge>,
}

/// `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success = 0,
    /// `IBV_WC_LOC_LEN_ERR`: a message longer than the receive buffer, or over the MTU (UD).
    LocLenErr = 1,
    /// `IBV_WC_LOC_QP_OP_ERR`: an operation the QP cannot do.
    LocQpOpErr = 2,
    /// `IBV_WC_LOC_EEC_OP_ERR` (RD; never produced).
    LocEecOpErr = 3,
    /// `IBV_WC_LOC_PROT_ERR`: an SGE outside its MR or with a wrong lkey.
    LocProtErr = 4,
    /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP is in ERR.
    WrFlushErr = 5,
    /// `IBV_WC_MW_BIND_ERR`.
    MwBindErr = 6,
    /// `IBV_WC_BAD_RESP_ERR`: an unexpected response opcode.
    BadRespErr = 7,
    /// `IBV_WC_LOC_ACCESS_ERR`: the responder could not write the receive buffer.
    LocAccessErr = 8,
    /// `IBV_WC_REM_INV_REQ_ERR`: the peer found the request invalid.
    RemInvReqErr = 9,
    /// `IBV_WC_REM_ACCESS_ERR`: the peer refused the rkey, range or access.
    RemAccessErr = 10,
    /// `IBV_WC_REM_OP_ERR`: the peer could not complete the operation.
    RemOpErr = 11,
    /// `IBV_WC_RETRY_EXC_ERR`: no ACK after `retry_cnt` retries.
    RetryExcErr = 12,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: the peer had no receive posted after `rnr_retry` retries.
    RnrRetryExcErr = 13,
    /// `IBV_WC_LOC_RDD_VIOL_ERR` (RD; never produced).
    LocRddViolErr = 14,
    /// `IBV_WC_REM_INV_RD_REQ_ERR` (RD; never produced).
    RemInvRdReqErr = 15,
    /// `IBV_WC_REM_ABORT_ERR`.
    RemAbortErr = 16,
    /// `IBV_WC_INV_EECN_ERR` (RD; never produced).
    InvEecnErr = 17,
    /// `IBV_WC_INV_EEC_STATE_ERR` (RD; never produced).
    InvEecStateErr = 18,
    /// `IBV_WC_FATAL_ERR`.
    FatalErr = 19,
    /// `IBV_WC_RESP_TIMEOUT_ERR`.
    RespTimeoutErr = 20,
    /// `IBV_WC_GENERAL_ERR`.
    GeneralErr = 21,
}

impl WcStatus {
    /// The text `ibv_wc_status_str()` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "operation aborted",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }

    /// The enum name, e.g. `IBV_WC_RETRY_EXC_ERR`.
    pub fn ibv_name(self) -> &'static str {
        match self {
            WcStatus::Success => "IBV_WC_SUCCESS",
            WcStatus::LocLenErr => "IBV_WC_LOC_LEN_ERR",
            WcStatus::LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
            WcStatus::LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
            WcStatus::LocProtErr => "IBV_WC_LOC_PROT_ERR",
            WcStatus::WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
            WcStatus::MwBindErr => "IBV_WC_MW_BIND_ERR",
            WcStatus::BadRespErr => "IBV_WC_BAD_RESP_ERR",
            WcStatus::LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
            WcStatus::RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
            WcStatus::RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemOpErr => "IBV_WC_REM_OP_ERR",
            WcStatus::RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
            WcStatus::RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
            WcStatus::RemAbortErr => "IBV_WC_REM_ABORT_ERR",
            WcStatus::InvEecnErr => "IBV_WC_INV_EECN_ERR",
            WcStatus::InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
            WcStatus::FatalErr => "IBV_WC_FATAL_ERR",
            WcStatus::RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
            WcStatus::GeneralErr => "IBV_WC_GENERAL_ERR",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.ibv_name(), self.as_str())
    }
}

/// `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// `IBV_WR_SEND` / `IBV_WC_SEND`.
    Send = 0,
    /// `IBV_WR_RDMA_WRITE` / `IBV_WC_RDMA_WRITE`.
    RdmaWrite = 1,
    /// `IBV_WR_RDMA_READ` / `IBV_WC_RDMA_READ`.
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd = 4,
    /// `IBV_WC_BIND_MW`.
    BindMw = 5,
    /// `IBV_WC_LOCAL_INV`.
    LocalInv = 6,
    /// `IBV_WC_FLUSH` (8; 7 is `IBV_WC_TSO`).
    Flush = 8,
    /// `IBV_WC_ATOMIC_WRITE`.
    AtomicWrite = 9,
    /// `IBV_WC_RECV`: a SEND arrived into a receive WR.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a WRITE with immediate consumed a receive WR.
    RecvRdmaWithImm = 129,
}

bitflags! {
    /// `enum ibv_wc_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// The first 40 bytes of the receive buffer hold the network header.
        const GRH = 1;
        /// `imm_data` is valid.
        const WITH_IMM = 2;
        /// `IBV_WC_IP_CSUM_OK` (never set).
        const IP_CSUM_OK = 4;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 8;
    }
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Success or why not.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Vendor error code (0).
    pub vendor_err: u32,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// ImmDt as read big-endian from the wire (valid with `WITH_IMM`).
    pub imm_data: u32,
    /// The invalidated rkey (valid with `WITH_INV`).
    pub invalidated_rkey: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP number (UD receives).
    pub src_qp: u32,
    /// Which optional fields are valid.
    pub wc_flags: WcFlags,
    /// P_Key index (0).
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level (0).
    pub sl: u8,
    /// DLID path bits (0 on RoCE).
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    pub(crate) fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }
}
