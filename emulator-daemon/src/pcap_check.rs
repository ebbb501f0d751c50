//! `rxe-emu pcap check`: decode any RoCEv2 capture and verify every ICRC.
//! Wireshark shows the ICRC field; it does not check it.
//!
//! Congestion control is understood too: RoCEv2 CNPs (opcode 0x81, which
//! kernel rxe's table lacks) are decoded and their ICRC checked like any
//! packet's, and the IP ECN codepoint of every packet is counted (the
//! ICRC masks it, so a CE mark does not make a packet bad).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use wire::frame;
use wire::pcap::PcapReader;
use wire::{Ecn, PacketRepr};

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
    /// Packets per opcode name (`CNP` for congestion notifications).
    pub opcodes: BTreeMap<&'static str, usize>,
    /// RoCEv2 packets per IP ECN codepoint, indexed by its 2-bit value:
    /// Not-ECT, ECT(1), ECT(0), CE.
    pub ecn: [usize; 4],
    /// CE-marked packets that are not acknowledgements or CNPs: those a
    /// ConnectX-like receiver answers with a CNP.
    pub ce_data: usize,
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
        if self.ecn[0] != self.roce {
            let [not_ect, ect1, ect0, ce] = self.ecn;
            let _ = writeln!(
                s,
                "  ECN: {not_ect} Not-ECT, {ect0} ECT(0), {ect1} ECT(1), {ce} CE \
                 ({} CE-marked data packets)",
                self.ce_data
            );
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
        let ecn = f.ecn();
        r.ecn[usize::from(ecn.bits())] += 1;
        let name = match PacketRepr::parse(f.udp_payload) {
            Ok(p) => {
                let ack = p.aeth.is_some()
                    && !p
                        .bth
                        .opcode
                        .info()
                        .is_some_and(|i| i.flags.contains(wire::OpFlags::READ));
                if ecn == Ecn::Ce && !ack {
                    r.ce_data += 1;
                }
                p.bth.opcode.name()
            }
            Err(wire::Error::UnknownOpcode(0x81)) => {
                match wire::cnp::CnpRepr::parse(f.udp_payload) {
                    Ok(_) => wire::Opcode::CNP.name(),
                    Err(e) => {
                        r.bad
                            .push((n, format!("a malformed CNP (opcode 0x81): {e}")));
                        continue;
                    }
                }
            }
            Err(e) => {
                r.bad.push((n, format!("does not parse as RoCEv2: {e}")));
                continue;
            }
        };
        *r.opcodes.entry(name).or_default() += 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use wire::icrc::IpUdpInfo;
    use wire::pcap::PcapWriter;

    fn info(src: &str, dst: &str, src_port: u16) -> IpUdpInfo {
        IpUdpInfo {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            src_port,
            dst_port: wire::ROCEV2_UDP_PORT,
            ipv4_id: 0,
            ipv4_flags_frag: 0x4000,
        }
    }

    /// A capture of what a congested ConnectX-like exchange looks like:
    /// ECT(0) and ECT(1) SENDs, one marked CE on the way (TOS rewritten as
    /// a switch does), its CNP back, and a CE-marked ACK.
    fn congested_capture(break_cnp: bool) -> Vec<u8> {
        let a_to_b = info("10.0.0.1", "10.0.0.2", 0xc011);
        let b_to_a = info("10.0.0.2", "10.0.0.1", 0xc022);
        let send = |psn: u8| {
            // RC SEND_ONLY to QP 0x12 with AckReq, 4 bytes of payload.
            let mut b = vec![
                0x04, 0x00, 0xff, 0xff, 0, 0, 0, 0x12, 0x80, 0, 0, psn, 1, 2, 3, 4, 0, 0, 0, 0,
            ];
            wire::icrc::write(&a_to_b, &mut b);
            b
        };
        let mut ack = vec![
            0x11, 0x00, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 3, 0x1f, 0, 0, 1, 0, 0, 0, 0,
        ];
        wire::icrc::write(&b_to_a, &mut ack);
        let mut cnp = vec![0u8; 32];
        wire::cnp::CnpRepr::new(0x11).emit(&mut cnp).unwrap();
        wire::icrc::write(&b_to_a, &mut cnp);
        if break_cnp {
            cnp.push(0); // 33 bytes: not a CNP (the ICRC is then wrong too)
        }
        let mut out = Vec::new();
        let mut w = PcapWriter::new(&mut out).unwrap();
        let frames = [
            wire::frame::build_ecn(&a_to_b, Ecn::Ect0, &send(1)),
            wire::frame::build_ecn(&a_to_b, Ecn::Ect1, &send(2)),
            wire::frame::build_ecn(&a_to_b, Ecn::Ce, &send(3)),
            wire::frame::build_with_tos(&b_to_a, Ecn::NotEct.tos(48), &cnp),
            wire::frame::build_ecn(&b_to_a, Ecn::Ce, &ack),
        ];
        for (i, f) in frames.iter().enumerate() {
            w.write_frame(i as u64 * 1000, f).unwrap();
        }
        w.flush().unwrap();
        out
    }

    #[test]
    fn cnps_and_ecn_marks_check_clean() {
        let r = check(&congested_capture(false)).unwrap();
        assert!(r.passed(), "{}", r.render());
        assert_eq!((r.roce, r.icrc_ok), (5, 5));
        assert_eq!(r.opcodes.get("CNP"), Some(&1));
        assert_eq!(r.opcodes.get("RC_SEND_ONLY"), Some(&3));
        assert_eq!(r.ecn, [1, 1, 1, 2], "Not-ECT, ECT(1), ECT(0), CE");
        assert_eq!(r.ce_data, 1, "the marked SEND, not the marked ACK");
        let text = r.render();
        assert!(
            text.contains("CNP") && text.contains("1 Not-ECT, 1 ECT(0), 1 ECT(1), 2 CE"),
            "{text}"
        );
    }

    #[test]
    fn a_bad_cnp_is_reported() {
        let mut bytes = congested_capture(false);
        // Corrupt the CNP's DestQP: its ICRC no longer matches.
        let clean = check(&bytes).unwrap();
        assert!(clean.passed());
        let at = find(&bytes, &[0x81, 0x00, 0xff, 0xff, 0x40, 0, 0, 0x11]) + 7;
        bytes[at] ^= 0x01;
        let r = check(&bytes).unwrap();
        assert_eq!(r.bad.len(), 1, "{}", r.render());
        assert!(r.bad[0].1.contains("bad ICRC"), "{:?}", r.bad);
        assert_eq!(r.bad[0].0, 4);
        // A CNP of the wrong length does not parse.
        let r = check(&congested_capture(true)).unwrap();
        assert_eq!(r.bad.len(), 1, "{}", r.render());
        assert!(r.bad[0].1.contains("a malformed CNP"), "{:?}", r.bad);
    }

    fn find(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len()).position(|w| w == needle).unwrap()
    }
}
