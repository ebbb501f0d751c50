//! The RoCEv2 invariant CRC (IBTA Annex A17, RoCEv2; kernel `rxe_icrc.c`).
//!
//! The ICRC is a CRC-32 (the zlib/Ethernet polynomial) over the parts of a
//! packet that no router may change:
//!
//! 1. 8 bytes of 0xff standing for the masked InfiniBand LRH (kernel rxe
//!    starts from the CRC state they produce, `0xdebb20e3`);
//! 2. the IP header with the fields routers rewrite set to all ones: IPv4
//!    TOS, TTL and header checksum; IPv6 traffic class, flow label and hop
//!    limit;
//! 3. the UDP header with its checksum set to 0xffff;
//! 4. the BTH with byte 4 (FECN, BECN, 6 reserved bits) set to 0xff;
//! 5. everything after the BTH up to the ICRC: extension headers, payload
//!    and pad.
//!
//! The result is stored inverted (the standard CRC-32 final XOR), in
//! little-endian byte order: kernel rxe writes the `u32` in host order, and
//! every reference capture (x86_64) has it little-endian.
//!
//! One exception, kernel rxe's and so ours: a FLUSH (opcode 0x1C). Kernel
//! rxe's opcode table (`rxe_opcode.c`, 6.2 to 7.2 at least) gives FLUSH
//! no payload offset, so `rxe_icrc_check`/`rxe_icrc_generate` take its
//! "payload" from the first byte of the BTH: after the 32 header bytes
//! (BTH masked as above, FETH, RETH) the CRC covers the whole packet again,
//! unmasked. Found by the interop suite (Linux 6.12 and 7.2 rejected every
//! IBTA-correct FLUSH and sent only such ICRCs). [`compute`] and [`write`]
//! give a FLUSH kernel rxe's ICRC, so kernel rxe takes our FLUSHes;
//! [`check`] and [`solve_ipv4_id`] accept either form; [`compute_ibta`]
//! is the IBTA form.
//!
//! Over a UDP socket a user-space device does not see the IP header; the
//! addresses and ports come from the socket, but the IPv4 identification
//! field, which the ICRC covers, is hidden. [`solve_ipv4_id`] recovers it
//! from the ICRC itself.

use std::net::{IpAddr, Ipv6Addr};

use crate::{Error, Result, ICRC_LEN};

/// The IP and UDP header fields the ICRC covers, for a packet whose real
/// headers are not at hand (one received from, or about to be given to, a
/// UDP socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpUdpInfo {
    /// Source address. If both addresses are IPv4 the packet is IPv4;
    /// otherwise it is IPv6, and an IPv4 address stands for its
    /// IPv4-mapped IPv6 form.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// UDP source port (kernel rxe: `0xc000 | hash(QPN)`, per QP).
    pub src_port: u16,
    /// UDP destination port ([`crate::ROCEV2_UDP_PORT`]).
    pub dst_port: u16,
    /// IPv4 identification (unused for IPv6). Kernel rxe takes it from the
    /// IP stack's per-socket counter, so it varies from packet to packet.
    pub ipv4_id: u16,
    /// IPv4 flags and fragment offset (unused for IPv6); 0x4000 (DF) from
    /// kernel rxe.
    pub ipv4_flags_frag: u16,
}

/// Bytes of the CRC stream before the BTH: LRH stand-in, IPv6 header at
/// most, UDP header.
const MAX_PREFIX: usize = 8 + 40 + 8;

/// The masked stand-in for the LRH.
const MASKED_LRH: [u8; 8] = [0xff; 8];

/// Bytes of the CRC stream after the IPv4 identification (bytes 4-5 of
/// the IPv4 header) and before the BTH: the rest of the 20-byte IPv4
/// header and the UDP header.
const AFTER_IPV4_ID: usize = 20 - 6 + 8;

