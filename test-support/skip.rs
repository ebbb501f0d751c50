//! Tests that need something the machine may lack (a Debian program or
//! package, root, namespaces) call these: under CI (`CI` set and not
//! empty) a missing need fails the test; elsewhere the test is skipped,
//! says so on stderr, and, when `./scripts/test` runs it, is listed at the
//! end of the run with the command that installs what it needs.
//!
//! Included by the test crates of several packages with
//! `#[path = ".../test-support/skip.rs"] mod skip;`, so that the rule
//! lives in one place.

#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The file `./scripts/test` collects skips in (one line per skip:
/// test name, what is missing, Debian package or other remedy).
const SKIP_LOG: &str = "RXE_TEST_SKIP_LOG";

/// Whether a missing need must fail the test (under CI) rather than skip it.
pub fn required() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// The calling test does not run because `what` is missing; `remedy` is
/// the Debian package that provides it (or, for a privilege, what to do).
/// Panics under CI. Always returns false, so `have_x() || skip(..)` reads
/// as "have it, or skip".
pub fn skip(what: &str, remedy: &str) -> bool {
    assert!(
        !required(),
        "{what} is missing: CI must provide it ({remedy}; see scripts/install-test-deps)"
    );
    eprintln!("SKIP: {what} is missing ({remedy}); this test did not run");
    if let Some(log) = std::env::var_os(SKIP_LOG) {
        let test = std::thread::current()
            .name()
            .unwrap_or("(unnamed test)")
            .to_string();
        let line = format!("{test}\t{what}\t{remedy}\n");
        // One write of an O_APPEND file: lines of parallel tests do not mix.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
    false
}

/// `path` exists, or the test is skipped (fails under CI).
pub fn have_file(path: &str, package: &str) -> bool {
    Path::new(path).exists() || skip(path, &format!("apt-get install {package}"))
}

/// `prog` is on PATH, or the test is skipped (fails under CI).
pub fn have_program(prog: &str, package: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()));
    found || skip(prog, &format!("apt-get install {package}"))
}

/// `tshark` runs, or the test is skipped (fails under CI).
pub fn have_tshark() -> bool {
    let ok = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    ok || skip("tshark", "apt-get install tshark")
}

/// This process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"))
    })
}

/// This process runs as root (for network namespaces, another uid...),
/// or the test is skipped (fails under CI, which runs as root).
pub fn have_root(what: &str) -> bool {
    is_root() || skip(&format!("root ({what})"), "run the tests as root")
}
