//! `rxe-emu pcap check` on real kernel-rxe captures, and on broken ones.

use std::path::{Path, PathBuf};
use std::process::Command;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../wire/tests/data")
        .join(name)
}

fn run(file: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rxe-emu"))
        .args(["pcap", "check"])
        .arg(file)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn every_kernel_capture_checks_clean() {
    let mut total = 0;
    for e in std::fs::read_dir(data("")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "pcap") {
            let (ok, out) = run(&p);
            assert!(ok, "{out}");
            let r = emulator_daemon::pcap_check::check(&std::fs::read(&p).unwrap()).unwrap();
            assert_eq!(r.icrc_ok, r.roce, "{out}");
            total += r.roce;
        }
    }
    assert_eq!(total, 488, "the 488 packets of the kernel captures");
}

#[test]
fn a_flipped_bit_is_reported_with_its_record_and_fails() {
    let mut bytes = std::fs::read(data("rc_write.pcap")).unwrap();
    let clean = emulator_daemon::pcap_check::check(&bytes).unwrap();
    assert!(clean.passed());
    // Flip a bit near the end of the file: inside the last packet's payload
    // or ICRC.
    let at = bytes.len() - 10;
    bytes[at] ^= 0x01;
    let r = emulator_daemon::pcap_check::check(&bytes).unwrap();
    assert_eq!(r.bad.len(), 1, "{}", r.render());
    assert_eq!(r.bad[0].0, r.records, "the last record");
    assert!(r.bad[0].1.contains("bad ICRC"), "{}", r.bad[0].1);
    let dir = std::env::temp_dir().join(format!("pcap-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.pcap");
    std::fs::write(&f, &bytes).unwrap();
    let (ok, out) = run(&f);
    assert!(!ok && out.contains("1 bad"), "{out}");
    // Not a pcap at all, and a capture with no RoCE in it.
    std::fs::write(&f, b"hello").unwrap();
    let (ok, out) = run(&f);
    assert!(!ok && out.contains("not a classic pcap"), "{out}");
    let mut w = wire::pcap::PcapWriter::new(Vec::new()).unwrap();
    w.write_frame(0, &[0u8; 60]).unwrap();
    std::fs::write(&f, w.into_inner()).unwrap();
    let (ok, out) = run(&f);
    assert!(!ok && out.contains("no RoCEv2 packet"), "{out}");
    let _ = std::fs::remove_dir_all(dir);
}
