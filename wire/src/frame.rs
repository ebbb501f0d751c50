//! Ethernet / IPv4 / IPv6 / UDP framing around a RoCEv2 UDP payload, for
//! captures only: [`build`] wraps what the engine sends so tshark and the
//! ICRC checkers see the frames kernel rxe would put on the wire; [`parse`]
//! takes a captured frame apart. Neither panics on any input.
//!
//! For IPv4 `build` reproduces kernel rxe's IP and UDP headers byte for
//! byte (the capture tests check it on every reference packet): version 4,
//! IHL 5, TOS 0, DF, TTL 64, the ID given, a correct header checksum, and
//! UDP checksum 0, which kernel rxe always sends over IPv4.
//!
//! [`build_with_tos`] and [`build_ecn`] put another TOS (IPv4) or traffic
//! class (IPv6) byte in the frame, e.g. an ECN codepoint ([`crate::Ecn`])
//! for congestion control; [`ParsedFrame::tos`] reads it back. The ICRC
//! masks that byte, so it is the same whatever the codepoint.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::icrc::IpUdpInfo;
use crate::{Error, Result};

/// Length of an Ethernet II header.
pub const ETHERNET_LEN: usize = 14;
/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Ethertype of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// The TTL / hop limit kernel rxe's packets leave with (the reference
/// captures: every packet has TTL 64).
pub const DEFAULT_TTL: u8 = 64;

/// IPv4 "more fragments" flag and fragment offset bits.
const IPV4_MF_AND_OFFSET: u16 = 0x3fff;

/// A locally administered unicast MAC (02:00:...) derived from the low 4
/// bytes of an IP address, so the frames of one host always carry the same
/// MAC and tshark's conversation views pair them up.
pub fn mac_for(ip: IpAddr) -> [u8; 6] {
    let low = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x00, low[0], low[1], low[2], low[3]]
}

/// One's-complement sum of 16-bit big-endian words (RFC 1071), not yet
/// folded or inverted.
fn sum16(data: &[u8], mut acc: u32) -> u32 {
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// Fold a one's-complement sum to 16 bits.
fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Build Ethernet + IPv4 (DF as `info.ipv4_flags_frag` says, TTL 64, ID
/// `info.ipv4_id`, correct header checksum, UDP checksum 0) or IPv6 (hop
/// limit 64, a correct UDP checksum, which IPv6 requires: RFC 8200 8.1) +
/// UDP around `udp_payload`. IPv6 is used unless both addresses are IPv4;
/// an IPv4 address then stands for its IPv4-mapped IPv6 form. MACs come
/// from [`mac_for`].
pub fn build(info: &IpUdpInfo, udp_payload: &[u8]) -> Vec<u8> {
    build_with_tos(info, 0, udp_payload)
}

/// [`build`] with the ECN codepoint `ecn` and DSCP 0 in the TOS / traffic
/// class; `Ecn::NotEct` gives exactly [`build`]'s bytes.
pub fn build_ecn(info: &IpUdpInfo, ecn: crate::Ecn, udp_payload: &[u8]) -> Vec<u8> {
    build_with_tos(info, ecn.tos(0), udp_payload)
}

/// [`build`] with `tos` (DSCP << 2 | ECN) as the IPv4 TOS byte or the IPv6
/// traffic class; `tos` 0 gives exactly [`build`]'s bytes.
pub fn build_with_tos(info: &IpUdpInfo, tos: u8, udp_payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + udp_payload.len();
    let mut frame = Vec::with_capacity(ETHERNET_LEN + 40 + udp_len);
    frame.extend_from_slice(&mac_for(info.dst));
    frame.extend_from_slice(&mac_for(info.src));
    let mut udp = Vec::with_capacity(udp_len);
    udp.extend_from_slice(&info.src_port.to_be_bytes());
    udp.extend_from_slice(&info.dst_port.to_be_bytes());
    udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(udp_payload);
    match (info.src, info.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            frame.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[1] = tos;
            ip[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&info.ipv4_id.to_be_bytes());
            ip[6..8].copy_from_slice(&info.ipv4_flags_frag.to_be_bytes());
            ip[8] = DEFAULT_TTL;
            ip[9] = IPPROTO_UDP;
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            let checksum = !fold(sum16(&ip, 0));
            ip[10..12].copy_from_slice(&checksum.to_be_bytes());
            frame.extend_from_slice(&ip);
        }
        (src, dst) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            let (src, dst) = (v6(src), v6(dst));
            frame.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            let mut ip = [0u8; 40];
            // Version 6, traffic class across the two nibbles, flow label 0.
            ip[0] = 0x60 | (tos >> 4);
            ip[1] = tos << 4;
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = IPPROTO_UDP;
            ip[7] = DEFAULT_TTL;
            ip[8..24].copy_from_slice(&src.octets());
            ip[24..40].copy_from_slice(&dst.octets());
            // Pseudo-header (addresses, length, next header) + UDP.
            let mut acc = sum16(&src.octets(), 0);
            acc = sum16(&dst.octets(), acc);
            acc += udp_len as u32 + u32::from(IPPROTO_UDP);
            acc = sum16(&udp, acc);
            let checksum = match !fold(acc) {
                0 => 0xffff, // RFC 768: a computed 0 is sent as all ones
                c => c,
            };
            udp[6..8].copy_from_slice(&checksum.to_be_bytes());
            frame.extend_from_slice(&ip);
        }
    }
    frame.extend_from_slice(&udp);
    frame
}

