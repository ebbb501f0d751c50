//! `rxe-conformance`: runs rxe-emu's pingpong tools against rdma-core's over
//! kernel rxe in the guest that `vm/rxe-vm.sh` booted, in both directions,
//! with a capture of every run checked by `rxe-emu pcap check`.
//!
//! `conformance-tests/run` builds everything, boots the guest, calls this
//! and tears the guest down; run that. This binary expects the guest up.
//!
//! Exit code: 0 every run passed, 1 a run failed, 2 the suite could not
//! run (no scenario selected, the guest stopped answering, ...).

mod cm;
mod guest;
mod peer;
mod scenario;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{exit, Command};
use std::thread::sleep;
use std::time::{Duration, Instant};

use guest::{Capture, Job, Proc, Vm};
use scenario::{Direction, Scenario, SideResult};

/// How long an `emu-server` CM run gives our server to reach
/// `rdma_listen` before the guest's client connects (see `Ctx::run`).
const CM_SETTLE: Duration = Duration::from_millis(1000);

struct Opts {
    out: PathBuf,
    vm: PathBuf,
    bin_dir: PathBuf,
    pattern: Option<String>,
    list: bool,
    timeout: Duration,
    strict: bool,
    /// `--like`: what our device is like (the kernel rxe release the guest
    /// runs; default the newest).
    like: Option<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: rxe-conformance --out DIR --vm RXE-VM.SH --bin-dir DIR [-k PATTERN] [--timeout S]\n\
         \x20                      [--like 6.1|6.12|7.2]\n\
         \x20      rxe-conformance --list [-k PATTERN]\n\
         PATTERN selects the runs whose \"scenario direction\" contains it.\n\
         --like: our device behaves as that kernel rxe (the guest's).\n\
         Normally started by conformance-tests/run, which boots the guest first."
    );
    exit(2)
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        out: PathBuf::new(),
        vm: PathBuf::new(),
        bin_dir: PathBuf::new(),
        pattern: None,
        list: false,
        timeout: Duration::from_secs(60),
        strict: std::env::var("CONFORMANCE_STRICT").is_ok_and(|v| v == "1"),
        like: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--out" => o.out = val().into(),
            "--vm" => o.vm = val().into(),
            "--bin-dir" => o.bin_dir = val().into(),
            "-k" => o.pattern = Some(val()),
            "--timeout" => {
                o.timeout = Duration::from_secs(val().parse().unwrap_or_else(|_| usage()))
            }
            "--list" => o.list = true,
            "--like" => o.like = Some(val()),
            _ => usage(),
        }
    }
    if !o.list && (o.out.as_os_str().is_empty() || o.vm.as_os_str().is_empty()) {
        usage();
    }
    o
}

/// The selected runs, in order. Against Linux 6.1 (`--like 6.1`), not
/// the operations its rxe lacks (FLUSH, ATOMIC WRITE).
fn selected(pattern: Option<&str>, like: Option<&str>) -> Vec<(Scenario, Direction)> {
    let v61 = like == Some("6.1");
    scenario::all()
        .into_iter()
        .filter(|s| !(v61 && s.peer.as_ref().is_some_and(|p| p.needs_6_2())))
        .flat_map(|s| s.directions().iter().map(move |&d| (s.clone(), d)))
        .filter(|(s, d)| pattern.is_none_or(|p| format!("{} {d}", s.name).contains(p)))
        .collect()
}

/// How one run ended.
struct Outcome {
    name: String,
    dir: Direction,
    bytes: u64,
    packets: u64,
    secs: f64,
    failures: Vec<String>,
    notes: Vec<String>,
    counters: BTreeMap<String, u64>,
    /// rxe-emu's device counters at the end of the run (peer scenarios:
    /// read while our side lingers after PEER-OK; empty otherwise).
    emu_counters: BTreeMap<String, u64>,
}

/// A UC run in which the bridge capture holds every packet our side sent
/// (`packets`: RoCE packets captured) and kernel rxe counted fewer: the
/// guest dropped them after the bridge; UC does not retransmit.
fn guest_dropped_uc(r: &Outcome) -> bool {
    let sent = r.emu_counters.get("sent_pkts").copied().unwrap_or(0);
    let rcvd = r.counters.get("rcvd_pkts").copied().unwrap_or(0);
    r.name.starts_with("p-uc-") && sent > 0 && r.packets >= sent && rcvd < sent
}

/// A failure of the harness rather than of a run: the suite stops.
struct Infra(String);

struct Ctx {
    o: Opts,
    vm: Vm,
    link_mtu: u32,
    /// rxe-emud serving `rxe0` on the bridge address, and its link MTU.
    emud: Option<(Proc, u32)>,
    /// rxe-interop-peer has been copied into the guest.
    peer_in_guest: bool,
}

impl Ctx {
    fn emud_socket(&self) -> PathBuf {
        self.o.out.join("rxe-emud.sock")
    }

