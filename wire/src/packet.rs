//! The whole RoCEv2 transport packet, in the header order of kernel rxe's
//! opcode table.

use crate::aeth::AethRepr;
use crate::atomic::{AtomicAckRepr, AtomicEthRepr};
use crate::bth::BthRepr;
use crate::deth::DethRepr;
use crate::feth::FethRepr;
use crate::ieth::IethRepr;
use crate::immdt::ImmDtRepr;
use crate::rdeth::RdethRepr;
use crate::reth::RethRepr;
use crate::{aeth, atomic, bth, deth, feth, ieth, immdt, rdeth, reth};
use crate::{Error, OpFlags, Result};

/// A whole transport packet (the UDP payload: BTH, extension headers,
/// payload, pad, ICRC), with the extension headers its opcode carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacketRepr<'a> {
    pub bth: BthRepr,
    pub rdeth: Option<RdethRepr>,
    pub deth: Option<DethRepr>,
    pub reth: Option<RethRepr>,
    pub feth: Option<FethRepr>,
    pub atomic: Option<AtomicEthRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack: Option<AtomicAckRepr>,
    pub immdt: Option<ImmDtRepr>,
    pub ieth: Option<IethRepr>,
    pub payload: &'a [u8],
}
impl<'a> PacketRepr<'a> {
    /// Parse a UDP payload that ends with the 4-byte ICRC: checks the
    /// length against the opcode's headers, pad count and ICRC, that the
    /// opcode is known, TVer is 0, and that only opcodes with a payload carry
    /// one. Does not check the ICRC (see `icrc`). Never panics.
    pub fn parse(d: &'a [u8]) -> Result<PacketRepr<'a>> {
        let bth = BthRepr::parse(&bth::Packet::new_checked(d)?)?;
        let info = bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode.0))?;
        if bth.tver != 0 {
            return Err(Error::Malformed);
        }
        let f = info.flags;
        let end = d
            .len()
            .checked_sub(crate::ICRC_LEN)
            .ok_or(Error::Truncated)?;
        if end < info.hdr_len {
            return Err(Error::Truncated);
        }
        let pad = usize::from(bth.pad_count);
        let plen = (end - info.hdr_len)
            .checked_sub(pad)
            .ok_or(Error::Malformed)?;
        if !f.contains(OpFlags::PAYLOAD) && (plen != 0 || pad != 0) {
            return Err(Error::Malformed);
        }
        // Every offset below is inside d[..info.hdr_len], checked above.
        let at = |h: OpFlags| info.offset_of(h).map(|o| &d[o..info.hdr_len]);
        Ok(PacketRepr {
            bth,
            rdeth: at(OpFlags::RDETH)
                .map(|b| RdethRepr::parse(&rdeth::Packet::new_checked(b)?))
                .transpose()?,
            deth: at(OpFlags::DETH)
                .map(|b| DethRepr::parse(&deth::Packet::new_checked(b)?))
                .transpose()?,
            reth: at(OpFlags::RETH)
                .map(|b| RethRepr::parse(&reth::Packet::new_checked(b)?))
                .transpose()?,
            feth: at(OpFlags::FETH)
                .map(|b| FethRepr::parse(&feth::Packet::new_checked(b)?))
                .transpose()?,
            atomic: at(OpFlags::ATMETH)
                .map(|b| AtomicEthRepr::parse(&atomic::Packet::new_checked(b)?))
                .transpose()?,
            aeth: at(OpFlags::AETH)
                .map(|b| AethRepr::parse(&aeth::Packet::new_checked(b)?))
                .transpose()?,
            atomic_ack: at(OpFlags::ATMACK)
                .map(|b| AtomicAckRepr::parse(&atomic::ack::Packet::new_checked(b)?))
                .transpose()?,
            immdt: at(OpFlags::IMMDT)
                .map(|b| ImmDtRepr::parse(&immdt::Packet::new_checked(b)?))
                .transpose()?,
            ieth: at(OpFlags::IETH)
                .map(|b| IethRepr::parse(&ieth::Packet::new_checked(b)?))
                .transpose()?,
            payload: &d[info.hdr_len..info.hdr_len + plen],
        })
    }

    pub fn header_len(&self) -> usize {
        self.bth.opcode.info().map_or(12, |i| i.hdr_len)
    }
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + (4 - self.payload.len() % 4) % 4 + 4
    }
    /// Emit headers, payload and zero pad into `b[..buffer_len()]`; the pad
    /// count written is computed from the payload length. The ICRC bytes are
    /// zeroed (see `icrc::write`). `Error::Malformed` if the extension
    /// headers present do not match the opcode's table entry.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        let info = self
            .bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))?;
        let n = self.buffer_len();
        if b.len() < n {
            return Err(Error::Truncated);
        }
        let f = info.flags;
        let present = [
            (OpFlags::RDETH, self.rdeth.is_some()),
            (OpFlags::DETH, self.deth.is_some()),
            (OpFlags::RETH, self.reth.is_some()),
            (OpFlags::FETH, self.feth.is_some()),
            (OpFlags::ATMETH, self.atomic.is_some()),
            (OpFlags::AETH, self.aeth.is_some()),
            (OpFlags::ATMACK, self.atomic_ack.is_some()),
            (OpFlags::IMMDT, self.immdt.is_some()),
            (OpFlags::IETH, self.ieth.is_some()),
        ];
        if present.iter().any(|(h, p)| f.contains(*h) != *p)
            || (!f.contains(OpFlags::PAYLOAD) && !self.payload.is_empty())
        {
            return Err(Error::Malformed);
        }
        let mut bth = self.bth;
        bth.pad_count = ((4 - self.payload.len() % 4) % 4) as u8;
        bth.emit(&mut bth::Packet::new_unchecked(&mut b[..bth::HEADER_LEN]));
        let hdr = info.hdr_len;
        // Offsets come from the table and lie inside b[..hdr] (n >= hdr).
        let at = |h: OpFlags| info.offset_of(h).unwrap_or(hdr);
        if let Some(x) = self.rdeth {
            x.emit(&mut rdeth::Packet::new_unchecked(
                &mut b[at(OpFlags::RDETH)..hdr],
            ));
        }
        if let Some(x) = self.deth {
            x.emit(&mut deth::Packet::new_unchecked(
                &mut b[at(OpFlags::DETH)..hdr],
            ));
        }
        if let Some(x) = self.reth {
            x.emit(&mut reth::Packet::new_unchecked(
                &mut b[at(OpFlags::RETH)..hdr],
            ));
        }
        if let Some(x) = self.feth {
            x.emit(&mut feth::Packet::new_unchecked(
                &mut b[at(OpFlags::FETH)..hdr],
            ));
        }
        if let Some(x) = self.atomic {
            x.emit(&mut atomic::Packet::new_unchecked(
                &mut b[at(OpFlags::ATMETH)..hdr],
            ));
        }
        if let Some(x) = self.aeth {
            x.emit(&mut aeth::Packet::new_unchecked(
                &mut b[at(OpFlags::AETH)..hdr],
            ));
        }
        if let Some(x) = self.atomic_ack {
            x.emit(&mut atomic::ack::Packet::new_unchecked(
                &mut b[at(OpFlags::ATMACK)..hdr],
            ));
        }
        if let Some(x) = self.immdt {
            x.emit(&mut immdt::Packet::new_unchecked(
                &mut b[at(OpFlags::IMMDT)..hdr],
            ));
        }
        if let Some(x) = self.ieth {
            x.emit(&mut ieth::Packet::new_unchecked(
                &mut b[at(OpFlags::IETH)..hdr],
            ));
        }
        b[hdr..hdr + self.payload.len()].copy_from_slice(self.payload);
        b[hdr + self.payload.len()..n].fill(0);
        Ok(())
    }
}
