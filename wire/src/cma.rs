//! What kernel rdma_cm puts into IB CM messages: the IP service IDs and
//! the private-data header of a REQ (kernel `drivers/infiniband/core/cma.c`,
//! `cma_priv.h`; `include/rdma/rdma_cm.h` for the port spaces).
//!
//! An rdma_cm REQ's service ID is `RDMA_IB_IP_PS_*` | destination port
//! ([`ip_service_id`]); its first 36 bytes of private data are a
//! `struct cma_hdr` ([`CmaHeaderRepr`]) naming the source port and both
//! IP addresses, and the consumer's own private data (at most 56 bytes)
//! follows. REP, REJ, RTU, DREQ and DREP carry only the consumer's data.
//!
//! ```text
//!  byte 0  cma_version (0x00)
//!       1  ip_version << 4 (0x40 IPv4, 0x60 IPv6)
//!     2-3  source port
//!    4-19  source address (IPv4: 12 zero bytes, then the address)
//!   20-35  destination address (likewise)
//! ```

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bytes::{self, header_view};
use crate::{Error, Result};

/// Byte layout of `struct cma_hdr`.
pub mod field {
    use crate::Field;
    /// rdma_cm header version (kernel `CMA_VERSION`, 0x00).
    pub const CMA_VERSION: Field = 0..1;
    /// IP version in the high nibble.
    pub const IP_VERSION: Field = 1..2;
    /// Source port.
    pub const PORT: Field = 2..4;
    /// Source address (`union cma_ip_addr`).
    pub const SRC_ADDR: Field = 4..20;
    /// Destination address.
    pub const DST_ADDR: Field = 20..36;
}

/// Length of `struct cma_hdr`.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

/// The only rdma_cm header version (kernel `CMA_VERSION`).
pub const CMA_VERSION: u8 = 0x00;

/// Consumer private data that fits in an rdma_cm REQ after the header
/// (92 - 36; librdmacm's `RDMA_MAX_PRIVATE_DATA` for RC connect on IB).
pub const REQ_CONSUMER_PRIVATE_DATA_LEN: usize = crate::cm::req::PRIVATE_DATA_LEN - HEADER_LEN;

/// rdma_cm port spaces (kernel `enum rdma_ucm_port_space`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB` (0x0002).
    Ipoib,
    /// `RDMA_PS_TCP` (0x0106): RC connections, what `rping` uses.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111): UD, resolved with SIDR.
    Udp,
    /// `RDMA_PS_IB` (0x013F): RC or UD.
    Ib,
}

impl PortSpace {
    /// The 16-bit port space number.
    pub const fn to_raw(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013f,
        }
    }

    /// The port space of a 16-bit number, if rdma_cm has one.
    pub const fn from_raw(raw: u16) -> Option<PortSpace> {
        match raw {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013f => Some(PortSpace::Ib),
            _ => None,
        }
    }
}

/// The bits of a service ID that name the port space (kernel
/// `RDMA_IB_IP_PS_MASK`).
pub const IP_PS_MASK: u64 = 0xffff_ffff_ffff_0000;

/// The service ID of an rdma_cm IP port (kernel `rdma_get_service_id`):
/// `0x0000_0000_01PP_0000 | port`, e.g. `RDMA_IB_IP_PS_TCP | 7174` =
/// 0x0000000001061c06 for rping.
pub const fn ip_service_id(ps: PortSpace, port: u16) -> u64 {
    ((ps.to_raw() as u64) << 16) | port as u64
}

/// The port space and port of an rdma_cm IP service ID, or `None` if the
/// service ID is not one (its top 32 bits are not zero, or the port
/// space is unknown): kernel `cma_save_ip_info` and `cma_ps_from_service_id`.
pub const fn parse_ip_service_id(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id >> 32 != 0 {
        return None;
    }
    match PortSpace::from_raw((service_id >> 16) as u16) {
        Some(ps) => Some((ps, service_id as u16)),
        None => None,
    }
}

header_view!("the rdma_cm private-data header (struct cma_hdr)");

impl<T: AsRef<[u8]>> Packet<T> {
    /// rdma_cm header version.
    pub fn cma_version(&self) -> u8 {
        bytes::read(self.buffer.as_ref(), field::CMA_VERSION) as u8
    }
    /// IP version (the high nibble of byte 1).
    pub fn ip_version(&self) -> u8 {
        bytes::read_bits(self.buffer.as_ref(), field::IP_VERSION, 0xf0) as u8
    }
    /// The low nibble of byte 1 (reserved).
    pub fn ip_version_resv(&self) -> u8 {
        bytes::read_bits(self.buffer.as_ref(), field::IP_VERSION, 0x0f) as u8
    }
    /// Source port.
    pub fn port(&self) -> u16 {
        bytes::read(self.buffer.as_ref(), field::PORT) as u16
    }
    /// Source address, 16 bytes.
    pub fn src_addr(&self) -> &[u8] {
        &self.buffer.as_ref()[field::SRC_ADDR]
    }
    /// Destination address, 16 bytes.
    pub fn dst_addr(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DST_ADDR]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Set the header version.
    pub fn set_cma_version(&mut self, v: u8) {
        bytes::write(self.buffer.as_mut(), field::CMA_VERSION, v.into())
    }
    /// Set byte 1 to `v << 4`.
    pub fn set_ip_version(&mut self, v: u8) {
        bytes::write(
            self.buffer.as_mut(),
            field::IP_VERSION,
            u64::from(v & 0x0f) << 4,
        )
    }
    /// Set the source port.
    pub fn set_port(&mut self, v: u16) {
        bytes::write(self.buffer.as_mut(), field::PORT, v.into())
    }
    /// The source address, writable.
    pub fn src_addr_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::SRC_ADDR]
    }
    /// The destination address, writable.
    pub fn dst_addr_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DST_ADDR]
    }
}

