//! The path information of a REQ, primary or alternate: 44 bytes
//! (IBTA Vol. 1, Table 106, REQ bytes 52-95 and 96-139; kernel
//! `CM_REQ_PRIMARY_*` / `CM_REQ_ALTERNATE_*`).
//!
//! ```text
//!  0-1 local port LID   2-3 remote port LID
//!  4-19 local port GID  20-35 remote port GID
//!  36-39 flow label (20) | resv (6) | packet rate (6)
//!  40 traffic class  41 hop limit
//!  42 SL (4) | subnet local (1) | resv (3)
//!  43 local ACK timeout (5) | resv (3; SAP supported in the alternate path)
//! ```
//!
//! Over RoCE both LIDs are 0xFFFF (the permissive LID) in the primary path
//! (kernel `cm_format_req` for a path without an IB LID) and the GIDs are
//! the RoCEv2 GIDs, IPv4-mapped for IPv4.

use super::{array, bit_fields, byte_fields};
use crate::bytes::header_view;
use crate::Result;

/// Byte layout of a REQ path, with the bit masks of the packed fields.
pub mod field {
    use crate::Field;
    /// Local port LID.
    pub const LOCAL_LID: Field = 0..2;
    /// Remote port LID.
    pub const REMOTE_LID: Field = 2..4;
    /// Local port GID.
    pub const LOCAL_GID: Field = 4..20;
    /// Remote port GID.
    pub const REMOTE_GID: Field = 20..36;
    /// Flow label, reserved, packet rate.
    pub const FLOW_RATE: Field = 36..40;
    /// Flow label: top 20 bits of `FLOW_RATE`.
    pub const FLOW_LABEL_MASK: u64 = 0xffff_f000;
    /// Packet rate (IBTA static rate code): low 6 bits of `FLOW_RATE`.
    pub const PACKET_RATE_MASK: u64 = 0x3f;
    /// Traffic class.
    pub const TRAFFIC_CLASS: Field = 40..41;
    /// Hop limit.
    pub const HOP_LIMIT: Field = 41..42;
    /// SL and subnet local.
    pub const SL_LOCAL: Field = 42..43;
    /// Service level: top 4 bits of `SL_LOCAL`.
    pub const SL_MASK: u64 = 0xf0;
    /// Subnet local: bit 3 of `SL_LOCAL`.
    pub const SUBNET_LOCAL_MASK: u64 = 0x08;
    /// Local ACK timeout.
    pub const ACK_TIMEOUT: Field = 43..44;
    /// Local ACK timeout: top 5 bits of `ACK_TIMEOUT`.
    pub const ACK_TIMEOUT_MASK: u64 = 0xf8;
}

/// Length of one path.
pub const HEADER_LEN: usize = field::ACK_TIMEOUT.end;

header_view!("the path information of a CM REQ");

bit_fields! {
    /// Local port LID.
    (local_lid, set_local_lid): u16 = field::LOCAL_LID, 0xffff;
    /// Remote port LID.
    (remote_lid, set_remote_lid): u16 = field::REMOTE_LID, 0xffff;
    /// Flow label (20 bits).
    (flow_label, set_flow_label): u32 = field::FLOW_RATE, field::FLOW_LABEL_MASK;
    /// Packet rate (6 bits).
    (packet_rate, set_packet_rate): u8 = field::FLOW_RATE, field::PACKET_RATE_MASK;
    /// Traffic class.
    (traffic_class, set_traffic_class): u8 = field::TRAFFIC_CLASS, 0xff;
    /// Hop limit.
    (hop_limit, set_hop_limit): u8 = field::HOP_LIMIT, 0xff;
    /// Service level (4 bits).
    (sl, set_sl): u8 = field::SL_LOCAL, field::SL_MASK;
    /// Subnet local.
    (subnet_local, set_subnet_local): bool = field::SL_LOCAL, field::SUBNET_LOCAL_MASK;
    /// Local ACK timeout (5 bits, 4.096 µs × 2^value).
    (local_ack_timeout, set_local_ack_timeout): u8 = field::ACK_TIMEOUT, field::ACK_TIMEOUT_MASK;
}

byte_fields! {
    /// Local port GID.
    (local_gid, local_gid_mut) = field::LOCAL_GID;
    /// Remote port GID.
    (remote_gid, remote_gid_mut) = field::REMOTE_GID;
}

/// The meaning of one REQ path. Reserved bits are sent as zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PathRepr {
    /// Local port LID (0xFFFF over RoCE).
    pub local_lid: u16,
    /// Remote port LID (0xFFFF over RoCE).
    pub remote_lid: u16,
    /// Local port GID (the sender's).
    pub local_gid: [u8; 16],
    /// Remote port GID (the receiver's).
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl PathRepr {
    /// Read a path (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<PathRepr> {
        packet.check_len()?;
        Ok(PathRepr {
            local_lid: packet.local_lid(),
            remote_lid: packet.remote_lid(),
            local_gid: array(packet.local_gid()),
            remote_gid: array(packet.remote_gid()),
            flow_label: packet.flow_label(),
            packet_rate: packet.packet_rate(),
            traffic_class: packet.traffic_class(),
            hop_limit: packet.hop_limit(),
            sl: packet.sl(),
            subnet_local: packet.subnet_local(),
            local_ack_timeout: packet.local_ack_timeout(),
        })
    }

    /// Write the 44 bytes; the reserved bits are left as they are (the
    /// caller zeroes the message first).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_lid(self.local_lid);
        packet.set_remote_lid(self.remote_lid);
        packet.local_gid_mut().copy_from_slice(&self.local_gid);
        packet.remote_gid_mut().copy_from_slice(&self.remote_gid);
        packet.set_flow_label(self.flow_label);
        packet.set_packet_rate(self.packet_rate);
        packet.set_traffic_class(self.traffic_class);
        packet.set_hop_limit(self.hop_limit);
        packet.set_sl(self.sl);
        packet.set_subnet_local(self.subnet_local);
        packet.set_local_ack_timeout(self.local_ack_timeout);
    }

    /// True if every field is zero: an absent alternate path (kernel
    /// `cm_req_has_alt_path` looks at the alternate local LID or GID).
    pub fn is_absent(&self) -> bool {
        *self == PathRepr::default()
    }
}