/// The masked IP and UDP headers of `info`, preceded by the LRH stand-in,
/// for a RoCE packet of `roce_len` bytes without its ICRC. Returns the
/// buffer and how much of it is used.
fn masked_prefix(info: &IpUdpInfo, roce_len: usize) -> ([u8; MAX_PREFIX], usize) {
    // UDP and IP lengths count the ICRC. They are 16-bit fields; a longer
    // "datagram" cannot exist, so truncation only affects nonsense input.
    let udp_len = (8 + roce_len + ICRC_LEN) as u16;
    let mut b = [0u8; MAX_PREFIX];
    b[..8].copy_from_slice(&MASKED_LRH);
    let udp_at = match (info.src, info.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let ip = &mut b[8..28];
            ip[0] = 0x45; // version 4, IHL 5: kernel rxe sends no options
            ip[1] = 0xff; // TOS, masked
            ip[2..4].copy_from_slice(&(20u16.wrapping_add(udp_len)).to_be_bytes());
            ip[4..6].copy_from_slice(&info.ipv4_id.to_be_bytes());
            ip[6..8].copy_from_slice(&info.ipv4_flags_frag.to_be_bytes());
            ip[8] = 0xff; // TTL, masked
            ip[9] = 17; // UDP
            ip[10..12].copy_from_slice(&[0xff, 0xff]); // header checksum, masked
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            28
        }
        (src, dst) => {
            let v6 = |a: IpAddr| -> Ipv6Addr {
                match a {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                    IpAddr::V6(v6) => v6,
                }
            };
            let ip = &mut b[8..48];
            // Version 6; traffic class and flow label, masked.
            ip[..4].copy_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
            ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
            ip[6] = 17; // next header: UDP, no extension headers
            ip[7] = 0xff; // hop limit, masked
            ip[8..24].copy_from_slice(&v6(src).octets());
            ip[24..40].copy_from_slice(&v6(dst).octets());
            48
        }
    };
    let udp = &mut b[udp_at..udp_at + 8];
    udp[0..2].copy_from_slice(&info.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&info.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].copy_from_slice(&[0xff, 0xff]); // checksum, masked
    (b, udp_at + 8)
}

/// Feed the RoCE part (BTH onwards, without the ICRC) to the CRC, with BTH
/// byte 4 masked (kernel: `bth->qpn |= cpu_to_be32(~BTH_QPN_MASK)`).
fn update_roce(h: &mut crc32fast::Hasher, roce: &[u8]) {
    match roce.split_at_checked(5) {
        Some((head, tail)) => {
            h.update(&head[..4]);
            h.update(&[0xff]);
            h.update(tail);
        }
        None => h.update(roce),
    }
}

/// Opcode of a FLUSH request (IBTA Annex A19).
const OPCODE_RC_FLUSH: u8 = 0x1c;
/// BTH + FETH + RETH: kernel rxe's `rxe_opcode[IB_OPCODE_RC_FLUSH].length`.
const FLUSH_HEADERS: usize = 12 + 4 + 16;

/// Whether kernel rxe's FLUSH rule applies to `roce` (see the module
/// documentation): a FLUSH with at least its headers.
fn kernel_flush(roce: &[u8]) -> bool {
    roce.first() == Some(&OPCODE_RC_FLUSH) && roce.len() >= FLUSH_HEADERS
}

/// Feed the RoCE part to the CRC as kernel rxe does (`ibta`: as IBTA
/// says; they differ only for a FLUSH).
fn update_packet(h: &mut crc32fast::Hasher, roce: &[u8], ibta: bool) {
    if !ibta && kernel_flush(roce) {
        update_roce(h, &roce[..FLUSH_HEADERS]);
        h.update(roce);
    } else {
        update_roce(h, roce);
    }
}

/// Bytes of the CRC stream from the BTH on.
fn stream_len(roce: &[u8], ibta: bool) -> usize {
    if !ibta && kernel_flush(roce) {
        FLUSH_HEADERS + roce.len()
    } else {
        roce.len()
    }
}

