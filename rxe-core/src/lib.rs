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

pub mod caps;
mod comp;
mod counters;
mod cq;
mod dma;
mod engine;
mod error;
pub mod mem;
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
pub use counters::Counters;
pub use engine::{
    gid_to_ip, ip_to_gid, AhAttrs, Engine, EngineConfig, QpInitAttr, RxDatagram, SrqAttr, Transmit,
};
pub use error::{Error, Result};
pub use mr::{AccessFlags, MwType};
pub use qp_attr::{AhAttr, QpAttr, QpAttrMask, QpCap, QpState, QpType};
pub use time::Instant;
pub use wr::{
    MwBindInfo, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
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

/// `enum ibv_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AsyncEventKind {
    CqErr = 0,
    QpFatal = 1,
    QpReqErr = 2,
    QpAccessErr = 3,
    CommEst = 4,
    SqDrained = 5,
    PathMig = 6,
    PathMigErr = 7,
    DeviceFatal = 8,
    PortActive = 9,
    PortErr = 10,
    LidChange = 11,
    PkeyChange = 12,
    SmChange = 13,
    SrqErr = 14,
    SrqLimitReached = 15,
    QpLastWqeReached = 16,
    ClientReregister = 17,
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
    Qp(u32),
    Cq(CqHandle),
    Srq(SrqHandle),
    Port(u8),
    Device,
}

/// An asynchronous event, with the reason in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: AsyncEventKind,
    pub object: EventObject,
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