    /// Copy rxe-interop-peer into the guest (once) and check that it runs
    /// there on Debian's libibverbs and is the same file.
    fn ensure_peer_in_guest(&mut self) -> Result<(), Infra> {
        if self.peer_in_guest {
            return Ok(());
        }
        let bin = self.o.bin_dir.join("rxe-interop-peer");
        let digest = |args: &[&str]| -> Option<String> {
            let o = Command::new(args[0]).args(&args[1..]).output().ok()?;
            o.status
                .success()
                .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
        };
        let b = bin.display().to_string();
        let (Some(b64), Some(sum)) = (digest(&["base64", "-w0", &b]), digest(&["sha256sum", &b]))
        else {
            return Err(Infra(format!("cannot read {b}")));
        };
        let sum = sum
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let r = self.vm.exec(
            60,
            &format!(
                "echo '{}' | base64 -d > /usr/bin/rxe-interop-peer && chmod 755 /usr/bin/rxe-interop-peer
                 sha256sum /usr/bin/rxe-interop-peer; rxe-interop-peer 2>&1 | head -1",
                b64.trim()
            ),
        );
        if r.rc != 0 || !r.stdout.contains(&sum) || !r.stdout.contains("usage: rxe-interop-peer") {
            return Err(Infra(format!(
                "rxe-interop-peer does not run in the guest (rc {}): {} {}",
                r.rc,
                r.stdout.trim(),
                r.stderr.trim()
            )));
        }
        self.peer_in_guest = true;
        Ok(())
    }

    /// An rxe-emud in the namespace with `rxe0` on the bridge address at
    /// the current link MTU (restarted when the MTU changes).
    fn ensure_daemon(&mut self) -> Result<(), Infra> {
        if let Some((p, mtu)) = &mut self.emud {
            if *mtu == self.link_mtu && p.poll().is_none() {
                return Ok(());
            }
            p.kill();
        }
        self.emud = None;
        let sock = self.emud_socket();
        let _ = std::fs::remove_file(&sock);
        let log = self
            .o
            .out
            .join(format!("rxe-emud-mtu{}.log", self.link_mtu));
        let mut c = self.vm.host_cmd(&self.o.bin_dir.join("rxe-emud"));
        let mut spec = format!("rxe0={}/{}", scenario::HOST_IP, self.link_mtu);
        if let Some(l) = &self.o.like {
            spec += &format!(",like={l}");
        }
        c.arg("--socket")
            .arg(&sock)
            .args(["--device", &spec, "--slots", "8"]);
        let mut p =
            Proc::spawn(c, &log).map_err(|e| Infra(format!("cannot start rxe-emud: {e}")))?;
        let t0 = Instant::now();
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .any(|l| l == "ready")
        {
            if p.poll().is_some() || t0.elapsed() > Duration::from_secs(10) {
                p.kill();
                return Err(Infra(format!(
                    "rxe-emud did not start: {}",
                    std::fs::read_to_string(&log).unwrap_or_default().trim()
                )));
            }
            sleep(Duration::from_millis(50));
        }
        self.emud = Some((p, self.link_mtu));
        Ok(())
    }

    /// rxe-emu's device counters (`rxe-emu stat rxe0`).
    fn emu_counters(&self) -> BTreeMap<String, u64> {
        Command::new(self.o.bin_dir.join("rxe-emu"))
            .args(["stat", "rxe0"])
            .env("RXE_EMU_SOCKET", self.emud_socket())
            .output()
            .map(|o| peer::parse_emu_stat(&String::from_utf8_lossy(&o.stdout)))
            .unwrap_or_default()
    }

    fn counters(&self) -> Result<BTreeMap<String, u64>, Infra> {
        let r = self.vm.exec(
            20,
            "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -H . *",
        );
        let c = scenario::parse_counters(&r.stdout);
        if r.rc != 0 || c.is_empty() {
            return Err(Infra(format!(
                "cannot read kernel rxe's counters in the guest (rc {}): {}",
                r.rc,
                r.stderr.trim()
            )));
        }
        Ok(c)
    }

    fn netem(&self, loss: u32) -> Result<(), Infra> {
        let args = if loss > 0 {
            format!("loss {loss}%")
        } else {
            "off".into()
        };
        let r = self.vm.netem(&args);
        if r.rc != 0 {
            return Err(Infra(format!(
                "cannot set netem {args} in the guest: {}",
                r.stderr.trim()
            )));
        }
        Ok(())
    }

