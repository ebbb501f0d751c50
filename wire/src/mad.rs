//! The common header of every Management Datagram (IBTA Vol. 1, 13.4.3,
//! "MAD Common Header"; kernel `struct ib_mad_hdr`).
//!
//! A MAD is always 256 bytes ([`MAD_LEN`]): this 24-byte header, then 232
//! bytes of class-specific data. Over RoCEv2 it rides as the payload of a
//! UD SEND_ONLY to QP1 (the GSI) with a DETH carrying
//! [`crate::deth::GSI_QKEY`]; the Communication Manager ([`crate::cm`]) is
//! the class this crate decodes.
//!
//! ```text
//!  byte 0         1           2             3
//!       BaseVer | MgmtClass | ClassVersion | R + Method
//!  4-5  Status            6-7  ClassSpecific
//!  8-15 TransactionID
//!  16-17 AttributeID      18-19 reserved
//!  20-23 AttributeModifier
//! ```

use crate::bytes::{self, header_view};
use crate::Result;

/// Byte layout of the MAD common header.
pub mod field {
    use crate::Field;
    /// Base version: 1 for every MAD this crate handles.
    pub const BASE_VERSION: Field = 0..1;
    /// Management class (0x07 = Communication Management).
    pub const MGMT_CLASS: Field = 1..2;
    /// Version of the class's own format (2 for the CM).
    pub const CLASS_VERSION: Field = 2..3;
    /// The response bit (bit 7) and the method (bits 0-6).
    pub const METHOD: Field = 3..4;
    /// Status of a response (zero in CM Sends).
    pub const STATUS: Field = 4..6;
    /// Class-specific word (zero for the CM).
    pub const CLASS_SPECIFIC: Field = 6..8;
    /// Transaction ID: pairs a response with its request.
    pub const TRANSACTION_ID: Field = 8..16;
    /// Attribute ID: which message of the class this is.
    pub const ATTRIBUTE_ID: Field = 16..18;
    /// Reserved.
    pub const RESV: Field = 18..20;
    /// Attribute modifier (the CM uses it for ECE; kernel rdma_cm sends 0).
    pub const ATTRIBUTE_MODIFIER: Field = 20..24;
}

/// Length of the MAD common header.
pub const HEADER_LEN: usize = field::ATTRIBUTE_MODIFIER.end;

/// Length of every MAD on the wire (IBTA 13.4.2; kernel `IB_MGMT_MAD_SIZE`).
pub const MAD_LEN: usize = 256;

/// Bytes of class data after the common header (kernel `IB_MGMT_MAD_DATA`).
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;

/// The only base version (kernel `IB_MGMT_BASE_VERSION`; OPA's 0x80 is not
/// spoken over RoCE).
pub const BASE_VERSION: u8 = 1;

/// The Communication Management class (kernel `IB_MGMT_CLASS_CM`).
pub const MGMT_CLASS_CM: u8 = 0x07;

/// The CM class version kernel `cm.c` sends and accepts (`IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;

/// Method Send (kernel `IB_MGMT_METHOD_SEND`): every CM message uses it.
pub const METHOD_SEND: u8 = 0x03;

/// The response bit of the method byte (kernel `IB_MGMT_METHOD_RESP`).
pub const METHOD_RESPONSE: u8 = 0x80;

header_view!("the MAD common header");

