//! ReadyToUse (RTU), attribute 0x0014 (IBTA Vol. 1, 12.6.9, Table 111; kernel `cm_format_rtu`, `cm_rtu_handler`).
//!
//! ```text
//!   0-3  local comm ID      4-7 remote comm ID
//!   8-231 private data (224 bytes)
//! ```

use super::{array, bit_fields, byte_fields, MESSAGE_LEN};
use crate::bytes::header_view;
use crate::Result;

/// Byte layout of the RTU.
pub mod field {
    use crate::Field;
    /// Local communication ID.
    pub const LOCAL_COMM_ID: Field = 0..4;
    /// Remote communication ID.
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Private data.
    pub const PRIVATE_DATA: Field = 8..232;
}

/// Length of a RTU (the whole CM message).
pub const HEADER_LEN: usize = MESSAGE_LEN;

/// Bytes of private data in a RTU (kernel `IB_CM_RTU_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 224;

header_view!("a CM ReadyToUse (RTU)");

bit_fields! {
    /// Local communication ID.
    (local_comm_id, set_local_comm_id): u32 = field::LOCAL_COMM_ID, 0xffff_ffff;
    /// Remote communication ID.
    (remote_comm_id, set_remote_comm_id): u32 = field::REMOTE_COMM_ID, 0xffff_ffff;
}

byte_fields! {
    /// Private data (224 bytes).
    (private_data, private_data_mut) = field::PRIVATE_DATA;
}

/// The meaning of a RTU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RtuRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, 224 bytes.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl RtuRepr {
    /// Read a RTU (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<RtuRepr> {
        packet.check_len()?;
        Ok(RtuRepr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            private_data: array(packet.private_data()),
        })
    }

    /// Write the fields into a zeroed 232-byte buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}
