//! What rdma-core's ibv_*_pingpong programs share: arguments, the 52-byte
//! `LID:QPN:PSN:GID` message and its TCP exchange on port 18515.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::exit;
use std::time::{Duration, Instant};

/// `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
pub const MSG_LEN: usize = 52;

/// One side's address, as exchanged.
pub struct Dest {
    pub lid: u16,
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
}

/// Command line, as ibv_*_pingpong takes it, plus `--ip`.
pub struct Args {
    pub port: u16,
    pub size: usize,
    pub iters: u32,
    pub rx_depth: u32,
    pub mtu: u32,
    pub gidx: Option<u8>,
    /// `--ip`: an in-process device on this address.
    pub ip: Option<String>,
    /// `-d`: the device name (default rxe0).
    pub dev: String,
    pub server: Option<String>,
    /// `--netdev-mtu`: the MTU of the in-process device's link (default:
    /// 1500, or 65536 on a loopback address). Its active MTU follows, as
    /// kernel rxe's does from its netdev.
    pub netdev_mtu: Option<u32>,
    /// `-c`: validate received buffers (see [`check_buf`]).
    pub chk: bool,
    /// `--uc`: UC instead of RC (rxe-rc-pingpong only, as ibv_uc_pingpong).
    pub uc: bool,
}

/// The device: in-process on `--ip` if given, else as `open_device` picks
/// (rxe-emud's device if it runs, else in-process on 127.0.0.1 for the
/// server and 127.0.0.2 for the client).
pub fn open(a: &Args) -> verbs_api::Device {
    let dev = match &a.ip {
        Some(ip) => {
            let mut cfg = verbs_api::DeviceConfig::new(
                ip.parse()
                    .unwrap_or_else(|_| die(format!("bad address {ip}"))),
            );
            if let Some(m) = a.netdev_mtu {
                cfg.netdev_mtu = m;
            }
            verbs_api::Device::open(cfg)
        }
        None if a.netdev_mtu.is_some() => die("--netdev-mtu needs --ip (an in-process device)"),
        None => {
            let fallback = if a.server.is_some() {
                [127, 0, 0, 2]
            } else {
                [127, 0, 0, 1]
            };
            verbs_api::open_device(&a.dev, fallback.into())
        }
    };
    dev.unwrap_or_else(|e| die(e))
}

pub fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("{msg}");
    exit(1);
}

pub fn parse_args(default_size: usize) -> Args {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut a = Args {
        port: 18515,
        size: default_size,
        iters: 1000,
        rx_depth: 500,
        mtu: 1024,
        gidx: None,
        ip: None,
        dev: "rxe0".into(),
        server: None,
        netdev_mtu: None,
        chk: false,
        uc: false,
    };
    let mut ip = None;
    let mut i = 0;
    while i < args.len() {
        let opt = args[i].as_str();
        let val = || {
            args.get(i + 1)
                .cloned()
                .unwrap_or_else(|| die(format!("{opt} needs a value")))
        };
        let num = |v: String| -> u64 {
            v.parse()
                .unwrap_or_else(|_| die(format!("bad value {v} for {opt}")))
        };
        match opt {
            "-p" | "--port" => a.port = num(val()) as u16,
            "-s" | "--size" => a.size = num(val()) as usize,
            "-n" | "--iters" => a.iters = num(val()) as u32,
            "-r" | "--rx-depth" => a.rx_depth = num(val()) as u32,
            "-m" | "--mtu" => a.mtu = num(val()) as u32,
            "-g" | "--gid-idx" => a.gidx = Some(num(val()) as u8),
            "--ip" => ip = Some(val()),
            "--netdev-mtu" => a.netdev_mtu = Some(num(val()) as u32),
            "-c" | "--chk" => a.chk = true,
            "--uc" => a.uc = true,
            "-h" | "--help" => {
                let me = std::env::args().next().unwrap_or_default();
                println!(
                    "usage: {me} [options] [server]   (start the server first, then the client naming it)\n\
                     \x20 --ip ADDR         local address of the device (UDP 4791 on it; default 127.0.0.1, client 127.0.0.2)\n\
                     \x20 -p, --port N      TCP port of the QPN/PSN/GID exchange (default 18515)\n\
                     \x20 -s, --size N      message size (default {default_size})\n\
                     \x20 -n, --iters N     number of exchanges (default 1000)\n\
                     \x20 -r, --rx-depth N  receives kept posted (default 500)\n\
                     \x20 -m, --mtu N       path MTU: 256, 512, 1024, 2048 or 4096 (default 1024)\n\
                     \x20 -g, --gid-idx N   local GID index (default: the device's address)\n\
                     \x20 --netdev-mtu N    link MTU of the --ip device (default 1500; 65536 on loopback);\n\
                     \x20                   its active MTU follows as in kernel rxe (9000 -> 4096)\n\
                     \x20 -c, --chk         the client marks its buffer as ibv_*_pingpong -c does; both\n\
                     \x20                   sides check every received message byte by byte\n\
                     \x20 --uc              UC QP instead of RC, as ibv_uc_pingpong (rxe-rc-pingpong only)\n\
                     \x20 -d, --ib-dev NAME device (default rxe0): rxe-emud's if it runs, else in-process\n\
                     \x20 -i, -l            accepted for ibv_*_pingpong compatibility and ignored"
                );
                exit(0);
            }
            "-d" | "--ib-dev" => a.dev = val(),
            "-i" | "--ib-port" | "-l" | "--sl" => {}
            s if !s.starts_with('-') => a.server = Some(s.to_string()),
            s => die(format!("unknown option {s}")),
        }
        let flag = matches!(opt, "-c" | "--chk" | "--uc");
        i += if opt.starts_with('-') && !flag { 2 } else { 1 };
    }
    a.ip = ip;
    a
}

