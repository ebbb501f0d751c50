//! Talking to `rxe-emud`: open a device (get a slot socket and ranges),
//! ask for status, ask it to stop.

use std::io::{self, Read};
use std::net::UdpSocket;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::fdpass;
use crate::proto::DeviceInfo;

/// A device opened through the daemon.
#[derive(Debug)]
pub struct Opened {
    /// The slot's UDP socket: part of the device's `<addr>:4791` reuseport
    /// group; the daemon steers this slot's QPNs to it.
    pub socket: UdpSocket,
    /// The control connection. Keep it open for the device's life; it
    /// becomes readable (end-of-file) if the daemon goes away.
    pub control: UnixStream,
    /// Ranges and addresses to configure the engine with.
    pub info: DeviceInfo,
    /// The slot's same-host inbox (memfd, eventfd; see `local_link`), if
    /// the daemon has one for it.
    pub inbox: Option<(OwnedFd, OwnedFd)>,
}

fn connect(path: &Path) -> Result<UnixStream, String> {
    UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot reach rxe-emud at {}: {e} (start it with `rxe-emu start`, or set RXE_EMU_SOCKET)",
            path.display()
        )
    })
}

/// Open device `name` on the daemon listening at `path`.
pub fn open(path: &Path, name: &str) -> Result<Opened, String> {
    let s = connect(path)?;
    // A daemon that refuses us (another user's) says why and hangs up,
    // perhaps before our request is written: its reason is still there to
    // read, and is the error to give.
    let sent = fdpass::send_all_nosignal(&s, format!("OPEN {name}\n").as_bytes());
    let got = fdpass::recv_line_with_fds(&s);
    let (line, mut fds) = match (sent, got) {
        (_, Ok((l, f))) if !l.is_empty() => (l, f),
        (Err(e), _) | (Ok(()), Err(e)) => {
            return Err(format!("rxe-emud at {}: {e}", path.display()))
        }
        (Ok(()), Ok(_)) => {
            return Err(format!(
                "rxe-emud at {} closed the connection without a reply",
                path.display()
            ))
        }
    };
    if let Some(msg) = line.strip_prefix("ERR ") {
        return Err(format!("rxe-emud: {msg}"));
    }
    let info = DeviceInfo::from_line(&line)?;
    if fds.len() != 1 && fds.len() != 3 {
        return Err(format!(
            "rxe-emud sent {} fds with its reply, expected 1 or 3",
            fds.len()
        ));
    }
    let socket = UdpSocket::from(fds.remove(0));
    let inbox = (fds.len() == 2).then(|| {
        let event = fds.pop().expect("two fds");
        (fds.pop().expect("two fds"), event)
    });
    socket
        .set_nonblocking(true)
        .map_err(|e| format!("slot socket: {e}"))?;
    Ok(Opened {
        socket,
        control: s,
        info,
        inbox,
    })
}

/// The same-host inbox (memfd, eventfd) of slot `slot` of device `name`,
/// or `None` when the slot has none (nobody owns it): its packets then go
/// by UDP, where the daemon counts them.
pub fn inbox(path: &Path, name: &str, slot: usize) -> Result<Option<(OwnedFd, OwnedFd)>, String> {
    let s = connect(path)?;
    fdpass::send_all_nosignal(&s, format!("INBOX {name} {slot}\n").as_bytes())
        .map_err(|e| format!("rxe-emud: {e}"))?;
    let (line, mut fds) = fdpass::recv_line_with_fds(&s).map_err(|e| format!("rxe-emud: {e}"))?;
    if line.starts_with("INBOX ") && fds.len() == 2 {
        let event = fds.pop().expect("two fds");
        return Ok(Some((fds.pop().expect("two fds"), event)));
    }
    if line.starts_with("NONE ") {
        return Ok(None);
    }
    Err(format!(
        "rxe-emud answered INBOX with {line:?} and {} fds",
        fds.len()
    ))
}

/// Send a one-shot request (`STATUS`, `STOP`) and read the whole reply.
pub fn request(path: &Path, req: &str) -> Result<String, String> {
    let mut s = connect(path)?;
    let sent = fdpass::send_all_nosignal(&s, format!("{req}\n").as_bytes());
    let mut out = String::new();
    match (sent, s.read_to_string(&mut out)) {
        // A refusal arrives even when our request did not go through.
        (_, Ok(_)) if !out.is_empty() => Ok(out),
        (Err(e), _) => Err(format!("rxe-emud: {e}")),
        (Ok(()), Ok(_)) => Ok(out),
        (Ok(()), Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => Ok(out),
        (Ok(()), Err(e)) => Err(format!("rxe-emud: {e}")),
    }
}

/// Start `rxe-emud` (the program `exe`) in the background on control
/// socket `socket`, hosting `devices` (`NAME=ADDR[/MTU]`; none: the
/// daemon's default `rxe0=127.0.0.1`), and wait until it is ready. It runs
/// in its own process group, so a Ctrl-C meant for the caller's terminal
/// does not reach it. `quiet` sends its start-up messages to /dev/null.
/// Returns its pid.
pub fn spawn_daemon(
    exe: &Path,
    socket: &Path,
    devices: &[String],
    any_user: bool,
    quiet: bool,
) -> Result<u32, String> {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(exe);
    cmd.arg("--socket").arg(socket);
    for d in devices {
        cmd.arg("--device").arg(d);
    }
    if any_user {
        cmd.arg("--any-user");
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(if quiet {
            Stdio::null()
        } else {
            Stdio::inherit()
        })
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let mut line = String::new();
    let out = child.stdout.take().expect("piped stdout");
    let _ = io::BufReader::new(out).read_line(&mut line);
    let line = line.trim();
    if line == "ready" {
        return Ok(child.id());
    }
    // `failed: <reason>` (rxe-emud's own words), or nothing at all.
    let status = child.wait();
    Err(match line.strip_prefix("failed: ") {
        Some(reason) => format!("rxe-emud could not start: {reason}"),
        None => format!(
            "rxe-emud ({}) {} before it was ready",
            exe.display(),
            match status {
                Ok(s) => describe_exit(s),
                Err(e) => format!("could not be waited for ({e})"),
            }
        ),
    })
}

/// "exited with status 1", "was killed by signal 9 (SIGKILL)".
pub fn describe_exit(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(name) => format!("was killed by signal {sig} ({name})"),
            Err(_) => format!("was killed by signal {sig}"),
        },
        (None, None) => "ended".to_string(),
    }
}
