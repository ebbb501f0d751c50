//! ServiceIDResolutionResponse, SIDR_REP, attribute 0x0018 (IBTA Vol. 1,
//! 12.11.2, Tables 120 and 121; kernel `cm_format_sidr_rep`,
//! `cm_sidr_rep_handler`, `enum ib_cm_sidr_status`).
//!
//! ```text
//!   0-3   request ID (the SIDR_REQ's)
//!   4     status               5 additional information length
//!   6-7   ECE vendor ID bits 23-8
//!   8-11  QPN (24) | ECE vendor ID bits 7-0
//!  12-19  service ID
//!  20-23  Q_Key
//!  24-95  additional information (72 bytes)
//!  96-231 private data (136 bytes)
//! ```
//!
//! The vendor ID fields are kernel `CM_SIDR_REP_VENDOR_ID_H` (16 bits at
//! byte 6) and `CM_SIDR_REP_VENDOR_ID_L` (byte 11). Kernel
//! `cm_format_sidr_rep` writes only `(vendor_id >> 8) & 0xff` into the
//! 16-bit high part, so a kernel peer sends bits 15-0 of its vendor ID
//! and zeros above; this module reads and writes all 24 bits.

use super::{array, bit_fields, byte_fields, MESSAGE_LEN};
use crate::bytes::header_view;
use crate::{Error, Result};

/// Byte layout of the SIDR_REP, with the bit masks of the packed fields.
pub mod field {
    use crate::Field;
    /// Request ID.
    pub const REQUEST_ID: Field = 0..4;
    /// Status (Table 121).
    pub const STATUS: Field = 4..5;
    /// Additional information length.
    pub const INFO_LENGTH: Field = 5..6;
    /// ECE vendor ID, bits 23-8.
    pub const VENDOR_ID_H: Field = 6..8;
    /// QPN (top 24 bits), ECE vendor ID bits 7-0 (low byte).
    pub const QPN_VENDOR_L: Field = 8..12;
    /// Service ID.
    pub const SERVICE_ID: Field = 12..20;
    /// Q_Key.
    pub const QKEY: Field = 20..24;
    /// Additional information.
    pub const INFO: Field = 24..96;
    /// Private data.
    pub const PRIVATE_DATA: Field = 96..232;
}

/// Length of a SIDR_REP (the whole CM message).
pub const HEADER_LEN: usize = MESSAGE_LEN;

/// Bytes of additional information (kernel `IB_CM_SIDR_REP_INFO_LENGTH`).
pub const INFO_LEN: usize = 72;

/// Bytes of private data in a SIDR_REP (kernel
/// `IB_CM_SIDR_REP_PRIVATE_DATA_SIZE`).
pub const PRIVATE_DATA_LEN: usize = 136;

header_view!("a CM ServiceIDResolutionResponse (SIDR_REP)");

bit_fields! {
    /// Request ID.
    (request_id, set_request_id): u32 = field::REQUEST_ID, 0xffff_ffff;
    /// Status.
    (status, set_status): u8 = field::STATUS, 0xff;
    /// Additional information length (at most 72).
    (info_length, set_info_length): u8 = field::INFO_LENGTH, 0xff;
    /// ECE vendor ID, bits 23-8.
    (vendor_id_h, set_vendor_id_h): u16 = field::VENDOR_ID_H, 0xffff;
    /// QPN (24 bits).
    (qpn, set_qpn): u32 = field::QPN_VENDOR_L, 0xffff_ff00;
    /// ECE vendor ID, bits 7-0.
    (vendor_id_l, set_vendor_id_l): u8 = field::QPN_VENDOR_L, 0xff;
    /// Service ID.
    (service_id, set_service_id): u64 = field::SERVICE_ID, u64::MAX;
    /// Q_Key.
    (qkey, set_qkey): u32 = field::QKEY, 0xffff_ffff;
}

byte_fields! {
    /// Additional information (72 bytes; `info_length` are meaningful).
    (info, info_mut) = field::INFO;
    /// Private data (136 bytes).
    (private_data, private_data_mut) = field::PRIVATE_DATA;
}

/// A SIDR_REP status (IBTA Table 121; kernel `enum ib_cm_sidr_status`).
/// Codes the table does not name are kept as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SidrStatus(pub u8);

macro_rules! statuses {
    ($($name:ident = $code:literal, $text:literal;)*) => {
        impl SidrStatus {
            $(
                #[doc = concat!("Status ", stringify!($code), ": ", $text, ".")]
                pub const $name: SidrStatus = SidrStatus($code);
            )*

            /// What the status means, or `None` for an unassigned code.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($code => Some($text),)*
                    _ => None,
                }
            }
        }
    };
}

statuses! {
    SUCCESS = 0, "QPN and Q_Key valid";
    UNSUPPORTED = 1, "service ID not supported";
    REJECT = 2, "service ID supported, request rejected";
    NO_QP = 3, "no QP available";
    REDIRECT = 4, "redirect (ClassPortInfo in the additional information)";
    UNSUPPORTED_VERSION = 5, "unsupported version (highest supported in the additional information)";
}

impl core::fmt::Display for SidrStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "unassigned SIDR status {}", self.0),
        }
    }
}

/// The meaning of a SIDR_REP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidrRepRepr {
    /// The SIDR_REQ's request ID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Additional information length (at most 72).
    pub info_length: u8,
    /// ECE vendor ID (24 bits, split over bytes 6-7 and 11).
    pub vendor_id: u32,
    /// The QPN serving the service ID (meaningful for status 0).
    pub qpn: u32,
    /// The service ID resolved.
    pub service_id: u64,
    /// The Q_Key to send to `qpn` with.
    pub qkey: u32,
    /// Additional information, 72 bytes (the first `info_length` are
    /// meaningful).
    pub info: [u8; INFO_LEN],
    /// Private data, 136 bytes.
    pub private_data: [u8; PRIVATE_DATA_LEN],
}

