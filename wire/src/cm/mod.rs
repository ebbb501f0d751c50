//! InfiniBand Communication Manager messages (IBTA Vol. 1, 12.6; kernel
//! `drivers/infiniband/core/cm.c`, field positions from
//! `include/rdma/ibta_vol1_c12.h`).
//!
//! Each message is the 232 bytes of class data after the
//! [`crate::mad`] common header, with its own module: a `Packet<T>` view
//! whose `mod field` lists byte ranges and bit masks, and an owned `Repr`
//! with `parse` and `emit`. [`CmMad`] ties a whole 256-byte MAD together.
//!
//! | attribute | message | module |
//! |---|---|---|
//! | 0x0010 | ConnectRequest (REQ) | [`req`] (paths in [`path`]) |
//! | 0x0011 | MessageReceiptAcknowledgement (MRA) | [`mra`] |
//! | 0x0012 | ConnectReject (REJ) | [`rej`] |
//! | 0x0013 | ConnectReply (REP) | [`rep`] |
//! | 0x0014 | ReadyToUse (RTU) | [`rtu`] |
//! | 0x0015 | DisconnectRequest (DREQ) | [`dreq`] |
//! | 0x0016 | DisconnectReply (DREP) | [`drep`] |
//! | 0x0017 | ServiceIDResolutionRequest (SIDR_REQ) | [`sidr_req`] |
//! | 0x0018 | ServiceIDResolutionResponse (SIDR_REP) | [`sidr_rep`] |
//!
//! Reserved bits are written as zero and ignored on receipt, as kernel
//! `cm.c` does (it builds every message in a zeroed MAD with `IBA_SET`).
//! Private data is kept at its full fixed size: the CM carries it as a
//! fixed-size field and the kernel hands all of it to the consumer.
//!
//! Over RoCEv2 a CM MAD is the payload of a UD SEND_ONLY from QP1 to QP1
//! with the GSI Q_Key ([`crate::deth::GSI_QKEY`]) and P_Key index 0.

use crate::mad::{self, MadHeaderRepr};
use crate::{Error, Result};

pub mod drep;
pub mod dreq;
pub mod mra;
pub mod path;
pub mod rej;
pub mod rep;
pub mod req;
pub mod rtu;
pub mod sidr_rep;
pub mod sidr_req;

pub use drep::DrepRepr;
pub use dreq::DreqRepr;
pub use mra::MraRepr;
pub use path::PathRepr;
pub use rej::{RejRepr, RejectReason};
pub use rep::RepRepr;
pub use req::ReqRepr;
pub use rtu::RtuRepr;
pub use sidr_rep::{SidrRepRepr, SidrStatus};
pub use sidr_req::SidrReqRepr;

/// Length of a CM message: the class data of one MAD.
pub const MESSAGE_LEN: usize = mad::DATA_LEN;

/// Attribute IDs of the CM messages (IBTA Table 102; kernel `CM_*_ATTR_ID`).
pub mod attr {
    /// ClassPortInfo (not decoded here).
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// MessageReceiptAcknowledgement.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResolutionRequest.
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResolutionResponse.
    pub const SIDR_REP: u16 = 0x0018;
}

/// Which message an MRA acknowledges or a REJ rejects: the 2-bit
/// "Message MRAed" / "Message Rejected" field (IBTA Tables 107, 108;
/// kernel `enum cm_msg_response`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageResponse {
    /// The REQ (`CM_MSG_RESPONSE_REQ`).
    Req,
    /// The REP (`CM_MSG_RESPONSE_REP`).
    Rep,
    /// Anything else: a LAP for MRA, no particular message for REJ
    /// (`CM_MSG_RESPONSE_OTHER`, e.g. a REJ sent when the active side
    /// gives up in REQ_SENT).
    Other,
}

impl MessageResponse {
    /// The 2-bit code. 3 is reserved and rejected by [`from_raw`](Self::from_raw).
    pub const fn to_raw(self) -> u8 {
        match self {
            MessageResponse::Req => 0,
            MessageResponse::Rep => 1,
            MessageResponse::Other => 2,
        }
    }

    /// Decode the 2-bit code (`Malformed` for the reserved value 3).
    pub fn from_raw(raw: u8) -> Result<MessageResponse> {
        match raw {
            0 => Ok(MessageResponse::Req),
            1 => Ok(MessageResponse::Rep),
            2 => Ok(MessageResponse::Other),
            _ => Err(Error::Malformed),
        }
    }
}

/// Conversion between a field's bits and its Rust type, for the
/// getter/setter macro below.
pub(crate) trait Bits: Copy {
    fn from_bits(bits: u64) -> Self;
    fn to_bits(self) -> u64;
}