/// A captured frame taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    /// Addresses and ports, and for IPv4 the real ID and flags: what
    /// [`crate::icrc::compute`] needs.
    pub info: IpUdpInfo,
    /// The whole IP header (with IPv4 options, if any).
    pub ip_header: &'a [u8],
    /// The 8-byte UDP header.
    pub udp_header: &'a [u8],
    /// The UDP payload, by the UDP length (Ethernet padding excluded).
    pub udp_payload: &'a [u8],
    /// The IPv4 TOS byte or the IPv6 traffic class: DSCP << 2 | ECN.
    pub tos: u8,
}

impl ParsedFrame<'_> {
    /// The ECN codepoint of the IP header.
    pub fn ecn(&self) -> crate::Ecn {
        crate::Ecn::from_tos(self.tos)
    }

    /// The DSCP (the 6 bits above the ECN field).
    pub fn dscp(&self) -> u8 {
        self.tos >> 2
    }
}

/// A big-endian u16 at `at`, or `Truncated`.
fn be16(bytes: &[u8], at: usize) -> Result<u16> {
    match bytes.get(at..at + 2) {
        Some(&[hi, lo]) => Ok(u16::from_be_bytes([hi, lo])),
        _ => Err(Error::Truncated),
    }
}

/// Parse Ethernet (with at most one 802.1Q tag) + IPv4/IPv6 + UDP.
///
/// `Error::Truncated` when a length field points past the frame;
/// `Error::Malformed` for an IP version that contradicts the ethertype or
/// an IPv4 IHL below 5; `Error::Unsupported` for other ethertypes, non-UDP
/// protocols, IPv4 fragments and IPv6 extension headers. The UDP port is
/// not checked: callers decide what 4791 means to them.
pub fn parse(frame: &[u8]) -> Result<ParsedFrame<'_>> {
    let mut ip_at = ETHERNET_LEN;
    let mut ethertype = be16(frame, 12)?;
    if ethertype == ETHERTYPE_VLAN {
        ethertype = be16(frame, 16)?;
        ip_at += 4;
    }
    let packet = frame.get(ip_at..).ok_or(Error::Truncated)?;
    let (info, ip_len, ip_end, tos) = match ethertype {
        ETHERTYPE_IPV4 => {
            let h: &[u8; 20] = packet
                .get(..20)
                .and_then(|h| h.try_into().ok())
                .ok_or(Error::Truncated)?;
            let ihl = usize::from(h[0] & 0x0f) * 4;
            if h[0] >> 4 != 4 || ihl < 20 {
                return Err(Error::Malformed);
            }
            let flags_frag = u16::from_be_bytes([h[6], h[7]]);
            if h[9] != IPPROTO_UDP || flags_frag & IPV4_MF_AND_OFFSET != 0 {
                return Err(Error::Unsupported);
            }
            let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
            if total < ihl || total > packet.len() {
                return Err(Error::Truncated);
            }
            let info = IpUdpInfo {
                src: IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
                dst: IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
                src_port: 0,
                dst_port: 0,
                ipv4_id: u16::from_be_bytes([h[4], h[5]]),
                ipv4_flags_frag: flags_frag,
            };
            (info, ihl, total, h[1])
        }
        ETHERTYPE_IPV6 => {
            let h: &[u8; 40] = packet
                .get(..40)
                .and_then(|h| h.try_into().ok())
                .ok_or(Error::Truncated)?;
            if h[0] >> 4 != 6 {
                return Err(Error::Malformed);
            }
            if h[6] != IPPROTO_UDP {
                return Err(Error::Unsupported);
            }
            let payload_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
            if 40 + payload_len > packet.len() {
                return Err(Error::Truncated);
            }
            let addr = |at: usize| {
                let mut a = [0u8; 16];
                a.copy_from_slice(&h[at..at + 16]);
                IpAddr::V6(Ipv6Addr::from(a))
            };
            let info = IpUdpInfo {
                src: addr(8),
                dst: addr(24),
                src_port: 0,
                dst_port: 0,
                ipv4_id: 0,
                ipv4_flags_frag: 0,
            };
            (info, 40, 40 + payload_len, (h[0] << 4) | (h[1] >> 4))
        }
        _ => return Err(Error::Unsupported),
    };
    let ip_header = packet.get(..ip_len).ok_or(Error::Truncated)?;
    let datagram = packet.get(ip_len..ip_end).ok_or(Error::Truncated)?;
    let udp_header = datagram.get(..8).ok_or(Error::Truncated)?;
    let udp_len = usize::from(be16(udp_header, 4)?);
    if udp_len < 8 {
        return Err(Error::Malformed);
    }
    let udp_payload = datagram.get(8..udp_len).ok_or(Error::Truncated)?;
    Ok(ParsedFrame {
        info: IpUdpInfo {
            src_port: be16(udp_header, 0)?,
            dst_port: be16(udp_header, 2)?,
            ..info
        },
        ip_header,
        udp_header,
        udp_payload,
        tos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(src: &str, dst: &str) -> IpUdpInfo {
        let v4 = src.contains('.') && dst.contains('.');
        IpUdpInfo {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            src_port: 49441,
            dst_port: 4791,
            ipv4_id: if v4 { 0x8b97 } else { 0 },
            ipv4_flags_frag: if v4 { 0x4000 } else { 0 },
        }
    }

    /// The first ACK of rc_send_recv.pcap, as captured (MACs from QEMU).
    const CAPTURED_ACK: [u8; 62] = [
        0x52, 0x54, 0x00, 0x77, 0x00, 0x0c, 0x52, 0x54, 0x00, 0x77, 0x00, 0x0b, 0x08,
        0x00, // Ethernet
        0x45, 0x00, 0x00, 0x30, 0x8b, 0x97, 0x40, 0x00, 0x40, 0x11, 0x9a, 0x75, 0x0a, 0x4d, 0x00,
        0x0b, 0x0a, 0x4d, 0x00, 0x0c, // IPv4
        0xc1, 0x21, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, // UDP
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0xac, 0x66, 0x82, 0x1f, 0x00, 0x00,
        0x01, 0x96, 0x5b, 0x52, 0x6d, // BTH, AETH, ICRC
    ];

    #[test]
    fn parse_a_captured_frame() {
        let f = parse(&CAPTURED_ACK).unwrap();
        assert_eq!(f.info, info("10.77.0.11", "10.77.0.12"));
        assert_eq!(f.ip_header, &CAPTURED_ACK[14..34]);
        assert_eq!(f.udp_header, &CAPTURED_ACK[34..42]);
        assert_eq!(f.udp_payload, &CAPTURED_ACK[42..]);
    }

    #[test]
    fn build_reproduces_kernel_ip_and_udp_headers() {
        let f = build(&info("10.77.0.11", "10.77.0.12"), &CAPTURED_ACK[42..]);
        assert_eq!(&f[12..], &CAPTURED_ACK[12..], "all but the MACs");
        assert_eq!(&f[..6], &[0x02, 0x00, 10, 77, 0, 12]);
        // A correct IPv4 header sums to all ones.
        assert_eq!(fold(sum16(&f[14..34], 0)), 0xffff);
    }

    #[test]
    fn build_then_parse_v4_v6_and_mixed() {
        let payload = [1u8, 2, 3, 4, 5];
        for (s, d) in [
            ("10.0.0.1", "10.0.0.2"),
            ("fe80::1", "fe80::2"),
            ("10.0.0.1", "fe80::2"),
        ] {
            let i = info(s, d);
            let f = build(&i, &payload);
            let p = parse(&f).unwrap();
            assert_eq!(p.udp_payload, &payload);
            if s.contains('.') && d.contains('.') {
                assert_eq!(p.info, i);
            } else {
                assert_eq!(f[12..14], [0x86, 0xdd]);
                assert_eq!((p.info.src_port, p.info.dst_port), (49441, 4791));
                // The UDP checksum over the pseudo-header verifies.
                let (src, dst) = (&p.ip_header[8..24], &p.ip_header[24..40]);
                let mut acc = sum16(src, sum16(dst, 0));
                acc += 8 + payload.len() as u32 + 17;
                acc = sum16(p.udp_header, sum16(p.udp_payload, acc));
                assert_eq!(fold(acc), 0xffff);
            }
        }
    }

    #[test]
    fn ecn_codepoints_in_ipv4_and_ipv6() {
        use crate::Ecn;
        let payload = &CAPTURED_ACK[42..];
        for (s, d) in [("10.77.0.11", "10.77.0.12"), ("fe80::1", "fe80::2")] {
            let i = info(s, d);
            let plain = build(&i, payload);
            // The default stays byte for byte what it was: TOS 0.
            assert_eq!(build_ecn(&i, Ecn::NotEct, payload), plain);
            assert_eq!(build_with_tos(&i, 0, payload), plain);
            assert_eq!(parse(&plain).unwrap().ecn(), Ecn::NotEct);
            for ecn in [Ecn::Ect1, Ecn::Ect0, Ecn::Ce] {
                let f = build_ecn(&i, ecn, payload);
                let p = parse(&f).unwrap();
                assert_eq!((p.ecn(), p.dscp(), p.tos), (ecn, 0, ecn.bits()));
                assert_eq!(p.udp_payload, payload);
                if s.contains('.') {
                    assert_eq!(f[15], ecn.bits(), "IPv4 TOS byte");
                    assert_eq!(fold(sum16(&f[14..34], 0)), 0xffff, "IP checksum");
                } else {
                    assert_eq!((f[14], f[15]), (0x60, ecn.bits() << 4), "IPv6 TC");
                }
            }
            // DSCP and ECN together, split across IPv6's nibbles.
            let p = parse(&build_with_tos(&i, Ecn::Ect0.tos(26), payload))
                .unwrap()
                .tos;
            assert_eq!(p, 106);
        }
    }

    /// A switch that marks CE rewrites the TOS / traffic class (and the
    /// IPv4 header checksum) and nothing else; RoCEv2's ICRC masks that
    /// byte, so the marked packet still verifies at the receiver.
    #[test]
    fn ce_marking_keeps_the_icrc() {
        use crate::icrc::{check, compute_from_headers, stored};
        use crate::Ecn;
        // IPv4: the captured ACK, sent ECT(0), then marked on the way.
        let i = info("10.77.0.11", "10.77.0.12");
        let roce = &CAPTURED_ACK[42..];
        let icrc = stored(roce).unwrap();
        let sent = build_ecn(&i, Ecn::Ect0, roce);
        let mut marked = sent.clone();
        marked[15] |= Ecn::Ce.bits();
        marked[24..26].fill(0);
        let sum = !fold(sum16(&marked[14..34], 0));
        marked[24..26].copy_from_slice(&sum.to_be_bytes());
        let p = parse(&marked).unwrap();
        assert_eq!(p.ecn(), Ecn::Ce);
        let body = &p.udp_payload[..p.udp_payload.len() - 4];
        assert_eq!(
            compute_from_headers(p.ip_header, p.udp_header, body),
            Ok(icrc)
        );
        assert!(check(&p.info, p.udp_payload));
        // IPv6: the same with the traffic class.
        let i6 = info("fe80::1", "fe80::2");
        let mut pkt = roce.to_vec();
        crate::icrc::write(&i6, &mut pkt);
        let mut f = build_ecn(&i6, Ecn::Ect0, &pkt);
        f[15] |= Ecn::Ce.bits() << 4;
        let p = parse(&f).unwrap();
        assert_eq!(p.ecn(), Ecn::Ce);
        let body = &p.udp_payload[..p.udp_payload.len() - 4];
        assert_eq!(
            compute_from_headers(p.ip_header, p.udp_header, body),
            Ok(stored(&pkt).unwrap())
        );
    }

    #[test]
    fn vlan_tag_and_ethernet_padding() {
        let mut f = build(&info("10.0.0.1", "10.0.0.2"), &[9u8; 4]);
        f.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
        f.extend_from_slice(&[0xee; 10]); // padding to the minimum frame
        let p = parse(&f).unwrap();
        assert_eq!(p.udp_payload, &[9u8; 4]);
    }

    #[test]
    fn garbage_is_rejected() {
        assert_eq!(parse(&[]), Err(Error::Truncated));
        assert_eq!(parse(&[0u8; 14]), Err(Error::Unsupported));
        let good = build(&info("10.0.0.1", "10.0.0.2"), &[0; 16]);
        let bad = |at: usize, v: u8| {
            let mut f = good.clone();
            f[at] = v;
            parse(&f).map(|_| ())
        };
        assert_eq!(bad(16, 0xff), Err(Error::Truncated), "total length");
        assert_eq!(bad(14, 0x44), Err(Error::Malformed), "IHL 4");
        assert_eq!(bad(14, 0x65), Err(Error::Malformed), "version 6");
        assert_eq!(bad(23, 6), Err(Error::Unsupported), "TCP");
        assert_eq!(bad(20, 0x20), Err(Error::Unsupported), "more fragments");
        assert_eq!(bad(39, 0xff), Err(Error::Truncated), "UDP length");
        assert_eq!(bad(39, 0x07), Err(Error::Malformed), "UDP length < 8");
        assert_eq!(parse(&good[..good.len() - 1]), Err(Error::Truncated));
        assert_eq!(parse(&good[..30]), Err(Error::Truncated));
        let v6 = build(&info("fe80::1", "fe80::2"), &[0; 16]);
        let mut ext = v6.clone();
        ext[20] = 0; // hop-by-hop options
        assert_eq!(parse(&ext), Err(Error::Unsupported));
        assert_eq!(parse(&v6[..50]), Err(Error::Truncated));
    }
}
