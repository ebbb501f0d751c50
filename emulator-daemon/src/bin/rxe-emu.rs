//! rxe-emu: manage the rxe-emu daemon (start, stop, status).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Manage rxe-emu devices.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Control socket (default: $RXE_EMU_SOCKET, else the user's runtime dir).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the daemon in the background (if it is not running).
    Start {
        /// A device to host: NAME=ADDR, NAME=ADDR/MTU or NAME=netdev:IF,
        /// with ,like=L as in `link add --like` (default rxe0=127.0.0.1,
        /// like the newest kernel rxe). `link add` adds more later.
        #[arg(
            long = "device",
            value_name = "NAME=ADDR[/MTU][,like=L]|NAME=netdev:IF[,like=L]"
        )]
        devices: Vec<String>,
        /// Serve every user (system-wide daemon).
        #[arg(long)]
        any_user: bool,
    },
    /// Stop the daemon.
    Stop,
    /// Devices, slots in use by which process, and drop counters.
    Status,
    /// Protocol counters (kernel rxe's names): device totals, the daemon's
    /// drops, and each process.
    Stat {
        /// Device (default rxe0).
        #[arg(default_value = "rxe0")]
        dev: String,
    },
    /// Devices, in the words of `rdma link`: add one (starting the
    /// daemon if none runs), show them, delete one.
    Link {
        #[command(subcommand)]
        cmd: LinkCmd,
    },
    /// Queue pairs.
    Qp {
        #[command(subcommand)]
        cmd: QpCmd,
    },
    /// Seeded, reproducible fault injection on every process of a device
    /// (and those that open it later). Percentages; all zero turns it off.
    Fault {
        /// Device.
        dev: String,
        /// Datagrams dropped, e.g. 2%.
        #[arg(long, default_value = "0%")]
        drop: String,
        /// Datagrams sent twice.
        #[arg(long, default_value = "0%")]
        dup: String,
        /// Datagrams sent after the next one.
        #[arg(long, default_value = "0%")]
        reorder: String,
        /// Datagrams with one bit flipped (dropped by the receiver's ICRC check).
        #[arg(long, default_value = "0%")]
        corrupt: String,
        /// ECN-capable datagrams (a --like mlx5 device's) marked Congestion
        /// Experienced, as a congested switch marks them; Not-ECT ones (a
        /// kernel-rxe-like device's) are left alone.
        #[arg(long, default_value = "0%")]
        ce: String,
        /// A bottleneck link: RATE,KMIN,KMAX,PMAX[,BUFFER], e.g.
        /// 10gbit,40KB,160KB,20%. Each process's datagrams queue behind
        /// what it sent faster than RATE and wait for the queue ahead of
        /// them; ECN-capable ones are marked CE with probability 0 below
        /// KMIN bytes queued, rising linearly to PMAX at KMAX, and 1 above
        /// (a switch's RED/ECN); past BUFFER (default 4 x KMAX, at least
        /// 64KB) they are dropped.
        #[arg(long, value_name = "RATE,KMIN,KMAX,PMAX[,BUFFER]")]
        queue: Option<String>,
        /// Every datagram leaves this much later, in order: 50us, 2ms, 1s
        /// (at most 10s). Longer than a QP's ACK timeout, it makes the
        /// requester retransmit.
        #[arg(long, default_value = "0")]
        delay: String,
        /// Seed: the same seed gives the same faults for the same traffic.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Live packets of a device, decoded (with --explain, in plain words),
    /// with QP state changes and asynchronous events. Ctrl-C ends it.
    Trace {
        /// Device (default rxe0).
        #[arg(default_value = "rxe0")]
        dev: String,
        /// Also write the packets to this pcap file.
        #[arg(long)]
        pcap: Option<PathBuf>,
        /// A sentence per packet, for learning RDMA.
        #[arg(long)]
        explain: bool,
        /// Stop after this many packets.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Run a program on rxe-emu: start the daemon (with its default device
    /// rxe0=127.0.0.1, or --device ones) if it is not running, point the
    /// program's libibverbs and librdmacm at ours (LD_LIBRARY_PATH), show
    /// it the devices where kernel rxe's would be (/sys/class/infiniband,
    /// /dev/infiniband; LD_PRELOAD of librxe_emu_preload.so), and run it.
    /// Unmodified rdma-core programs and middleware (UCX, libfabric, MPI)
    /// then find rxe0.
    Exec {
        /// Devices for a daemon this command starts: NAME=ADDR[/MTU].
        #[arg(long = "device", value_name = "NAME=ADDR[/MTU]")]
        devices: Vec<String>,
        /// Accepted for old scripts: the devices are always shown in
        /// /sys/class/infiniband now, with no namespace.
        #[arg(long, hide = true)]
        sysfs: bool,
        /// The program and its arguments.
        #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Work with captures.
    Pcap {
        #[command(subcommand)]
        cmd: PcapCmd,
    },
    /// Congestion control of a ConnectX-like device (--like mlx5): DCQCN
    /// and notification-point parameters, by their mlx5 names.
    Cc {
        #[command(subcommand)]
        cmd: CcCmd,
    },
}

#[derive(Subcommand)]
enum CcCmd {
    /// Every parameter: value, default, range and meaning.
    Show {
        /// Device (default rxe0).
        #[arg(default_value = "rxe0")]
        dev: String,
    },
    /// Set parameters (NAME=VALUE, or NAME=default) on every process of
    /// the device at once, and on those that open it later; all are
    /// checked first, and nothing is set if one is unknown or out of range.
    Set {
        /// Device.
        dev: String,
        /// NAME=VALUE assignments, e.g. rpg_ai_rate=10 min_time_between_cnps=4.
        #[arg(required = true, value_name = "NAME=VALUE")]
        params: Vec<String>,
    },
}

#[derive(Subcommand)]
enum LinkCmd {
    /// Add a device bound to an address or to a netdev (as `rdma link add
    /// rxe0 type rxe netdev eth0`).
    Add {
        /// Device name, e.g. rxe1.
        name: String,
        /// The address it owns (UDP 4791 on it); ADDR/MTU sets the netdev MTU.
        #[arg(
            long,
            value_name = "ADDR[/MTU]",
            conflicts_with = "netdev",
            required_unless_present = "netdev"
        )]
        addr: Option<String>,
        /// A network interface: the device takes its first IPv4 address (else
        /// its first global IPv6 address) and its MTU.
        #[arg(long, value_name = "IFNAME")]
        netdev: Option<String>,
        /// What the device is like: rxe (the newest kernel rxe, 7.2), a
        /// given kernel rxe (6.1, 6.12, 7.2: where releases differ, see
        /// docs/kernels.md), or mlx5 (ConnectX: ECT(0), CNPs for CE marks,
        /// DCQCN pacing each QP; `rxe-emu cc` sets its parameters). Kernel
        /// rxe ignores CE marks and CNPs.
        #[arg(long, default_value = "rxe", value_parser = ["rxe", "6.1", "6.12", "7.2", "mlx5"])]
        like: String,
    },
    /// Show the devices (or one).
    Show {
        /// Device name (default: all).
        name: Option<String>,
    },
    /// Delete a device: processes using it get IBV_EVENT_DEVICE_FATAL and
    /// their QPs go to ERR, as when kernel rxe's link is deleted.
    #[command(visible_alias = "del")]
    Delete {
        /// Device name.
        name: String,
    },
}

