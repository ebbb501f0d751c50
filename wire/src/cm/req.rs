//! ConnectRequest, REQ, attribute 0x0010 (IBTA Vol. 1, 12.6.5, Table 106;
//! kernel `cm_format_req`, `cm_req_handler`).
//!
//! ```text
//!   0-3   local comm ID        4 resv | 5-7 ECE vendor ID
//!   8-15  service ID           16-23 local CA GUID
//!  24-27  resv                 28-31 local Q_Key
//!  32-35  local QPN (24) | responder resources (8)
//!  36-39  local EECN (24) | initiator depth (8)
//!  40-43  remote EECN (24) | remote CM response timeout (5) |
//!         transport service type (2) | end-to-end flow control (1)
//!  44-47  starting PSN (24) | local CM response timeout (5) | retry count (3)
//!  48-49  partition key
//!  50     path MTU (4) | RDC exists (1) | RNR retry count (3)
//!  51     max CM retries (4) | SRQ (1) | extended transport type (3)
//!  52-95  primary path (see [`super::path`])
//!  96-139 alternate path (byte 139 bit 2: SAP supported)
//! 140-231 private data (92 bytes; rdma_cm puts its `cma_hdr` first)
//! ```

use super::path::{self, PathRepr};
use super::{array, bit_fields, byte_fields, MESSAGE_LEN};
use crate::bytes::header_view;
use crate::Result;

/// Byte layout of the REQ, with the bit masks of the packed fields.
pub mod field {
    use crate::Field;
    /// Local communication ID.
    pub const LOCAL_COMM_ID: Field = 0..4;
    /// Reserved byte, then the 24-bit ECE vendor ID.
    pub const VENDOR_ID: Field = 4..8;
    /// Service ID.
    pub const SERVICE_ID: Field = 8..16;
    /// Local CA GUID.
    pub const LOCAL_CA_GUID: Field = 16..24;
    /// Local Q_Key (RD only; 0 for RC).
    pub const LOCAL_QKEY: Field = 28..32;
    /// Local QPN and responder resources.
    pub const QPN_RESP_RES: Field = 32..36;
    /// Local EECN and initiator depth.
    pub const EECN_INIT_DEPTH: Field = 36..40;
    /// Remote EECN, remote CM response timeout, transport type, flow control.
    pub const REMOTE_EECN_TIMEOUT: Field = 40..44;
    /// Starting PSN, local CM response timeout, retry count.
    pub const PSN_TIMEOUT_RETRY: Field = 44..48;
    /// Partition key.
    pub const PKEY: Field = 48..50;
    /// Path MTU, RDC exists, RNR retry count.
    pub const MTU_RNR: Field = 50..51;
    /// Max CM retries, SRQ, extended transport type.
    pub const CM_RETRIES_SRQ: Field = 51..52;
    /// Primary path.
    pub const PRIMARY_PATH: Field = 52..96;
    /// Alternate path.
    pub const ALTERNATE_PATH: Field = 96..140;
    /// The byte of the alternate path holding SAP supported (mask 0x04).
    pub const SAP_SUPPORTED: Field = 139..140;
    /// Private data.
    pub const PRIVATE_DATA: Field = 140..232;
}

/// Length of a REQ (the whole CM message).
pub const HEADER_LEN: usize = MESSAGE_LEN;

/// Bytes of private data in a REQ (kernel `IB_CM_REQ_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 92;

header_view!("a CM ConnectRequest (REQ)");

