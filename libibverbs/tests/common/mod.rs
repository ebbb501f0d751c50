//! Helpers for running unmodified rdma-core programs on our libibverbs
//! (and, for librdmacm's tests, which include this file, our librdmacm):
//! an in-test rxe-emud, a directory holding `libibverbs.so.1` (and
//! `librdmacm.so.1`), and client/server runs with timeouts.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use emulator_daemon::server::{Server, ServerConfig};

pub mod debian;
pub mod layout;

#[path = "../../../test-support/skip.rs"]
mod skip;
#[allow(unused_imports)]
pub use skip::{have_file, have_program, have_root, required, skip};

/// The results of a `unittest -v` log, in order: (test name, result),
/// the result one of "ok", "ERROR", "FAIL", "skipped", "expected failure".
/// unittest -v prints "name (id) ... result", or "name (id)" and then the
/// docstring's first line with the result; a warning printed by a test
/// pushes the result onto a line of its own.
pub fn unittest_results(log: &str) -> Vec<(&str, &'static str)> {
    let mut results = Vec::new();
    let mut current = "";
    for l in log.lines() {
        if l.starts_with("test") && l.contains(" (tests.") {
            current = l.split(' ').next().unwrap_or("");
        }
        for r in ["ok", "ERROR", "FAIL", "skipped", "expected failure"] {
            if l.ends_with(&format!("... {r}"))
                || l.contains(&format!("... {r} "))
                || l == r
                || l.starts_with(&format!("{r} '"))
            {
                results.push((current, r));
            }
        }
    }
    results
}

pub fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rxe-dropin-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The directory of the test binary's target profile (`target/release`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// `lib` exists and is not older than the sources of `crate_dir`
/// (`cargo test` does not rebuild a cdylib).
fn fresh(lib: &Path, crate_dir: &Path) {
    assert!(
        lib.exists(),
        "{} is missing: build the workspace in this profile first (cargo build{} --workspace)",
        lib.display(),
        if profile_dir().ends_with("release") {
            " --release"
        } else {
            ""
        }
    );
    let built = std::fs::metadata(lib).and_then(|m| m.modified()).unwrap();
    let mut sources = vec![crate_dir.join("exports.txt"), crate_dir.join("layout.txt")];
    let mut dirs = vec![crate_dir.join("src")];
    while let Some(d) = dirs.pop() {
        for p in std::fs::read_dir(d)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
        {
            if p.is_dir() {
                dirs.push(p);
            } else {
                sources.push(p);
            }
        }
    }
    let newer: Vec<PathBuf> = sources
        .into_iter()
        .filter(|p| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t > built)
        })
        .collect();
    assert!(
        newer.is_empty(),
        "{} is older than {newer:?}: run `cargo build --release --workspace` (scripts/test does)",
        lib.display()
    );
}

/// A directory holding `libibverbs.so.1` (and `librdmacm.so.1` in
/// librdmacm's tests): links to the libraries cargo built, checked to be
/// fresh, for `LD_LIBRARY_PATH`.
pub fn dropin_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut libs = vec!["ibverbs"];
        if env!("CARGO_PKG_NAME") == "rxe-librdmacm" {
            libs.push("rdmacm");
        }
        let d = scratch_dir("lib");
        for name in libs {
            let lib = profile_dir().join(format!("lib{name}.so"));
            fresh(&lib, &workspace.join(format!("lib{name}")));
            let link = d.join(format!("lib{name}.so.1"));
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&lib, &link).unwrap();
        }
        d
    })
    .clone()
}

/// Programs of different tests would compete for the 2 cores of a CI
/// machine; run them one test at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

