//! # verbs-api: RDMA verbs in Rust over an in-process rxe-emu device
//!
//! A [`Device`] is the rxe-core engine plus a UDP socket on `<addr>:4791`
//! and a progress thread. It sends and receives real RoCEv2, so it talks
//! to another device in the same process, to another process, or to Linux
//! kernel rxe. Several devices in one process (say on 127.0.0.1 and
//! 127.0.0.2) talk to each other with no setup and no root.
//!
//! ```
//! use verbs_api::{AccessFlags, Device, DeviceConfig};
//! let dev = Device::open(DeviceConfig::new("127.0.0.9".parse().unwrap())).unwrap();
//! let pd = dev.alloc_pd().unwrap();
//! let mut buf = vec![0u8; 4096];
//! let mr = pd.reg_mr(&mut buf, AccessFlags::LOCAL_WRITE).unwrap();
//! assert_eq!(mr.len(), 4096);
//! ```
//!
//! Status: the device, PD, MR, CQ (polling and completion channels with a
//! pollable fd), QP, SRQ and AH work over real UDP; the GID table follows
//! kernel rxe; asynchronous events arrive on a pollable fd with the reason
//! in words. Still to come: latency (see the README's performance table)
//! and paced READ responses.

mod device;
mod hostmem;
mod objects;
mod sys;

pub use device::{device_list, gid_table, Device, DeviceConfig, FaultConfig, PortAttr};
pub use hostmem::HostMemory;
pub use objects::{
    AddressHandle, CompletionQueue, MemoryRegion, ProtectionDomain, QueuePair, SharedReceiveQueue,
};
pub use rxe_core::{
    AccessFlags, AhAttr, AsyncEvent, AsyncEventKind, Counters, Mtu, MwBindInfo, QpAttr, QpAttrMask,
    QpCap, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqAttr, UdDest, WcFlags,
    WcOpcode, WcStatus, WorkCompletion,
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
