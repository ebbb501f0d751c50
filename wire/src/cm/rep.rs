//! ConnectReply, REP, attribute 0x0013 (IBTA Vol. 1, 12.6.8, Table 110;
//! kernel `cm_format_rep`, `cm_rep_handler`).
//!
//! ```text
//!   0-3   local comm ID            4-7 remote comm ID
//!   8-11  local Q_Key
//!  12-15  local QPN (24)  | ECE vendor ID bits 23-16
//!  16-19  local EECN (24) | ECE vendor ID bits 15-8
//!  20-23  starting PSN (24) | ECE vendor ID bits 7-0
//!  24     responder resources     25 initiator depth
//!  26     target ACK delay (5) | failover accepted (2) | end-to-end flow control (1)
//!  27     RNR retry count (3) | SRQ (1) | resv (4)
//!  28-35  local CA GUID
//!  36-231 private data (196 bytes)
//! ```

use super::{array, bit_fields, byte_fields, MESSAGE_LEN};
use crate::bytes::header_view;
use crate::Result;

/// Byte layout of the REP, with the bit masks of the packed fields.
pub mod field {
    use crate::Field;
    /// Local communication ID.
    pub const LOCAL_COMM_ID: Field = 0..4;
    /// Remote communication ID (the REQ's local one).
    pub const REMOTE_COMM_ID: Field = 4..8;
    /// Local Q_Key.
    pub const LOCAL_QKEY: Field = 8..12;
    /// Local QPN, vendor ID high byte.
    pub const QPN_VENDOR_H: Field = 12..16;
    /// Local EECN, vendor ID middle byte.
    pub const EECN_VENDOR_M: Field = 16..20;
    /// Starting PSN, vendor ID low byte.
    pub const PSN_VENDOR_L: Field = 20..24;
    /// Responder resources.
    pub const RESPONDER_RESOURCES: Field = 24..25;
    /// Initiator depth.
    pub const INITIATOR_DEPTH: Field = 25..26;
    /// Target ACK delay, failover accepted, end-to-end flow control.
    pub const ACK_DELAY_FAILOVER: Field = 26..27;
    /// RNR retry count, SRQ.
    pub const RNR_SRQ: Field = 27..28;
    /// Local CA GUID.
    pub const LOCAL_CA_GUID: Field = 28..36;
    /// Private data.
    pub const PRIVATE_DATA: Field = 36..232;
}

/// Length of a REP (the whole CM message).
pub const HEADER_LEN: usize = MESSAGE_LEN;

/// Bytes of private data in a REP (kernel `IB_CM_REP_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 196;

header_view!("a CM ConnectReply (REP)");

bit_fields! {
    /// Local communication ID.
    (local_comm_id, set_local_comm_id): u32 = field::LOCAL_COMM_ID, 0xffff_ffff;
    /// Remote communication ID.
    (remote_comm_id, set_remote_comm_id): u32 = field::REMOTE_COMM_ID, 0xffff_ffff;
    /// Local Q_Key.
    (local_qkey, set_local_qkey): u32 = field::LOCAL_QKEY, 0xffff_ffff;
    /// Local QPN (24 bits).
    (local_qpn, set_local_qpn): u32 = field::QPN_VENDOR_H, 0xffff_ff00;
    /// ECE vendor ID, high byte.
    (vendor_id_h, set_vendor_id_h): u8 = field::QPN_VENDOR_H, 0xff;
    /// Local EECN (24 bits).
    (local_eecn, set_local_eecn): u32 = field::EECN_VENDOR_M, 0xffff_ff00;
    /// ECE vendor ID, middle byte.
    (vendor_id_m, set_vendor_id_m): u8 = field::EECN_VENDOR_M, 0xff;
    /// Starting PSN (24 bits).
    (starting_psn, set_starting_psn): u32 = field::PSN_VENDOR_L, 0xffff_ff00;
    /// ECE vendor ID, low byte.
    (vendor_id_l, set_vendor_id_l): u8 = field::PSN_VENDOR_L, 0xff;
    /// Responder resources.
    (responder_resources, set_responder_resources): u8 = field::RESPONDER_RESOURCES, 0xff;
    /// Initiator depth.
    (initiator_depth, set_initiator_depth): u8 = field::INITIATOR_DEPTH, 0xff;
    /// Target ACK delay (5 bits; kernel sends its device's `ack_delay`).
    (target_ack_delay, set_target_ack_delay): u8 = field::ACK_DELAY_FAILOVER, 0xf8;
    /// Failover accepted (2 bits).
    (failover_accepted, set_failover_accepted): u8 = field::ACK_DELAY_FAILOVER, 0x06;
    /// End-to-end flow control.
    (end_to_end_flow_control, set_end_to_end_flow_control): bool =
        field::ACK_DELAY_FAILOVER, 0x01;
    /// RNR retry count (3 bits).
    (rnr_retry_count, set_rnr_retry_count): u8 = field::RNR_SRQ, 0xe0;
    /// SRQ.
    (srq, set_srq): bool = field::RNR_SRQ, 0x10;
    /// Local CA GUID.
    (local_ca_guid, set_local_ca_guid): u64 = field::LOCAL_CA_GUID, u64::MAX;
}

byte_fields! {
    /// Private data (196 bytes).
    (private_data, private_data_mut) = field::PRIVATE_DATA;
}

/// The meaning of a REP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepRepr {
    /// The sender's (passive side's) communication ID.
    pub local_comm_id: u32,
    /// The REQ's local communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// The sender's QPN.
    pub local_qpn: u32,
    /// Local EECN.
    pub local_eecn: u32,
    /// ECE vendor ID (24 bits, split over bytes 15, 19 and 23).
    pub vendor_id: u32,
    /// The sender's starting PSN.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data, 196 bytes.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl RepRepr {
    /// Read a REP (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<RepRepr> {
        packet.check_len()?;
        Ok(RepRepr {
            local_comm_id: packet.local_comm_id(),
            remote_comm_id: packet.remote_comm_id(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            local_eecn: packet.local_eecn(),
            vendor_id: u32::from(packet.vendor_id_h()) << 16
                | u32::from(packet.vendor_id_m()) << 8
                | u32::from(packet.vendor_id_l()),
            starting_psn: packet.starting_psn(),
            responder_resources: packet.responder_resources(),
            initiator_depth: packet.initiator_depth(),
            target_ack_delay: packet.target_ack_delay(),
            failover_accepted: packet.failover_accepted(),
            end_to_end_flow_control: packet.end_to_end_flow_control(),
            rnr_retry_count: packet.rnr_retry_count(),
            srq: packet.srq(),
            local_ca_guid: packet.local_ca_guid(),
            private_data: array(packet.private_data()),
        })
    }

    /// Write the fields into a zeroed 232-byte buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_remote_comm_id(self.remote_comm_id);
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn);
        packet.set_vendor_id_h((self.vendor_id >> 16) as u8);
        packet.set_local_eecn(self.local_eecn);
        packet.set_vendor_id_m((self.vendor_id >> 8) as u8);
        packet.set_starting_psn(self.starting_psn);
        packet.set_vendor_id_l(self.vendor_id as u8);
        packet.set_responder_resources(self.responder_resources);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_target_ack_delay(self.target_ack_delay);
        packet.set_failover_accepted(self.failover_accepted);
        packet.set_end_to_end_flow_control(self.end_to_end_flow_control);
        packet.set_rnr_retry_count(self.rnr_retry_count);
        packet.set_srq(self.srq);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}
