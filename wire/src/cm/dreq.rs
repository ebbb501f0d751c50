//! DisconnectRequest, DREQ, attribute 0x0015 (IBTA Vol. 1, 12.6.10,
//! Table 112; kernel `cm_format_dreq`, `cm_dreq_handler`).
//!
//! ```text
//!   0-3  local comm ID      4-7 remote comm ID
//!   8-11 remote QPN/EECN (24) | resv (8)
//!  12-231 private data (220 bytes)
//! ```

use super::{array, bit_fields, byte_fields, MESSAGE_LEN};
use crate::bytes::header_view;
use crate::Result;

/// Byte layout of the DREQ.
pub mod field {
    use crate::Field;
    /// Local communication ID.
    pub const LOCAL_COMM_ID: Field = 0..4;
    /// Remote communication ID.
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// The receiver's QPN (or EECN), top 24 bits.
    pub const REMOTE_QPN: Field = 8..12;
    /// Private data.
    pub const PRIVATE_DATA: Field = 12..232;
}

/// Length of a DREQ (the whole CM message).
pub const HEADER_LEN: usize = MESSAGE_LEN;

/// Bytes of private data in a DREQ (kernel `IB_CM_DREQ_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 220;

header_view!("a CM DisconnectRequest (DREQ)");

bit_fields! {
    /// Local communication ID.
    (local_comm_id, set_local_comm_id): u32 = field::LOCAL_COMM_ID, 0xffff_ffff;
    /// Remote communication ID.
    (remote_comm_id, set_remote_comm_id): u32 = field::REMOTE_COMM_ID, 0xffff_ffff;
    /// Remote QPN/EECN (24 bits).
    (remote_qpn, set_remote_qpn): u32 = field::REMOTE_QPN, 0xffff_ff00;
}

byte_fields! {
    /// Private data (220 bytes).
    (private_data, private_data_mut) = field::PRIVATE_DATA;
}

/// The meaning of a DREQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DreqRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN (kernel `cm_dreq_handler` finds the connection
    /// by comm IDs; this field is informative).
    pub remote_qpn: u32,
    /// Private data, 220 bytes.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl DreqRepr {
    /// Read a DREQ (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<DreqRepr> {
        packet.check_len()?;
        Ok(DreqRepr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            remote_qpn: packet.remote_qpn(),
            private_data: array(packet.private_data()),
        })
    }

    /// Write the fields into a zeroed 232-byte buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_remote_qpn(self.remote_qpn);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}
