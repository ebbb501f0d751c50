//! Ethernet / IPv4 / IPv6 / UDP framing around a RoCEv2 UDP payload, for
//! captures: `build` wraps what the engine sends so tshark sees real frames;
//! `parse` takes a captured frame apart. Neither panics on any input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::icrc::IpUdpInfo;
use crate::{Error, Result};

const ETH_LEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IPPROTO_UDP: u8 = 17;

/// A locally administered MAC derived from an IP address, so the frames of
/// one host always carry the same MAC.
fn mac_for(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(v) => {
            let b = v.octets();
            [0, 0, b[0], b[1], b[2], b[3]]
        }
        IpAddr::V6(v) => {
            let b = v.octets();
            [0, 0, b[12], b[13], b[14], b[15]]
        }
    };
    [0x02, 0x00, o[2], o[3], o[4], o[5]]
}

/// The one's-complement sum of 16-bit words (RFC 1071), not yet inverted.
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Build Ethernet + IPv4 (DF, TTL 64, ID `info.ipv4_id`, correct header
/// checksum, UDP checksum 0 as rxe sends) or IPv6 (hop limit 64, correct
/// UDP checksum, which IPv6 requires) + UDP around `udp_payload`.
pub fn build(info: &IpUdpInfo, udp_payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + udp_payload.len();
    let mut f = Vec::with_capacity(ETH_LEN + 40 + udp_len);
    f.extend_from_slice(&mac_for(info.dst));
    f.extend_from_slice(&mac_for(info.src));
    let mut udp = Vec::with_capacity(udp_len);
    udp.extend_from_slice(&info.src_port.to_be_bytes());
    udp.extend_from_slice(&info.dst_port.to_be_bytes());
    udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(udp_payload);
    match (info.src, info.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&info.ipv4_id.to_be_bytes());
            ip[6..8].copy_from_slice(&info.ipv4_flags_frag.to_be_bytes());
            ip[8] = 64;
            ip[9] = IPPROTO_UDP;
            ip[12..16].copy_from_slice(&s.octets());
            ip[16..20].copy_from_slice(&d.octets());
            let c = !fold(sum16(&ip, 0));
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&ip);
        }
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(v) => v.to_ipv6_mapped(),
                IpAddr::V6(v) => v,
            };
            let (s, d) = (to6(s), to6(d));
            f.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = IPPROTO_UDP;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&s.octets());
            ip[24..40].copy_from_slice(&d.octets());
            // RFC 8200 8.1: the pseudo-header checksum is mandatory over IPv6.
            let mut acc = sum16(&s.octets(), 0);
            acc = sum16(&d.octets(), acc);
            acc += udp_len as u32 + u32::from(IPPROTO_UDP);
            acc = sum16(&udp, acc);
            let c = match !fold(acc) {
                0 => 0xffff,
                c => c,
            };
            udp[6..8].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(&ip);
        }
    }
    f.extend_from_slice(&udp);
    f
}

/// A captured frame taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// Addresses, ports and (IPv4) the real ID and flags.
    pub info: IpUdpInfo,
    pub ip_header: &'a [u8],
    pub udp_header: &'a [u8],
    pub udp_payload: &'a [u8],
}