    fn run(&mut self, s: &Scenario, dir: Direction, idx: usize) -> Result<Outcome, Infra> {
        let tag = format!("{}.{dir}", s.name);
        let out = &self.o.out.clone();
        let file = |ext: &str| out.join(format!("{tag}.{ext}"));
        let port = scenario::BASE_PORT + idx as u16;
        let t0 = Instant::now();
        let mut failures = Vec::new();
        let mut notes = Vec::new();

        if self.link_mtu != s.link_mtu {
            let r = self.vm.set_mtu(s.link_mtu);
            if r.rc != 0 {
                return Err(Infra(format!(
                    "cannot set the link MTU: {}",
                    r.stderr.trim()
                )));
            }
            self.link_mtu = s.link_mtu;
        }
        if s.loss_pct > 0 {
            self.netem(s.loss_pct)?;
        }
        if s.peer.is_some() {
            self.ensure_peer_in_guest()?;
        }
        if s.needs_daemon() {
            self.ensure_daemon()?;
        } else if let Some((mut p, _)) = self.emud.take() {
            // the pingpongs bind 10.77.0.1:4791 themselves
            p.kill();
        }
        let before = self.counters()?;
        let kcmd = s.kernel_cmd(dir, port);
        let emu_bin = if s.debian_on_host() {
            // Debian's ibverbs-utils, rdmacm-utils, perftest, found on PATH
            PathBuf::from(s.emu_bin(dir))
        } else {
            self.o.bin_dir.join(s.emu_bin(dir))
        };
        let eargs = s.emu_args(dir, port);
        let _ = std::fs::write(
            file("cmd.txt"),
            format!(
                "guest (kernel rxe): {kcmd}\nhost (rxe-emu, netns {}): {} {}\n",
                self.vm.netns,
                emu_bin.display(),
                eargs.join(" ")
            ),
        );
        let capture =
            Capture::start(&self.vm, &file("pcap"), &file("dumpcap.log")).map_err(Infra)?;
        let job = tag.replace('.', "_");
        let lib_dir = self.o.out.join("lib");
        let spawn_emu = || {
            let mut c = self.vm.host_cmd(&emu_bin);
            c.args(&eargs);
            if s.needs_daemon() {
                // a Debian-built program on our drop-in libibverbs.so.1 and rxe-emud
                c.env("LD_LIBRARY_PATH", &lib_dir)
                    .env("RXE_EMU_SOCKET", self.emud_socket())
                    .env("RXE_EMU_MODE", "daemon")
                    .env("RXE_EMU_AUTOSTART", "0");
                if s.cm.is_some() {
                    // librdmacm says why a call failed, into emu.log
                    c.env("RXE_EMU_DEBUG", "1");
                }
            }
            Proc::spawn(c, &file("emu.log"))
        };

        // Server first; the client only once the server can take it.
        let mut emu: Option<Proc> = None;
        let mut kernel_started = false;
        let mut emu_rc: Option<i32> = None;
        let mut kernel: Option<Job> = None;
        let mut kernel_killed = false;
        match dir {
            Direction::EmuServer => match spawn_emu() {
                Ok(mut p) => {
                    let w = Instant::now();
                    // An rdma_cm listener has no socket to see: give our
                    // server CM_SETTLE to reach rdma_listen (it binds and
                    // listens within milliseconds of starting); a kernel
                    // client that comes too early is rejected, which the
                    // CM check reports.
                    let listening = |vm: &Vm| match s.cm {
                        Some(_) => w.elapsed() >= CM_SETTLE,
                        None => vm.host_listening(port),
                    };
                    while !listening(&self.vm) {
                        if let Some(rc) = p.poll() {
                            emu_rc = Some(rc);
                            break;
                        }
                        if w.elapsed() > Duration::from_secs(10) {
                            failures.push("rxe-emu server did not listen within 10 s".into());
                            p.kill();
                            emu_rc = Some(-1);
                            break;
                        }
                        sleep(Duration::from_millis(50));
                    }
                    emu = Some(p);
                }
                Err(e) => return Err(Infra(format!("cannot start {}: {e}", emu_bin.display()))),
            },
            Direction::KernelServer => {
                let r = self.vm.bg(&job, &kcmd);
                if r.rc != 0 {
                    return Err(Infra(format!(
                        "cannot start the guest job: {}",
                        r.stderr.trim()
                    )));
                }
                kernel_started = true;
            }
        }
        if emu_rc.is_none() {
            match dir {
                Direction::EmuServer => {
                    let r = self.vm.bg(&job, &kcmd);
                    if r.rc != 0 {
                        return Err(Infra(format!(
                            "cannot start the guest job: {}",
                            r.stderr.trim()
                        )));
                    }
                    kernel_started = true;
                }
                Direction::KernelServer => {
                    // Debian's pingpong tries to connect once: wait until
                    // the guest's server listens
                    let w = Instant::now();
                    let listening = |vm: &Vm| match s.cm {
                        Some(t) => vm.guest_cm_listening(t.port(port)),
                        None => vm.guest_listening(port),
                    };
                    while s.debian_on_host() && !listening(&self.vm) {
                        if matches!(self.vm.bgstat(&job), Some(Job::Exited(_)) | None)
                            || w.elapsed() > Duration::from_secs(15)
                        {
                            failures.push("kernel server did not listen within 15 s".into());
                            break;
                        }
                        sleep(Duration::from_millis(100));
                    }
                    emu =
                        Some(spawn_emu().map_err(|e| {
                            Infra(format!("cannot start {}: {e}", emu_bin.display()))
                        })?);
                }
            }
        }

        // Wait for both; whichever fails first ends the other at once.
        let deadline = Instant::now() + self.o.timeout;
        let mut last_guest_poll = Instant::now() - Duration::from_secs(1);
        let mut emu_counters = BTreeMap::new();
        loop {
            if emu_rc.is_none() {
                // our side lingers after PEER-OK: read its counters then
                if s.peer.is_some()
                    && emu_counters.is_empty()
                    && std::fs::read_to_string(file("emu.log")).is_ok_and(|t| t.contains("PEER-OK"))
                {
                    emu_counters = self.emu_counters();
                }
                emu_rc = emu.as_mut().and_then(Proc::poll);
            }
            let kernel_done = !kernel_started || matches!(kernel, Some(Job::Exited(_)));
            if !kernel_done && last_guest_poll.elapsed() >= Duration::from_millis(250) {
                last_guest_poll = Instant::now();
                match self.vm.bgstat(&job) {
                    Some(j) => kernel = Some(j),
                    None => return Err(Infra("the guest does not answer".into())),
                }
            }
            let kernel_done = !kernel_started || matches!(kernel, Some(Job::Exited(_)));
            let kernel_failed = matches!(kernel, Some(Job::Exited(rc)) if rc != 0);
            let emu_failed = matches!(emu_rc, Some(rc) if rc != 0);
            if emu_rc.is_some() && kernel_done {
                break;
            }
            if emu_failed && !kernel_done {
                failures.push("rxe-emu side failed first: guest job killed".into());
                self.vm.bgkill(&job);
                kernel_killed = true;
                break;
            }
            if kernel_failed && emu_rc.is_none() {
                failures.push("kernel side failed first: rxe-emu killed".into());
                if let Some(p) = emu.as_mut() {
                    p.kill();
                }
                break;
            }
            if Instant::now() > deadline {
                failures.push(format!(
                    "timed out after {} s: both sides killed",
                    self.o.timeout.as_secs()
                ));
                if let Some(p) = emu.as_mut() {
                    p.kill();
                }
                if kernel_started {
                    self.vm.bgkill(&job);
                    kernel_killed = true;
                }
                break;
            }
            sleep(Duration::from_millis(50));
        }
        let emu_res = SideResult {
            rc: emu_rc.filter(|&rc| rc >= 0),
            output: std::fs::read_to_string(file("emu.log")).unwrap_or_default(),
        };
        let kernel_res = if !kernel_started {
            SideResult::default()
        } else if kernel_killed {
            SideResult {
                rc: None,
                output: self.vm.bgkill(&job).stdout,
            }
        } else {
            let r = self.vm.bgwait(&job, 5);
            SideResult {
                rc: if r.rc == 124 { None } else { Some(r.rc) },
                output: r.stdout,
            }
        };
        let _ = std::fs::write(file("kernel.log"), &kernel_res.output);
        let dumpcap = capture.stop();
        if s.loss_pct > 0 {
            self.netem(0)?;
        }
        let after = self.counters()?;
        let delta = scenario::counter_delta(&before, &after);
        let mut ctext = String::from("kernel rxe hw_counters, change during this run:\n");
        for (k, v) in &delta {
            let _ = writeln!(ctext, "  {k:<24} {v}");
        }
        ctext += "after the run:\n";
        for (k, v) in &after {
            let _ = writeln!(ctext, "  {k:<24} {v}");
        }
        if !emu_counters.is_empty() {
            ctext += "rxe-emu device counters (rxe-emu stat rxe0) at the end of the run:\n";
            for (k, v) in emu_counters.iter().filter(|(_, v)| **v > 0) {
                let _ = writeln!(ctext, "  {k:<24} {v}");
            }
        }
        let _ = std::fs::write(file("counters.txt"), ctext);

        let emu_responder = dir == Direction::EmuServer;
        failures.extend(scenario::check_side(
            s,
            "rxe-emu",
            &emu_res,
            true,
            emu_responder,
        ));
        if kernel_started {
            failures.extend(scenario::check_side(
                s,
                "kernel",
                &kernel_res,
                false,
                !emu_responder,
            ));
        } else {
            failures.push("kernel side never started".into());
        }
        // Our counters are compared with the kernel's: not reading them is
        // a failure, not a skipped comparison (the vanishing responder
        // leaves at once and has none).
        if let Some(p) = &s.peer {
            let vanished = p.op == "vanish" && emu_responder;
            if !vanished && emu_res.output.contains("PEER-OK") && emu_counters.is_empty() {
                failures.push("could not read rxe-emu's counters (rxe-emu stat rxe0)".into());
            }
        }
        let (required, allowed) = match &s.peer {
            Some(p) => (p.kernel_counters(!emu_responder), p.kernel_allowed()),
            None => (Vec::new(), &[][..]),
        };
        let (cf, cn) =
            scenario::judge_counters(&delta, s.loss_pct > 0, self.o.strict, &required, allowed);
        failures.extend(cf);
        notes.extend(cn);

        if s.peer.as_ref().is_some_and(|p| p.op == "rnr") {
            // our requester must wait the RNR timer before each retry
            let pcap = std::fs::read(file("pcap")).unwrap_or_default();
            match peer::rnr_backoffs(&pcap) {
                Ok(b) => {
                    let (f, n) = peer::judge_rnr_backoffs(&b, emu_responder);
                    failures.extend(f);
                    notes.extend(n);
                    if let (Some(min), Some(&(asked, _))) = (b.iter().map(|x| x.1).min(), b.first())
                    {
                        notes.push(format!(
                            "{} RNR NAKs on the wire, retries {:.1} ms or more after them (timer {:.2} ms)",
                            b.len(),
                            min as f64 / 1e6,
                            asked as f64 / 1e6
                        ));
                    }
                }
                Err(e) => failures.push(format!("RNR back-off: {e}")),
            }
        }
        let check = Command::new(self.o.bin_dir.join("rxe-emu"))
            .args(["pcap", "check"])
            .arg(file("pcap"))
            .output();
        let mut packets = 0;
        match check {
            Ok(c) => {
                let text = String::from_utf8_lossy(&c.stdout).into_owned()
                    + &String::from_utf8_lossy(&c.stderr);
                let _ = std::fs::write(file("pcap-check.txt"), format!("{text}\n{dumpcap}"));
                match scenario::parse_pcap_check(&text) {
                    Some(p) => {
                        packets = p.roce;
                        failures.extend(scenario::check_pcap(s, &p));
                        if !c.status.success() && p.bad == 0 && p.roce > 0 {
                            failures.push("rxe-emu pcap check failed".into());
                        }
                    }
                    None => failures.push(format!("rxe-emu pcap check: {}", text.trim())),
                }
            }
            Err(e) => return Err(Infra(format!("cannot run rxe-emu pcap check: {e}"))),
        }
        if let Some(t) = s.cm {
            // the CM exchange itself, message by message
            let (server, client) = match dir {
                Direction::EmuServer => (scenario::HOST_IP, scenario::GUEST_IP),
                Direction::KernelServer => (scenario::GUEST_IP, scenario::HOST_IP),
            };
            let pcap = std::fs::read(file("pcap")).unwrap_or_default();
            match cm::cm_mads(&pcap) {
                Ok(m) => {
                    let (sv, cl) = (server.parse(), client.parse());
                    if let (Ok(sv), Ok(cl)) = (sv, cl) {
                        failures.extend(t.check_mads(&m, sv, cl, t.port(port)));
                    }
                    notes.push(cm::summary(&m));
                }
                Err(e) => failures.push(format!("CM MADs: {e}")),
            }
        }
        Ok(Outcome {
            name: s.name.clone(),
            dir,
            bytes: s.bytes(),
            packets,
            secs: t0.elapsed().as_secs_f64(),
            failures,
            notes,
            counters: delta,
            emu_counters,
        })
    }
}