impl SidrRepRepr {
    /// Read a SIDR_REP: `Truncated` if short, `Malformed` for an
    /// additional information length over 72.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<SidrRepRepr> {
        packet.check_len()?;
        let info_length = packet.info_length();
        if usize::from(info_length) > INFO_LEN {
            return Err(Error::Malformed);
        }
        Ok(SidrRepRepr {
            request_id: packet.request_id(),
            status: SidrStatus(packet.status()),
            info_length,
            vendor_id: u32::from(packet.vendor_id_h()) << 8 | u32::from(packet.vendor_id_l()),
            qpn: packet.qpn(),
            service_id: packet.service_id(),
            qkey: packet.qkey(),
            info: array(packet.info()),
            private_data: array(packet.private_data()),
        })
    }

    /// The meaningful part of the additional information (clamped to 72
    /// bytes).
    pub fn info_bytes(&self) -> &[u8] {
        &self.info[..usize::from(self.info_length).min(INFO_LEN)]
    }

    /// Write the fields into a zeroed 232-byte buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_request_id(self.request_id);
        packet.set_status(self.status.0);
        packet.set_info_length(self.info_length);
        packet.set_vendor_id_h((self.vendor_id >> 8) as u16);
        packet.set_qpn(self.qpn);
        packet.set_vendor_id_l(self.vendor_id as u8);
        packet.set_service_id(self.service_id);
        packet.set_qkey(self.qkey);
        packet.info_mut().copy_from_slice(&self.info);
        packet
            .private_data_mut()
            .copy_from_slice(&self.private_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SidrRepRepr {
        let mut info = [0u8; INFO_LEN];
        info[..3].copy_from_slice(&[7, 8, 9]);
        let mut private_data = [0u8; PRIVATE_DATA_LEN];
        private_data[0] = 0xaa;
        private_data[PRIVATE_DATA_LEN - 1] = 0xbb;
        SidrRepRepr {
            request_id: 0x1122_3344,
            status: SidrStatus::SUCCESS,
            info_length: 3,
            vendor_id: 0x00ab_cdef,
            qpn: 0x00fe_dcba,
            service_id: 0x0000_0000_0111_4e21,
            qkey: 0x8765_4321,
            info,
            private_data,
        }
    }

    #[test]
    fn fields_sit_where_the_kernel_header_puts_them() {
        // CM_SIDR_REP_REQUESTID 0, STATUS 4, ADDITIONAL_INFORMATION_LENGTH
        // 5, VENDOR_ID_H 6 (16 bits), QPN 8 (24 bits), VENDOR_ID_L 11,
        // SERVICEID 12, Q_KEY 20, ADDITIONAL_INFORMATION 24 (576 bits),
        // PRIVATE_DATA 96 (1088 bits).
        let mut b = [0u8; HEADER_LEN];
        sample().emit(&mut Packet::new_unchecked(&mut b[..]));
        assert_eq!(
            &b[..27],
            &[
                0x11, 0x22, 0x33, 0x44, // request ID
                0x00, 0x03, // status, info length
                0xab, 0xcd, // vendor ID 23-8
                0xfe, 0xdc, 0xba, 0xef, // QPN, vendor ID 7-0
                0, 0, 0, 0, 0x01, 0x11, 0x4e, 0x21, // service ID
                0x87, 0x65, 0x43, 0x21, // Q_Key
                7, 8, 9, // additional information
            ]
        );
        assert!(b[27..96].iter().all(|&x| x == 0));
        assert_eq!(b[96], 0xaa);
        assert_eq!(b[231], 0xbb);
    }

    #[test]
    fn round_trip() {
        let mut b = [0u8; HEADER_LEN];
        let m = sample();
        m.emit(&mut Packet::new_unchecked(&mut b[..]));
        let back = SidrRepRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.info_bytes(), &[7, 8, 9]);
    }

    #[test]
    fn kernel_vendor_id_encoding_reads_back() {
        // Kernel `cm_format_sidr_rep` for vendor ID 0x02c9 (Mellanox):
        // VENDOR_ID_H = 0x02 in the 16-bit field, VENDOR_ID_L = 0xc9.
        let mut b = [0u8; HEADER_LEN];
        b[7] = 0x02;
        b[11] = 0xc9;
        let m = SidrRepRepr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(m.vendor_id, 0x02c9);
        assert_eq!(m.qpn, 0);
    }

    #[test]
    fn bad_lengths_are_errors() {
        let b = [0u8; HEADER_LEN];
        for len in [0, 5, 24, HEADER_LEN - 1] {
            assert_eq!(Packet::new_checked(&b[..len]).err(), Some(Error::Truncated));
            assert_eq!(
                SidrRepRepr::parse(&Packet::new_unchecked(&b[..len])),
                Err(Error::Truncated)
            );
        }
        let mut b = [0u8; HEADER_LEN];
        b[5] = 73;
        assert_eq!(
            SidrRepRepr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(Error::Malformed)
        );
        b[5] = 72;
        assert!(SidrRepRepr::parse(&Packet::new_checked(&b[..]).unwrap()).is_ok());
    }

    #[test]
    fn status_names() {
        assert_eq!(
            SidrStatus::UNSUPPORTED.to_string(),
            "service ID not supported (1)"
        );
        assert_eq!(SidrStatus(9).to_string(), "unassigned SIDR status 9");
        assert_eq!(SidrStatus::REJECT, SidrStatus(2));
    }
}
