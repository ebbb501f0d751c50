//! Talking to `rxe-emud`: open a device (get a slot socket and ranges),
//! ask for status, ask it to stop.

use std::io::{self, Read, Write};
use std::net::UdpSocket;
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
    let mut s = connect(path)?;
    s.write_all(format!("OPEN {name}\n").as_bytes())
        .map_err(|e| format!("rxe-emud at {}: {e}", path.display()))?;
    let (line, mut fds) = fdpass::recv_line_with_fds(&s)
        .map_err(|e| format!("rxe-emud at {}: {e}", path.display()))?;
    if let Some(msg) = line.strip_prefix("ERR ") {
        return Err(format!("rxe-emud: {msg}"));
    }
    let info = DeviceInfo::from_line(&line)?;
    if fds.len() != 1 {
        return Err(format!(
            "rxe-emud sent {} sockets with its reply, expected 1",
            fds.len()
        ));
    }
    let socket = UdpSocket::from(fds.remove(0));
    socket
        .set_nonblocking(true)
        .map_err(|e| format!("slot socket: {e}"))?;
    Ok(Opened {
        socket,
        control: s,
        info,
    })
}

/// Send a one-shot request (`STATUS`, `STOP`) and read the whole reply.
pub fn request(path: &Path, req: &str) -> Result<String, String> {
    let mut s = connect(path)?;
    s.write_all(format!("{req}\n").as_bytes())
        .map_err(|e| format!("rxe-emud: {e}"))?;
    let mut out = String::new();
    match s.read_to_string(&mut out) {
        Ok(_) => Ok(out),
        Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(out),
        Err(e) => Err(format!("rxe-emud: {e}")),
    }
}