fn table(results: &[Outcome], not_run: &[(Scenario, Direction)]) -> String {
    let mut t = format!(
        "{:<18} {:<14} {:>9} {:<7} {:>8} {:>6}  kernel counters / notes\n",
        "scenario", "direction", "bytes", "result", "packets", "secs"
    );
    for r in results {
        let verdict = if r.failures.is_empty() {
            "PASS"
        } else {
            "FAIL"
        };
        let pkts = r.counters.get("sent_pkts").copied().unwrap_or(0);
        let rcvd = r.counters.get("rcvd_pkts").copied().unwrap_or(0);
        let mut extra = format!("sent {pkts} rcvd {rcvd}");
        if !r.emu_counters.is_empty() {
            let e = |k: &str| r.emu_counters.get(k).copied().unwrap_or(0);
            extra += &format!("; emu sent {} rcvd {}", e("sent_pkts"), e("rcvd_pkts"));
        }
        for n in &r.notes {
            extra += &format!("; {n}");
        }
        let _ = writeln!(
            t,
            "{:<18} {:<14} {:>9} {:<7} {:>8} {:>6.1}  {extra}",
            r.name,
            r.dir.to_string(),
            r.bytes,
            verdict,
            r.packets,
            r.secs
        );
        for f in &r.failures {
            let _ = writeln!(t, "    - {f}");
        }
    }
    for (s, d) in not_run {
        let _ = writeln!(
            t,
            "{:<18} {:<14} {:>9} {:<7}",
            s.name,
            d.to_string(),
            s.bytes(),
            "NOT RUN"
        );
    }
    t
}