impl<T: AsRef<[u8]>> Packet<T> {
    /// Base version.
    pub fn base_version(&self) -> u8 {
        bytes::read(self.buffer.as_ref(), field::BASE_VERSION) as u8
    }
    /// Management class.
    pub fn mgmt_class(&self) -> u8 {
        bytes::read(self.buffer.as_ref(), field::MGMT_CLASS) as u8
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        bytes::read(self.buffer.as_ref(), field::CLASS_VERSION) as u8
    }
    /// Method byte, including the response bit.
    pub fn method(&self) -> u8 {
        bytes::read(self.buffer.as_ref(), field::METHOD) as u8
    }
    /// Status.
    pub fn status(&self) -> u16 {
        bytes::read(self.buffer.as_ref(), field::STATUS) as u16
    }
    /// Class-specific word.
    pub fn class_specific(&self) -> u16 {
        bytes::read(self.buffer.as_ref(), field::CLASS_SPECIFIC) as u16
    }
    /// Transaction ID.
    pub fn transaction_id(&self) -> u64 {
        bytes::read(self.buffer.as_ref(), field::TRANSACTION_ID)
    }
    /// Attribute ID.
    pub fn attribute_id(&self) -> u16 {
        bytes::read(self.buffer.as_ref(), field::ATTRIBUTE_ID) as u16
    }
    /// The reserved word after the attribute ID.
    pub fn resv(&self) -> u16 {
        bytes::read(self.buffer.as_ref(), field::RESV) as u16
    }
    /// Attribute modifier.
    pub fn attribute_modifier(&self) -> u32 {
        bytes::read(self.buffer.as_ref(), field::ATTRIBUTE_MODIFIER) as u32
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the base version.
    pub fn set_base_version(&mut self, v: u8) {
        bytes::write(self.buffer.as_mut(), field::BASE_VERSION, v.into())
    }
    /// Set the management class.
    pub fn set_mgmt_class(&mut self, v: u8) {
        bytes::write(self.buffer.as_mut(), field::MGMT_CLASS, v.into())
    }
    /// Set the class version.
    pub fn set_class_version(&mut self, v: u8) {
        bytes::write(self.buffer.as_mut(), field::CLASS_VERSION, v.into())
    }
    /// Set the method byte.
    pub fn set_method(&mut self, v: u8) {
        bytes::write(self.buffer.as_mut(), field::METHOD, v.into())
    }
    /// Set the status.
    pub fn set_status(&mut self, v: u16) {
        bytes::write(self.buffer.as_mut(), field::STATUS, v.into())
    }
    /// Set the class-specific word.
    pub fn set_class_specific(&mut self, v: u16) {
        bytes::write(self.buffer.as_mut(), field::CLASS_SPECIFIC, v.into())
    }
    /// Set the transaction ID.
    pub fn set_transaction_id(&mut self, v: u64) {
        bytes::write(self.buffer.as_mut(), field::TRANSACTION_ID, v)
    }
    /// Set the attribute ID.
    pub fn set_attribute_id(&mut self, v: u16) {
        bytes::write(self.buffer.as_mut(), field::ATTRIBUTE_ID, v.into())
    }
    /// Set the reserved word.
    pub fn set_resv(&mut self, v: u16) {
        bytes::write(self.buffer.as_mut(), field::RESV, v.into())
    }
    /// Set the attribute modifier.
    pub fn set_attribute_modifier(&mut self, v: u32) {
        bytes::write(self.buffer.as_mut(), field::ATTRIBUTE_MODIFIER, v.into())
    }
}

/// The meaning of a MAD common header. The reserved word is sent as zero
/// and ignored on receipt (kernel `struct ib_mad_hdr` `resv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadHeaderRepr {
    /// Base version ([`BASE_VERSION`]).
    pub base_version: u8,
    /// Management class ([`MGMT_CLASS_CM`] for the CM).
    pub mgmt_class: u8,
    /// Class version ([`CM_CLASS_VERSION`] for the CM).
    pub class_version: u8,
    /// Method byte, response bit included ([`METHOD_SEND`] for the CM).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific word.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// The header of a CM Send, as kernel `cm_format_mad_hdr` writes it.
    pub const fn cm_send(attribute_id: u16, transaction_id: u64) -> MadHeaderRepr {
        MadHeaderRepr {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id,
            attribute_modifier: 0,
        }
    }

    /// Read a MAD header (`Truncated` if short). Any class is accepted:
    /// checking the class is the caller's business ([`crate::cm`] does).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<MadHeaderRepr> {
        packet.check_len()?;
        Ok(MadHeaderRepr {
            base_version: packet.base_version(),
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            transaction_id: packet.transaction_id(),
            attribute_id: packet.attribute_id(),
            attribute_modifier: packet.attribute_modifier(),
        })
    }

    /// Write the 24 bytes, the reserved word as zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_base_version(self.base_version);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_transaction_id(self.transaction_id);
        packet.set_attribute_id(self.attribute_id);
        packet.set_resv(0);
        packet.set_attribute_modifier(self.attribute_modifier);
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MAD header of the REQ in rdmacm_rping.pcap (kernel 6.1 rping).
    const RPING_REQ: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x0c, 0xc8, 0x5b,
        0x4f, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn deconstruct() {
        let p = Packet::new_checked(&RPING_REQ[..]).unwrap();
        assert_eq!(p.base_version(), 1);
        assert_eq!(p.mgmt_class(), MGMT_CLASS_CM);
        assert_eq!(p.class_version(), 2);
        assert_eq!(p.method(), METHOD_SEND);
        assert_eq!(p.status(), 0);
        assert_eq!(p.class_specific(), 0);
        assert_eq!(p.transaction_id(), 0x0000_0002_0cc8_5b4f);
        assert_eq!(p.attribute_id(), 0x0010);
        assert_eq!(p.resv(), 0);
        assert_eq!(p.attribute_modifier(), 0);
    }

    #[test]
    fn construct_and_round_trip() {
        let r = MadHeaderRepr::cm_send(0x0010, 0x0000_0002_0cc8_5b4f);
        assert_eq!(
            MadHeaderRepr::parse(&Packet::new_checked(&RPING_REQ[..]).unwrap()),
            Ok(r)
        );
        let mut buf = [0xffu8; 24];
        r.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, RPING_REQ);
        assert_eq!(r.buffer_len(), HEADER_LEN);
        assert_eq!(DATA_LEN, 232);
    }

    #[test]
    fn truncated() {
        assert_eq!(
            Packet::new_checked(&RPING_REQ[..23]).err(),
            Some(crate::Error::Truncated)
        );
    }
}
