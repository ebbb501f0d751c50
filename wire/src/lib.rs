//! # wire: RoCEv2 on the wire
//!
//! Every RoCEv2 transport header as a zero-copy `Packet<T>` view with an
//! owned `Repr` (parse/emit), the opcode table of kernel rxe as data, the
//! ICRC, 24-bit PSN arithmetic, and pcap with Ethernet/IP/UDP framing. No
//! I/O beyond writing a pcap, no state, no `unsafe`, no panic on any input.
pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod deth;
pub mod feth;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod psn;
pub mod rdeth;
pub mod reth;
mod view;
pub use opcode::{OpFlags, Opcode, OpcodeInfo, Transport};
pub use packet::PacketRepr;
pub use psn::Psn;
pub const ROCEV2_UDP_PORT: u16 = 4791;
pub const ICRC_LEN: usize = 4;
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    Truncated,
    Malformed,
    UnknownOpcode(u8),
    Checksum,
    Unsupported,
}
impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
impl std::error::Error for Error {}
pub type Result<T> = core::result::Result<T, Error>;
