//! `librxe_emu_preload.so`: `rxe-emu exec` puts it in `LD_PRELOAD` and
//! the view's directory in `RXE_EMU_VIEW`. It defines the libc functions
//! through which programs reach files by name; each one, given a path
//! under a redirected tree (`around_device::paths::REDIRECTED`:
//! `/sys/class/infiniband`, `/dev/infiniband`...), calls the real libc
//! function with that path inside the view instead, and otherwise calls it
//! unchanged. So a program sees rxe-emu's devices where it would see
//! kernel rxe's, and nothing else changes for it.
//!
//! Rules of this file, because it runs inside every call of every program
//! started under `rxe-emu exec`:
//! - No allocation, no lock, no panic on the paths the program uses: a
//!   forked child of a threaded program may call `open` before `exec`,
//!   and `open` is async-signal-safe. The rewrite is a copy into a buffer
//!   on the stack (`around_device::paths`), the view is read once at load
//!   time, and each real function is looked up with `dlsym(RTLD_NEXT)` at
//!   load time (and again on first use if it was missing then).
//! - A path that is not redirected, or does not fit `PATH_MAX` once
//!   prefixed, is passed on as it was: the program gets what libc gives.
//! - `openat`-style calls are redirected only for absolute paths; a
//!   relative path names a file relative to a directory the program
//!   already opened (inside the view if it opened it through us).
//!
//! Not covered: programs that do not call libc for these (static
//! binaries, Go), and `chdir` into the trees.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use around_device::paths;
use libc::{mode_t, size_t, ssize_t, FILE};

/// The view's directory (`RXE_EMU_VIEW`), without a trailing slash;
/// empty: redirect nothing.
static VIEW: OnceLock<Box<[u8]>> = OnceLock::new();

fn view() -> &'static [u8] {
    VIEW.get_or_init(|| {
        // SAFETY: getenv's result is NUL-terminated or NULL; it is copied
        // at once.
        let v = unsafe { libc::getenv(c"RXE_EMU_VIEW".as_ptr()) };
        if v.is_null() {
            return Box::default();
        }
        // SAFETY: non-NULL getenv result: a C string.
        let mut bytes = unsafe { CStr::from_ptr(v) }.to_bytes();
        while bytes.len() > 1 && bytes.ends_with(b"/") {
            bytes = &bytes[..bytes.len() - 1];
        }
        // Only an absolute path makes sense; anything else: off.
        if bytes.first() != Some(&b'/') {
            return Box::default();
        }
        bytes.into()
    })
}

/// Read the view and look up every real function while the program is
/// still single-threaded (before `main` and before other libraries'
/// constructors that might call us).
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn init() {
    let _ = view();
    for r in REALS {
        r.get();
    }
}

/// A real libc function, found with `dlsym(RTLD_NEXT)` (or, for the old
/// `__xstat` family, which exists only at a base version, `dlvsym`).
struct Real {
    name: &'static CStr,
    version: Option<&'static CStr>,
    addr: AtomicUsize,
}

impl Real {
    const fn new(name: &'static CStr) -> Real {
        Real {
            name,
            version: None,
            addr: AtomicUsize::new(0),
        }
    }

    const fn versioned(name: &'static CStr, version: &'static CStr) -> Real {
        Real {
            name,
            version: Some(version),
            addr: AtomicUsize::new(0),
        }
    }

    fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        // SAFETY: dlsym/dlvsym with RTLD_NEXT and NUL-terminated names.
        let p = unsafe {
            match self.version {
                None => libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()),
                Some(v) => libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr(), v.as_ptr()),
            }
        } as usize;
        self.addr.store(p, Ordering::Relaxed);
        p
    }
}

/// The base symbol version of the architecture (where the `__xstat`
/// family lives in glibc 2.33 and later).
#[cfg(target_arch = "x86_64")]
const BASE: &CStr = c"GLIBC_2.2.5";
#[cfg(target_arch = "aarch64")]
const BASE: &CStr = c"GLIBC_2.17";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const BASE: &CStr = c"GLIBC_2.0";

/// Turns `path` into the path to pass on: the view's copy in `buf` if
/// redirected, else `path` itself.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
unsafe fn map(path: *const c_char, buf: &mut [u8; libc::PATH_MAX as usize]) -> *const c_char {
    if path.is_null() {
        return path;
    }
    // SAFETY: the caller's promise.
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    // The cheap test first: most paths are not ours.
    if !p.starts_with(b"/sys/") && !p.starts_with(b"/dev/") {
        return path;
    }
    match paths::rewrite(view(), p, buf) {
        Some(_) => buf.as_ptr() as *const c_char,
        None => path,
    }
}

