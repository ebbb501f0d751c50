//! The process's one command connection to rxe-emud's connection manager
//! (what `/dev/infiniband/rdma_cm` is to rdma-core's librdmacm). Requests
//! are strictly request → reply, so one mutex serialises them.

use std::os::fd::OwnedFd;
use std::sync::Mutex;

use emulator_daemon::cm_client::CmConnection;
use emulator_daemon::cmproto::{CmErr, Fields, Request};

use crate::err;

static CONN: Mutex<Option<CmConnection>> = Mutex::new(None);

/// Whether `e` came from the connection itself (the daemon went away),
/// not from an `ERR` reply.
fn transport_failure(e: &CmErr) -> bool {
    e.message.starts_with("rxe-emud request") || e.message.starts_with("rxe-emud reply")
}

/// Make sure an `rxe-emud` runs: our libibverbs starts one when asked for
/// its devices (unless `RXE_EMU_AUTOSTART=0`), and a daemon with no
/// device is of no use to rdma_cm either.
fn daemon_with_devices() -> Result<(), CmErr> {
    let n = crate::device::count_devices();
    if n == 0 {
        return Err(err(
            libc::ENODEV,
            "no RDMA device: libibverbs found none (is rxe-emud running, with a device? RXE_EMU_SOCKET)",
        ));
    }
    Ok(())
}

fn with_conn<T>(f: impl FnOnce(&CmConnection) -> Result<T, CmErr>) -> Result<T, CmErr> {
    let mut g = CONN.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        daemon_with_devices()?;
        let path = emulator_daemon::default_socket_path();
        *g = Some(CmConnection::connect(&path).map_err(|e| err(libc::ENODEV, e.message))?);
    }
    let Some(c) = g.as_ref() else {
        return Err(err(libc::ENODEV, "no connection to rxe-emud"));
    };
    match f(c) {
        Err(e) if transport_failure(&e) => {
            *g = None;
            Err(err(
                libc::ENODEV,
                format!("{} (rxe-emud went away)", e.message),
            ))
        }
        r => r,
    }
}

/// Send `req` and wait for its reply.
pub fn request(req: &Request) -> Result<Fields, CmErr> {
    with_conn(|c| c.request(req))
}

/// A new event channel: its number and socket.
pub fn channel() -> Result<(u64, OwnedFd), CmErr> {
    with_conn(|c| c.channel())
}