bit_fields! {
    /// Local communication ID.
    (local_comm_id, set_local_comm_id): u32 = field::LOCAL_COMM_ID, 0xffff_ffff;
    /// ECE vendor ID (24 bits).
    (vendor_id, set_vendor_id): u32 = field::VENDOR_ID, 0x00ff_ffff;
    /// Service ID.
    (service_id, set_service_id): u64 = field::SERVICE_ID, u64::MAX;
    /// Local CA GUID.
    (local_ca_guid, set_local_ca_guid): u64 = field::LOCAL_CA_GUID, u64::MAX;
    /// Local Q_Key.
    (local_qkey, set_local_qkey): u32 = field::LOCAL_QKEY, 0xffff_ffff;
    /// Local QPN (24 bits).
    (local_qpn, set_local_qpn): u32 = field::QPN_RESP_RES, 0xffff_ff00;
    /// Responder resources.
    (responder_resources, set_responder_resources): u8 = field::QPN_RESP_RES, 0xff;
    /// Local EECN (24 bits).
    (local_eecn, set_local_eecn): u32 = field::EECN_INIT_DEPTH, 0xffff_ff00;
    /// Initiator depth.
    (initiator_depth, set_initiator_depth): u8 = field::EECN_INIT_DEPTH, 0xff;
    /// Remote EECN (24 bits).
    (remote_eecn, set_remote_eecn): u32 = field::REMOTE_EECN_TIMEOUT, 0xffff_ff00;
    /// Remote CM response timeout (5 bits): how long the receiver may take.
    (remote_cm_response_timeout, set_remote_cm_response_timeout): u8 =
        field::REMOTE_EECN_TIMEOUT, 0xf8;
    /// Transport service type (2 bits: 0 RC, 1 UC, 2 RD).
    (transport_type, set_transport_type): u8 = field::REMOTE_EECN_TIMEOUT, 0x06;
    /// End-to-end flow control.
    (end_to_end_flow_control, set_end_to_end_flow_control): bool =
        field::REMOTE_EECN_TIMEOUT, 0x01;
    /// Starting PSN (24 bits).
    (starting_psn, set_starting_psn): u32 = field::PSN_TIMEOUT_RETRY, 0xffff_ff00;
    /// Local CM response timeout (5 bits): how long the sender may take.
    (local_cm_response_timeout, set_local_cm_response_timeout): u8 =
        field::PSN_TIMEOUT_RETRY, 0xf8;
    /// Retry count (3 bits).
    (retry_count, set_retry_count): u8 = field::PSN_TIMEOUT_RETRY, 0x07;
    /// Partition key.
    (pkey, set_pkey): u16 = field::PKEY, 0xffff;
    /// Path packet payload MTU (4 bits, IB MTU code).
    (path_mtu, set_path_mtu): u8 = field::MTU_RNR, 0xf0;
    /// RDC exists.
    (rdc_exists, set_rdc_exists): bool = field::MTU_RNR, 0x08;
    /// RNR retry count (3 bits).
    (rnr_retry_count, set_rnr_retry_count): u8 = field::MTU_RNR, 0x07;
    /// Max CM retries (4 bits).
    (max_cm_retries, set_max_cm_retries): u8 = field::CM_RETRIES_SRQ, 0xf0;
    /// SRQ.
    (srq, set_srq): bool = field::CM_RETRIES_SRQ, 0x08;
    /// Extended transport type (3 bits; 1 = XRC).
    (extended_transport_type, set_extended_transport_type): u8 = field::CM_RETRIES_SRQ, 0x07;
    /// SAP supported (in the alternate path's last byte).
    (sap_supported, set_sap_supported): bool = field::SAP_SUPPORTED, 0x04;
}

byte_fields! {
    /// Private data (92 bytes).
    (private_data, private_data_mut) = field::PRIVATE_DATA;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// A view of the primary path.
    pub fn primary_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.buffer.as_ref()[field::PRIMARY_PATH])
    }
    /// A view of the alternate path.
    pub fn alternate_path(&self) -> path::Packet<&[u8]> {
        path::Packet::new_unchecked(&self.buffer.as_ref()[field::ALTERNATE_PATH])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// A writable view of the primary path.
    pub fn primary_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.buffer.as_mut()[field::PRIMARY_PATH])
    }
    /// A writable view of the alternate path.
    pub fn alternate_path_mut(&mut self) -> path::Packet<&mut [u8]> {
        path::Packet::new_unchecked(&mut self.buffer.as_mut()[field::ALTERNATE_PATH])
    }
}

