//! Which paths a program sees through the view, and how they are
//! rewritten. Pure byte functions, no allocation: the preload library
//! calls them inside `open`, `stat`... of any program, where allocating
//! or locking is not safe (a forked child of a threaded program, a signal
//! handler).

/// The trees of kernel rxe's that the view replaces: sysfs' device and
/// uverbs classes (and the directories their entries link to) and the
/// character devices. A path is ours if it is one of these or lies below
/// one; everything else is the machine's.
pub const REDIRECTED: [&[u8]; 5] = [
    b"/sys/class/infiniband",
    b"/sys/class/infiniband_verbs",
    b"/sys/devices/virtual/infiniband",
    b"/sys/devices/virtual/infiniband_verbs",
    b"/dev/infiniband",
];

/// Whether `path` (as a program gave it to libc, without its NUL) is one
/// of [`REDIRECTED`] or below one. Relative paths never are.
pub fn is_redirected(path: &[u8]) -> bool {
    REDIRECTED
        .iter()
        .any(|p| path.starts_with(p) && (path.len() == p.len() || path[p.len()] == b'/'))
}

/// `view` + `path` with a NUL, into `out`, if `path` is redirected and it
/// fits; the length without the NUL.
pub fn rewrite(view: &[u8], path: &[u8], out: &mut [u8]) -> Option<usize> {
    if view.is_empty() || !is_redirected(path) {
        return None;
    }
    let n = view.len() + path.len();
    if n + 1 > out.len() {
        return None;
    }
    out[..view.len()].copy_from_slice(view);
    out[view.len()..n].copy_from_slice(path);
    out[n] = 0;
    Some(n)
}

/// The length of the `view` prefix to take off a resolved path
/// (`realpath`'s answer) so that the program sees the path kernel rxe's
/// sysfs would give: `<view>/sys/devices/virtual/infiniband/rxe0` becomes
/// `/sys/devices/virtual/infiniband/rxe0`. `None` for paths outside the
/// view, or inside it but not in a redirected tree.
pub fn unview(view: &[u8], resolved: &[u8]) -> Option<usize> {
    if view.is_empty() || !resolved.starts_with(view) {
        return None;
    }
    is_redirected(&resolved[view.len()..]).then_some(view.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_trees_and_what_lies_below_them() {
        for p in [
            "/sys/class/infiniband",
            "/sys/class/infiniband/",
            "/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/1",
            "/sys/class/infiniband_verbs/uverbs0/ibdev",
            "/sys/devices/virtual/infiniband/rxe0",
            "/dev/infiniband/uverbs0",
            "/dev/infiniband",
        ] {
            assert!(is_redirected(p.as_bytes()), "{p}");
        }
        for p in [
            "",
            "/",
            "/sys/class",
            "/sys/class/infinibandx",
            "/sys/class/infiniband_mad/umad0",
            "/sys/class/net/lo",
            "/dev/null",
            "/dev/infinibandx",
            "sys/class/infiniband",
            "/tmp/sys/class/infiniband",
        ] {
            assert!(!is_redirected(p.as_bytes()), "{p}");
        }
    }

    #[test]
    fn rewriting_prefixes_the_view_and_ends_with_a_nul() {
        let mut out = [0xaau8; 64];
        let n = rewrite(b"/run/v", b"/dev/infiniband/uverbs0", &mut out).unwrap();
        assert_eq!(&out[..n], b"/run/v/dev/infiniband/uverbs0");
        assert_eq!(out[n], 0);
        assert_eq!(rewrite(b"/run/v", b"/dev/null", &mut out), None);
        assert_eq!(rewrite(b"", b"/dev/infiniband", &mut out), None);
        // Too long for the buffer: not rewritten (the caller passes the
        // path on unchanged, and the program gets ENOENT as without us).
        let mut small = [0u8; 29];
        assert_eq!(
            rewrite(b"/run/v", b"/dev/infiniband/uverbs0", &mut small),
            None
        );
        let mut exact = [0u8; 30];
        assert_eq!(
            rewrite(b"/run/v", b"/dev/infiniband/uverbs0", &mut exact),
            Some(29)
        );
    }

    #[test]
    fn resolved_paths_lose_the_view() {
        let v = b"/run/v";
        assert_eq!(
            unview(v, b"/run/v/sys/devices/virtual/infiniband/rxe0"),
            Some(6)
        );
        assert_eq!(unview(v, b"/run/v/other"), None);
        assert_eq!(unview(v, b"/sys/devices/virtual/infiniband/rxe0"), None);
        assert_eq!(unview(b"", b"/sys/class/infiniband"), None);
    }
}
