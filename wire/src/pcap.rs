//! Classic pcap files with Ethernet frames (linktype 1): a writer for
//! traces of our own traffic, and a reader for captures such as the kernel
//! rxe references (`dumpcap -P`).
//!
//! Format (the libpcap "classic" format, as in the pcap man page / IETF
//! draft-ietf-opsawg-pcap): a 24-byte global header (magic, version 2.4,
//! snaplen, linktype), then records of a 16-byte header (seconds,
//! fraction, captured length, original length) and the frame. The magic
//! `a1b2c3d4` means microsecond fractions, `a1b23c4d` nanoseconds; its
//! byte order gives the file's.
//!
//! The writer is the crate's only I/O, and only through the `io::Write` it
//! is given.

use std::io::{self, Write};

use crate::icrc::IpUdpInfo;
use crate::{Error, Result};

/// Linktype of Ethernet frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Magic of a file with microsecond timestamps.
pub const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
/// Magic of a file with nanosecond timestamps.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// The snapshot length the writer declares (tcpdump's default); frames are
/// always written whole.
pub const SNAPLEN: u32 = 262_144;

const GLOBAL_HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 16;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Writes a nanosecond-resolution, little-endian pcap file of Ethernet
/// frames.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Start a file: writes the global header (version 2.4, nanosecond
    /// magic, snaplen [`SNAPLEN`], linktype Ethernet).
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = [0u8; GLOBAL_HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC_NANOS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // 8..16: time zone offset and accuracy, always 0.
        h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out })
    }

    /// Append one Ethernet frame with a timestamp in nanoseconds (since the
    /// Unix epoch, or since the start of a simulation).
    /// `io::ErrorKind::InvalidInput` for a frame longer than 4 GiB.
    pub fn write_frame(&mut self, ts_ns: u64, frame: &[u8]) -> io::Result<()> {
        let len = u32::try_from(frame.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame longer than 4 GiB"))?;
        let secs = (ts_ns / NANOS_PER_SEC) as u32; // wraps in 2106
        let nanos = (ts_ns % NANOS_PER_SEC) as u32;
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&nanos.to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(frame)
    }

    /// Append a RoCEv2 UDP payload framed as kernel rxe would send it
    /// ([`crate::frame::build`]).
    pub fn write_roce(
        &mut self,
        ts_ns: u64,
        info: &IpUdpInfo,
        udp_payload: &[u8],
    ) -> io::Result<()> {
        let frame = crate::frame::build(info, udp_payload);
        self.write_frame(ts_ns, &frame)
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer (not flushed).
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// One record of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcapRecord<'a> {
    /// Timestamp in nanoseconds.
    pub ts_ns: u64,
    /// The captured bytes (possibly fewer than `orig_len` if the capture
    /// was truncated by its snaplen).
    pub data: &'a [u8],
    /// Length of the frame on the wire.
    pub orig_len: u32,
}

/// Reads a classic pcap file held in memory: either byte order,
/// microsecond or nanosecond timestamps. Iterating yields one
/// `Result<PcapRecord>` per record; after a broken record (truncated file)
/// it yields that error once and then ends.
#[derive(Debug, Clone)]
pub struct PcapReader<'a> {
    bytes: &'a [u8],
    offset: usize,
    big_endian: bool,
    nanos: bool,
    linktype: u32,
}

impl<'a> PcapReader<'a> {
    /// Check the global header. `Error::Truncated` if the file is shorter
    /// than it, `Error::Malformed` for an unknown magic (e.g. pcapng: use
    /// `editcap -F pcap` or `dumpcap -P`).
    pub fn new(bytes: &'a [u8]) -> Result<Self> {
        let magic: [u8; 4] = bytes
            .get(..4)
            .and_then(|m| m.try_into().ok())
            .ok_or(Error::Truncated)?;
        let (big_endian, nanos) = match (u32::from_le_bytes(magic), u32::from_be_bytes(magic)) {
            (MAGIC_MICROS, _) => (false, false),
            (MAGIC_NANOS, _) => (false, true),
            (_, MAGIC_MICROS) => (true, false),
            (_, MAGIC_NANOS) => (true, true),
            _ => return Err(Error::Malformed),
        };
        let mut reader = PcapReader {
            bytes,
            offset: GLOBAL_HEADER_LEN,
            big_endian,
            nanos,
            linktype: 0,
        };
        reader.linktype = reader.u32_at(20).ok_or(Error::Truncated)?;
        Ok(reader)
    }

