//! The reuseport steering program: a datagram for QPN `q` goes to the
//! group's socket number `q >> 16` (its slot), and anything else (slot out
//! of range, a datagram too short for a BTH) to socket 0, the daemon's.

use std::os::fd::AsFd;

use nix::sys::socket::{setsockopt, sockopt};

/// Classic BPF, as `struct sock_filter` entries (code, jt, jf, k). For a
/// UDP reuseport group the program sees the UDP payload: BTH first.
fn program(slots: u32) -> [libc::sock_filter; 6] {
    let ins = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    [
        // A = 32-bit word at payload offset 4: BTH reserved byte + DestQP.
        ins((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, 0, 0, 4),
        // A &= 0xffffff: the QPN.
        ins(
            (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16,
            0,
            0,
            0x00ff_ffff,
        ),
        // A >>= 16: the slot.
        ins(
            (libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K) as u16,
            0,
            0,
            16,
        ),
        // A >= slots: to the daemon.
        ins(
            (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
            1,
            0,
            slots,
        ),
        ins((libc::BPF_RET | libc::BPF_A) as u16, 0, 0, 0),
        ins((libc::BPF_RET | libc::BPF_K) as u16, 0, 0, 0),
    ]
}

/// Attach the program to the reuseport group `sock` belongs to. A load
/// past the end of a short datagram ends the program with 0: socket 0.
pub(crate) fn attach(sock: &impl AsFd, slots: u32) -> nix::Result<()> {
    let mut prog = program(slots);
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // The kernel copies the program during the call; `prog` outlives it.
    setsockopt(sock, sockopt::AttachReusePortCbpf, &fprog)
}
