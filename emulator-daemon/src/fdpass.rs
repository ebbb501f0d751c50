//! Passing sockets and other fds between processes (`SCM_RIGHTS`) with a
//! reply line.
//! The only `unsafe` of the crate: taking ownership of a received fd.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Send `line` (with a newline) and, attached to it, `fd`.
pub(crate) fn send_line_with_fd(stream: &UnixStream, line: &str, fd: RawFd) -> io::Result<()> {
    send_line_with_fds(stream, line, &[fd])
}

/// Send `line` (with a newline) and, attached to it, `fds` (at most 4).
pub(crate) fn send_line_with_fds(stream: &UnixStream, line: &str, fds: &[RawFd]) -> io::Result<()> {
    let data = format!("{line}\n");
    let cmsg = [ControlMessage::ScmRights(fds)];
    let mut sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(data.as_bytes())],
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)?;
    // The fd travelled with the first byte; the rest is plain data.
    while sent < data.len() {
        sent += sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&data.as_bytes()[sent..])],
            &[],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(io::Error::from)?;
    }
    Ok(())
}

/// Write what the stream takes of `buf` now, without SIGPIPE: the client
/// side of the control connection runs inside applications (C programs
/// through the drop-in libibverbs) whose SIGPIPE kills them by default,
/// and a daemon that went away must give them an error, not a signal.
pub fn send_nosignal(stream: &UnixStream, buf: &[u8]) -> io::Result<usize> {
    loop {
        match nix::sys::socket::send(stream.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// All of `buf` (blocking as the stream does), without SIGPIPE.
pub fn send_all_nosignal(stream: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match send_nosignal(stream, buf)? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => buf = &buf[n..],
        }
    }
    Ok(())
}

/// Read one line, and the fds that came with it (at most a few).
pub(crate) fn recv_line_with_fds(stream: &UnixStream) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    loop {
        let mut buf = [0u8; 512];
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: the kernel installed `fd` in this process
                    // for this message just now; nothing else refers to
                    // it, so it is ours to own and close.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        let n = msg.bytes;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "rxe-emud closed the connection",
            ));
        }
        line.extend_from_slice(&buf[..n]);
        if line.contains(&b'\n') || line.len() > 65536 {
            break;
        }
    }
    let s = String::from_utf8_lossy(&line);
    Ok((s.trim_end_matches('\n').to_string(), fds))
}