#[derive(Subcommand)]
enum QpCmd {
    /// Each QP's state, PSNs, outstanding WRs and error, per process.
    Show {
        /// Device (default rxe0).
        #[arg(default_value = "rxe0")]
        dev: String,
    },
}

/// "50us", "2ms", "1.5s", "100ns" (or "0") as nanoseconds, at most 10 s.
fn duration_ns(s: &str) -> u64 {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e3 * 1e3,
        "s" => 1e9,
        "" if num.parse::<f64>() == Ok(0.0) => 0.0,
        _ => die(format!(
            "{s:?} is not a duration (like 50us, 2ms or 1s; units ns, us, ms, s)"
        )),
    };
    match num.parse::<f64>() {
        Ok(v) if v * scale <= 10e9 => (v * scale).round() as u64,
        Ok(_) => die(format!("{s:?}: the delay is at most 10s")),
        Err(_) => die(format!("{s:?} is not a duration (like 50us, 2ms or 1s)")),
    }
}

/// "10gbit", "500mbit", "1.5gbit" (or "10gbps", "10g", "800m") as Mb/s.
fn rate_mbps(s: &str) -> u64 {
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit {
        "gbit" | "gbps" | "g" | "gb/s" => 1000.0,
        "mbit" | "mbps" | "m" | "mb/s" => 1.0,
        _ => die(format!(
            "{s:?} is not a rate (like 10gbit or 500mbit; units gbit, mbit)"
        )),
    };
    match num.parse::<f64>() {
        Ok(v) if v * scale >= 1.0 && v * scale <= 10e6 => (v * scale).round() as u64,
        _ => die(format!("{s:?}: the rate must be 1mbit..10000gbit")),
    }
}