macro_rules! impl_bits {
    ($($t:ty),*) => {$(
        impl Bits for $t {
            fn from_bits(bits: u64) -> Self { bits as $t }
            fn to_bits(self) -> u64 { self as u64 }
        }
    )*};
}
impl_bits!(u8, u16, u32, u64);

impl Bits for bool {
    fn from_bits(bits: u64) -> Self {
        bits != 0
    }
    fn to_bits(self) -> u64 {
        u64::from(self)
    }
}

/// Getters and setters of bit fields, each `(getter, setter): type =
/// byte range, mask;` with the mask over the big-endian value of the
/// range (as `ibta_vol1_c12.h` places them: bit offsets from the most
/// significant bit).
macro_rules! bit_fields {
    ($( $(#[$doc:meta])* ($get:ident, $set:ident): $ty:ty = $field:expr, $mask:expr; )*) => {
        impl<T: AsRef<[u8]>> Packet<T> {
            $(
                $(#[$doc])*
                pub fn $get(&self) -> $ty {
                    <$ty as $crate::cm::Bits>::from_bits($crate::bytes::read_bits(
                        self.buffer.as_ref(), $field, $mask))
                }
            )*
        }
        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            $(
                #[doc = concat!("Set the field read by [`", stringify!($get),
                    "`](Self::", stringify!($get), "), truncated to its width.")]
                pub fn $set(&mut self, value: $ty) {
                    $crate::bytes::write_bits(self.buffer.as_mut(), $field, $mask,
                        $crate::cm::Bits::to_bits(value))
                }
            )*
        }
    };
}
pub(crate) use bit_fields;

/// Getters and setters of whole byte-array fields (GIDs, private data).
macro_rules! byte_fields {
    ($( $(#[$doc:meta])* ($get:ident, $get_mut:ident) = $field:expr; )*) => {
        impl<T: AsRef<[u8]>> Packet<T> {
            $(
                $(#[$doc])*
                pub fn $get(&self) -> &[u8] {
                    &self.buffer.as_ref()[$field]
                }
            )*
        }
        impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
            $(
                #[doc = concat!("The bytes of [`", stringify!($get),
                    "`](Self::", stringify!($get), "), writable.")]
                pub fn $get_mut(&mut self) -> &mut [u8] {
                    &mut self.buffer.as_mut()[$field]
                }
            )*
        }
    };
}
pub(crate) use byte_fields;

/// Copy a field of a view into a fixed-size array (the field's length is
/// `N` by construction of the `mod field` ranges).
pub(crate) fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

/// Pad consumer private data to the fixed size of a message's field, as
/// kernel `cm.c` does (`IBA_SET_MEM` into a zeroed MAD). `Malformed` if
/// `data` is longer than the field (kernel `ib_send_cm_*` return -EINVAL).
pub fn pad_private_data<const N: usize>(data: &[u8]) -> Result<[u8; N]> {
    if data.len() > N {
        return Err(Error::Malformed);
    }
    let mut out = [0u8; N];
    out[..data.len()].copy_from_slice(data);
    Ok(out)
}

