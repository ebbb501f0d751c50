use crate::aeth::{AethRepr, Syndrome};
use crate::atomic::{AtomicAckRepr, AtomicEthRepr};
use crate::bth::BthRepr;
use crate::deth::DethRepr;
use crate::feth::FethRepr;
use crate::ieth::IethRepr;
use crate::immdt::ImmDtRepr;
use crate::rdeth::RdethRepr;
use crate::reth::RethRepr;
use crate::{Error, OpFlags, Result};
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
fn u32b(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn u64b(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}
impl<'a> PacketRepr<'a> {
    pub fn parse(d: &'a [u8]) -> Result<PacketRepr<'a>> {
        let bth = BthRepr::parse_bytes(d)?;
        let info = bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode.0))?;
        if bth.tver != 0 {
            return Err(Error::Malformed);
        }
        let f = info.flags;
        let end = d.len().checked_sub(4).ok_or(Error::Truncated)?;
        if end < info.hdr_len {
            return Err(Error::Truncated);
        }
        let pad = bth.pad_count as usize;
        let plen = (end - info.hdr_len)
            .checked_sub(pad)
            .ok_or(Error::Malformed)?;
        if !f.contains(OpFlags::PAYLOAD) && (plen != 0 || pad != 0) {
            return Err(Error::Malformed);
        }
        let at = |h: OpFlags| info.offset_of(h);
        Ok(PacketRepr {
            bth,
            rdeth: at(OpFlags::RDETH).map(|o| RdethRepr {
                een: u32b(&d[o..]) & 0xff_ffff,
            }),
            deth: at(OpFlags::DETH).map(|o| DethRepr {
                qkey: u32b(&d[o..]),
                src_qpn: u32b(&d[o + 4..]) & 0xff_ffff,
            }),
            reth: at(OpFlags::RETH).map(|o| RethRepr {
                va: u64b(&d[o..]),
                rkey: u32b(&d[o + 8..]),
                dma_len: u32b(&d[o + 12..]),
            }),
            feth: at(OpFlags::FETH).map(|o| {
                let v = u32b(&d[o..]);
                FethRepr {
                    selectivity: ((v >> 4) & 3) as u8,
                    placement: (v & 0xf) as u8,
                }
            }),
            atomic: at(OpFlags::ATMETH).map(|o| AtomicEthRepr {
                va: u64b(&d[o..]),
                rkey: u32b(&d[o + 8..]),
                swap_add: u64b(&d[o + 12..]),
                compare: u64b(&d[o + 20..]),
            }),
            aeth: at(OpFlags::AETH).map(|o| AethRepr {
                syndrome: Syndrome::from_raw(d[o]),
                msn: u32b(&d[o..]) & 0xff_ffff,
            }),
            atomic_ack: at(OpFlags::ATMACK).map(|o| AtomicAckRepr {
                orig: u64b(&d[o..]),
            }),
            immdt: at(OpFlags::IMMDT).map(|o| ImmDtRepr { imm: u32b(&d[o..]) }),
            ieth: at(OpFlags::IETH).map(|o| IethRepr {
                rkey: u32b(&d[o..]),
            }),
            payload: &d[info.hdr_len..info.hdr_len + plen],
        })
    }
    pub fn header_len(&self) -> usize {
        self.bth.opcode.info().map_or(12, |i| i.hdr_len)
    }
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + (4 - self.payload.len() % 4) % 4 + 4
    }
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
        let pres = [
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
        if pres.iter().any(|(h, p)| f.contains(*h) != *p) {
            return Err(Error::Malformed);
        }
        let mut bth = self.bth;
        bth.pad_count = ((4 - self.payload.len() % 4) % 4) as u8;
        bth.emit_bytes(b);
        let at = |h: OpFlags| info.offset_of(h).unwrap_or(0);
        if let Some(x) = self.rdeth {
            b[at(OpFlags::RDETH)..][..4].copy_from_slice(&(x.een & 0xff_ffff).to_be_bytes());
        }
        if let Some(x) = self.deth {
            let o = at(OpFlags::DETH);
            b[o..o + 4].copy_from_slice(&x.qkey.to_be_bytes());
            b[o + 4..o + 8].copy_from_slice(&(x.src_qpn & 0xff_ffff).to_be_bytes());
        }
        if let Some(x) = self.reth {
            let o = at(OpFlags::RETH);
            b[o..o + 8].copy_from_slice(&x.va.to_be_bytes());
            b[o + 8..o + 12].copy_from_slice(&x.rkey.to_be_bytes());
            b[o + 12..o + 16].copy_from_slice(&x.dma_len.to_be_bytes());
        }
        if let Some(x) = self.feth {
            let o = at(OpFlags::FETH);
            b[o..o + 4].copy_from_slice(
                &((u32::from(x.selectivity & 3) << 4) | u32::from(x.placement & 0xf)).to_be_bytes(),
            );
        }
        if let Some(x) = self.atomic {
            let o = at(OpFlags::ATMETH);
            b[o..o + 8].copy_from_slice(&x.va.to_be_bytes());
            b[o + 8..o + 12].copy_from_slice(&x.rkey.to_be_bytes());
            b[o + 12..o + 20].copy_from_slice(&x.swap_add.to_be_bytes());
            b[o + 20..o + 28].copy_from_slice(&x.compare.to_be_bytes());
        }
        if let Some(x) = self.aeth {
            let o = at(OpFlags::AETH);
            b[o..o + 4].copy_from_slice(&(x.msn & 0xff_ffff).to_be_bytes());
            b[o] = x.syndrome.to_raw();
        }
        if let Some(x) = self.atomic_ack {
            let o = at(OpFlags::ATMACK);
            b[o..o + 8].copy_from_slice(&x.orig.to_be_bytes());
        }
        if let Some(x) = self.immdt {
            let o = at(OpFlags::IMMDT);
            b[o..o + 4].copy_from_slice(&x.imm.to_be_bytes());
        }
        if let Some(x) = self.ieth {
            let o = at(OpFlags::IETH);
            b[o..o + 4].copy_from_slice(&x.rkey.to_be_bytes());
        }
        let h = info.hdr_len;
        b[h..h + self.payload.len()].copy_from_slice(self.payload);
        for x in &mut b[h + self.payload.len()..n] {
            *x = 0;
        }
        Ok(())
    }
}
