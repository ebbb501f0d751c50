//! # verbs-api: RDMA verbs in Rust over an in-process rxe-emu device
//!
//! A [`Device`] is the rxe-core engine plus a UDP socket on `<addr>:4791`
//! and a progress thread. It sends and receives real RoCEv2, so it talks
//! to another device in the same process, to another process, or to Linux
//! kernel rxe. Several devices in one process (say on 127.0.0.1 and
//! 127.0.0.2) talk to each other with no setup and no root.
//!
//! The objects are those of libibverbs: [`ProtectionDomain`] (`ibv_pd`),
//! [`MemoryRegion`] (`ibv_mr`, borrowing its buffer so the memory cannot go
//! away while registered), [`CompletionQueue`] (`ibv_cq`, with an optional
//! completion channel whose fd works with poll/epoll), [`QueuePair`]
//! (`ibv_qp`: RC, UC, UD), [`SharedReceiveQueue`], [`AddressHandle`].
//! Polling a CQ drives the device from the calling thread; when nobody
//! polls, the progress thread does.
//!
//! One RDMA WRITE between two devices:
//!
//! ```
//! use std::time::Duration;
//! use verbs_api::*;
//!
//! let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
//! let open = |ip: &str| Device::open(DeviceConfig::new(ip.parse().unwrap())).unwrap();
//! let (da, db) = (open("127.0.77.1"), open("127.0.77.2"));
//! let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
//! let (ca, cb) = (da.create_cq(16).unwrap(), db.create_cq(16).unwrap());
//! let cap = QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
//! let qa = pa.create_qp(QpType::Rc, &ca, &ca, None, cap, false).unwrap();
//! let qb = pb.create_qp(QpType::Rc, &cb, &cb, None, cap, false).unwrap();
//! // RESET -> INIT -> RTR -> RTS, with what the peers would exchange out
//! // of band (QPN, PSN, GID).
//! for (qp, me, peer, peer_qpn) in [(&qa, &da, &db, qb.qpn()), (&qb, &db, &da, qa.qpn())] {
//!     let init = QpAttr { qp_state: Some(QpState::Init), port_num: 1, qp_access_flags: rw.bits(), ..Default::default() };
//!     qp.modify(&init, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS).unwrap();
//!     let rtr = QpAttr {
//!         qp_state: Some(QpState::Rtr), path_mtu: Some(Mtu::M1024), dest_qp_num: peer_qpn,
//!         rq_psn: 0, max_dest_rd_atomic: 1, min_rnr_timer: 12,
//!         ah_attr: AhAttr { dgid: peer.gid(), sgid_index: me.gid_index(), is_global: true, port_num: 1, hop_limit: 64, ..Default::default() },
//!         ..Default::default()
//!     };
//!     qp.modify(&rtr, QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN
//!         | QpAttrMask::RQ_PSN | QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER).unwrap();
//!     let rts = QpAttr { qp_state: Some(QpState::Rts), sq_psn: 0, timeout: 14, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 1, ..Default::default() };
//!     qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN | QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT
//!         | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC).unwrap();
//! }
//! let mut src = b"hello, RDMA".to_vec();
//! let mut dst = vec![0u8; src.len()];
//! let smr = pa.reg_mr(&mut src, AccessFlags::empty()).unwrap();
//! let dmr = pb.reg_mr(&mut dst, rw).unwrap();
//! let op = SendOp::RdmaWrite { remote_addr: dmr.addr(), rkey: dmr.rkey() };
//! qa.post_send(SendWr::new(1, op, vec![smr.sge(0, 11)])).unwrap();
//! let wc = ca.wait(1, Duration::from_secs(10)).unwrap();
//! assert_eq!(wc[0].status, WcStatus::Success);
//! drop(dmr); // ends the borrow of `dst`
//! assert_eq!(&dst, b"hello, RDMA");
//! ```
//!
//! Errors are [`Error`] values whose messages say what to change, with the
//! errno a C caller would see ([`Error::errno`]).

#![deny(missing_docs)]

mod device;
mod hostmem;
mod local;
mod objects;
mod sys;
mod warmup;

pub use device::{
    device_list, gid_table, like_from_env, open_device, Device, DeviceConfig, FaultConfig, PortAttr,
};
pub use hostmem::HostMemory;
pub use objects::{
    AddressHandle, CompletionChannel, CompletionQueue, CqId, MemoryRegion, MemoryWindow,
    ProtectionDomain, QueuePair, SharedReceiveQueue, XrcDomain,
};
pub use rxe_core::{
    AccessFlags, AhAttr, AsyncEvent, AsyncEventKind, CcConfig, CcModel, CcParams, Counters, Mtu,
    MwBindInfo, QpAttr, QpAttrMask, QpCap, QpCcState, QpState, QpType, RecvWr, SendFlags, SendOp,
    SendWr, Sge, SrqAttr, UdDest, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

use std::fmt;

/// An error of the verbs API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The engine refused the call; the message says why (errno inside).
    Verbs(rxe_core::Error),
    /// The device could not be opened or used.
    Io(String),
    /// A configuration that cannot work.
    Config(String),
}

impl Error {
    /// The errno a C caller would see.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Verbs(e) => e.errno(),
            Error::Io(_) => 5,
            Error::Config(_) => 22,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Verbs(e) => write!(f, "{e}"),
            Error::Io(m) => write!(f, "device I/O: {m}"),
            Error::Config(m) => write!(f, "configuration: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<rxe_core::Error> for Error {
    fn from(e: rxe_core::Error) -> Self {
        Error::Verbs(e)
    }
}

/// Result of the verbs API.
pub type Result<T> = std::result::Result<T, Error>;
