//! The library side of [`crate::cmproto`]: a command connection to
//! `rxe-emud`'s connection manager and the event channels it hands out.
//! `librdmacm.so.1` is built on this.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::sys::socket::{recv, MsgFlags};

use crate::cmproto::{parse_reply, CmErr, CmEvent, Fields, Request};
use crate::fdpass;

/// Longest event message the daemon sends (private data is at most 220
/// bytes, 440 hex digits; the rest is well under 1 KiB).
pub const MAX_EVENT_LEN: usize = 4096;

fn io_cm(e: io::Error, what: &str) -> CmErr {
    CmErr::new(
        e.raw_os_error().unwrap_or(libc::EIO),
        format!("rxe-emud {what}: {e}"),
    )
}

/// A process's command connection to the daemon's connection manager.
/// Requests are answered in order; callers serialise them (one request
/// at a time on a connection).
#[derive(Debug)]
pub struct CmConnection {
    stream: UnixStream,
}

impl CmConnection {
    /// Connect to the daemon at `path` and switch the connection to CM
    /// requests.
    pub fn connect(path: &Path) -> Result<CmConnection, CmErr> {
        let stream = UnixStream::connect(path).map_err(|e| {
            CmErr::new(
                libc::ENODEV,
                format!(
                    "cannot reach rxe-emud at {}: {e} (start it with `rxe-emu start`, or set RXE_EMU_SOCKET)",
                    path.display()
                ),
            )
        })?;
        let c = CmConnection { stream };
        c.exchange("CM")?;
        Ok(c)
    }

    fn exchange(&self, line: &str) -> Result<(Fields, Vec<OwnedFd>), CmErr> {
        fdpass::send_all_nosignal(&self.stream, format!("{line}\n").as_bytes())
            .map_err(|e| io_cm(e, "request"))?;
        let (reply, fds) =
            fdpass::recv_line_with_fds(&self.stream).map_err(|e| io_cm(e, "reply"))?;
        Ok((parse_reply(&reply)?, fds))
    }

    /// Send `req` and wait for its answer.
    pub fn request(&self, req: &Request) -> Result<Fields, CmErr> {
        self.exchange(&req.to_line()).map(|(f, _)| f)
    }

    /// A new event channel: its number and its socket (a
    /// `SOCK_SEQPACKET` socket, one event per message).
    pub fn channel(&self) -> Result<(u64, OwnedFd), CmErr> {
        let (f, mut fds) = self.exchange(&Request::Channel.to_line())?;
        let chan = f.u64("chan")?;
        if fds.len() != 1 {
            return Err(CmErr::new(
                libc::EPROTO,
                format!("rxe-emud sent {} fds with CHANNEL, expected 1", fds.len()),
            ));
        }
        Ok((chan, fds.remove(0)))
    }

    /// The connection's fd (readable at end-of-file when the daemon goes).
    pub fn as_raw_fd(&self) -> i32 {
        self.stream.as_raw_fd()
    }
}

/// Take every event waiting in an event channel socket now, without
/// blocking (for `rdma_migrate_id`, which hands some of them on).
pub fn drain_events(chan: BorrowedFd<'_>) -> Vec<CmEvent> {
    let mut out = Vec::new();
    let mut buf = [0u8; MAX_EVENT_LEN];
    loop {
        match recv(chan.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(n) if n > 0 => {
                if let Ok(e) = CmEvent::parse(&String::from_utf8_lossy(&buf[..n])) {
                    out.push(e);
                }
            }
            _ => return out,
        }
    }
}

/// Receive one event from an event channel socket. Blocks unless the
/// socket is non-blocking (then `EAGAIN` as an `io::Error` of kind
/// `WouldBlock`). End-of-file (the daemon went away) is `ENODEV`.
pub fn recv_event(chan: BorrowedFd<'_>) -> Result<CmEvent, CmErr> {
    let mut buf = [0u8; MAX_EVENT_LEN];
    let n = loop {
        match recv(chan.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(CmErr::new(e as i32, format!("event channel: {e}"))),
            Ok(0) => {
                return Err(CmErr::new(
                    libc::ENODEV,
                    "event channel: rxe-emud went away",
                ))
            }
            Ok(n) => break n,
        }
    };
    CmEvent::parse(&String::from_utf8_lossy(&buf[..n]))
}