/// One CM message, by attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MessageReceiptAcknowledgement.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(RtuRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(DrepRepr),
    /// ServiceIDResolutionRequest.
    SidrReq(SidrReqRepr),
    /// ServiceIDResolutionResponse.
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// The attribute ID of this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The sender's communication ID (the first word of every connection
    /// message; a SIDR_REQ's request ID, which is the requester's comm ID;
    /// 0 in a SIDR_REP, whose sender has none on the wire).
    pub const fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
            CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(_) => 0,
        }
    }

    /// The receiver's communication ID (0 in a REQ or SIDR_REQ, which have
    /// none yet; a SIDR_REP's request ID).
    pub const fn remote_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(_) | CmMessage::SidrReq(_) => 0,
            CmMessage::Mra(m) => m.remote_comm_id,
            CmMessage::Rej(m) => m.remote_comm_id,
            CmMessage::Rep(m) => m.remote_comm_id,
            CmMessage::Rtu(m) => m.remote_comm_id,
            CmMessage::Dreq(m) => m.remote_comm_id,
            CmMessage::Drep(m) => m.remote_comm_id,
            CmMessage::SidrRep(m) => m.request_id,
        }
    }

    /// Parse the 232 bytes of class data of a message with attribute
    /// `attribute_id`.
    pub fn parse(attribute_id: u16, data: &[u8]) -> Result<CmMessage> {
        Ok(match attribute_id {
            attr::REQ => CmMessage::Req(ReqRepr::parse(&req::Packet::new_checked(data)?)?),
            attr::MRA => CmMessage::Mra(MraRepr::parse(&mra::Packet::new_checked(data)?)?),
            attr::REJ => CmMessage::Rej(RejRepr::parse(&rej::Packet::new_checked(data)?)?),
            attr::REP => CmMessage::Rep(RepRepr::parse(&rep::Packet::new_checked(data)?)?),
            attr::RTU => CmMessage::Rtu(RtuRepr::parse(&rtu::Packet::new_checked(data)?)?),
            attr::DREQ => CmMessage::Dreq(DreqRepr::parse(&dreq::Packet::new_checked(data)?)?),
            attr::DREP => CmMessage::Drep(DrepRepr::parse(&drep::Packet::new_checked(data)?)?),
            attr::SIDR_REQ => {
                CmMessage::SidrReq(SidrReqRepr::parse(&sidr_req::Packet::new_checked(data)?)?)
            }
            attr::SIDR_REP => {
                CmMessage::SidrRep(SidrRepRepr::parse(&sidr_rep::Packet::new_checked(data)?)?)
            }
            other => {
                return Err(Error::UnsupportedMad {
                    mgmt_class: mad::MGMT_CLASS_CM,
                    class_version: mad::CM_CLASS_VERSION,
                    method: mad::METHOD_SEND,
                    attribute_id: other,
                })
            }
        })
    }

    /// Write the 232 bytes of class data (`Truncated` if `data` is
    /// shorter). Every byte of the message is written: reserved bits as 0.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        if data.len() < MESSAGE_LEN {
            return Err(Error::Truncated);
        }
        data[..MESSAGE_LEN].fill(0);
        match self {
            CmMessage::Req(m) => m.emit(&mut req::Packet::new_unchecked(data)),
            CmMessage::Mra(m) => m.emit(&mut mra::Packet::new_unchecked(data)),
            CmMessage::Rej(m) => m.emit(&mut rej::Packet::new_unchecked(data)),
            CmMessage::Rep(m) => m.emit(&mut rep::Packet::new_unchecked(data)),
            CmMessage::Rtu(m) => m.emit(&mut rtu::Packet::new_unchecked(data)),
            CmMessage::Dreq(m) => m.emit(&mut dreq::Packet::new_unchecked(data)),
            CmMessage::Drep(m) => m.emit(&mut drep::Packet::new_unchecked(data)),
            CmMessage::SidrReq(m) => m.emit(&mut sidr_req::Packet::new_unchecked(data)),
            CmMessage::SidrRep(m) => m.emit(&mut sidr_rep::Packet::new_unchecked(data)),
        }
        Ok(())
    }
}

/// A whole CM MAD: the parts of the common header that vary, and the
/// message. The rest of the header is fixed for the CM (base version 1,
/// class 0x07, class version 2, method Send, status 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CmMad {
    /// Transaction ID. Kernel `cm_form_tid` builds it from the MAD agent's
    /// `hi_tid` and the sender's comm ID; responses (REP, REJ to a REQ,
    /// MRA, DREP) echo the request's.
    pub transaction_id: u64,
    /// Attribute modifier. Kernel cm puts the Enhanced Connection
    /// Establishment options (`ece.attr_mod`) here in REQ, REP and SIDR_REP
    /// (`cm_format_mad_ece_hdr`) and sends 0 in every other message;
    /// kernel rdma_cm without ECE sends 0 throughout.
    pub attribute_modifier: u32,
    /// The message.
    pub message: CmMessage,
}

impl CmMad {
    /// Parse a 256-byte MAD. `Truncated` if shorter, `Malformed` if longer
    /// (the GSI delivers exactly one MAD per datagram), `UnsupportedMad`
    /// if it is not a CM Send of class version 2 with a known attribute.
    pub fn parse(bytes: &[u8]) -> Result<CmMad> {
        if bytes.len() < mad::MAD_LEN {
            return Err(Error::Truncated);
        }
        if bytes.len() > mad::MAD_LEN {
            return Err(Error::Malformed);
        }
        let header = MadHeaderRepr::parse(&mad::Packet::new_checked(bytes)?)?;
        if header.base_version != mad::BASE_VERSION
            || header.mgmt_class != mad::MGMT_CLASS_CM
            || header.class_version != mad::CM_CLASS_VERSION
            || header.method != mad::METHOD_SEND
        {
            return Err(Error::UnsupportedMad {
                mgmt_class: header.mgmt_class,
                class_version: header.class_version,
                method: header.method,
                attribute_id: header.attribute_id,
            });
        }
        let message = CmMessage::parse(header.attribute_id, &bytes[mad::HEADER_LEN..])?;
        Ok(CmMad {
            transaction_id: header.transaction_id,
            attribute_modifier: header.attribute_modifier,
            message,
        })
    }