/// Takes the view off a resolved path in place (NUL-terminated `s`).
///
/// # Safety
/// `s` is NULL or a writable NUL-terminated string.
unsafe fn unmap(s: *mut c_char) {
    if s.is_null() {
        return;
    }
    // SAFETY: the caller's promise.
    let len = unsafe { libc::strlen(s) };
    // SAFETY: len bytes before the NUL.
    let bytes = unsafe { std::slice::from_raw_parts(s as *const u8, len) };
    if let Some(k) = paths::unview(view(), bytes) {
        // SAFETY: moves the tail and its NUL (len - k + 1 bytes) to the
        // start of the same buffer; memmove allows the overlap.
        unsafe { libc::memmove(s as *mut c_void, s.add(k) as *const c_void, len - k + 1) };
    }
}

macro_rules! reals {
    ($($id:ident = $e:expr;)*) => {
        $(static $id: Real = $e;)*
        static REALS: &[&Real] = &[$(&$id),*];
    };
}

reals! {
    R_OPEN = Real::new(c"open");
    R_OPEN64 = Real::new(c"open64");
    R_OPENAT = Real::new(c"openat");
    R_OPENAT64 = Real::new(c"openat64");
    R_OPEN_2 = Real::new(c"__open_2");
    R_OPEN64_2 = Real::new(c"__open64_2");
    R_OPENAT_2 = Real::new(c"__openat_2");
    R_OPENAT64_2 = Real::new(c"__openat64_2");
    R_FOPEN = Real::new(c"fopen");
    R_FOPEN64 = Real::new(c"fopen64");
    R_FREOPEN = Real::new(c"freopen");
    R_FREOPEN64 = Real::new(c"freopen64");
    R_STAT = Real::new(c"stat");
    R_STAT64 = Real::new(c"stat64");
    R_LSTAT = Real::new(c"lstat");
    R_LSTAT64 = Real::new(c"lstat64");
    R_FSTATAT = Real::new(c"fstatat");
    R_FSTATAT64 = Real::new(c"fstatat64");
    R_STATX = Real::new(c"statx");
    R_XSTAT = Real::versioned(c"__xstat", BASE);
    R_XSTAT64 = Real::versioned(c"__xstat64", BASE);
    R_LXSTAT = Real::versioned(c"__lxstat", BASE);
    R_LXSTAT64 = Real::versioned(c"__lxstat64", BASE);
    R_FXSTATAT = Real::versioned(c"__fxstatat", BASE);
    R_FXSTATAT64 = Real::versioned(c"__fxstatat64", BASE);
    R_ACCESS = Real::new(c"access");
    R_FACCESSAT = Real::new(c"faccessat");
    R_EUIDACCESS = Real::new(c"euidaccess");
    R_EACCESS = Real::new(c"eaccess");
    R_OPENDIR = Real::new(c"opendir");
    R_SCANDIR = Real::new(c"scandir");
    R_SCANDIR64 = Real::new(c"scandir64");
    R_READLINK = Real::new(c"readlink");
    R_READLINKAT = Real::new(c"readlinkat");
    R_REALPATH = Real::new(c"realpath");
    R_REALPATH_CHK = Real::new(c"__realpath_chk");
    R_CANONICALIZE = Real::new(c"canonicalize_file_name");
    R_GETXATTR = Real::new(c"getxattr");
    R_LGETXATTR = Real::new(c"lgetxattr");
    R_LISTXATTR = Real::new(c"listxattr");
    R_LLISTXATTR = Real::new(c"llistxattr");
}

/// Calls the real function `$real` as a `$ty` with `$args`, or fails with
/// ENOSYS (and `$fail`) if libc has none.
macro_rules! call {
    ($real:ident as $ty:ty, $fail:expr, $($arg:expr),*) => {{
        let a = $real.get();
        if a == 0 {
            // SAFETY: errno is thread-local and always writable.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            $fail
        } else {
            // SAFETY: `a` is the address of the libc function of that
            // name, whose C prototype `$ty` spells out.
            let f: $ty = unsafe { std::mem::transmute::<usize, $ty>(a) };
            // SAFETY: the caller's arguments, passed on (the path perhaps
            // replaced by a NUL-terminated one of ours of the same kind).
            unsafe { f($($arg),*) }
        }
    }};
}