/// The same workload in the same role on both implementations: kernel
/// rxe's counter deltas (requester: `emu-server` runs; responder:
/// `kernel-server`) beside rxe-emu's device counters from the other
/// direction. Every counter that differs is listed.
fn counter_comparison(results: &[Outcome]) -> String {
    let mut t = String::from(
        "counters, same workload and role (kernel rxe | rxe-emu; only counters that differ):\n",
    );
    let mut any = false;
    for k in results.iter().filter(|r| r.dir == Direction::EmuServer) {
        let Some(e) = results
            .iter()
            .find(|r| r.name == k.name && r.dir == Direction::KernelServer)
        else {
            continue;
        };
        if k.emu_counters.is_empty() && e.emu_counters.is_empty() {
            continue;
        }
        any = true;
        // kernel requester: k.counters; rxe-emu requester: e.emu_counters;
        // kernel responder: e.counters; rxe-emu responder: k.emu_counters
        for (role, kern, emu) in [
            ("requester", &k.counters, &e.emu_counters),
            ("responder", &e.counters, &k.emu_counters),
        ] {
            let mut diff = Vec::new();
            let names: std::collections::BTreeSet<&String> =
                kern.keys().chain(emu.keys()).collect();
            for n in names {
                let (a, b) = (
                    kern.get(n).copied().unwrap_or(0),
                    emu.get(n).copied().unwrap_or(0),
                );
                // lifespan and ack_deferred are kernel-only bookkeeping
                if a != b && !matches!(n.as_str(), "lifespan") {
                    diff.push(format!("{n} {a}|{b}"));
                }
            }
            let _ = writeln!(
                t,
                "  {:<18} {role:<9}  {}",
                k.name,
                if diff.is_empty() {
                    "same".to_string()
                } else {
                    diff.join(", ")
                }
            );
        }
    }
    if any {
        t
    } else {
        String::new()
    }
}