    /// The MAD common header this MAD is sent with.
    pub const fn header(&self) -> MadHeaderRepr {
        let mut h = MadHeaderRepr::cm_send(self.message.attribute_id(), self.transaction_id);
        h.attribute_modifier = self.attribute_modifier;
        h
    }

    /// Write the 256 bytes (`Truncated` if `buf` is shorter).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < mad::MAD_LEN {
            return Err(Error::Truncated);
        }
        self.header()
            .emit(&mut mad::Packet::new_unchecked(&mut buf[..mad::HEADER_LEN]));
        self.message.emit(&mut buf[mad::HEADER_LEN..mad::MAD_LEN])
    }

    /// The 256 bytes.
    pub fn to_bytes(&self) -> [u8; mad::MAD_LEN] {
        let mut buf = [0u8; mad::MAD_LEN];
        // Cannot fail: the buffer is exactly one MAD long.
        let _ = self.emit(&mut buf);
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CM MAD header with attribute `attr`, then zeroed class data.
    fn mad_with(attr: u16) -> [u8; mad::MAD_LEN] {
        let mut b = [0u8; mad::MAD_LEN];
        MadHeaderRepr::cm_send(attr, 0x1234)
            .emit(&mut mad::Packet::new_unchecked(&mut b[..mad::HEADER_LEN]));
        b
    }

    #[test]
    fn lengths_and_headers_are_checked() {
        let b = mad_with(attr::RTU);
        assert!(CmMad::parse(&b).is_ok());
        assert_eq!(CmMad::parse(&b[..255]), Err(Error::Truncated));
        let mut long = b.to_vec();
        long.push(0);
        assert_eq!(CmMad::parse(&long), Err(Error::Malformed));
        for (at, value) in [(0, 2u8), (1, 0x81), (2, 1), (3, 0x83)] {
            let mut bad = b;
            bad[at] = value;
            assert!(
                matches!(CmMad::parse(&bad), Err(Error::UnsupportedMad { .. })),
                "byte {at} = {value:#x}"
            );
        }
        // LAP (0x0019) and APR (0x001a) are not decoded: kernel cm
        // refuses them over RoCE.
        for a in [attr::CLASS_PORT_INFO, 0x0019, 0x001a, 0x0000] {
            let e = CmMad::parse(&mad_with(a)).unwrap_err();
            assert_eq!(
                e,
                Error::UnsupportedMad {
                    mgmt_class: 7,
                    class_version: 2,
                    method: 3,
                    attribute_id: a
                }
            );
            assert!(e.to_string().contains("only CM"), "{e}");
        }
        let mut short = [0u8; 255];
        assert_eq!(
            CmMad::parse(&b).unwrap().emit(&mut short),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn reserved_codes_are_malformed() {
        // REJ "message rejected" 3 and an ARI length over 72.
        let mut b = mad_with(attr::REJ);
        b[mad::HEADER_LEN + 8] = 0xc0;
        assert_eq!(CmMad::parse(&b), Err(Error::Malformed));
        let mut b = mad_with(attr::REJ);
        b[mad::HEADER_LEN + 9] = 73 << 1;
        assert_eq!(CmMad::parse(&b), Err(Error::Malformed));
        b[mad::HEADER_LEN + 9] = 72 << 1;
        assert!(CmMad::parse(&b).is_ok());
        // MRA "message MRAed" 3.
        let mut b = mad_with(attr::MRA);
        b[mad::HEADER_LEN + 8] = 0xc0;
        assert_eq!(CmMad::parse(&b), Err(Error::Malformed));
    }

    #[test]
    fn reserved_bits_are_ignored_and_emitted_as_zero() {
        let mut b = mad_with(attr::REQ);
        b[mad::HEADER_LEN + 4] = 0xff; // resv before the vendor ID
        b[mad::HEADER_LEN + 24] = 0xff; // resv word
        b[mad::HEADER_LEN + 52 + 38] = 0x0f; // flow label's low nibble | resv
        b[mad::HEADER_LEN + 52 + 39] = 0xff; // resv | packet rate
        let m = CmMad::parse(&b).unwrap();
        let CmMessage::Req(req) = &m.message else {
            panic!("not a REQ")
        };
        assert_eq!(req.primary_path.packet_rate, 0x3f);
        assert_eq!(req.primary_path.flow_label, 0);
        let out = m.to_bytes();
        assert_eq!(out[mad::HEADER_LEN + 4], 0);
        assert_eq!(out[mad::HEADER_LEN + 24], 0);
        assert_eq!(out[mad::HEADER_LEN + 52 + 38], 0);
        assert_eq!(out[mad::HEADER_LEN + 52 + 39], 0x3f);
    }

    #[test]
    fn kernel_style_timeout_rej() {
        // What kernel cm sends when a REQ_SENT id is destroyed (as in
        // rdmacm_req_to_host.pcap): TIMEOUT, ARI = the CA GUID.
        let guid = 0x5054_00ff_fe77_000cu64.to_be_bytes();
        let rej = RejRepr {
            local_comm_id: 0x4e5b_c80c,
            remote_comm_id: 0,
            message_rejected: MessageResponse::Other,
            reason: RejectReason::TIMEOUT,
            ari_length: 8,
            ari: pad_private_data(&guid).unwrap(),
            private_data: [0; rej::PRIVATE_DATA_LEN],
        };
        let m = CmMad {
            transaction_id: 0x0000_0002_0cc8_5b4e,
            attribute_modifier: 0,
            message: CmMessage::Rej(rej),
        };
        let b = m.to_bytes();
        assert_eq!(
            &b[..24],
            &[
                1, 7, 2, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0x0c, 0xc8, 0x5b, 0x4e, 0, 0x12, 0, 0, 0, 0, 0,
                0
            ]
        );
        assert_eq!(
            &b[24..44],
            &[
                0x4e, 0x5b, 0xc8, 0x0c, 0, 0, 0, 0, 0x80, 0x10, 0, 4, 0x50, 0x54, 0, 0xff, 0xfe,
                0x77, 0, 0x0c
            ]
        );
        assert_eq!(CmMad::parse(&b), Ok(m));
        assert_eq!(RejectReason(34).to_string(), "unassigned reason 34");
        assert_eq!(RejectReason::STALE_CONN.name(), Some("stale connection"));
    }

    #[test]
    fn sidr_mads_round_trip_with_their_headers() {
        let req = CmMad {
            transaction_id: 0x0000_0002_4433_2211,
            attribute_modifier: 0,
            message: CmMessage::SidrReq(SidrReqRepr {
                request_id: 0x1122_3344,
                pkey: 0xffff,
                service_id: 0x0000_0000_0111_4e21,
                private_data: pad_private_data(b"cma").unwrap(),
            }),
        };
        let b = req.to_bytes();
        assert_eq!(&b[16..18], &[0x00, 0x17]);
        assert_eq!(&b[24..28], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&b[40..43], b"cma");
        assert_eq!(CmMad::parse(&b), Ok(req.clone()));
        assert_eq!(req.message.local_comm_id(), 0x1122_3344);
        assert_eq!(req.message.remote_comm_id(), 0);

        // A SIDR_REP with ECE: the attribute modifier rides in the header.
        let rep = CmMad {
            transaction_id: 0x0000_0002_4433_2211,
            attribute_modifier: 0x8000_0001,
            message: CmMessage::SidrRep(SidrRepRepr {
                request_id: 0x1122_3344,
                status: SidrStatus::SUCCESS,
                info_length: 0,
                vendor_id: 0x02c9,
                qpn: 0x12,
                service_id: 0x0000_0000_0111_4e21,
                qkey: 0x0123_4567,
                info: [0; sidr_rep::INFO_LEN],
                private_data: [0; sidr_rep::PRIVATE_DATA_LEN],
            }),
        };
        let b = rep.to_bytes();
        assert_eq!(&b[16..24], &[0x00, 0x18, 0, 0, 0x80, 0, 0, 1]);
        assert_eq!(
            &b[24..36],
            &[0x11, 0x22, 0x33, 0x44, 0, 0, 0, 0x02, 0, 0, 0x12, 0xc9]
        );
        assert_eq!(CmMad::parse(&b), Ok(rep.clone()));
        assert_eq!(rep.message.local_comm_id(), 0);
        assert_eq!(rep.message.remote_comm_id(), 0x1122_3344);

        // Truncated class data is an error, not a panic.
        for len in [0, 8, MESSAGE_LEN - 1] {
            assert_eq!(
                CmMessage::parse(attr::SIDR_REQ, &b[24..24 + len]),
                Err(Error::Truncated)
            );
            assert_eq!(
                CmMessage::parse(attr::SIDR_REP, &b[24..24 + len]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn private_data_padding() {
        assert_eq!(pad_private_data::<4>(&[1, 2]), Ok([1, 2, 0, 0]));
        assert_eq!(pad_private_data::<1>(&[1, 2]), Err(Error::Malformed));
    }
}
