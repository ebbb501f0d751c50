//! rxe-emud: host rxe-emu devices that many processes share.
//!
//! `rxe-emud [--device NAME=ADDR[/MTU][,like=L]|NAME=netdev:IF[,like=L]]... [--socket PATH] [--slots N] [--any-user]`
//! (default device: rxe0=127.0.0.1). Usually started by `rxe-emu start`.

use std::path::PathBuf;

use clap::Parser;
use emulator_daemon::server::{DeviceSpec, Server, ServerConfig, DEFAULT_SLOTS};

/// Host rxe-emu devices shared by many processes (UDP/4791 steered by QPN).
#[derive(Parser)]
#[command(version)]
struct Args {
    /// A device to host: NAME=ADDR, NAME=ADDR/MTU to set the netdev MTU,
    /// or NAME=netdev:IFNAME to take an interface's address and MTU; add
    /// ,like=mlx5 for a ConnectX-like device (ECN, CNPs, DCQCN), or
    /// ,like=6.1 / ,like=6.12 for an older kernel rxe, instead of the
    /// newest kernel rxe (,like=rxe, the default; also ,like=7.2).
    #[arg(
        long = "device",
        value_name = "NAME=ADDR[/MTU][,like=L]|NAME=netdev:IF"
    )]
    devices: Vec<DeviceSpec>,
    /// Control socket (default: $RXE_EMU_SOCKET, else the user's runtime dir).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Client slots per device, 2..=64 (slot 0 is the daemon's).
    #[arg(long, default_value_t = DEFAULT_SLOTS)]
    slots: u32,
    /// Serve every user (system-wide); by default only this user.
    #[arg(long)]
    any_user: bool,
}

fn main() {
    let a = Args::parse();
    // Each client and each RDMA CM event channel is a socket here: use
    // the whole file limit the system allows us, not the 1024 default.
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
    let devices = if a.devices.is_empty() {
        vec!["rxe0=127.0.0.1".parse().expect("valid default")]
    } else {
        a.devices
    };
    let cfg = ServerConfig {
        socket_path: a
            .socket
            .unwrap_or_else(emulator_daemon::default_socket_path),
        devices,
        slots: a.slots,
        any_user: a.any_user,
    };
    let server = match Server::bind(cfg.clone(), true) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rxe-emud: {e}");
            // A parent waiting on our stdout (`rxe-emu start`, `exec`, the
            // drop-in's autostart) reads the reason there; a person at a
            // terminal has just read it on stderr.
            if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                println!("failed: {e}");
            }
            std::process::exit(1);
        }
    };
    for (name, addr) in server.devices() {
        eprintln!("rxe-emud: device {name} on {addr}:4791");
    }
    eprintln!("rxe-emud: listening on {}", cfg.socket_path.display());
    // Tell a parent waiting on our stdout that we are ready (or, above,
    // why we are not: `failed: <reason>`).
    println!("ready");
    if let Err(e) = server.run_until_stopped() {
        eprintln!("rxe-emud: {e}");
        std::process::exit(1);
    }
}
