use std::net::IpAddr;
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpUdpInfo {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
    pub ipv4_id: u16,
    pub ipv4_flags_frag: u16,
}
fn pseudo(info: &IpUdpInfo, roce_len: usize) -> Vec<u8> {
    let udp_len = (8 + roce_len + 4) as u16;
    let mut v = vec![0xffu8; 8];
    match (info.src, info.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            v.push(0x45);
            v.push(0xff);
            v.extend_from_slice(&(20 + udp_len).to_be_bytes());
            v.extend_from_slice(&info.ipv4_id.to_be_bytes());
            v.extend_from_slice(&info.ipv4_flags_frag.to_be_bytes());
            v.push(0xff);
            v.push(17);
            v.extend_from_slice(&[0xff, 0xff]);
            v.extend_from_slice(&s.octets());
            v.extend_from_slice(&d.octets());
        }
        (s, d) => {
            v.extend_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
            v.extend_from_slice(&udp_len.to_be_bytes());
            v.push(17);
            v.push(0xff);
            let o = |a: IpAddr| match a {
                IpAddr::V4(x) => x.to_ipv6_mapped().octets(),
                IpAddr::V6(x) => x.octets(),
            };
            v.extend_from_slice(&o(s));
            v.extend_from_slice(&o(d));
        }
    }
    v.extend_from_slice(&info.src_port.to_be_bytes());
    v.extend_from_slice(&info.dst_port.to_be_bytes());
    v.extend_from_slice(&udp_len.to_be_bytes());
    v.extend_from_slice(&[0xff, 0xff]);
    v
}
pub fn compute(info: &IpUdpInfo, roce: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&pseudo(info, roce.len()));
    if roce.len() >= 12 {
        let mut bth = [0u8; 12];
        bth.copy_from_slice(&roce[..12]);
        bth[4] = 0xff;
        h.update(&bth);
        h.update(&roce[12..]);
    } else {
        h.update(roce);
    }
    h.finalize()
}
pub fn write(info: &IpUdpInfo, p: &mut [u8]) {
    if p.len() < 4 {
        return;
    }
    let n = p.len() - 4;
    let c = compute(info, &p[..n]);
    p[n..].copy_from_slice(&c.to_le_bytes());
}
pub fn stored(p: &[u8]) -> Option<u32> {
    let n = p.len().checked_sub(4)?;
    Some(u32::from_le_bytes([p[n], p[n + 1], p[n + 2], p[n + 3]]))
}
pub fn check(info: &IpUdpInfo, p: &[u8]) -> bool {
    match stored(p) {
        Some(s) => compute(info, &p[..p.len() - 4]) == s,
        None => false,
    }
}
/// For IPv4 datagrams received through a UDP socket the kernel hides the IP
/// identification field, which the ICRC covers. CRC-32 is affine over
/// GF(2): `crc(id) = crc(0) ^ L(id)` with `L` linear in the 16 ID bits. So
/// the ID that would make the stored ICRC valid is found by solving a
/// 32x16 linear system: `Some(id)` if one exists (the packet is then
/// verified up to those 16 bits), `None` if no ID fits (the packet is
/// corrupt).
pub fn solve_ipv4_id(info: &IpUdpInfo, p: &[u8]) -> Option<u16> {
    if !matches!((info.src, info.dst), (IpAddr::V4(_), IpAddr::V4(_))) {
        return None;
    }
    let stored = stored(p)?;
    let roce = &p[..p.len() - 4];
    let with = |id: u16| {
        compute(
            &IpUdpInfo {
                ipv4_id: id,
                ..*info
            },
            roce,
        )
    };
    let base = with(0);
    let target = stored ^ base;
    // Column b: the contribution of ID bit b to the CRC.
    let cols: Vec<u32> = (0..16).map(|b| with(1 << b) ^ base).collect();
    // Rows are the 32 CRC bits; unknowns the 16 ID bits.
    let mut rows: Vec<(u16, bool)> = (0..32)
        .map(|r| {
            let mut m = 0u16;
            for (b, c) in cols.iter().enumerate() {
                if (c >> r) & 1 == 1 {
                    m |= 1 << b;
                }
            }
            (m, (target >> r) & 1 == 1)
        })
        .collect();
    let mut next = 0;
    let mut pivots = Vec::new();
    for b in 0..16 {
        let Some(i) = (next..32).find(|&i| (rows[i].0 >> b) & 1 == 1) else {
            continue;
        };
        rows.swap(next, i);
        for j in 0..32 {
            if j != next && (rows[j].0 >> b) & 1 == 1 {
                rows[j].0 ^= rows[next].0;
                rows[j].1 ^= rows[next].1;
            }
        }
        pivots.push((b, next));
        next += 1;
    }
    if rows[next..].iter().any(|r| r.0 == 0 && r.1) {
        return None;
    }
    let mut id = 0u16;
    for (b, r) in pivots {
        if rows[r].1 {
            id |= 1 << b;
        }
    }
    (with(id) == stored).then_some(id)
}

/// ICRC from the real header bytes of a captured packet: `ip_header` is an
/// IPv4 header (options allowed) or a 40-byte IPv6 header, `udp_header` the
/// 8-byte UDP header, `roce` the UDP payload without its ICRC.
pub fn compute_from_headers(
    ip_header: &[u8],
    udp_header: &[u8],
    roce: &[u8],
) -> crate::Result<u32> {
    if udp_header.len() != 8 || roce.len() < 12 {
        return Err(crate::Error::Truncated);
    }
    let mut ip = ip_header.to_vec();
    match ip.first().map(|b| b >> 4) {
        Some(4) if ip.len() >= 20 => {
            ip[1] = 0xff; // TOS
            ip[8] = 0xff; // TTL
            ip[10] = 0xff; // header checksum
            ip[11] = 0xff;
        }
        Some(6) if ip.len() == 40 => {
            // Traffic class, flow label, hop limit.
            ip[0] |= 0x0f;
            ip[1] = 0xff;
            ip[2] = 0xff;
            ip[3] = 0xff;
            ip[7] = 0xff;
        }
        _ => return Err(crate::Error::Malformed),
    }
    let mut udp = [0u8; 8];
    udp.copy_from_slice(udp_header);
    udp[6] = 0xff;
    udp[7] = 0xff;
    let mut bth = [0u8; 12];
    bth.copy_from_slice(&roce[..12]);
    bth[4] = 0xff;
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&ip);
    h.update(&udp);
    h.update(&bth);
    h.update(&roce[12..]);
    Ok(h.finalize())
}
