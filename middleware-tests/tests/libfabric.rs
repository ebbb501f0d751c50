//! libfabric (Debian's libfabric-bin, 1.17) over its verbs provider on
//! rxe0, unmodified, through `rxe-emu exec`, with no libfabric setting
//! (kernel rxe needs FI_UNIVERSE_SIZE <= 127 for RDM). The device sits on a
//! veth interface in a network namespace of the test's: the verbs
//! provider, as with kernel rxe, offers connected endpoints only on
//! devices of non-loopback interfaces.

mod common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(120);
const A: &str = "10.89.0.1";

fn have_libfabric() -> bool {
    have_program("fi_pingpong", "libfabric-bin")
        && have_program("ip", "iproute2")
        && have_root("network namespaces")
}

/// fi_pingpong with every size it knows, each message checked (`-c`).
fn pingpong(d: &Rxe, ep: &str, port: u16) -> String {
    let p = port.to_string();
    let cmd = |client: bool| {
        let mut c = d.exec("fi_pingpong");
        c.args(["-p", "verbs", "-e", ep, "-I", "10", "-S", "all", "-c"]);
        // The server's control port, and the client's destination port.
        if client {
            c.args(["-P", &p, A]);
        } else {
            c.args(["-B", &p]);
        }
        c
    };
    let r = server_client(cmd(false), port, cmd(true), LIMIT);
    assert!(r.ok(), "fi_pingpong -e {ep}:\n{}", r.text());
    let t = text(&r.client);
    eprintln!("fi_pingpong -e {ep}:\n{t}");
    t
}

#[test]
fn fi_pingpong_msg_rdm_and_dgram_on_rxe0_every_size_checked() {
    if !have_libfabric() {
        return;
    }
    let _s = serial();
    let ns = Netns::new("rxe-mw-fi", A, "10.89.0.2");
    let d = Rxe::start_in(Some(&ns.name), "fi", &format!("rxe0={A}"));
    let info = d
        .exec("fi_info")
        .args(["-p", "verbs", "-v"])
        .output()
        .unwrap();
    let t = text(&info);
    assert!(info.status.success(), "{t}");
    for want in [
        "type: FI_EP_MSG",
        "type: FI_EP_DGRAM",
        "name: rxe0",
        "name: rxe0-dgram",
    ] {
        assert!(t.contains(want), "fi_info lacks {want}:\n{t}");
    }
    // msg: every size from 0 B to 6 MiB; rdm (verbs;ofi_rxm) likewise;
    // dgram up to the path MTU (1024 on a 1500-byte link).
    let msg = pingpong(&d, "msg", 47611);
    assert!(msg.lines().any(|l| l.starts_with("6m ")), "{msg}");
    let rdm = pingpong(&d, "rdm", 47612);
    assert!(rdm.lines().any(|l| l.starts_with("6m ")), "{rdm}");
    let dgram = pingpong(&d, "dgram", 47613);
    assert!(dgram.lines().any(|l| l.starts_with("1k ")), "{dgram}");
}