/// The meaning of a REQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReqRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits; 0 from kernel rdma_cm without ECE).
    pub vendor_id: u32,
    /// Service ID ([`crate::cma::ip_service_id`] for rdma_cm).
    pub service_id: u64,
    /// The sender's CA (node) GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// The sender's QPN.
    pub local_qpn: u32,
    /// Responder resources (RDMA READ/atomic the sender will serve).
    pub responder_resources: u8,
    /// Local EECN.
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN.
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits).
    pub transport_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The sender's starting PSN.
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU code (4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: PathRepr,
    /// Alternate path (all zero when absent).
    pub alternate_path: PathRepr,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data, 92 bytes.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Read a REQ (`Truncated` if short). The alternate path's SAP bit
    /// is reported separately and not part of [`PathRepr`].
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<ReqRepr> {
        packet.check_len()?;
        Ok(ReqRepr {
            local_comm_id: packet.local_comm_id(),
            vendor_id: packet.vendor_id(),
            service_id: packet.service_id(),
            local_ca_guid: packet.local_ca_guid(),
            local_qkey: packet.local_qkey(),
            local_qpn: packet.local_qpn(),
            responder_resources: packet.responder_resources(),
            local_eecn: packet.local_eecn(),
            initiator_depth: packet.initiator_depth(),
            remote_eecn: packet.remote_eecn(),
            remote_cm_response_timeout: packet.remote_cm_response_timeout(),
            transport_type: packet.transport_type(),
            end_to_end_flow_control: packet.end_to_end_flow_control(),
            starting_psn: packet.starting_psn(),
            local_cm_response_timeout: packet.local_cm_response_timeout(),
            retry_count: packet.retry_count(),
            pkey: packet.pkey(),
            path_mtu: packet.path_mtu(),
            rdc_exists: packet.rdc_exists(),
            rnr_retry_count: packet.rnr_retry_count(),
            max_cm_retries: packet.max_cm_retries(),
            srq: packet.srq(),
            extended_transport_type: packet.extended_transport_type(),
            primary_path: PathRepr::parse(&packet.primary_path())?,
            alternate_path: PathRepr::parse(&packet.alternate_path())?,
            sap_supported: packet.sap_supported(),
            private_data: array(packet.private_data()),
        })
    }

    /// Write the fields into a zeroed 232-byte buffer (see
    /// [`super::CmMessage::emit`], which zeroes it).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_local_comm_id(self.local_comm_id);
        packet.set_vendor_id(self.vendor_id);
        packet.set_service_id(self.service_id);
        packet.set_local_ca_guid(self.local_ca_guid);
        packet.set_local_qkey(self.local_qkey);
        packet.set_local_qpn(self.local_qpn);
        packet.set_responder_resources(self.responder_resources);
        packet.set_local_eecn(self.local_eecn);
        packet.set_initiator_depth(self.initiator_depth);
        packet.set_remote_eecn(self.remote_eecn);
        packet.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        packet.set_transport_type(self.transport_type);
        packet.set_end_to_end_flow_control(self.end_to_end_flow_control);
        packet.set_starting_psn(self.starting_psn);
        packet.set_local_cm_response_timeout(self.local_cm_response_timeout);
        packet.set_retry_count(self.retry_count);
        packet.set_pkey(self.pkey);
        packet.set_path_mtu(self.path_mtu);
        packet.set_rdc_exists(self.rdc_exists);
        packet.set_rnr_retry_count(self.rnr_retry_count);
        packet.set_max_cm_retries(self.max_cm_retries);
        packet.set_srq(self.srq);
        packet.set_extended_transport_type(self.extended_transport_type);
        self.primary_path.emit(&mut packet.primary_path_mut());
        self.alternate_path.emit(&mut packet.alternate_path_mut());
        packet.set_sap_supported(self.sap_supported);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}
