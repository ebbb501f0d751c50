//! MessageReceiptAcknowledgement, MRA, attribute 0x0011 (IBTA Vol. 1,
//! 12.6.6, Table 107; kernel `cm_format_mra`, `cm_mra_handler`): "I got
//! your REQ/REP/LAP, but answering will take up to `service_timeout`".
//!
//! ```text
//!   0-3  local comm ID      4-7 remote comm ID
//!   8    message MRAed (2) | resv (6)
//!   9    service timeout (5) | resv (3)
//!  10-231 private data (222 bytes)
//! ```

use super::{array, bit_fields, byte_fields, MessageResponse, MESSAGE_LEN};
use crate::bytes::header_view;
use crate::Result;

/// Byte layout of the MRA, with the bit masks of the packed fields.
pub mod field {
    use crate::Field;
    /// Local communication ID.
    pub const LOCAL_COMM_ID: Field = 0..4;
    /// Remote communication ID.
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Message MRAed: top 2 bits.
    pub const MESSAGE_MRAED: Field = 8..9;
    /// Service timeout: top 5 bits.
    pub const SERVICE_TIMEOUT: Field = 9..10;
    /// Private data.
    pub const PRIVATE_DATA: Field = 10..232;
}

/// Length of an MRA (the whole CM message).
pub const HEADER_LEN: usize = MESSAGE_LEN;

/// Bytes of private data in an MRA (kernel `IB_CM_MRA_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 222;

header_view!("a CM MessageReceiptAcknowledgement (MRA)");

bit_fields! {
    /// Local communication ID.
    (local_comm_id, set_local_comm_id): u32 = field::LOCAL_COMM_ID, 0xffff_ffff;
    /// Remote communication ID.
    (remote_comm_id, set_remote_comm_id): u32 = field::REMOTE_COMM_ID, 0xffff_ffff;
    /// Message MRAed (2 bits, see [`MessageResponse`]).
    (message_mraed, set_message_mraed): u8 = field::MESSAGE_MRAED, 0xc0;
    /// Service timeout (5 bits, 4.096 µs × 2^value).
    (service_timeout, set_service_timeout): u8 = field::SERVICE_TIMEOUT, 0xf8;
}

byte_fields! {
    /// Private data (222 bytes).
    (private_data, private_data_mut) = field::PRIVATE_DATA;
}

/// The meaning of an MRA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MraRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged (REQ, REP, or Other = LAP).
    pub message_mraed: MessageResponse,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data, 222 bytes.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl MraRepr {
    /// Read an MRA: `Truncated` if short, `Malformed` for the reserved
    /// "message MRAed" code 3.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<MraRepr> {
        packet.check_len()?;
        Ok(MraRepr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            message_mraed: MessageResponse::from_raw(packet.message_mraed())?,
            service_timeout: packet.service_timeout(),
            private_data: array(packet.private_data()),
        })
    }

    /// Write the fields into a zeroed 232-byte buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_message_mraed(self.message_mraed.to_raw());
        packet.set_service_timeout(self.service_timeout);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}
