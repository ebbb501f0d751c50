//! # rxe-core: the RoCEv2 transport engine as a sans-IO state machine
//!
//! Packets, posted work requests and the current time go in; packets to send,
//! work completions, asynchronous events and the next deadline come out. The
//! engine never touches a socket, a thread or a clock, so the same code runs
//! in-process, in a daemon and in a deterministic network simulator.
//!
//! The protocol behaviour follows Linux `drivers/infiniband/sw/rxe` (SoftRoCE):
//! the requester (`req.rs`, like `rxe_req.c`) turns WQEs into packets, the
//! responder (`resp.rs`, `rxe_resp.c`) executes requests and produces ACKs,
//! NAKs and read responses, the completer (`comp.rs`, `rxe_comp.c`) consumes
//! them and drives retransmission, and the receive path (`recv.rs`,
//! `rxe_recv.c`) validates and routes packets.
//!
//! ```
//! use rxe_core::{Engine, EngineConfig, Instant, mem::VecMemory};
//! let mut eng = Engine::new(EngineConfig::new("10.0.0.1".parse().unwrap()), VecMemory::new());
//! let pd = eng.alloc_pd().unwrap();
//! let cq = eng.create_cq(16).unwrap();
//! assert!(eng.poll_transmit().is_none());
//! assert_eq!(eng.poll_timeout(), None);
//! # let _ = (pd, cq, Instant::ZERO);
//! ```

#![warn(missing_docs)]

pub mod caps;
pub mod cc;
mod comp;
mod counters;
mod cq;
mod dma;
mod engine;
mod error;
pub mod mcast;
pub mod mem;
pub mod model;
pub mod mr;
mod qp;
pub mod qp_attr;
mod recv;
mod req;
mod resp;
pub mod sim;
mod srq;
mod time;
mod tx;
pub mod wr;

pub use caps::{DeviceCaps, Mtu};
pub use cc::{CcConfig, CcModel, CcParamError, CcParams, QpCcState};
pub use counters::Counters;
pub use engine::{
    derived_link_local, gid_table, gid_to_ip, ip_to_gid, AhAttrs, Engine, EngineConfig, QpInitAttr,
    QpSummary, RxDatagram, SrqAttr, Transmit,
};
pub use engine::{Gathered, ReadDest};
pub use error::{Error, Result};
pub use model::{Like, RxeRelease};
pub use mr::{AccessFlags, KeySpace, MwType};
pub use qp_attr::{AhAttr, MigState, QpAttr, QpAttrMask, QpCap, QpState, QpType};
pub use time::Instant;
/// The IP ECN codepoint of a datagram ([`RxDatagram::ecn`], [`Transmit::ecn`]).
pub use wire::Ecn;
pub use wr::{
    MwBindInfo, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion, FLUSH_GLOBAL, FLUSH_MR, FLUSH_PERSISTENT, FLUSH_RANGE,
};

/// A protection domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdHandle(pub u32);
/// A completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqHandle(pub u32);
/// A shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqHandle(pub u32);
/// An address handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AhHandle(pub u32);
/// An XRC domain (`ibv_open_xrcd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct XrcdHandle(pub u32);

/// `enum ibv_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AsyncEventKind {
    /// `IBV_EVENT_CQ_ERR`: a CQ overran.
    CqErr = 0,
    /// `IBV_EVENT_QP_FATAL`: the QP hit an error it cannot report in a WC.
    QpFatal = 1,
    /// `IBV_EVENT_QP_REQ_ERR`: the responder saw an invalid request.
    QpReqErr = 2,
    /// `IBV_EVENT_QP_ACCESS_ERR`: a remote access violation.
    QpAccessErr = 3,
    /// `IBV_EVENT_COMM_EST`: the first packet arrived in RTR.
    CommEst = 4,
    /// `IBV_EVENT_SQ_DRAINED`: a QP in SQD has no message in flight.
    SqDrained = 5,
    /// `IBV_EVENT_PATH_MIG` (never raised: rxe has no alternate path).
    PathMig = 6,
    /// `IBV_EVENT_PATH_MIG_ERR` (never raised).
    PathMigErr = 7,
    /// `IBV_EVENT_DEVICE_FATAL`: the device is gone.
    DeviceFatal = 8,
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortActive = 9,
    /// `IBV_EVENT_PORT_ERR`.
    PortErr = 10,
    /// `IBV_EVENT_LID_CHANGE` (never raised on RoCE).
    LidChange = 11,
    /// `IBV_EVENT_PKEY_CHANGE` (never raised).
    PkeyChange = 12,
    /// `IBV_EVENT_SM_CHANGE` (never raised on RoCE).
    SmChange = 13,
    /// `IBV_EVENT_SRQ_ERR`.
    SrqErr = 14,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: the SRQ fell below its limit (the limit is then disarmed).
    SrqLimitReached = 15,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ entered ERR and takes no more WQEs.
    QpLastWqeReached = 16,
    /// `IBV_EVENT_CLIENT_REREGISTER` (never raised).
    ClientReregister = 17,
    /// `IBV_EVENT_GID_CHANGE`.
    GidChange = 18,
}

impl AsyncEventKind {
    /// The name `ibv_event_type_str()` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            AsyncEventKind::CqErr => "CQ error",
            AsyncEventKind::QpFatal => "local work queue catastrophic error",
            AsyncEventKind::QpReqErr => "invalid request local work queue error",
            AsyncEventKind::QpAccessErr => "local access violation work queue error",
            AsyncEventKind::CommEst => "communication established",
            AsyncEventKind::SqDrained => "send queue drained",
            AsyncEventKind::PathMig => "path migrated",
            AsyncEventKind::PathMigErr => "path migration request error",
            AsyncEventKind::DeviceFatal => "local catastrophic error",
            AsyncEventKind::PortActive => "port active",
            AsyncEventKind::PortErr => "port error",
            AsyncEventKind::LidChange => "LID change",
            AsyncEventKind::PkeyChange => "P_Key change",
            AsyncEventKind::SmChange => "SM change",
            AsyncEventKind::SrqErr => "SRQ catastrophic error",
            AsyncEventKind::SrqLimitReached => "SRQ limit reached",
            AsyncEventKind::QpLastWqeReached => "last WQE reached",
            AsyncEventKind::ClientReregister => "client reregistration",
            AsyncEventKind::GidChange => "GID table change",
        }
    }
}

/// What an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventObject {
    /// A QP, by number.
    Qp(u32),
    /// A CQ.
    Cq(CqHandle),
    /// An SRQ.
    Srq(SrqHandle),
    /// A port, by number (1).
    Port(u8),
    /// The whole device.
    Device,
}

/// An asynchronous event, with the reason in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// The object it happened to.
    pub object: EventObject,
    /// Why, in words (for logs and for people learning RDMA).
    pub reason: String,
}

impl std::fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} on {:?}: {}",
            self.kind.as_str(),
            self.object,
            self.reason
        )
    }
}