    /// The file's linktype ([`LINKTYPE_ETHERNET`] for the frames
    /// [`crate::frame::parse`] understands).
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    /// Whether timestamps have nanosecond (rather than microsecond)
    /// resolution.
    pub fn is_nanosecond(&self) -> bool {
        self.nanos
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        let b: [u8; 4] = self.bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    fn record_at(&self, at: usize) -> Result<(PcapRecord<'a>, usize)> {
        let field = |i: usize| self.u32_at(at + 4 * i).ok_or(Error::Truncated);
        let (secs, frac, incl, orig_len) = (field(0)?, field(1)?, field(2)?, field(3)?);
        let data_at = at + RECORD_HEADER_LEN;
        let end = usize::try_from(incl)
            .ok()
            .and_then(|n| data_at.checked_add(n))
            .ok_or(Error::Truncated)?;
        let data = self.bytes.get(data_at..end).ok_or(Error::Truncated)?;
        let frac_ns = if self.nanos {
            u64::from(frac)
        } else {
            u64::from(frac) * 1_000
        };
        let ts_ns = u64::from(secs) * NANOS_PER_SEC + frac_ns;
        Ok((
            PcapRecord {
                ts_ns,
                data,
                orig_len,
            },
            end,
        ))
    }
}

impl<'a> Iterator for PcapReader<'a> {
    type Item = Result<PcapRecord<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.offset >= self.bytes.len() {
            return None;
        }
        match self.record_at(self.offset) {
            Ok((record, end)) => {
                self.offset = end;
                Some(Ok(record))
            }
            Err(e) => {
                self.offset = self.bytes.len();
                Some(Err(e))
            }
        }
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
        w.flush().unwrap();
        let bytes = w.into_inner();
        assert_eq!(&bytes[..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        assert_eq!(bytes.len(), 24 + 16 + 3 + 16 + 1);
        let r = PcapReader::new(&bytes).unwrap();
        assert_eq!(r.linktype(), LINKTYPE_ETHERNET);
        assert!(r.is_nanosecond());
        let recs: Vec<_> = r.map(|x| x.unwrap()).collect();
        assert_eq!(
            recs,
            vec![
                PcapRecord {
                    ts_ns: 1_500_000_123,
                    data: &[1, 2, 3],
                    orig_len: 3
                },
                PcapRecord {
                    ts_ns: 2_000_000_000,
                    data: &[4],
                    orig_len: 1
                },
            ]
        );
    }

    #[test]
    fn big_endian_microsecond_file() {
        // The header and one 2-byte record, big-endian, µs timestamps,
        // truncated by snaplen (orig_len 60).
        let mut f = Vec::new();
        f.extend_from_slice(&MAGIC_MICROS.to_be_bytes());
        f.extend_from_slice(&[0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(&2u32.to_be_bytes());
        f.extend_from_slice(&LINKTYPE_ETHERNET.to_be_bytes());
        for v in [7u32, 250_000, 2, 60] {
            f.extend_from_slice(&v.to_be_bytes());
        }
        f.extend_from_slice(&[0xab, 0xcd]);
        let mut r = PcapReader::new(&f).unwrap();
        assert!(!r.is_nanosecond());
        let rec = r.next().unwrap().unwrap();
        assert_eq!(rec.ts_ns, 7_250_000_000);
        assert_eq!((rec.data, rec.orig_len), (&[0xab, 0xcd][..], 60));
        assert!(r.next().is_none());
    }

    #[test]
    fn truncated_record_is_an_error_then_end() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.write_frame(0, &[1, 2, 3, 4]).unwrap();
        let mut bytes = w.into_inner();
        bytes.truncate(bytes.len() - 1);
        let mut r = PcapReader::new(&bytes).unwrap();
        assert_eq!(r.next(), Some(Err(Error::Truncated)));
        assert!(r.next().is_none());
        // A record length of 4 GiB - 1 does not overflow anything.
        let mut huge = bytes[..24].to_vec();
        huge.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        assert_eq!(
            PcapReader::new(&huge).unwrap().next(),
            Some(Err(Error::Truncated))
        );
        // Header problems.
        assert_eq!(PcapReader::new(&[0u8; 3]).err(), Some(Error::Truncated));
        assert_eq!(PcapReader::new(&bytes[..20]).err(), Some(Error::Truncated));
        assert_eq!(PcapReader::new(&[0u8; 24]).err(), Some(Error::Malformed));
        let pcapng = [
            0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(PcapReader::new(&pcapng).err(), Some(Error::Malformed));
    }
}