/// Parse Ethernet (with an optional 802.1Q tag) + IPv4/IPv6 + UDP.
/// `Error::Unsupported` for other protocols or IPv6 extension headers.
pub fn parse(frame: &[u8]) -> Result<ParsedFrame<'_>> {
    let mut off = ETH_LEN;
    let et = |o: usize| -> Result<u16> {
        frame
            .get(o..o + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or(Error::Truncated)
    };
    let mut ethertype = et(12)?;
    if ethertype == ETHERTYPE_VLAN {
        ethertype = et(16)?;
        off += 4;
    }
    let rest = frame.get(off..).ok_or(Error::Truncated)?;
    let (info, ip_len, payload_end) = match ethertype {
        ETHERTYPE_IPV4 => {
            let h = rest.get(..20).ok_or(Error::Truncated)?;
            if h[0] >> 4 != 4 {
                return Err(Error::Malformed);
            }
            let ihl = usize::from(h[0] & 0xf) * 4;
            if ihl < 20 || h[9] != IPPROTO_UDP {
                return Err(if ihl < 20 {
                    Error::Malformed
                } else {
                    Error::Unsupported
                });
            }
            let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
            if total < ihl + 8 || total > rest.len() {
                return Err(Error::Truncated);
            }
            let src = IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15]));
            let dst = IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19]));
            let info = IpUdpInfo {
                src,
                dst,
                src_port: 0,
                dst_port: 0,
                ipv4_id: u16::from_be_bytes([h[4], h[5]]),
                ipv4_flags_frag: u16::from_be_bytes([h[6], h[7]]),
            };
            (info, ihl, total)
        }
        ETHERTYPE_IPV6 => {
            let h = rest.get(..40).ok_or(Error::Truncated)?;
            if h[0] >> 4 != 6 {
                return Err(Error::Malformed);
            }
            if h[6] != IPPROTO_UDP {
                return Err(Error::Unsupported);
            }
            let plen = usize::from(u16::from_be_bytes([h[4], h[5]]));
            if 40 + plen > rest.len() || plen < 8 {
                return Err(Error::Truncated);
            }
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&h[8..24]);
            d.copy_from_slice(&h[24..40]);
            let info = IpUdpInfo {
                src: IpAddr::V6(Ipv6Addr::from(s)),
                dst: IpAddr::V6(Ipv6Addr::from(d)),
                src_port: 0,
                dst_port: 0,
                ipv4_id: 0,
                ipv4_flags_frag: 0,
            };
            (info, 40, 40 + plen)
        }
        _ => return Err(Error::Unsupported),
    };
    let ip_header = &rest[..ip_len];
    let udp_all = &rest[ip_len..payload_end];
    let udp_header = udp_all.get(..8).ok_or(Error::Truncated)?;
    let udp_len = usize::from(u16::from_be_bytes([udp_header[4], udp_header[5]]));
    if udp_len < 8 || udp_len > udp_all.len() {
        return Err(Error::Truncated);
    }
    Ok(ParsedFrame {
        info: IpUdpInfo {
            src_port: u16::from_be_bytes([udp_header[0], udp_header[1]]),
            dst_port: u16::from_be_bytes([udp_header[2], udp_header[3]]),
            ..info
        },
        ip_header,
        udp_header,
        udp_payload: &udp_all[8..udp_len],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_then_parse_v4_and_v6() {
        for (s, d) in [("10.0.0.1", "10.0.0.2"), ("fe80::1", "fe80::2")] {
            let info = IpUdpInfo {
                src: s.parse().unwrap(),
                dst: d.parse().unwrap(),
                src_port: 49441,
                dst_port: 4791,
                ipv4_id: if s.contains('.') { 77 } else { 0 },
                ipv4_flags_frag: if s.contains('.') { 0x4000 } else { 0 },
            };
            let payload = [1u8, 2, 3, 4, 5];
            let f = build(&info, &payload);
            let p = parse(&f).unwrap();
            assert_eq!(p.info, info);
            assert_eq!(p.udp_payload, &payload);
            if s.contains('.') {
                // A correct IPv4 header checksums to zero.
                assert_eq!(fold(sum16(p.ip_header, 0)), 0xffff);
            }
        }
    }

    #[test]
    fn garbage_is_rejected() {
        assert_eq!(parse(&[]), Err(Error::Truncated));
        assert!(parse(&[0u8; 14]).is_err());
        let mut f = build(
            &IpUdpInfo {
                src: "10.0.0.1".parse().unwrap(),
                dst: "10.0.0.2".parse().unwrap(),
                src_port: 1,
                dst_port: 4791,
                ipv4_id: 0,
                ipv4_flags_frag: 0x4000,
            },
            &[0; 16],
        );
        f[16] = 0xff; // total length larger than the frame
        assert_eq!(parse(&f), Err(Error::Truncated));
    }
}
