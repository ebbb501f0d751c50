//! # emulator-daemon: one rxe-emu device shared by many processes
//!
//! Kernel rxe is one device per netdev that every process on the host
//! opens. An in-process rxe-emu device cannot be that: only one socket can
//! own `<addr>:4791`. `rxe-emud` can. It is the device's control plane; the
//! data path never crosses it:
//!
//! - For each device it binds a `SO_REUSEPORT` group of UDP sockets on
//!   `<addr>:4791`, one per **slot**, and attaches a classic BPF program
//!   (`SO_ATTACH_REUSEPORT_CBPF`, no privilege needed) that steers each
//!   datagram by its BTH destination QPN: slot = `QPN >> 16`. Slot 0 (QPN
//!   below 0x10000, which includes QP1, and anything too short to carry a
//!   BTH) stays with the daemon, which counts and drops it.
//! - A client process asks for a device over a Unix socket; the daemon
//!   gives it a free slot's socket over `SCM_RIGHTS`, the slot's QPN range
//!   (`slot << 16 | 0x11 ..= slot << 16 | 0xffff`) and a disjoint MR/MW key
//!   space, so nothing one process hands out can name another's QP or
//!   memory. The client runs the engine itself, on its own memory, and
//!   sends and receives directly.
//! - The daemon keeps a duplicate of every slot socket, so the group's
//!   order (which the BPF program indexes) never changes. When a client
//!   goes (exit or crash, seen as end-of-file on its control connection)
//!   its slot is drained and counted until it is given again, and the next
//!   owner's QPNs start further on, so a late packet for a dead QP finds no
//!   QP of the new owner (the engine counts and drops it).
//!
//! [`client`] is what `verbs-api` uses to open a daemon device; [`server`]
//! is the daemon. See `ARCHITECTURE.md` for why the engine runs in the
//! client rather than in the daemon.

#![deny(missing_docs)]

pub mod client;
pub mod cm;
pub mod cm_client;
pub mod cmproto;
pub mod explain;
mod fdpass;
pub use fdpass::{send_all_nosignal, send_nosignal};
pub mod pcap_check;
pub mod proto;
pub mod server;
mod steer;
pub mod trace;

pub use proto::{default_socket_path, DeviceInfo};