fn main() {
    let o = parse_opts();
    let runs = selected(o.pattern.as_deref(), o.like.as_deref());
    if o.list {
        for (s, d) in &runs {
            if s.cm.is_some() {
                // the port is the run's own; 0 here
                println!(
                    "{:<18} {:<14} host: {} {}; guest: {}",
                    s.name,
                    d.to_string(),
                    s.emu_bin(*d),
                    s.emu_args(*d, 0).join(" "),
                    s.kernel_cmd(*d, 0)
                );
                continue;
            }
            println!(
                "{:<18} {:<14} {:?} size {} x{} path MTU {} link MTU {}{}",
                s.name,
                d.to_string(),
                s.transport,
                s.size,
                s.iters,
                s.path_mtu,
                s.link_mtu,
                if s.loss_pct > 0 {
                    format!(" netem loss {}%", s.loss_pct)
                } else {
                    String::new()
                }
            );
        }
        exit(if runs.is_empty() { 2 } else { 0 });
    }
    if runs.is_empty() {
        eprintln!(
            "rxe-conformance: no scenario matches -k {:?}",
            o.pattern.unwrap_or_default()
        );
        exit(2);
    }
    for b in ["rxe-rc-pingpong", "rxe-ud-pingpong", "rxe-emu"] {
        if !o.bin_dir.join(b).is_file() {
            eprintln!(
                "rxe-conformance: {} is missing (build first)",
                o.bin_dir.join(b).display()
            );
            exit(2);
        }
    }
    if let Err(e) = std::fs::create_dir_all(&o.out) {
        eprintln!("rxe-conformance: {}: {e}", o.out.display());
        exit(2);
    }
    let netns = std::env::var("RXE_EMU_VM_NETNS").unwrap_or_else(|_| "rxe-emu-conf".into());
    let link_mtu = std::env::var("RXE_EMU_VM_MTU")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(1500);
    let vm = Vm {
        script: o.vm.clone(),
        netns,
    };
    for (s, d) in runs.iter().filter(|(s, _)| s.debian_on_host()) {
        let tool = s.emu_bin(*d);
        let on_path = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(&tool).is_file()));
        if !on_path {
            eprintln!(
                "rxe-conformance: {tool} is not on PATH (apt-get install ibverbs-utils rdmacm-utils perftest)"
            );
            exit(2);
        }
    }
    if runs.iter().any(|(s, _)| s.needs_daemon()) {
        for b in [
            "rxe-interop-peer",
            "rxe-emud",
            "libibverbs.so",
            "librdmacm.so",
        ] {
            if b == "rxe-interop-peer" && !runs.iter().any(|(s, _)| s.peer.is_some()) {
                continue;
            }
            if b == "librdmacm.so" && !runs.iter().any(|(s, _)| s.cm.is_some()) {
                continue;
            }
            if !o.bin_dir.join(b).is_file() {
                eprintln!(
                    "rxe-conformance: {} is missing (build first)",
                    o.bin_dir.join(b).display()
                );
                exit(2);
            }
        }
        // what LD_LIBRARY_PATH points our side's rxe-interop-peer and
        // Debian's pingpongs and RDMA CM programs at
        let lib = o.out.join("lib");
        let _ = std::fs::create_dir_all(&lib);
        for (so, soname) in [
            ("libibverbs.so", "libibverbs.so.1"),
            ("librdmacm.so", "librdmacm.so.1"),
        ] {
            if !o.bin_dir.join(so).is_file() {
                continue;
            }
            let link = lib.join(soname);
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink(o.bin_dir.join(so), &link) {
                eprintln!("rxe-conformance: {}: {e}", link.display());
                exit(2);
            }
        }
    }
    let mut ctx = Ctx {
        o,
        vm,
        link_mtu,
        emud: None,
        peer_in_guest: false,
    };
    let n = runs.len();
    let mut results = Vec::new();
    let mut infra = None;
    for (i, (s, d)) in runs.iter().enumerate() {
        let mut result = ctx.run(s, *d, i);
        // Debian's perftest 4.5 with -R connects its test QP as soon as the
        // parameter exchange ends, without retrying, while its server only
        // then listens again: a client that comes first is rejected (no
        // listener: reason 8) on kernel rxe as on ours. Such a run is the
        // tool's race, not a result: it runs again, at most twice more (the
        // librdmacm tests do the same). The earlier attempt's files are
        // kept beside the new ones.
        //
        // With `ib_send_bw -z` and kernel rxe as server, the kernel's last
        // SEND could go unacknowledged: our client's last poll held its
        // ACK back and the client exited with the device open (fixed: held
        // responses leave at exit, see the README); the kernel side then
        // retried it for ever and never answered our DREQ (resent every
        // 6 s). Such a run still runs again, at most twice, and says so.
        //
        // The mirror image, seen once in 102 runs on Linux 6.12: in
        // cm-rdma-server with our rdma_server, the kernel's rdma_client
        // takes our reply, completes it, disconnects and exits before
        // kernel rxe sends the ACK it deferred (its ack_deferred counter
        // moves); our server's SEND is never acknowledged and, with
        // rdma_cm's retry_count 7 (retry for ever), rdma_server waits in
        // rdma_get_send_comp until the run times out. kernel rxe in our
        // place would wait the same. Such a run also runs again, at most
        // twice, and says so.
        //
        // UC has no retransmission, and the TCG guest sometimes drops part
        // of a long burst after the bridge (seen: 7-9 of the 1,108
        // packets of p-uc-write-m1024, about one run in five): when the
        // bridge capture holds every packet our side sent and kernel rxe
        // counted fewer, the loss was the guest's, not ours. Such a run
        // also runs again, at most twice, and says so.
        for attempt in 2..=3 {
            let failed = matches!(&result, Ok(r) if !r.failures.is_empty());
            let perftest_race = (s.name == "cm-send-bw" || s.name == "cm-write-lat")
                && ["kernel.log", "emu.log"].iter().any(|f| {
                    std::fs::read_to_string(ctx.o.out.join(format!("{}.{d}.{f}", s.name)))
                        .is_ok_and(|t| t.contains("RDMA_CM_EVENT_REJECTED; error: 8"))
                });
            let last_send_unacked = s.name == "cm-send-bw-z"
                && matches!(&result, Ok(r) if r.notes.iter().any(|n| {
                    n.split_whitespace()
                        .skip_while(|x| *x != "DREQ")
                        .nth(1)
                        .and_then(|c| c.parse::<u32>().ok())
                        .is_some_and(|c| c > 1)
                }));
            let kernel_ack_deferred = s.name == "cm-rdma-server"
                && *d == Direction::EmuServer
                && std::fs::read_to_string(ctx.o.out.join(format!("{}.{d}.kernel.log", s.name)))
                    .is_ok_and(|t| t.contains("rdma_client: end 0"));
            let guest_dropped_uc = matches!(&result, Ok(r) if guest_dropped_uc(r));
            let raced = failed
                && (perftest_race || last_send_unacked || kernel_ack_deferred || guest_dropped_uc);
            if !raced {
                break;
            }
            for f in ["kernel.log", "emu.log", "pcap"] {
                let from = ctx.o.out.join(format!("{}.{d}.{f}", s.name));
                let to = ctx
                    .o
                    .out
                    .join(format!("{}.{d}.race{}.{f}", s.name, attempt - 1));
                let _ = std::fs::rename(&from, to);
            }
            println!(
                "[{:>2}/{n}] {:<18} {:<14} {}; attempt {attempt}",
                i + 1,
                s.name,
                d.to_string(),
                if perftest_race {
                    "rejected before the server listened again (perftest 4.5 -R race)"
                } else if guest_dropped_uc {
                    "the guest dropped UC packets that the bridge capture shows we sent"
                } else if kernel_ack_deferred {
                    "the kernel's client exited before acknowledging our last SEND (kernel rxe defers ACKs)"
                } else {
                    "the kernel's last SEND went unacknowledged at our client's exit"
                }
            );
            result = ctx.run(s, *d, i);
        }
        match result {
            Ok(r) => {
                println!(
                    "[{:>2}/{n}] {:<18} {:<14} {} ({:.1} s)",
                    i + 1,
                    r.name,
                    r.dir.to_string(),
                    if r.failures.is_empty() {
                        "PASS"
                    } else {
                        "FAIL"
                    },
                    r.secs
                );
                results.push(r);
            }
            Err(Infra(e)) => {
                eprintln!("rxe-conformance: CANNOT CONTINUE at {} {d}: {e}", s.name);
                infra = Some((i, e));
                break;
            }
        }
    }
    let not_run: Vec<_> = match &infra {
        Some((i, _)) => runs[*i..].to_vec(),
        None => Vec::new(),
    };
    // Same workload, same role: the counters kernel rxe and rxe-emu keep
    // must agree when nothing had to be recovered.
    for i in 0..results.len() {
        let (k, e) = (
            &results[i],
            results
                .iter()
                .position(|r| r.name == results[i].name && r.dir == Direction::KernelServer),
        );
        let Some(j) = e else { continue };
        if k.dir != Direction::EmuServer
            || k.emu_counters.is_empty()
            || results[j].emu_counters.is_empty()
        {
            continue;
        }
        // kernel requester: k.counters; rxe-emu requester: results[j].emu_counters
        let cmp = peer::compare_roles(
            &k.counters,
            &results[j].emu_counters,
            &results[j].counters,
            &k.emu_counters,
            peer::packets_timing_dependent(&k.name),
        );
        match cmp {
            Some(d) if !d.is_empty() => results[j].failures.push(format!(
                "counters differ from kernel rxe's in the same role (kernel|rxe-emu): {}",
                d.join(", ")
            )),
            Some(_) => results[j]
                .notes
                .push("counters as kernel rxe's in both roles".into()),
            None => {}
        }
    }
    let t = table(&results, &not_run);
    let failed = results.iter().filter(|r| !r.failures.is_empty()).count();
    let mut summary = format!("\n{t}\n{}", counter_comparison(&results));
    let _ = write!(
        summary,
        "{} passed, {} failed",
        results.len() - failed,
        failed + not_run.len()
    );
    if let Some((_, e)) = &infra {
        let _ = write!(
            summary,
            "\nNOT RUN: {} runs (harness error: {e})",
            not_run.len()
        );
    }
    println!("{summary}");
    let _ = std::fs::write(ctx.o.out.join("summary.txt"), format!("{summary}\n"));
    // exit() runs no destructor: stop our rxe-emud here, so that the
    // bridge address is free for what `run` does next (the facts check).
    if let Some((mut p, _)) = ctx.emud.take() {
        p.kill();
    }
    exit(if infra.is_some() {
        2
    } else if failed > 0 {
        1
    } else {
        0
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, captured: u64, kernel_rcvd: u64, emu_sent: u64) -> Outcome {
        Outcome {
            name: name.into(),
            dir: Direction::KernelServer,
            bytes: 0,
            packets: captured,
            secs: 0.0,
            failures: vec!["byte mismatch".into()],
            notes: Vec::new(),
            counters: [("rcvd_pkts".to_string(), kernel_rcvd)].into(),
            emu_counters: [("sent_pkts".to_string(), emu_sent)].into(),
        }
    }

    /// Only a UC run whose every packet is on the bridge, and fewer in
    /// the kernel's count, is the guest's loss.
    #[test]
    fn guest_dropped_uc_needs_every_packet_on_the_bridge() {
        assert!(guest_dropped_uc(&outcome(
            "p-uc-write-m1024",
            1108,
            1101,
            1108
        )));
        // Fewer on the bridge than we sent: ours (or the host's) loss.
        assert!(!guest_dropped_uc(&outcome(
            "p-uc-write-m1024",
            1100,
            1100,
            1108
        )));
        // All received: the failure is something else.
        assert!(!guest_dropped_uc(&outcome(
            "p-uc-write-m1024",
            1108,
            1108,
            1108
        )));
        // RC retransmits: a loss is never the answer there.
        assert!(!guest_dropped_uc(&outcome(
            "p-rc-write-m1024",
            1108,
            1101,
            1108
        )));
        // Nothing sent by us (the kernel was the sender).
        assert!(!guest_dropped_uc(&outcome("p-uc-write-m1024", 1108, 0, 0)));
    }
}