type Buf = [u8; libc::PATH_MAX as usize];

/// Defines `name(path, rest...)`: the path mapped, the rest passed on.
macro_rules! path_first {
    ($name:ident, $real:ident, $ret:ty, $fail:expr, ($($arg:ident: $t:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char $(, $arg: $t)*) -> $ret {
            let mut buf: Buf = [0; libc::PATH_MAX as usize];
            // SAFETY: the program passes a C string (or NULL).
            let p = unsafe { map(path, &mut buf) };
            call!($real as unsafe extern "C" fn(*const c_char $(, $t)*) -> $ret, $fail, p $(, $arg)*)
        }
    };
}

/// Defines `name(dirfd, path, rest...)`: an absolute path mapped.
macro_rules! at_path {
    ($name:ident, $real:ident, $ret:ty, $fail:expr, ($($arg:ident: $t:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char $(, $arg: $t)*) -> $ret {
            let mut buf: Buf = [0; libc::PATH_MAX as usize];
            // SAFETY: as above; relative paths are never redirected.
            let p = unsafe { map(path, &mut buf) };
            call!($real as unsafe extern "C" fn(c_int, *const c_char $(, $t)*) -> $ret, $fail, dirfd, p $(, $arg)*)
        }
    };
}

/// Defines the `__xstat` family: `name(ver, path, buf)`.
macro_rules! ver_path {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(ver: c_int, path: *const c_char, st: *mut c_void) -> c_int {
            let mut buf: Buf = [0; libc::PATH_MAX as usize];
            // SAFETY: as above.
            let p = unsafe { map(path, &mut buf) };
            call!(
                $real as unsafe extern "C" fn(c_int, *const c_char, *mut c_void) -> c_int,
                -1,
                ver,
                p,
                st
            )
        }
    };
}

// open(2) and friends take a third (variadic) `mode` argument only with
// O_CREAT or O_TMPFILE. It is declared here as a plain argument: on the
// 64-bit ABIs we build for, a variadic integer arrives where a named one
// would, and without those flags the callee never reads it.
path_first!(open, R_OPEN, c_int, -1, (flags: c_int, mode: mode_t));
path_first!(open64, R_OPEN64, c_int, -1, (flags: c_int, mode: mode_t));
path_first!(__open_2, R_OPEN_2, c_int, -1, (flags: c_int));
path_first!(__open64_2, R_OPEN64_2, c_int, -1, (flags: c_int));
at_path!(openat, R_OPENAT, c_int, -1, (flags: c_int, mode: mode_t));
at_path!(openat64, R_OPENAT64, c_int, -1, (flags: c_int, mode: mode_t));
at_path!(__openat_2, R_OPENAT_2, c_int, -1, (flags: c_int));
at_path!(__openat64_2, R_OPENAT64_2, c_int, -1, (flags: c_int));
path_first!(fopen, R_FOPEN, *mut FILE, std::ptr::null_mut(), (mode: *const c_char));
path_first!(fopen64, R_FOPEN64, *mut FILE, std::ptr::null_mut(), (mode: *const c_char));
path_first!(freopen, R_FREOPEN, *mut FILE, std::ptr::null_mut(), (mode: *const c_char, stream: *mut FILE));
path_first!(freopen64, R_FREOPEN64, *mut FILE, std::ptr::null_mut(), (mode: *const c_char, stream: *mut FILE));
path_first!(stat, R_STAT, c_int, -1, (st: *mut c_void));
path_first!(stat64, R_STAT64, c_int, -1, (st: *mut c_void));
path_first!(lstat, R_LSTAT, c_int, -1, (st: *mut c_void));
path_first!(lstat64, R_LSTAT64, c_int, -1, (st: *mut c_void));
at_path!(fstatat, R_FSTATAT, c_int, -1, (st: *mut c_void, flags: c_int));
at_path!(fstatat64, R_FSTATAT64, c_int, -1, (st: *mut c_void, flags: c_int));
at_path!(statx, R_STATX, c_int, -1, (flags: c_int, mask: c_uint, stx: *mut c_void));
ver_path!(__xstat, R_XSTAT);
ver_path!(__xstat64, R_XSTAT64);
ver_path!(__lxstat, R_LXSTAT);
ver_path!(__lxstat64, R_LXSTAT64);
path_first!(access, R_ACCESS, c_int, -1, (mode: c_int));
path_first!(euidaccess, R_EUIDACCESS, c_int, -1, (mode: c_int));
path_first!(eaccess, R_EACCESS, c_int, -1, (mode: c_int));
at_path!(faccessat, R_FACCESSAT, c_int, -1, (mode: c_int, flags: c_int));
path_first!(opendir, R_OPENDIR, *mut c_void, std::ptr::null_mut(), ());
path_first!(scandir, R_SCANDIR, c_int, -1, (list: *mut c_void, filter: *mut c_void, compar: *mut c_void));
path_first!(scandir64, R_SCANDIR64, c_int, -1, (list: *mut c_void, filter: *mut c_void, compar: *mut c_void));
path_first!(readlink, R_READLINK, ssize_t, -1, (out: *mut c_char, size: size_t));
at_path!(readlinkat, R_READLINKAT, ssize_t, -1, (out: *mut c_char, size: size_t));
// `ls -l` asks for a file's security label and ACL by name.
path_first!(getxattr, R_GETXATTR, ssize_t, -1, (name: *const c_char, value: *mut c_void, size: size_t));
path_first!(lgetxattr, R_LGETXATTR, ssize_t, -1, (name: *const c_char, value: *mut c_void, size: size_t));
path_first!(listxattr, R_LISTXATTR, ssize_t, -1, (list: *mut c_char, size: size_t));
path_first!(llistxattr, R_LLISTXATTR, ssize_t, -1, (list: *mut c_char, size: size_t));

/// Defines `__fxstatat`-style `name(ver, dirfd, path, buf, flags)`.
macro_rules! ver_at_path {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            ver: c_int,
            dirfd: c_int,
            path: *const c_char,
            st: *mut c_void,
            flags: c_int,
        ) -> c_int {
            let mut buf: Buf = [0; libc::PATH_MAX as usize];
            // SAFETY: the program passes a C string (or NULL).
            let p = unsafe { map(path, &mut buf) };
            call!(
                $real
                    as unsafe extern "C" fn(
                        c_int,
                        c_int,
                        *const c_char,
                        *mut c_void,
                        c_int,
                    ) -> c_int,
                -1,
                ver,
                dirfd,
                p,
                st,
                flags
            )
        }
    };
}

