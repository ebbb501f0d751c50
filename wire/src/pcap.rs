//! Classic pcap files (linktype Ethernet): a writer for traces of our
//! traffic, and a reader for captures such as the kernel-rxe references.

use std::io::{self, Write};

use crate::icrc::IpUdpInfo;
use crate::{Error, Result};

/// Linktype of Ethernet frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
const MAGIC_US: u32 = 0xa1b2_c3d4;
const MAGIC_NS: u32 = 0xa1b2_3c4d;

/// Writes a nanosecond-resolution pcap file.
pub struct PcapWriter<W: Write> {
    w: W,
}

impl<W: Write> PcapWriter<W> {
    /// Start a file: writes the global header (pcap 2.4, ns timestamps,
    /// snaplen 262144, Ethernet).
    pub fn new(mut w: W) -> io::Result<Self> {
        let mut h = [0u8; 24];
        h[0..4].copy_from_slice(&MAGIC_NS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&262_144u32.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        w.write_all(&h)?;
        Ok(PcapWriter { w })
    }

    /// Append one frame with a timestamp in nanoseconds.
    pub fn write_frame(&mut self, ts_ns: u64, frame: &[u8]) -> io::Result<()> {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((ts_ns / 1_000_000_000) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&((ts_ns % 1_000_000_000) as u32).to_le_bytes());
        let len = frame.len() as u32;
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.w.write_all(&h)?;
        self.w.write_all(frame)
    }

    /// Append a RoCEv2 datagram, framed with Ethernet/IP/UDP (`frame::build`).
    pub fn write_roce(
        &mut self,
        ts_ns: u64,
        info: &IpUdpInfo,
        udp_payload: &[u8],
    ) -> io::Result<()> {
        let f = crate::frame::build(info, udp_payload);
        self.write_frame(ts_ns, &f)
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.w
    }
}

/// One record of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcapRecord<'a> {
    pub ts_ns: u64,
    pub data: &'a [u8],
    pub orig_len: u32,
}

/// Reads a classic pcap file from memory (either byte order, µs or ns).
#[derive(Debug, Clone)]
pub struct PcapReader<'a> {
    bytes: &'a [u8],
    off: usize,
    big_endian: bool,
    nanos: bool,
    linktype: u32,
}

impl<'a> PcapReader<'a> {
    /// Check the global header.
    pub fn new(bytes: &'a [u8]) -> Result<Self> {
        let h = bytes.get(..24).ok_or(Error::Truncated)?;
        let le = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let be = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let (big_endian, nanos) = match (le, be) {
            (MAGIC_US, _) => (false, false),
            (MAGIC_NS, _) => (false, true),
            (_, MAGIC_US) => (true, false),
            (_, MAGIC_NS) => (true, true),
            _ => return Err(Error::Malformed),
        };
        let mut r = PcapReader {
            bytes,
            off: 24,
            big_endian,
            nanos,
            linktype: 0,
        };
        r.linktype = r.u32_at(20).ok_or(Error::Truncated)?;
        Ok(r)
    }

    /// The file's linktype (1 = Ethernet).
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    fn u32_at(&self, o: usize) -> Option<u32> {
        let b = self.bytes.get(o..o + 4)?;
        let a = [b[0], b[1], b[2], b[3]];
        Some(if self.big_endian {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        })
    }
}

impl<'a> Iterator for PcapReader<'a> {
    type Item = Result<PcapRecord<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.off >= self.bytes.len() {
            return None;
        }
        let rec = (|| {
            let o = self.off;
            let sec = u64::from(self.u32_at(o).ok_or(Error::Truncated)?);
            let frac = u64::from(self.u32_at(o + 4).ok_or(Error::Truncated)?);
            let incl = self.u32_at(o + 8).ok_or(Error::Truncated)? as usize;
            let orig_len = self.u32_at(o + 12).ok_or(Error::Truncated)?;
            let data = self
                .bytes
                .get(o + 16..o + 16 + incl)
                .ok_or(Error::Truncated)?;
            self.off = o + 16 + incl;
            let ts_ns = sec * 1_000_000_000 + if self.nanos { frac } else { frac * 1000 };
            Ok(PcapRecord {
                ts_ns,
                data,
                orig_len,
            })
        })();
        if rec.is_err() {
            // Stop after a broken record.
            self.off = self.bytes.len();
        }
        Some(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(1_500_000_123, &[1, 2, 3]).unwrap();
        w.write_frame(2_000_000_000, &[4]).unwrap();
        let bytes = w.into_inner();
        let r = PcapReader::new(&bytes).unwrap();
        assert_eq!(r.linktype(), LINKTYPE_ETHERNET);
        let recs: Vec<_> = r.map(|x| x.unwrap()).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].ts_ns, 1_500_000_123);
        assert_eq!(recs[0].data, &[1, 2, 3]);
        assert_eq!(recs[1].data, &[4]);
    }

    #[test]
    fn truncated_record_is_an_error_then_end() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(0, &[1, 2, 3, 4]).unwrap();
        let mut bytes = w.into_inner();
        bytes.truncate(bytes.len() - 1);
        let mut r = PcapReader::new(&bytes).unwrap();
        assert!(matches!(r.next(), Some(Err(Error::Truncated))));
        assert!(r.next().is_none());
        assert!(PcapReader::new(&[0u8; 10]).is_err());
        assert!(PcapReader::new(&[0u8; 24]).is_err());
    }
}