/// "40KB" (1000s), "64KiB", "1MB", "1500" (bytes) as bytes.
fn size_bytes(s: &str) -> u64 {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1048576.0,
        _ => die(format!(
            "{s:?} is not a size (like 40KB, 64KiB, 1MB or 1500)"
        )),
    };
    match num.parse::<f64>() {
        Ok(v) if v * scale <= 1e12 => (v * scale).round() as u64,
        _ => die(format!(
            "{s:?} is not a size (like 40KB, 64KiB, 1MB or 1500)"
        )),
    }
}

/// `--queue RATE,KMIN,KMAX,PMAX[,BUFFER]` as the `queue=` fault field.
fn queue_spec(s: &str) -> String {
    let f: Vec<&str> = s.split(',').collect();
    if !(4..=5).contains(&f.len()) {
        die(format!(
            "--queue {s:?}: expected RATE,KMIN,KMAX,PMAX[,BUFFER], e.g. 10gbit,40KB,160KB,20%"
        ));
    }
    let (rate, kmin, kmax, pmax) = (
        rate_mbps(f[0]),
        size_bytes(f[1]),
        size_bytes(f[2]),
        probability(f[3]),
    );
    let buffer = f.get(4).map_or((4 * kmax).max(64_000), |b| size_bytes(b));
    // The processes check it too; checked here so a bad queue is refused
    // even when no process has the device open yet.
    let b = rxe_core::sim::Bottleneck {
        rate_mbps: rate,
        buffer_bytes: buffer,
        kmin_bytes: kmin,
        kmax_bytes: kmax,
        pmax,
    };
    if let Err(e) = b.check(std::time::Duration::from_secs(10)) {
        die(format!("--queue {s}: {e}"));
    }
    format!("{rate}:{kmin}:{kmax}:{pmax}:{buffer}")
}

/// "2%" or "0.5%" or "0.02" as a probability.
fn probability(s: &str) -> f64 {
    let v = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => s.trim().parse::<f64>(),
    };
    match v {
        Ok(p) if (0.0..=1.0).contains(&p) => p,
        _ => die(format!("{s:?} is not a percentage (like 2% or 0.1%)")),
    }
}

#[derive(Subcommand)]
enum PcapCmd {
    /// Decode a RoCEv2 capture (ours or anybody's) and verify every ICRC;
    /// exits 1 if any is wrong or the capture holds no RoCEv2 packet.
    Check {
        /// A classic pcap file (Ethernet, raw IP or Linux cooked).
        file: PathBuf,
    },
}

fn wire_pcap_writer(f: std::fs::File) -> std::io::Result<wire::pcap::PcapWriter<std::fs::File>> {
    wire::pcap::PcapWriter::new(f)
}

/// `rxe-emud` beside this program, else on PATH.
fn daemon_exe() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("rxe-emud")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("rxe-emud"))
}

