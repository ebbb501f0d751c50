//! ServiceIDResolutionRequest, SIDR_REQ, attribute 0x0017 (IBTA Vol. 1,
//! 12.11.1, Table 119; kernel `cm_format_sidr_req`, `cm_sidr_req_handler`).
//!
//! A UD client asks which QPN and Q_Key serve a service ID. There is no
//! connection: the request ID plays the comm ID's part (kernel puts the
//! requester's local comm ID there) and the answer is one SIDR_REP.
//!
//! ```text
//!   0-3   request ID
//!   4-5   partition key       6-7 resv
//!   8-15  service ID
//!  16-231 private data (216 bytes; rdma_cm puts its `cma_hdr` first)
//! ```

use super::{array, bit_fields, byte_fields, MESSAGE_LEN};
use crate::bytes::header_view;
use crate::Result;

/// Byte layout of the SIDR_REQ.
pub mod field {
    use crate::Field;
    /// Request ID (the requester's comm ID).
    pub const REQUEST_ID: Field = 0..4;
    /// Partition key of the path the requester will use.
    pub const PARTITION_KEY: Field = 4..6;
    /// Service ID.
    pub const SERVICE_ID: Field = 8..16;
    /// Private data.
    pub const PRIVATE_DATA: Field = 16..232;
}

/// Length of a SIDR_REQ (the whole CM message).
pub const HEADER_LEN: usize = MESSAGE_LEN;

/// Bytes of private data in a SIDR_REQ (kernel
/// `IB_CM_SIDR_REQ_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 216;

header_view!("a CM ServiceIDResolutionRequest (SIDR_REQ)");

bit_fields! {
    /// Request ID.
    (request_id, set_request_id): u32 = field::REQUEST_ID, 0xffff_ffff;
    /// Partition key.
    (pkey, set_pkey): u16 = field::PARTITION_KEY, 0xffff;
    /// Service ID.
    (service_id, set_service_id): u64 = field::SERVICE_ID, u64::MAX;
}

byte_fields! {
    /// Private data (216 bytes).
    (private_data, private_data_mut) = field::PRIVATE_DATA;
}

/// The meaning of a SIDR_REQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrReqRepr {
    /// The requester's request ID; the SIDR_REP echoes it.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service ID to resolve.
    pub service_id: u64,
    /// Private data, 216 bytes.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl SidrReqRepr {
    /// Read a SIDR_REQ (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<SidrReqRepr> {
        packet.check_len()?;
        Ok(SidrReqRepr {
            request_id: packet.request_id(),
            pkey: packet.pkey(),
            service_id: packet.service_id(),
            private_data: array(packet.private_data()),
        })
    }

    /// Write the fields into a zeroed 232-byte buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_request_id(self.request_id);
        packet.set_pkey(self.pkey);
        packet.set_service_id(self.service_id);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    fn sample() -> SidrReqRepr {
        let mut private_data = [0u8; PRIVATE_DATA_LEN];
        private_data[0] = 0xaa;
        private_data[PRIVATE_DATA_LEN - 1] = 0xbb;
        SidrReqRepr {
            request_id: 0x1122_3344,
            pkey: 0xffff,
            service_id: 0x0000_0000_0111_4e21,
            private_data,
        }
    }

    #[test]
    fn fields_sit_where_the_kernel_header_puts_them() {
        // CM_SIDR_REQ_REQUESTID at 0, PARTITION_KEY at 4 (16 bits),
        // SERVICEID at 8, PRIVATE_DATA at 16 (1728 bits).
        let mut b = [0u8; HEADER_LEN];
        sample().emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(
            &b[..16],
            &[0x11, 0x22, 0x33, 0x44, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0x01, 0x11, 0x4e, 0x21]
        );
        assert_eq!(b[16], 0xaa);
        assert_eq!(b[231], 0xbb);
    }

    #[test]
    fn round_trip_and_reserved_bytes() {
        let mut b = [0u8; HEADER_LEN];
        sample().emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(
            SidrReqRepr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Ok(sample())
        );
        // The reserved half-word is ignored on receipt.
        b[6] = 0xff;
        b[7] = 0xff;
        assert_eq!(
            SidrReqRepr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Ok(sample())
        );
    }

    #[test]
    fn truncated_is_an_error() {
        let b = [0u8; HEADER_LEN];
        for len in [0, 4, 16, HEADER_LEN - 1] {
            assert_eq!(Packet::new_checked(&b[..len]).err(), Some(Error::Truncated));
            assert_eq!(
                SidrReqRepr::parse(&Packet::new_unchecked(&b[..len])),
                Err(Error::Truncated)
            );
        }
    }
}