/// The meaning of a `struct cma_hdr`: the connecting socket address and
/// the address it connects to (whose port is the service ID's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmaHeaderRepr {
    /// Source port of the active side.
    pub src_port: u16,
    /// Source address (both addresses have the same family).
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
}

fn addr_from(bytes: &[u8], v4: bool) -> IpAddr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&bytes[..16]);
    if v4 {
        IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))
    } else {
        IpAddr::V6(Ipv6Addr::from(a))
    }
}

fn addr_into(addr: IpAddr, out: &mut [u8]) {
    out.fill(0);
    match addr {
        IpAddr::V4(v4) => out[12..16].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
}

impl CmaHeaderRepr {
    /// Read a cma_hdr. `Truncated` if short; `Malformed` if the version is
    /// not 0x00 or the IP version is neither 4 nor 6 (kernel
    /// `cma_check_req_qp_type`/`cma_save_ip_info` reject such a REQ; the
    /// kernel's `cma_get_ip_ver` takes the high nibble only).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<CmaHeaderRepr> {
        packet.check_len()?;
        if packet.cma_version() != CMA_VERSION {
            return Err(Error::Malformed);
        }
        let v4 = match packet.ip_version() {
            4 => true,
            6 => false,
            _ => return Err(Error::Malformed),
        };
        Ok(CmaHeaderRepr {
            src_port: packet.port(),
            src: addr_from(packet.src_addr(), v4),
            dst: addr_from(packet.dst_addr(), v4),
        })
    }

    /// Write the 36 bytes (`Malformed` if the two addresses are of
    /// different families, which kernel rdma_cm never sends).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<()> {
        let version = match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            _ => return Err(Error::Malformed),
        };
        packet.set_cma_version(CMA_VERSION);
        packet.set_ip_version(version);
        packet.set_port(self.src_port);
        addr_into(self.src, packet.src_addr_mut());
        addr_into(self.dst, packet.dst_addr_mut());
        Ok(())
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cma_hdr of the REQ in rdmacm_rping.pcap: 10.77.0.12:47616 to
    /// 10.77.0.11 (port 7174 in the service ID).
    fn rping_hdr() -> [u8; 36] {
        let mut h = [0u8; 36];
        h[..4].copy_from_slice(&[0x00, 0x40, 0xba, 0x00]);
        h[16..20].copy_from_slice(&[10, 77, 0, 12]);
        h[32..36].copy_from_slice(&[10, 77, 0, 11]);
        h
    }

    #[test]
    fn parse_emit_rping() {
        let bytes = rping_hdr();
        let r = CmaHeaderRepr::parse(&Packet::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(r.src_port, 0xba00);
        assert_eq!(r.src, "10.77.0.12".parse::<IpAddr>().unwrap());
        assert_eq!(r.dst, "10.77.0.11".parse::<IpAddr>().unwrap());
        let mut out = [0xffu8; 36];
        r.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn ipv6_and_errors() {
        let r = CmaHeaderRepr {
            src_port: 1,
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
        };
        let mut out = [0u8; 36];
        r.emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out[1], 0x60);
        assert_eq!(
            CmaHeaderRepr::parse(&Packet::new_checked(&out[..]).unwrap()),
            Ok(r)
        );
        let mixed = CmaHeaderRepr {
            dst: "10.0.0.1".parse().unwrap(),
            ..r
        };
        assert_eq!(
            mixed.emit(&mut Packet::new_unchecked(&mut out[..])),
            Err(Error::Malformed)
        );
        let mut bad = rping_hdr();
        bad[1] = 0x50;
        assert_eq!(
            CmaHeaderRepr::parse(&Packet::new_checked(&bad[..]).unwrap()),
            Err(Error::Malformed)
        );
        bad = rping_hdr();
        bad[0] = 1;
        assert_eq!(
            CmaHeaderRepr::parse(&Packet::new_checked(&bad[..]).unwrap()),
            Err(Error::Malformed)
        );
        assert_eq!(
            Packet::new_checked(&rping_hdr()[..35]).err(),
            Some(Error::Truncated)
        );
    }

    #[test]
    fn service_ids() {
        assert_eq!(ip_service_id(PortSpace::Tcp, 7174), 0x0000_0000_0106_1c06);
        assert_eq!(ip_service_id(PortSpace::Udp, 1), 0x0000_0000_0111_0001);
        assert_eq!(ip_service_id(PortSpace::Ib, 2), 0x0000_0000_013f_0002);
        assert_eq!(ip_service_id(PortSpace::Ipoib, 3), 0x0000_0000_0002_0003);
        assert_eq!(
            parse_ip_service_id(0x0000_0000_0106_1c06),
            Some((PortSpace::Tcp, 7174))
        );
        assert_eq!(parse_ip_service_id(0x0000_0001_0106_1c06), None);
        assert_eq!(parse_ip_service_id(0x0000_0000_0107_1c06), None);
        for ps in [
            PortSpace::Ipoib,
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
        ] {
            assert_eq!(PortSpace::from_raw(ps.to_raw()), Some(ps));
            assert_eq!(ip_service_id(ps, 0) & !IP_PS_MASK, 0);
        }
    }
}