/// An rxe-emud serving one device, in a thread of the test.
pub struct Daemon {
    pub socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Daemon {
    /// `device` is `rxe0=ADDR`.
    pub fn start(tag: &str, device: &str) -> Daemon {
        Self::start_with_slots(tag, device, 8)
    }

    /// As [`Daemon::start`], with room for `slots` open contexts.
    pub fn start_with_slots(tag: &str, device: &str, slots: u32) -> Daemon {
        let socket = scratch_dir(&format!("d-{tag}")).join("rxe-emud.sock");
        let cfg = ServerConfig {
            socket_path: socket.clone(),
            devices: vec![device.parse().unwrap()],
            slots,
            any_user: false,
        };
        // The address may still be held for a moment by a process of an
        // earlier run that is exiting (a CI run saw EADDRINUSE once, with
        // nothing on the address a moment later): try again for 2 s.
        let mut tries = 0;
        let server = loop {
            match Server::bind(cfg.clone(), false) {
                Ok(s) => break s,
                Err(e) if e.contains("Address already in use") && tries < 20 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{e}"),
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::spawn(move || server.run(&s2).unwrap());
        Daemon {
            socket,
            stop,
            thread: Some(thread),
        }
    }

    /// A command that loads our libibverbs and finds this daemon's device.
    pub fn command(&self, prog: &str) -> Command {
        let mut c = Command::new(prog);
        c.env("LD_LIBRARY_PATH", dropin_dir())
            .env("RXE_EMU_SOCKET", &self.socket)
            .env("RXE_EMU_AUTOSTART", "0")
            .env_remove("RXE_EMU_MODE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(d) = self.socket.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Wait for a child, killing it after `limit`.
pub fn wait_limited(mut child: Child, limit: Duration) -> (Output, bool) {
    // The pipes are drained as the child writes: a child that writes more
    // than a pipe holds (rdma-core's suite with -v) would otherwise block
    // until the limit.
    fn drain<R: std::io::Read + Send + 'static>(r: Option<R>) -> JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut b);
            }
            b
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = Instant::now();
    let (status, timed_out) = loop {
        match child.try_wait().unwrap() {
            Some(st) => break (st, false),
            None if start.elapsed() > limit => {
                let _ = child.kill();
                break (child.wait().unwrap(), true);
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let output = Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    };
    (output, timed_out)
}

/// Whether something listens on TCP `port` (IPv4 or IPv6, any address).
pub fn listening(port: u16) -> bool {
    listening_in(std::process::id(), port)
}

/// Whether something listens on TCP `port` in the network namespace of
/// process `pid` (a server may run in another namespace than the test).
pub fn listening_in(pid: u32, port: u16) -> bool {
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3
                    && w[3] == "0A"
                    && w[1]
                        .rsplit(':')
                        .next()
                        .and_then(|p| u16::from_str_radix(p, 16).ok())
                        == Some(port)
            })
        })
    })
}

/// Both sides of a client/server run.
pub struct Run {
    pub server: Output,
    pub client: Output,
    pub timed_out: bool,
    /// Client attempts ([`client_server_retrying`] starts a client that
    /// was rejected before its server listened again).
    pub attempts: u32,
}

impl Run {
    pub fn text(&self) -> String {
        format!(
            "--- server ({:?}):\n{}{}\n--- client ({:?}, attempt {}):\n{}{}",
            self.server.status,
            String::from_utf8_lossy(&self.server.stdout),
            String::from_utf8_lossy(&self.server.stderr),
            self.client.status,
            self.attempts,
            String::from_utf8_lossy(&self.client.stdout),
            String::from_utf8_lossy(&self.client.stderr)
        )
    }

    pub fn ok(&self) -> bool {
        !self.timed_out && self.server.status.success() && self.client.status.success()
    }

    pub fn stdout(&self) -> (String, String) {
        (
            String::from_utf8_lossy(&self.server.stdout).into_owned(),
            String::from_utf8_lossy(&self.client.stdout).into_owned(),
        )
    }
}

/// Run `prog args -p port` as a server, wait until it listens, then the
/// same as a client of 127.0.0.1; both must end within `limit`.
pub fn client_server(d: &Daemon, prog: &str, args: &[&str], port: u16, limit: Duration) -> Run {
    let port_s = port.to_string();
    let server = d
        .command(prog)
        .args(args)
        .args(["-p", &port_s])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !listening(port) && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = d
        .command(prog)
        .args(args)
        .args(["-p", &port_s, "127.0.0.1"])
        .spawn()
        .unwrap();
    let (client, t1) = wait_limited(client, limit);
    // A client that failed leaves the server waiting: give it a moment.
    let slimit = if client.status.success() {
        limit
    } else {
        Duration::from_secs(3)
    };
    let (server, t2) = wait_limited(server, slimit);
    Run {
        server,
        client,
        timed_out: t1 || t2,
        attempts: 1,
    }
}

/// Run `server`, then `client` until it succeeds (an RDMA CM client that
/// comes before the server listens is rejected and exits at once: it is
/// started again, for at most 20 s), each within `limit`.
pub fn client_server_retrying(
    d: &Daemon,
    server: (&str, &[&str]),
    client: (&str, &[&str]),
    limit: Duration,
) -> Run {
    let s = d.command(server.0).args(server.1).spawn().unwrap();
    let start = Instant::now();
    let mut attempts = 0;
    let (c, t1) = loop {
        attempts += 1;
        std::thread::sleep(Duration::from_millis(200));
        let child = d.command(client.0).args(client.1).spawn().unwrap();
        let (out, timed_out) = wait_limited(child, limit);
        if out.status.success() || timed_out || start.elapsed() > Duration::from_secs(20) {
            break (out, timed_out);
        }
    };
    let slimit = if c.status.success() {
        limit
    } else {
        Duration::from_secs(3)
    };
    let (s, t2) = wait_limited(s, slimit);
    Run {
        server: s,
        client: c,
        timed_out: t1 || t2,
        attempts,
    }
}

/// Compile `tests/c/<name>.c` against the system's `<infiniband/verbs.h>`
/// and libibverbs (as a program is built; it runs on ours through
/// [`Daemon::command`]) into `dir`. `None`, after saying why, if the
/// headers or a C compiler are missing outside CI.
pub fn compile_c(name: &str, dir: &Path) -> Option<PathBuf> {
    if !have_file("/usr/include/infiniband/verbs.h", "libibverbs-dev") || !have_program("cc", "gcc")
    {
        return None;
    }
    let exe = dir.join(name);
    let src = format!("{}/tests/c/{name}.c", env!("CARGO_MANIFEST_DIR"));
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(src)
        .arg("-libverbs")
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    Some(exe)
}