pub fn to_msg(d: &Dest) -> [u8; MSG_LEN] {
    let gid: String = d.gid.iter().map(|b| format!("{b:02x}")).collect();
    let s = format!("{:04x}:{:06x}:{:06x}:{}", d.lid, d.qpn, d.psn, gid);
    let mut m = [0u8; MSG_LEN];
    m[..s.len()].copy_from_slice(s.as_bytes());
    m
}

pub fn from_msg(m: &[u8]) -> Option<Dest> {
    let s = std::str::from_utf8(m).ok()?.trim_end_matches('\0');
    let mut it = s.split(':');
    let lid = u16::from_str_radix(it.next()?, 16).ok()?;
    let qpn = u32::from_str_radix(it.next()?, 16).ok()?;
    let psn = u32::from_str_radix(it.next()?, 16).ok()?;
    let g = it.next()?;
    if g.len() != 32 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(g.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Dest { lid, qpn, psn, gid })
}

pub fn fmt_gid(g: &[u8; 16]) -> String {
    std::net::Ipv6Addr::from(*g).to_string()
}

pub fn print_dest(which: &str, d: &Dest) {
    println!(
        "  {which} address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid,
        d.qpn,
        d.psn,
        fmt_gid(&d.gid)
    );
}

/// The exchange of ibv_*_pingpong: the client sends its address and reads
/// the server's, then writes "done"; the server reads, calls `connect`,
/// answers, and waits for "done". Returns the peer's address.
pub fn exchange(a: &Args, my: &Dest, connect: impl FnOnce(&Dest)) -> Dest {
    match &a.server {
        Some(host) => {
            let start = Instant::now();
            let mut s = loop {
                match TcpStream::connect((host.as_str(), a.port)) {
                    Ok(s) => break s,
                    Err(e) if start.elapsed() > Duration::from_secs(10) => {
                        die(format!("Couldn't connect to {host}:{}: {e}", a.port))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            };
            s.write_all(&to_msg(my)).unwrap_or_else(|e| die(e));
            let mut m = [0u8; MSG_LEN];
            s.read_exact(&mut m)
                .unwrap_or_else(|e| die(format!("Couldn't read remote address: {e}")));
            s.write_all(b"done\0").unwrap_or_else(|e| die(e));
            let rem = from_msg(&m).unwrap_or_else(|| die("Couldn't parse remote address"));
            connect(&rem);
            rem
        }
        None => {
            let l = TcpListener::bind(("0.0.0.0", a.port))
                .unwrap_or_else(|e| die(format!("Couldn't listen to port {}: {e}", a.port)));
            let (mut s, _) = l.accept().unwrap_or_else(|e| die(e));
            let mut m = [0u8; MSG_LEN];
            s.read_exact(&mut m)
                .unwrap_or_else(|e| die(format!("Couldn't read remote address: {e}")));
            let rem = from_msg(&m).unwrap_or_else(|| die("Couldn't parse remote address"));
            connect(&rem);
            s.write_all(&to_msg(my)).unwrap_or_else(|e| die(e));
            let mut done = [0u8; 5];
            s.read_exact(&mut done)
                .unwrap_or_else(|e| die(format!("Couldn't read \"done\": {e}")));
            rem
        }
    }
}

/// A random 24-bit PSN, as lrand48() & 0xffffff.
pub fn random_psn() -> u32 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    (rxe_core::sim::Rng::new(seed).next_u64() & 0xff_ffff) as u32
}

pub fn report(size: usize, iters: u32, start: Instant) {
    let secs = start.elapsed().as_secs_f64();
    let bytes = size as f64 * f64::from(iters) * 2.0;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes as u64,
        secs,
        bytes * 8.0 / secs / 1e6
    );
    println!(
        "{iters} iters in {secs:.2} seconds = {:.2} usec/iter",
        secs * 1e6 / f64::from(iters)
    );
}

/// What `ibv_*_pingpong -c` puts in a message: the buffer is memset to 0x7b
/// and the client writes `i / page_size % sizeof(char)`, i.e. 0, at the
/// start of every page. The receiver's buffer is also its send buffer, so
/// every message of a run carries exactly this pattern.
pub fn pattern_byte(i: usize) -> u8 {
    if i.is_multiple_of(PAGE_SIZE) {
        0
    } else {
        0x7b
    }
}

/// The page size ibv_*_pingpong takes from sysconf (x86-64).
pub const PAGE_SIZE: usize = 4096;

/// Mark a message as `ibv_*_pingpong -c`'s client does.
pub fn mark_buf(msg: &mut [u8]) {
    for (i, b) in msg.iter_mut().enumerate() {
        *b = pattern_byte(i);
    }
}

/// Check a received message byte by byte against [`pattern_byte`]; `Err`
/// names the first differing offset. (rdma-core's server checks only the
/// page starts, at the end of its run.)
pub fn check_buf(msg: &[u8]) -> Result<(), String> {
    match msg
        .iter()
        .enumerate()
        .find(|(i, b)| **b != pattern_byte(*i))
    {
        None => Ok(()),
        Some((i, b)) => Err(format!(
            "invalid data at offset {i}: 0x{b:02x}, expected 0x{:02x}",
            pattern_byte(i)
        )),
    }
}
