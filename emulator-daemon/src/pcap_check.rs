//! `rxe-emu pcap check`: decode any RoCEv2 capture and verify every ICRC.
//! Wireshark shows the ICRC field; it does not check it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use wire::frame;
use wire::pcap::PcapReader;
use wire::PacketRepr;

/// pcap link types we read besides Ethernet.
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_LINUX_SLL2: u32 = 276;

/// What a capture held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Records in the file.
    pub records: usize,
    /// UDP datagrams to port 4791.
    pub roce: usize,
    /// Of those, with a correct ICRC.
    pub icrc_ok: usize,
    /// Cut short by the capture's snaplen: the ICRC cannot be checked.
    pub truncated: usize,
    /// Record number (from 1) and what is wrong, for each bad packet.
    pub bad: Vec<(usize, String)>,
    /// Packets per opcode name.
    pub opcodes: BTreeMap<&'static str, usize>,
}

impl Report {
    /// At least one RoCEv2 packet, and none bad.
    pub fn passed(&self) -> bool {
        self.roce > 0 && self.bad.is_empty()
    }

    /// A summary for people.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{} records, {} RoCEv2 packets: {} ICRC ok, {} bad, {} truncated (not checkable)\n",
            self.records,
            self.roce,
            self.icrc_ok,
            self.bad.len(),
            self.truncated
        );
        for (op, n) in &self.opcodes {
            let _ = writeln!(s, "  {op:<40} {n}");
        }
        for (i, why) in self.bad.iter().take(20) {
            let _ = writeln!(s, "  record {i}: {why}");
        }
        if self.bad.len() > 20 {
            let _ = writeln!(s, "  ... and {} more", self.bad.len() - 20);
        }
        if self.roce == 0 {
            s += "  no RoCEv2 packet (UDP port 4791) in this capture\n";
        }
        s
    }
}

/// An Ethernet frame around an IP packet (for raw and Linux cooked captures).
fn as_ethernet(ip: &[u8]) -> Vec<u8> {
    let ethertype: u16 = match ip.first().map(|b| b >> 4) {
        Some(6) => frame::ETHERTYPE_IPV6,
        _ => frame::ETHERTYPE_IPV4,
    };
    let mut f = vec![0u8; frame::ETHERNET_LEN];
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(ip);
    f
}

/// Check every RoCEv2 packet of a classic pcap file.
pub fn check(bytes: &[u8]) -> Result<Report, String> {
    let reader = PcapReader::new(bytes).map_err(|e| {
        format!("not a classic pcap file ({e}); convert pcapng with `editcap -F pcap IN OUT`")
    })?;
    let link = reader.linktype();
    let strip = match link {
        wire::pcap::LINKTYPE_ETHERNET => None,
        LINKTYPE_RAW => Some(0),
        LINKTYPE_LINUX_SLL => Some(16),
        LINKTYPE_LINUX_SLL2 => Some(20),
        other => {
            return Err(format!(
                "link type {other} is not supported (Ethernet, raw IP, Linux cooked)"
            ))
        }
    };
    let mut r = Report::default();
    for (i, rec) in reader.enumerate() {
        let n = i + 1;
        let rec = match rec {
            Ok(rec) => rec,
            Err(e) => {
                r.bad
                    .push((n, format!("the file ends inside this record ({e})")));
                break;
            }
        };
        r.records += 1;
        let owned;
        let data = match strip {
            None => rec.data,
            Some(k) => {
                owned = as_ethernet(rec.data.get(k..).unwrap_or(&[]));
                &owned
            }
        };
        let truncated = (rec.data.len() as u32) < rec.orig_len;
        // Not IP/UDP (or cut before its UDP header): not ours to judge.
        let Ok(f) = frame::parse(data) else {
            continue;
        };
        if f.info.dst_port != wire::ROCEV2_UDP_PORT {
            continue;
        }
        r.roce += 1;
        if truncated {
            r.truncated += 1;
            continue;
        }
        match PacketRepr::parse(f.udp_payload) {
            Ok(p) => *r.opcodes.entry(p.bth.opcode.name()).or_default() += 1,
            Err(e) => {
                r.bad.push((n, format!("does not parse as RoCEv2: {e}")));
                continue;
            }
        }
        if wire::icrc::check(&f.info, f.udp_payload) {
            r.icrc_ok += 1;
        } else {
            let stored = wire::icrc::stored(f.udp_payload).unwrap_or(0);
            let roce = &f.udp_payload[..f.udp_payload.len().saturating_sub(4)];
            let want = wire::icrc::compute(&f.info, roce);
            r.bad.push((
                n,
                format!(
                    "bad ICRC {stored:#010x}, expected {want:#010x} ({} -> {}, {} bytes)",
                    f.info.src,
                    f.info.dst,
                    f.udp_payload.len()
                ),
            ));
        }
    }
    Ok(r)
}