/// The ICRC of a packet, over reconstructed and masked IPv4 (IHL 5,
/// protocol 17) or IPv6 (next header 17, no extension headers) and UDP
/// headers, as kernel rxe computes it (a FLUSH's differs from IBTA's: see
/// the module documentation). `roce` is the UDP payload without the
/// trailing ICRC; the IP and UDP length fields are derived from
/// `roce.len() + 4`.
pub fn compute(info: &IpUdpInfo, roce: &[u8]) -> u32 {
    compute_as(info, roce, false)
}

/// The ICRC as IBTA defines it: the same as [`compute`] but for a FLUSH.
pub fn compute_ibta(info: &IpUdpInfo, roce: &[u8]) -> u32 {
    compute_as(info, roce, true)
}

fn compute_as(info: &IpUdpInfo, roce: &[u8], ibta: bool) -> u32 {
    let (prefix, n) = masked_prefix(info, roce.len());
    let mut h = crc32fast::Hasher::new();
    h.update(&prefix[..n]);
    update_packet(&mut h, roce, ibta);
    h.finalize()
}

/// The ICRC from a packet's real header bytes, as in a capture:
/// `ip_header` is an IPv4 header (options allowed, though kernel rxe sends
/// none) or a 40-byte IPv6 header, `udp_header` the 8-byte UDP header,
/// `roce` the UDP payload without its ICRC. The lengths come from the
/// headers, not from `roce`, so a capture is checked as it was sent.
///
/// `Error::Truncated` if the UDP header or `roce` (less than a BTH) is
/// short; `Error::Malformed` if `ip_header` is neither a whole IPv4 header
/// (by its IHL) nor a 40-byte IPv6 header.
pub fn compute_from_headers(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32> {
    let udp: &[u8; 8] = match udp_header.len() {
        n if n < 8 => return Err(Error::Truncated),
        _ => udp_header.try_into().map_err(|_| Error::Malformed)?,
    };
    if roce.len() < crate::bth::HEADER_LEN {
        return Err(Error::Truncated);
    }
    let mut ip = [0u8; 60];
    let ip = match ip_header
        .first()
        .map(|b| (b >> 4, usize::from(b & 0xf) * 4))
    {
        Some((4, ihl)) if ihl >= 20 && ip_header.len() == ihl => {
            let ip = &mut ip[..ihl];
            ip.copy_from_slice(ip_header);
            ip[1] = 0xff; // TOS
            ip[8] = 0xff; // TTL
            ip[10..12].copy_from_slice(&[0xff, 0xff]); // header checksum
            ip
        }
        Some((6, _)) if ip_header.len() == 40 => {
            let ip = &mut ip[..40];
            ip.copy_from_slice(ip_header);
            ip[0] |= 0x0f; // traffic class ...
            ip[1..4].copy_from_slice(&[0xff, 0xff, 0xff]); // ... and flow label
            ip[7] = 0xff; // hop limit
            ip
        }
        _ => return Err(Error::Malformed),
    };
    let mut masked_udp = *udp;
    masked_udp[6..8].copy_from_slice(&[0xff, 0xff]);
    let mut h = crc32fast::Hasher::new();
    h.update(&MASKED_LRH);
    h.update(ip);
    h.update(&masked_udp);
    update_packet(&mut h, roce, false);
    Ok(h.finalize())
}

/// Compute the ICRC of `udp_payload` (whose last 4 bytes are the ICRC's
/// place, e.g. as left zero by [`crate::PacketRepr::emit`]) and store it
/// there, little-endian. A buffer shorter than 4 bytes is left alone.
pub fn write(info: &IpUdpInfo, udp_payload: &mut [u8]) {
    let Some(at) = udp_payload.len().checked_sub(ICRC_LEN) else {
        return;
    };
    let (roce, icrc) = udp_payload.split_at_mut(at);
    icrc.copy_from_slice(&compute(info, roce).to_le_bytes());
}

/// The ICRC stored in the last 4 bytes of `udp_payload`, or `None` if it
/// is shorter than that.
pub fn stored(udp_payload: &[u8]) -> Option<u32> {
    let at = udp_payload.len().checked_sub(ICRC_LEN)?;
    let icrc: [u8; ICRC_LEN] = udp_payload.get(at..)?.try_into().ok()?;
    Some(u32::from_le_bytes(icrc))
}

/// Whether the ICRC of a received UDP payload (ending with its ICRC) is
/// right for `info`, in kernel rxe's form or IBTA's (they differ only for
/// a FLUSH). False for a buffer shorter than the ICRC.
pub fn check(info: &IpUdpInfo, udp_payload: &[u8]) -> bool {
    match (stored(udp_payload), udp_payload.len().checked_sub(ICRC_LEN)) {
        (Some(icrc), Some(at)) => udp_payload.get(..at).is_some_and(|roce| {
            compute(info, roce) == icrc || (kernel_flush(roce) && compute_ibta(info, roce) == icrc)
        }),
        _ => false,
    }
}

/// The reflected CRC-32 polynomial (zlib, Ethernet, kernel `crc32_le`).
const POLY: u32 = 0xedb8_8320;

/// A linear map on the 32-bit CRC register over GF(2): entry `i` is the
/// image of bit `i`.
type Gf2Map = [u32; 32];

/// The register after one more zero bit, with a zero initial value and no
/// final XOR (the linear part of the CRC).
const fn zero_bit(r: u32) -> u32 {
    if r & 1 == 1 {
        (r >> 1) ^ POLY
    } else {
        r >> 1
    }
}

/// Apply `m` to `v`.
const fn apply(m: &Gf2Map, v: u32) -> u32 {
    let mut out = 0;
    let mut i = 0;
    while i < 32 {
        if (v >> i) & 1 == 1 {
            out ^= m[i];
        }
        i += 1;
    }
    out
}

/// Bit `j` of a byte count selects `ZERO_BYTES[j]`, the map "append 2^j
/// zero bytes" on the register; 17 of them cover any UDP datagram.
const ZERO_BYTES_MAPS: usize = 17;

/// `ZERO_BYTES[j]` appends 2^j zero bytes, computed at compile time by
/// squaring the one-byte map (the method of zlib's `crc32_combine`).
static ZERO_BYTES: [Gf2Map; ZERO_BYTES_MAPS] = {
    let mut maps = [[0u32; 32]; ZERO_BYTES_MAPS];
    let mut i = 0;
    while i < 32 {
        let mut r = 1u32 << i;
        let mut bit = 0;
        while bit < 8 {
            r = zero_bit(r);
            bit += 1;
        }
        maps[0][i] = r;
        i += 1;
    }
    let mut j = 1;
    while j < ZERO_BYTES_MAPS {
        let mut i = 0;
        while i < 32 {
            maps[j][i] = apply(&maps[j - 1], maps[j - 1][i]);
            i += 1;
        }
        j += 1;
    }
    maps
};

/// The linear CRC contribution of `bytes` followed by `zeros` zero bytes
/// (`zeros < 2^17`).
fn contribution(bytes: &[u8], zeros: usize) -> u32 {
    let mut r = 0u32;
    for b in bytes {
        r ^= u32::from(*b);
        for _ in 0..8 {
            r = zero_bit(r);
        }
    }
    for (j, map) in ZERO_BYTES.iter().enumerate() {
        if (zeros >> j) & 1 == 1 {
            r = apply(map, r);
        }
    }
    r
}

/// The CRC contribution of each of the 16 IPv4 ID bits (bit `b` of the
/// ID value) to the ICRC of a packet with `roce_len` bytes before its
/// ICRC. It depends only on that length: the ID bit is followed by the
/// rest of the headers and the packet.
fn ipv4_id_basis(roce_len: usize) -> [u32; 16] {
    let zeros = AFTER_IPV4_ID + roce_len;
    let mut basis = [0u32; 16];
    for (b, col) in basis.iter_mut().enumerate() {
        *col = contribution(&(1u16 << b).to_be_bytes(), zeros);
    }
    basis
}

/// For an IPv4 packet received through a UDP socket, which hides the IP
/// identification that the ICRC covers: the ID that makes the stored ICRC
/// right, if there is one. `info.ipv4_id` is ignored; every other field of
/// `info` must be the packet's.
///
/// CRC-32 is affine over GF(2): `icrc(id) = icrc(0) ^ L(id)`, with `L`
/// linear in the 16 ID bits, its 16 columns the CRC contributions of each
/// bit. Those depend only on the packet length. Solving the 32x16 system
/// `L(id) = stored ^ icrc(0)` exactly gives:
///
/// - `Some(id)` if a solution exists: the packet is then verified except
///   for the 16 ID bits (CRC-32 detects every error burst of 32 bits or
///   less, so the columns are independent and the ID is unique);
/// - `None` if no ID fits, i.e. the packet is corrupt (all but about 1 in
///   65536 corruptions are caught this way), and for IPv6 (no ID: use
///   [`check`]) or a buffer that cannot be a RoCE datagram.
pub fn solve_ipv4_id(info: &IpUdpInfo, udp_payload: &[u8]) -> Option<u16> {
    if !matches!((info.src, info.dst), (IpAddr::V4(_), IpAddr::V4(_))) {
        return None;
    }
    let icrc = stored(udp_payload)?;
    let roce = udp_payload.get(..udp_payload.len().checked_sub(ICRC_LEN)?)?;
    if udp_payload.len() > usize::from(u16::MAX) - 8 {
        return None; // longer than any UDP datagram
    }
    let id0 = IpUdpInfo {
        ipv4_id: 0,
        ..*info
    };
    // Kernel rxe's form, then (a FLUSH only) IBTA's.
    let forms: &[bool] = if kernel_flush(roce) {
        &[false, true]
    } else {
        &[false]
    };
    forms.iter().find_map(|&ibta| {
        let base = compute_as(&id0, roce, ibta);
        if base == icrc {
            // The common case (a UDP socket with DF set, as rxe-emu's
            // are, sends ID 0): no system to solve. Kernel rxe picks real
            // IDs.
            return Some(0);
        }
        solve_gf2(&ipv4_id_basis(stream_len(roce, ibta)), icrc ^ base)
    })
}

/// Solve `sum(id_b * basis[b]) = target` over GF(2) for the 16 bits of
/// `id`, by Gauss-Jordan elimination on the 32 equations (one per CRC
/// bit). `None` if the system is inconsistent.
fn solve_gf2(basis: &[u32; 16], target: u32) -> Option<u16> {
    const RHS: u32 = 1 << 16;
    // Row r: bit b set if ID bit b flips CRC bit r; RHS: CRC bit r of target.
    let mut rows = [0u32; 32];
    for (r, row) in rows.iter_mut().enumerate() {
        for (b, col) in basis.iter().enumerate() {
            *row |= ((col >> r) & 1) << b;
        }
        *row |= ((target >> r) & 1) << 16;
    }
    let mut pivot_row = [None; 16];
    let mut rank = 0;
    for (b, pivot) in pivot_row.iter_mut().enumerate() {
        let Some(p) = (rank..32).find(|&i| (rows[i] >> b) & 1 == 1) else {
            continue; // a free variable (never, for CRC-32): take 0
        };
        rows.swap(rank, p);
        let pr = rows[rank];
        for (i, row) in rows.iter_mut().enumerate() {
            if i != rank && (*row >> b) & 1 == 1 {
                *row ^= pr;
            }
        }
        *pivot = Some(rank);
        rank += 1;
    }
    if rows.iter().any(|row| row & 0xffff == 0 && row & RHS != 0) {
        return None;
    }
    let mut id = 0u16;
    for (b, pivot) in pivot_row.iter().enumerate() {
        if let Some(r) = pivot {
            if rows[*r] & RHS != 0 {
                id |= 1 << b;
            }
        }
    }
    Some(id)
}

#[cfg(test)]
mod flush_tests {
    use super::*;

    /// A FLUSH that Linux 6.12.117's rxe sent (interop suite, `p-flush`,
    /// 2026-11-26): 10.77.0.11:49444 -> 10.77.0.1:4791, IPv4 ID 0x2997,
    /// RANGE, GLOBAL, 1 byte; the ICRC as captured.
    const IP: [u8; 20] = [
        0x45, 0x00, 0x00, 0x40, 0x29, 0x97, 0x40, 0x00, 0x40, 0x11, 0xfc, 0x70, 0x0a, 0x4d, 0x00,
        0x0b, 0x0a, 0x4d, 0x00, 0x01,
    ];
    const UDP: [u8; 8] = [0xc1, 0x24, 0x12, 0xb7, 0x00, 0x2c, 0x00, 0x00];
    const PAYLOAD: [u8; 36] = [
        0x1c, 0x00, 0xff, 0xff, 0x00, 0x01, 0x00, 0x11, 0x80, 0x0a, 0x9a, 0xdd, // BTH
        0x00, 0x00, 0x00, 0x01, // FETH
        0x00, 0x00, 0x7f, 0xd9, 0x69, 0x0f, 0x70, 0x40, 0x04, 0x00, 0x01, 0x8c, 0x00, 0x00, 0x00,
        0x01, // RETH
        0x77, 0xd4, 0x75, 0xc9, // ICRC
    ];

    fn info() -> IpUdpInfo {
        IpUdpInfo {
            src: "10.77.0.11".parse().unwrap(),
            dst: "10.77.0.1".parse().unwrap(),
            src_port: 0xc124,
            dst_port: 4791,
            ipv4_id: 0x2997,
            ipv4_flags_frag: 0x4000,
        }
    }

    #[test]
    fn kernel_rxe_flush_icrc_covers_the_headers_twice() {
        let roce = &PAYLOAD[..32];
        let want = stored(&PAYLOAD).unwrap();
        assert_eq!(compute(&info(), roce), want);
        assert_eq!(compute_from_headers(&IP, &UDP, roce).unwrap(), want);
        assert_ne!(compute_ibta(&info(), roce), want, "IBTA's form differs");
        assert!(check(&info(), &PAYLOAD));
        // The ID hidden by a UDP socket is found in kernel rxe's form ...
        assert_eq!(solve_ipv4_id(&info(), &PAYLOAD), Some(0x2997));
        // ... and an IBTA-form FLUSH is accepted too, ID and all.
        let mut ibta = PAYLOAD;
        ibta[32..].copy_from_slice(&compute_ibta(&info(), roce).to_le_bytes());
        assert!(check(&info(), &ibta));
        assert_eq!(solve_ipv4_id(&info(), &ibta), Some(0x2997));
        // A changed byte fails both forms.
        let mut bad = PAYLOAD;
        bad[31] ^= 1;
        assert!(!check(&info(), &bad));
        assert_eq!(solve_ipv4_id(&info(), &bad), None);
        // Every other opcode: one form (a WRITE ONLY with the same bytes).
        let mut w = PAYLOAD;
        w[0] = 0x0a;
        assert_eq!(compute(&info(), &w[..32]), compute_ibta(&info(), &w[..32]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RNR NAK of rc_rnr_nak.pcap, 10.77.0.11:49881 -> 10.77.0.12:4791.
    const IP: [u8; 20] = [
        0x45, 0x00, 0x00, 0x30, 0xae, 0xd3, 0x40, 0x00, 0x40, 0x11, 0x77, 0x39, 0x0a, 0x4d, 0x00,
        0x0b, 0x0a, 0x4d, 0x00, 0x0c,
    ];
    const UDP: [u8; 8] = [0xc2, 0xd9, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00];
    const ROCE: [u8; 20] = [
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x1b, 0x00, 0x63, 0xd3, 0x5f, 0x2c, 0x00, 0x00,
        0x02, 0xa3, 0x0e, 0x47, 0xb5,
    ];

    fn info() -> IpUdpInfo {
        IpUdpInfo {
            src: "10.77.0.11".parse().unwrap(),
            dst: "10.77.0.12".parse().unwrap(),
            src_port: 0xc2d9,
            dst_port: 4791,
            ipv4_id: 0xaed3,
            ipv4_flags_frag: 0x4000,
        }
    }

    #[test]
    fn captured_icrc_both_ways() {
        let icrc = stored(&ROCE).unwrap();
        assert_eq!(icrc, 0xb547_0ea3, "stored little-endian");
        assert_eq!(compute(&info(), &ROCE[..16]), icrc);
        assert_eq!(compute_from_headers(&IP, &UDP, &ROCE[..16]), Ok(icrc));
        assert!(check(&info(), &ROCE));
        let mut out = ROCE;
        out[16..].fill(0);
        write(&info(), &mut out);
        assert_eq!(out, ROCE);
    }

    #[test]
    fn masked_fields_do_not_count() {
        // TOS/ECN, TTL, IP checksum, UDP checksum and BTH byte 4 may change
        // on the way without changing the ICRC.
        let mut ip = IP;
        ip[1] = 0x03; // ECN CE
        ip[8] = 1; // TTL
        ip[10] = 0;
        let mut udp = UDP;
        udp[6..8].copy_from_slice(&[0x12, 0x34]);
        let mut roce = ROCE;
        roce[4] = 0xc0; // FECN, BECN
        assert_eq!(
            compute_from_headers(&ip, &udp, &roce[..16]),
            Ok(stored(&ROCE).unwrap())
        );
        assert!(check(&info(), &roce));
        // ... but the ID, the flags, the addresses, ports and the rest count.
        for change in [
            IpUdpInfo {
                ipv4_id: 1,
                ..info()
            },
            IpUdpInfo {
                ipv4_flags_frag: 0,
                ..info()
            },
            IpUdpInfo {
                src_port: 49152,
                ..info()
            },
            IpUdpInfo {
                dst: "10.77.0.13".parse().unwrap(),
                ..info()
            },
        ] {
            assert!(!check(&change, &ROCE), "{change:?}");
        }
    }

    #[test]
    fn bad_headers_are_errors_not_panics() {
        let roce = &ROCE[..16];
        assert_eq!(
            compute_from_headers(&IP, &UDP[..7], roce),
            Err(Error::Truncated)
        );
        assert_eq!(
            compute_from_headers(&IP, &[0; 9], roce),
            Err(Error::Malformed)
        );
        assert_eq!(
            compute_from_headers(&IP, &UDP, &roce[..11]),
            Err(Error::Truncated)
        );
        assert_eq!(
            compute_from_headers(&IP[..19], &UDP, roce),
            Err(Error::Malformed)
        );
        assert_eq!(compute_from_headers(&[], &UDP, roce), Err(Error::Malformed));
        let mut ihl6 = [0u8; 24];
        ihl6[..20].copy_from_slice(&IP);
        ihl6[0] = 0x46; // 4 bytes of options
        assert!(compute_from_headers(&ihl6, &UDP, roce).is_ok());
        assert_eq!(
            compute_from_headers(&ihl6[..20], &UDP, roce),
            Err(Error::Malformed)
        );
        assert_eq!(stored(&[1, 2, 3]), None);
        assert!(!check(&info(), &[1, 2, 3]));
        let mut short = [1u8, 2, 3];
        write(&info(), &mut short);
        assert_eq!(short, [1, 2, 3]);
        // Shorter than a BTH: still a CRC, no panic.
        let _ = compute(&info(), &[0x11, 0]);
    }

    /// An IPv6 RoCEv2 packet (RC SEND ONLY, 8-byte payload, fe80::1 ->
    /// fe80::2, ports 49152 -> 4791). No kernel capture has IPv6, so the
    /// expected ICRC was checked with two independent implementations on
    /// this frame: the project's `shared/tools/rxe-vm/icrc_check.py`, and
    /// Scapy 2.8.0's `scapy.contrib.roce` (which builds it from scratch).
    #[test]
    fn ipv6_vector() {
        let info = IpUdpInfo {
            src: "fe80::1".parse().unwrap(),
            dst: "fe80::2".parse().unwrap(),
            src_port: 49152,
            dst_port: 4791,
            ipv4_id: 0x1234, // ignored for IPv6
            ipv4_flags_frag: 0x4000,
        };
        let roce = [
            0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x07, // BTH
            1, 2, 3, 4, 5, 6, 7, 8,
        ];
        let icrc = compute(&info, &roce);
        assert_eq!(icrc, IPV6_VECTOR_ICRC);
        let frame = crate::frame::build(&info, &[&roce[..], &icrc.to_le_bytes()].concat());
        let f = crate::frame::parse(&frame).unwrap();
        assert_eq!(
            compute_from_headers(f.ip_header, f.udp_header, &roce),
            Ok(icrc)
        );
        // The traffic class and flow label are masked.
        let mut ip = f.ip_header.to_vec();
        ip[0] = 0x6a;
        ip[1..4].copy_from_slice(&[0xbc, 0xde, 0xf0]);
        ip[7] = 1;
        assert_eq!(compute_from_headers(&ip, f.udp_header, &roce), Ok(icrc));
        assert_eq!(solve_ipv4_id(&info, f.udp_payload), None);
        // An IPv4 address mixed with IPv6 stands for its mapped form.
        let mapped = IpUdpInfo {
            src: "::ffff:10.0.0.1".parse().unwrap(),
            dst: "::ffff:10.0.0.2".parse().unwrap(),
            ..info
        };
        let mixed = IpUdpInfo {
            src: "10.0.0.1".parse().unwrap(),
            ..mapped
        };
        assert_eq!(compute(&mixed, &roce), compute(&mapped, &roce));
    }

    const IPV6_VECTOR_ICRC: u32 = 0x3eac_cb9d;

    #[test]
    fn id_basis_matches_brute_force() {
        for len in [12, 16, 20, 28, 1036, 4140, 65_000] {
            let roce = vec![0x5au8; len];
            let zero = compute(
                &IpUdpInfo {
                    ipv4_id: 0,
                    ..info()
                },
                &roce,
            );
            let basis = ipv4_id_basis(len);
            for (b, col) in basis.iter().enumerate() {
                let one = compute(
                    &IpUdpInfo {
                        ipv4_id: 1 << b,
                        ..info()
                    },
                    &roce,
                );
                assert_eq!(*col, one ^ zero, "len {len} bit {b}");
            }
        }
    }

    #[test]
    fn solve_recovers_the_id_and_rejects_corruption() {
        let hidden = IpUdpInfo {
            ipv4_id: 0,
            ..info()
        };
        assert_eq!(solve_ipv4_id(&hidden, &ROCE), Some(0xaed3));
        for id in [0u16, 1, 0x8000, 0xffff, 0x1234] {
            let mut p = ROCE;
            write(
                &IpUdpInfo {
                    ipv4_id: id,
                    ..info()
                },
                &mut p,
            );
            assert_eq!(solve_ipv4_id(&hidden, &p), Some(id));
        }
        for bit in 0..ROCE.len() * 8 {
            if bit / 8 == 4 {
                continue; // BTH byte 4 is masked by design
            }
            let mut p = ROCE;
            p[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(solve_ipv4_id(&hidden, &p), None, "bit {bit}");
        }
        assert_eq!(solve_ipv4_id(&hidden, &ROCE[..3]), None);
        assert_eq!(solve_ipv4_id(&hidden, &vec![0; 70_000]), None);
    }
}
