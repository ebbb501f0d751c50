//! The kernel rxe reference captures in tests/data (Linux 6.1 rdma_rxe in
//! two QEMU guests; see tests/data/README.md), shared by the integration
//! tests.

#![allow(dead_code)] // each test binary uses a different part

use wire::frame::{self, ParsedFrame};
use wire::pcap::PcapReader;

/// Every capture: file name, packet count, and the BTH opcodes it holds,
/// as tests/data/README.md lists them.
pub const CAPTURES: [(&str, usize, &[u8]); 14] = [
    ("rc_atomic_cswap.pcap", 10, &[0x12, 0x13]),
    ("rc_atomic_fadd.pcap", 10, &[0x12, 0x14]),
    ("rc_read.pcap", 20, &[0x0c, 0x0d, 0x0e, 0x0f]),
    ("rc_retransmit.pcap", 149, &[0x06, 0x07, 0x08, 0x11]),
    ("rc_rnr_nak.pcap", 130, &[0x04, 0x11]),
    ("rc_send_multi.pcap", 20, &[0x00, 0x01, 0x02, 0x11]),
    ("rc_send_recv.pcap", 12, &[0x04, 0x11]),
    ("rc_send_to_host.pcap", 44, &[0x04]),
    ("rc_write.pcap", 20, &[0x06, 0x07, 0x08, 0x11]),
    ("rc_write_small.pcap", 20, &[0x0a, 0x11]),
    ("rdmacm_req_to_host.pcap", 3, &[0x64]),
    (
        "rdmacm_rping.pcap",
        29,
        &[0x04, 0x0a, 0x0c, 0x10, 0x11, 0x64],
    ),
    ("uc_write.pcap", 15, &[0x26, 0x27, 0x28]),
    ("ud_send.pcap", 6, &[0x64]),
];

/// The number of packets in all captures together.
pub const TOTAL_PACKETS: usize = 488;

/// The bytes of one capture file.
pub fn read_capture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One captured packet: the file it came from, its timestamp, the whole
/// Ethernet frame, and that frame taken apart.
pub struct Captured<'a> {
    pub file: &'static str,
    pub index: usize,
    pub ts_ns: u64,
    pub frame: &'a [u8],
    pub parsed: ParsedFrame<'a>,
}

/// Call `f` on every packet of every capture, in file order.
pub fn for_each_packet(mut f: impl FnMut(&Captured<'_>)) {
    for (file, _, _) in CAPTURES {
        let bytes = read_capture(file);
        let reader = PcapReader::new(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(reader.linktype(), wire::pcap::LINKTYPE_ETHERNET, "{file}");
        for (index, rec) in reader.enumerate() {
            let rec = rec.unwrap_or_else(|e| panic!("{file} #{index}: {e}"));
            assert_eq!(
                rec.data.len(),
                rec.orig_len as usize,
                "{file} #{index}: snapped"
            );
            let parsed =
                frame::parse(rec.data).unwrap_or_else(|e| panic!("{file} #{index}: frame: {e}"));
            f(&Captured {
                file,
                index,
                ts_ns: rec.ts_ns,
                frame: rec.data,
                parsed,
            });
        }
    }
}
