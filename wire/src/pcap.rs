use crate::icrc::IpUdpInfo;
use std::io::{self, Write};
pub struct PcapWriter<W: Write> {
    w: W,
}
impl<W: Write> PcapWriter<W> {
    pub fn new(mut w: W) -> io::Result<Self> {
        w.write_all(&0xa1b2_3c4du32.to_le_bytes())?;
        w.write_all(&2u16.to_le_bytes())?;
        w.write_all(&4u16.to_le_bytes())?;
        w.write_all(&[0; 8])?;
        w.write_all(&65535u32.to_le_bytes())?;
        w.write_all(&1u32.to_le_bytes())?;
        Ok(PcapWriter { w })
    }
    pub fn write_frame(&mut self, ts_ns: u64, f: &[u8]) -> io::Result<()> {
        self.w
            .write_all(&((ts_ns / 1_000_000_000) as u32).to_le_bytes())?;
        self.w
            .write_all(&((ts_ns % 1_000_000_000) as u32).to_le_bytes())?;
        self.w.write_all(&(f.len() as u32).to_le_bytes())?;
        self.w.write_all(&(f.len() as u32).to_le_bytes())?;
        self.w.write_all(f)
    }
    pub fn write_roce(&mut self, ts_ns: u64, _info: &IpUdpInfo, _p: &[u8]) -> io::Result<()> {
        let _ = ts_ns;
        Ok(())
    }
    pub fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
    pub fn into_inner(self) -> W {
        self.w
    }
}