/// Our `libibverbs.so` (the cdylib built beside this program, or an
/// installed `libibverbs.so.1` under `../lib/rxe-emu/`).
fn dropin_library() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join("libibverbs.so"),
        dir.join("../lib/rxe-emu/libibverbs.so.1"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

fn exec(
    socket: &std::path::Path,
    devices: &[String],
    _sysfs: bool,
    cmd: &[std::ffi::OsString],
) -> ! {
    use std::os::unix::process::CommandExt;
    if emulator_daemon::client::request(socket, "STATUS").is_err() {
        if let Err(e) =
            emulator_daemon::client::spawn_daemon(&daemon_exe(), socket, devices, false, true)
        {
            if e.contains("cannot bind UDP") {
                die(format!(
                    "{e}\nNo rxe-emud answers on {}. If another one is running, point RXE_EMU_SOCKET at its control socket; or give this one an address of its own: rxe-emu exec --device rxe0=127.0.0.2 -- CMD",
                    socket.display()
                ));
            }
            die(e);
        }
    }
    let lib = dropin_library().unwrap_or_else(|| {
        die("cannot find rxe-emu's libibverbs.so beside this program (build it: cargo build --release -p rxe-libibverbs)")
    });
    // A private directory whose libibverbs.so.1 is ours, first on the
    // loader's path: the program's own libibverbs.so.1 is never loaded.
    let dir = socket
        .parent()
        .map(|d| d.join("lib"))
        .unwrap_or_else(|| PathBuf::from("/tmp/rxe-emu-lib"));
    let link = dir.join("libibverbs.so.1");
    let lib = std::fs::canonicalize(&lib).unwrap_or(lib);
    if std::fs::read_link(&link).ok().as_deref() != Some(lib.as_path()) {
        let _ = std::fs::create_dir_all(&dir);
        let tmp = dir.join(format!(".libibverbs.so.1.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&lib, &tmp)
            .and_then(|()| std::fs::rename(&tmp, &link))
            .unwrap_or_else(|e| die(format!("{}: {e}", link.display())));
    }
    // Our librdmacm.so.1 too, when it was built (or installed) beside
    // libibverbs: rdma_cm programs then reach rxe-emud's connection manager.
    let rdmacm = lib.with_file_name(if lib.ends_with("libibverbs.so") {
        "librdmacm.so"
    } else {
        "librdmacm.so.1"
    });
    if rdmacm.exists() {
        let link = dir.join("librdmacm.so.1");
        if std::fs::read_link(&link).ok().as_deref() != Some(rdmacm.as_path()) {
            let tmp = dir.join(format!(".librdmacm.so.1.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&rdmacm, &tmp)
                .and_then(|()| std::fs::rename(&tmp, &link))
                .unwrap_or_else(|e| die(format!("{}: {e}", link.display())));
        }
    }
    let mut path = std::ffi::OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut command = std::process::Command::new(&cmd[0]);
    command
        .args(&cmd[1..])
        .env("LD_LIBRARY_PATH", path)
        .env("RXE_EMU_SOCKET", socket);
    if std::env::var_os("RXE_EMU_PRELOAD").is_none_or(|v| v != "0") {
        show_devices(socket, &dir, &lib, &mut command);
    }
    let err = command.exec();
    die(format!("cannot run {}: {err}", cmd[0].to_string_lossy()))
}

/// Shows the daemon's devices to the program where kernel rxe's would be:
/// writes the view of them (`around_device::view`) next to the daemon's
/// socket and preloads `librxe_emu_preload.so` (found beside our
/// libibverbs), which redirects the program's file calls on
/// /sys/class/infiniband, /dev/infiniband... into it.
fn show_devices(
    socket: &std::path::Path,
    libdir: &std::path::Path,
    dropin: &std::path::Path,
    command: &mut std::process::Command,
) {
    let preload = dropin.with_file_name(if dropin.ends_with("libibverbs.so") {
        "librxe_emu_preload.so"
    } else {
        "librxe_emu_preload.so.1"
    });
    if !preload.exists() {
        eprintln!(
            "rxe-emu exec: {} is missing, so the program will not see the devices in /sys/class/infiniband or /dev/infiniband (UCX, libfabric and MPI need them); build it: cargo build --release -p rxe-emu-preload",
            preload.display()
        );
        return;
    }
    let status = emulator_daemon::client::request(socket, "STATUS").unwrap_or_else(|e| die(e));
    let devs = around_device::view::devices_of_status(&status);
    let base = libdir.parent().unwrap_or(libdir).join("views");
    let view = around_device::view::ensure(&base, &devs)
        .unwrap_or_else(|e| die(format!("cannot write the view of the devices: {e}")));
    let mut pre = std::ffi::OsString::from(preload.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        pre.push(":");
        pre.push(old);
    }
    command.env("LD_PRELOAD", pre).env("RXE_EMU_VIEW", view);
}

fn link(path: &std::path::Path, cmd: LinkCmd) {
    let req = match cmd {
        LinkCmd::Add {
            name,
            addr,
            netdev,
            like,
        } => {
            let mut spec = match (addr, netdev) {
                (Some(a), _) => format!("{name}={a}"),
                (None, Some(n)) => format!("{name}=netdev:{n}"),
                (None, None) => die("link add needs --addr or --netdev"),
            };
            if like != "rxe" && like != "7.2" {
                spec += &format!(",like={like}");
            }
            // Checked here too, so a bad spec is not first met by a
            // daemon being started for it.
            if let Err(e) = spec.parse::<emulator_daemon::server::DeviceSpec>() {
                die(e);
            }
            if emulator_daemon::client::request(path, "STATUS").is_err() {
                // No daemon: start one hosting just this device.
                let pid = emulator_daemon::client::spawn_daemon(
                    &daemon_exe(),
                    path,
                    std::slice::from_ref(&spec),
                    false,
                    false,
                )
                .unwrap_or_else(|e| die(e));
                println!("rxe-emud started (pid {pid}) on {}", path.display());
                format!("LINK SHOW {name}")
            } else {
                format!("LINK ADD {spec}")
            }
        }
        LinkCmd::Show { name } => match name {
            Some(n) => format!("LINK SHOW {n}"),
            None => "LINK SHOW".into(),
        },
        LinkCmd::Delete { name } => format!("LINK DEL {name}"),
    };
    match emulator_daemon::client::request(path, &req) {
        Ok(s) if s.starts_with("ERR ") => die(s.trim_end().trim_start_matches("ERR ")),
        Ok(s) => print!("{}", s.strip_prefix("OK ").unwrap_or(&s)),
        Err(e) => die(e),
    }
}

fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("rxe-emu: {msg}");
    std::process::exit(1);
}

// The daemon `start` spawns is meant to outlive this command (once we exit,
// init reaps it), so it is not waited for on success.
#[allow(clippy::zombie_processes)]
fn main() {
    let cli = Cli::parse();
    let path = cli
        .socket
        .clone()
        .unwrap_or_else(emulator_daemon::default_socket_path);
    match cli.cmd {
        Cmd::Pcap {
            cmd: PcapCmd::Check { file },
        } => {
            let bytes =
                std::fs::read(&file).unwrap_or_else(|e| die(format!("{}: {e}", file.display())));
            let r = emulator_daemon::pcap_check::check(&bytes)
                .unwrap_or_else(|e| die(format!("{}: {e}", file.display())));
            print!("{}: {}", file.display(), r.render());
            if !r.passed() {
                std::process::exit(1);
            }
        }
        Cmd::Trace {
            dev,
            pcap,
            explain,
            count,
        } => {
            let writer = pcap.map(|p| {
                std::fs::File::create(&p)
                    .and_then(wire_pcap_writer)
                    .unwrap_or_else(|e| die(format!("{}: {e}", p.display())))
            });
            let opts = emulator_daemon::trace::TraceOptions { explain, count };
            let mut out = std::io::stdout();
            if let Err(e) = emulator_daemon::trace::run(&path, &dev, &opts, writer, &mut out, || {})
            {
                die(e);
            }
        }
        Cmd::Stat { dev } => {
            match emulator_daemon::client::request(&path, &format!("STAT {dev}")) {
                Ok(s) if s.starts_with("ERR ") => die(s.trim_end()),
                Ok(s) => print!("{s}"),
                Err(e) => die(e),
            }
        }
        Cmd::Qp {
            cmd: QpCmd::Show { dev },
        } => match emulator_daemon::client::request(&path, &format!("QPS {dev}")) {
            Ok(s) if s.starts_with("ERR ") => die(s.trim_end()),
            Ok(s) => print!("{s}"),
            Err(e) => die(e),
        },
        Cmd::Fault {
            dev,
            drop,
            dup,
            reorder,
            corrupt,
            ce,
            queue,
            delay,
            seed,
        } => {
            let mut spec = format!(
                "drop={} dup={} reorder={} corrupt={} ce={} delay_ns={} seed={seed}",
                probability(&drop),
                probability(&dup),
                probability(&reorder),
                probability(&corrupt),
                probability(&ce),
                duration_ns(&delay)
            );
            if let Some(q) = queue {
                spec += &format!(" queue={}", queue_spec(&q));
            }
            match emulator_daemon::client::request(&path, &format!("FAULT {dev} {spec}")) {
                Ok(s) if s.starts_with("ERR") => die(s.trim_end()),
                Ok(s) => print!("{s}"),
                Err(e) => die(e),
            }
        }
        Cmd::Link { cmd } => link(&path, cmd),
        Cmd::Cc { cmd } => {
            let req = match cmd {
                CcCmd::Show { dev } => format!("CC SHOW {dev}"),
                CcCmd::Set { dev, params } => format!("CC SET {dev} {}", params.join(" ")),
            };
            match emulator_daemon::client::request(&path, &req) {
                Ok(s) if s.starts_with("ERR ") => die(s.trim_end().trim_start_matches("ERR ")),
                Ok(s) => print!("{s}"),
                Err(e) => die(e),
            }
        }
        Cmd::Status => match emulator_daemon::client::request(&path, "STATUS") {
            Ok(s) => print!("{s}"),
            Err(e) => die(e),
        },
        Cmd::Stop => match emulator_daemon::client::request(&path, "STOP") {
            Ok(s) => print!("{s}"),
            Err(e) => die(e),
        },
        Cmd::Exec {
            devices,
            sysfs,
            cmd,
        } => exec(&path, &devices, sysfs, &cmd),
        Cmd::Start { devices, any_user } => {
            if emulator_daemon::client::request(&path, "STATUS").is_ok() {
                println!("rxe-emud is already running on {}", path.display());
                return;
            }
            let exe = daemon_exe();
            let pid = emulator_daemon::client::spawn_daemon(&exe, &path, &devices, any_user, false)
                .unwrap_or_else(|e| die(e));
            println!("rxe-emud started (pid {}) on {}", pid, path.display());
        }
    }
}