ver_at_path!(__fxstatat, R_FXSTATAT);
ver_at_path!(__fxstatat64, R_FXSTATAT64);

// The resolving calls answer with the kernel's path: the view is taken
// off what they resolved (`<view>/sys/devices/virtual/infiniband/rxe0` ->
// `/sys/devices/virtual/infiniband/rxe0`), which is itself redirected.

#[no_mangle]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    let mut buf: Buf = [0; libc::PATH_MAX as usize];
    // SAFETY: as above.
    let p = unsafe { map(path, &mut buf) };
    let r = call!(
        R_REALPATH as unsafe extern "C" fn(*const c_char, *mut c_char) -> *mut c_char,
        std::ptr::null_mut(),
        p,
        resolved
    );
    // SAFETY: realpath's answer is NULL or a writable C string (the
    // caller's buffer or one it malloc'ed).
    unsafe { unmap(r) };
    r
}

#[no_mangle]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    resolved_len: size_t,
) -> *mut c_char {
    let mut buf: Buf = [0; libc::PATH_MAX as usize];
    // SAFETY: as above.
    let p = unsafe { map(path, &mut buf) };
    let r = call!(
        R_REALPATH_CHK as unsafe extern "C" fn(*const c_char, *mut c_char, size_t) -> *mut c_char,
        std::ptr::null_mut(),
        p,
        resolved,
        resolved_len
    );
    // SAFETY: as in realpath.
    unsafe { unmap(r) };
    r
}

#[no_mangle]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    let mut buf: Buf = [0; libc::PATH_MAX as usize];
    // SAFETY: as above.
    let p = unsafe { map(path, &mut buf) };
    let r = call!(
        R_CANONICALIZE as unsafe extern "C" fn(*const c_char) -> *mut c_char,
        std::ptr::null_mut(),
        p
    );
    // SAFETY: a malloc'ed C string or NULL.
    unsafe { unmap(r) };
    r
}

// After the macros above, which it uses.
mod netlink;
