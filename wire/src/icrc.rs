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
pub fn solve_ipv4_id(info: &IpUdpInfo, p: &[u8]) -> Option<u16> {
    (0..=u16::MAX).find(|id| {
        check(
            &IpUdpInfo {
                ipv4_id: *id,
                ..*info
            },
            p,
        )
    })
}
