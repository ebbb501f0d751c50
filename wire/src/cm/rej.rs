//! ConnectReject, REJ, attribute 0x0012 (IBTA Vol. 1, 12.6.7, Table 108
//! and Table 109 for the reasons; kernel `cm_format_rej`, `cm_issue_rej`,
//! `enum ib_cm_rej_reason`).
//!
//! ```text
//!   0-3   local comm ID       4-7 remote comm ID
//!   8     message rejected (2) | resv (6)
//!   9     reject info length (7) | resv (1)
//!  10-11  reason
//!  12-83  additional reject information (ARI, 72 bytes)
//!  84-231 private data (148 bytes)
//! ```

use super::{array, bit_fields, byte_fields, MessageResponse, MESSAGE_LEN};
use crate::bytes::header_view;
use crate::{Error, Result};

/// Byte layout of the REJ, with the bit masks of the packed fields.
pub mod field {
    use crate::Field;
    /// Local communication ID (0 when rejecting a REQ from REQ_RCVD).
    pub const LOCAL_COMM_ID: Field = 0..4;
    /// Remote communication ID.
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Message rejected: top 2 bits.
    pub const MESSAGE_REJECTED: Field = 8..9;
    /// Reject info length: top 7 bits.
    pub const ARI_LENGTH: Field = 9..10;
    /// Reason.
    pub const REASON: Field = 10..12;
    /// Additional reject information.
    pub const ARI: Field = 12..84;
    /// Private data.
    pub const PRIVATE_DATA: Field = 84..232;
}

/// Length of a REJ (the whole CM message).
pub const HEADER_LEN: usize = MESSAGE_LEN;

/// Bytes of ARI (kernel `IB_CM_REJ_ARI_LENGTH`).
pub const ARI_LEN: usize = 72;

/// Bytes of private data in a REJ (kernel `IB_CM_REJ_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 148;

header_view!("a CM ConnectReject (REJ)");

bit_fields! {
    /// Local communication ID.
    (local_comm_id, set_local_comm_id): u32 = field::LOCAL_COMM_ID, 0xffff_ffff;
    /// Remote communication ID.
    (remote_comm_id, set_remote_comm_id): u32 = field::REMOTE_COMM_ID, 0xffff_ffff;
    /// Message rejected (2 bits, see [`MessageResponse`]).
    (message_rejected, set_message_rejected): u8 = field::MESSAGE_REJECTED, 0xc0;
    /// Reject info length (7 bits, at most 72).
    (ari_length, set_ari_length): u8 = field::ARI_LENGTH, 0xfe;
    /// Reason (Table 109).
    (reason, set_reason): u16 = field::REASON, 0xffff;
}

byte_fields! {
    /// Additional reject information (72 bytes; `ari_length` are meaningful).
    (ari, ari_mut) = field::ARI;
    /// Private data (148 bytes).
    (private_data, private_data_mut) = field::PRIVATE_DATA;
}

/// A REJ reason code (IBTA Table 109; kernel `enum ib_cm_rej_reason`).
/// Codes this table does not name are kept as they are: a reject is a
/// reject whatever its reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RejectReason(pub u16);

macro_rules! reasons {
    ($($name:ident = $code:literal, $text:literal;)*) => {
        impl RejectReason {
            $(
                #[doc = concat!("Reason ", stringify!($code), ": ", $text, ".")]
                pub const $name: RejectReason = RejectReason($code);
            )*

            /// The kernel's name for the reason (`IB_CM_REJ_*` without the
            /// prefix, lower case), or `None` for an unassigned code.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($code => Some($text),)*
                    _ => None,
                }
            }
        }
    };
}

reasons! {
    NO_QP = 1, "no QP available";
    NO_EEC = 2, "no EEC available";
    NO_RESOURCES = 3, "no resources available";
    TIMEOUT = 4, "timeout";
    UNSUPPORTED = 5, "unsupported request";
    INVALID_COMM_ID = 6, "invalid communication ID";
    INVALID_COMM_INSTANCE = 7, "invalid communication instance";
    INVALID_SERVICE_ID = 8, "invalid service ID";
    INVALID_TRANSPORT_TYPE = 9, "invalid transport service type";
    STALE_CONN = 10, "stale connection";
    RDC_NOT_EXIST = 11, "RDC does not exist";
    INVALID_GID = 12, "primary remote port GID rejected";
    INVALID_LID = 13, "primary remote port LID rejected";
    INVALID_SL = 14, "invalid primary SL";
    INVALID_TRAFFIC_CLASS = 15, "invalid primary traffic class";
    INVALID_HOP_LIMIT = 16, "invalid primary hop limit";
    INVALID_PACKET_RATE = 17, "invalid primary packet rate";
    INVALID_ALT_GID = 18, "alternate remote port GID rejected";
    INVALID_ALT_LID = 19, "alternate remote port LID rejected";
    INVALID_ALT_SL = 20, "invalid alternate SL";
    INVALID_ALT_TRAFFIC_CLASS = 21, "invalid alternate traffic class";
    INVALID_ALT_HOP_LIMIT = 22, "invalid alternate hop limit";
    INVALID_ALT_PACKET_RATE = 23, "invalid alternate packet rate";
    PORT_CM_REDIRECT = 24, "port and CM redirection";
    PORT_REDIRECT = 25, "port redirection";
    INVALID_MTU = 26, "invalid path MTU";
    INSUFFICIENT_RESP_RESOURCES = 27, "insufficient responder resources";
    CONSUMER_DEFINED = 28, "consumer reject";
    INVALID_RNR_RETRY = 29, "RNR retry count reject";
    DUPLICATE_LOCAL_COMM_ID = 30, "duplicate local communication ID";
    INVALID_CLASS_VERSION = 31, "unsupported class version";
    INVALID_FLOW_LABEL = 32, "invalid primary flow label";
    INVALID_ALT_FLOW_LABEL = 33, "invalid alternate flow label";
    VENDOR_OPTION_NOT_SUPPORTED = 35, "vendor option not supported";
}

impl core::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "unassigned reason {}", self.0),
        }
    }
}

/// The meaning of a REJ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejRepr {
    /// The sender's communication ID (0 if it never had one).
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MessageResponse,
    /// Reason.
    pub reason: RejectReason,
    /// Reject info length (at most 72).
    pub ari_length: u8,
    /// Additional reject information, 72 bytes (the first `ari_length`
    /// are meaningful; e.g. the CA GUID for TIMEOUT).
    pub ari: [u8; ARI_LEN],
    /// Private data, 148 bytes.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl RejRepr {
    /// Read a REJ: `Truncated` if short, `Malformed` for the reserved
    /// "message rejected" code 3 or an ARI length over 72.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<RejRepr> {
        packet.check_len()?;
        let ari_length = packet.ari_length();
        if usize::from(ari_length) > ARI_LEN {
            return Err(Error::Malformed);
        }
        Ok(RejRepr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            message_rejected: MessageResponse::from_raw(packet.message_rejected())?,
            reason: RejectReason(packet.reason()),
            ari_length,
            ari: array(packet.ari()),
            private_data: array(packet.private_data()),
        })
    }

    /// The meaningful part of the ARI (clamped to 72 bytes).
    pub fn ari_bytes(&self) -> &[u8] {
        &self.ari[..usize::from(self.ari_length).min(ARI_LEN)]
    }

    /// Write the fields into a zeroed 232-byte buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_message_rejected(self.message_rejected.to_raw());
        packet.set_ari_length(self.ari_length);
        packet.set_reason(self.reason.0);
        packet.ari_mut().copy_from_slice(&self.ari);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}
