//! rsockets (`rsocket`, `rbind`, `rconnect`, ...): sockets over RDMA,
//! which rdma-core implements inside librdmacm. **Not implemented**: the
//! functions exist so that programs linked against Debian's librdmacm
//! load (with BIND_NOW every imported symbol must resolve), and each
//! fails with `ENOSYS`, saying so on stderr under `RXE_EMU_DEBUG=1`.

use std::ffi::c_int;

fn enosys(name: &str) -> c_int {
    crate::debug(|| {
        format!("{name}: rsockets are not implemented by rxe-emu's librdmacm (ENOSYS)")
    });
    crate::set_errno(libc::ENOSYS);
    -1
}

macro_rules! rsocket_stubs {
    ($($name:ident -> $t:ty),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> $t {
                enosys(&stringify!($name)[4..]) as $t
            }
        )*
    };
}

// Each returns -1 (or (size_t)-1, (off_t)-1 for riomap's MAP_FAILED-like
// -1) with errno ENOSYS whatever its arguments: C passes them in
// registers, and a function that takes none ignores them safely.
rsocket_stubs!(
    rxe_rsocket -> c_int,
    rxe_rbind -> c_int,
    rxe_rlisten -> c_int,
    rxe_raccept -> c_int,
    rxe_rconnect -> c_int,
    rxe_rshutdown -> c_int,
    rxe_rclose -> c_int,
    rxe_rrecv -> isize,
    rxe_rrecvfrom -> isize,
    rxe_rrecvmsg -> isize,
    rxe_rsend -> isize,
    rxe_rsendto -> isize,
    rxe_rsendmsg -> isize,
    rxe_rread -> isize,
    rxe_rreadv -> isize,
    rxe_rwrite -> isize,
    rxe_rwritev -> isize,
    rxe_rpoll -> c_int,
    rxe_rselect -> c_int,
    rxe_rgetpeername -> c_int,
    rxe_rgetsockname -> c_int,
    rxe_rsetsockopt -> c_int,
    rxe_rgetsockopt -> c_int,
    rxe_rfcntl -> c_int,
    rxe_riomap -> i64,
    rxe_riounmap -> c_int,
    rxe_riowrite -> usize,
);
