//! The harness of the middleware tests: a daemon started with `rxe-emu
//! start` and programs run with `rxe-emu exec`, exactly as the README
//! tells a user; libibverbs' test helpers for the rest.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[path = "../../../libibverbs/tests/common/mod.rs"]
mod dropin;
#[allow(unused_imports)]
pub use dropin::debian;
#[allow(unused_imports)]
pub use dropin::{
    have_file, have_program, have_root, listening, listening_in, profile_dir, required,
    scratch_dir, serial, skip, wait_limited,
};

/// `target/<profile>/rxe-emu`, which finds our libraries beside itself.
pub fn cli() -> PathBuf {
    let p = profile_dir().join("rxe-emu");
    assert!(
        p.exists() && profile_dir().join("librxe_emu_preload.so").exists(),
        "{} or librxe_emu_preload.so is missing: build the workspace in this profile first (cargo build --release --workspace)",
        p.display()
    );
    p
}

/// A device (its own daemon, its own control socket) that programs reach
/// through `rxe-emu exec`.
pub struct Rxe {
    pub socket: PathBuf,
    dir: PathBuf,
    /// The network namespace the daemon and the programs run in.
    netns: Option<String>,
}

impl Rxe {
    /// `rxe-emu start --device <device>` on a socket of this test's.
    pub fn start(tag: &str, device: &str) -> Rxe {
        Self::start_in(None, tag, device)
    }

    /// `cli()`, inside `netns` if there is one.
    fn cli_command(netns: Option<&str>) -> Command {
        match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(cli());
                c
            }
            None => Command::new(cli()),
        }
    }

    /// As [`Rxe::start`], in network namespace `netns` (see [`Netns`]).
    pub fn start_in(netns: Option<&str>, tag: &str, device: &str) -> Rxe {
        let dir = scratch_dir(&format!("mw-{tag}"));
        let socket = dir.join("rxe-emud.sock");
        // The daemon inherits the output of `rxe-emu start`: a file, not
        // a pipe that would never end.
        let log = dir.join("start.log");
        let f = std::fs::File::create(&log).unwrap();
        let status = Self::cli_command(netns)
            .arg("--socket")
            .arg(&socket)
            .args(["start", "--device", device])
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "rxe-emu start --device {device}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Rxe {
            socket,
            dir,
            netns: netns.map(str::to_string),
        }
    }

    /// `rxe-emu exec -- <prog>`, output captured.
    pub fn exec(&self, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Self::cli_command(self.netns.as_deref());
        self.exec_args(&mut c, prog);
        c
    }

    /// The same, with no namespace to be had (see `deny_ns`).
    pub fn exec_denied_ns(&self, deny: &Path, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(deny);
        c.arg(cli());
        self.exec_args(&mut c, prog);
        c
    }

    fn exec_args(&self, c: &mut Command, prog: impl AsRef<std::ffi::OsStr>) {
        c.arg("--socket")
            .arg(&self.socket)
            .args(["exec", "--"])
            .arg(prog)
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("LD_PRELOAD")
            .env_remove("RXE_EMU_MODE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }

    /// `rxe-emu status`.
    pub fn status(&self) -> String {
        let out = Self::cli_command(self.netns.as_deref())
            .arg("--socket")
            .arg(&self.socket)
            .arg("status")
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A counter of the device's line in `rxe-emu status`.
    pub fn status_counter(&self, name: &str) -> u64 {
        let s = self.status();
        s.split_whitespace()
            .skip_while(|w| *w != name)
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{s}"))
    }
}

impl Drop for Rxe {
    fn drop(&mut self) {
        let _ = Self::cli_command(self.netns.as_deref())
            .arg("--socket")
            .arg(&self.socket)
            .arg("stop")
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `deny-ns` (test-support/deny_ns.c), compiled once: runs a command
/// where unshare, setns, mount and namespace clones fail, as in an
/// unprivileged container. `None` (the test skipped) without a C compiler.
pub fn deny_ns() -> Option<PathBuf> {
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    if !have_program("cc", "gcc") {
        return None;
    }
    EXE.get_or_init(|| {
        let exe = std::env::temp_dir().join(format!("rxe-deny-ns-{}", std::process::id()));
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../test-support/deny_ns.c");
        let out = Command::new("cc")
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cc deny_ns.c: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(exe)
    })
    .clone()
}

/// Compile a C program of a middleware package (`cc SRC -o EXE LIBS`).
pub fn compile(src: &Path, exe: &Path, libs: &[&str]) {
    let out = Command::new("cc")
        .args(["-O1", "-o"])
        .arg(exe)
        .arg(src)
        .args(libs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Output of a finished program as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A server and a client of one run; both must succeed.
pub struct Pair {
    pub server: Output,
    pub client: Output,
}

impl Pair {
    pub fn text(&self) -> String {
        format!(
            "--- server ({}):\n{}\n--- client ({}):\n{}",
            self.server.status,
            text(&self.server),
            self.client.status,
            text(&self.client)
        )
    }

    pub fn ok(&self) -> bool {
        self.server.status.success() && self.client.status.success()
    }
}

/// Start `server`, wait until something listens on TCP `port` (its
/// out-of-band connection), run `client`, and wait for both (at most
/// `limit` each).
pub fn server_client(mut server: Command, port: u16, mut client: Command, limit: Duration) -> Pair {
    let s = server.spawn().unwrap();
    let start = Instant::now();
    while !listening_in(s.id(), port) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (client, _) = wait_limited(client.spawn().unwrap(), limit);
    let slimit = if client.status.success() {
        limit
    } else {
        Duration::from_secs(3)
    };
    let (server, _) = wait_limited(s, slimit);
    Pair { server, client }
}

/// A network namespace with a veth pair whose two ends carry `a` and `b`
/// (/24), as a host with a real network interface has: libfabric's verbs
/// provider, like kernel rxe, will not use a device on a loopback
/// interface. Deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: &str, a: &str, b: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
        let run = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {}", text(&out));
        };
        run(&["netns", "add", name]);
        let ns = |args: &[&str]| {
            let mut v = vec!["netns", "exec", name, "ip"];
            v.extend_from_slice(args);
            run(&v);
        };
        ns(&["link", "add", "va", "type", "veth", "peer", "name", "vb"]);
        ns(&["addr", "add", &format!("{a}/24"), "dev", "va"]);
        ns(&["addr", "add", &format!("{b}/24"), "dev", "vb"]);
        for dev in ["lo", "va", "vb"] {
            ns(&["link", "set", dev, "up"]);
        }
        Netns { name: name.into() }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Open MPI over UCX on rxe0 only: pml ucx, one-sided through UCX, no
/// shared memory or TCP transport.
pub const MPI_OVER_UCX: &[&str] = &[
    "--mca",
    "pml",
    "ucx",
    "--mca",
    "btl",
    "self",
    "--mca",
    "osc",
    "ucx",
    "-x",
    "UCX_TLS=rc_verbs,ud_verbs,self",
    "-x",
    "UCX_NET_DEVICES=rxe0:1",
];
