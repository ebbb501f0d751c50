//! UD multicast through the drop-in: three processes on one rxe-emud
//! device, two attached to a group and one sending to it, as an
//! application written for kernel rxe or mlx5 does it (`c/mcast.c`,
//! compiled against Debian's verbs.h, run on our libibverbs.so.1).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::time::Duration;

use common::{compile_c, scratch_dir, serial, wait_limited, Daemon};

#[test]
fn two_processes_receive_what_a_third_sends_to_their_group() {
    let dir = scratch_dir("mcast");
    let Some(exe) = compile_c("mcast", &dir) else {
        return;
    };
    let _s = serial();
    let exe = exe.to_str().unwrap();
    let d = Daemon::start("mcast", "rxe0=127.0.94.1");
    let group = "239.94.0.7";
    let n = "20";
    let mut receivers = Vec::new();
    for _ in 0..2 {
        let mut c = d.command(exe);
        c.args(["recv", group, n]);
        let mut child = c.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if !line.starts_with("READY") {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
            panic!("receiver did not attach: {line}{rest}");
        }
        receivers.push((child, out));
    }
    let mut s = d.command(exe);
    s.args(["send", group, n]);
    let (so, timed_out) = wait_limited(s.spawn().unwrap(), Duration::from_secs(30));
    let sent = String::from_utf8_lossy(&so.stdout).to_string();
    assert!(
        !timed_out && so.status.success() && sent.contains("OK sent 20"),
        "sender: {sent}{}",
        String::from_utf8_lossy(&so.stderr)
    );
    for (child, mut out) in receivers {
        let (ro, timed_out) = wait_limited(child, Duration::from_secs(30));
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        assert!(
            !timed_out && ro.status.success() && text.contains("OK received 20"),
            "receiver: {text}{}",
            String::from_utf8_lossy(&ro.stderr)
        );
    }
}
