//! Debian 13's unmodified programs (rdma-core 56.1, perftest 25.01) on
//! the drop-in, as a Debian 13 user runs them: a Debian 13 root file
//! system built from Debian's packages with `mmdebstrap` (cached under
//! `~/.cache/rxe-emu/roots/`, like the conformance guest's image), entered
//! with `chroot` in a private mount namespace, with this build's
//! `rxe-emu`, `rxe-emud` and libraries at `/opt/rxe-emu`. Every program
//! of the packages that links libibverbs or librdmacm must load with
//! `LD_BIND_NOW` (every symbol and version node it and its providers
//! import, libmlx5 included, exists in ours), and perftest's pairs must
//! run to the end. Needs root, `mmdebstrap` and Debian's package registry.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// What the root holds besides the base system.
const PACKAGES: &str = "perftest,ibverbs-utils,rdmacm-utils,ibverbs-providers";

/// The cached Debian 13 root, built on first use (a few hundred MB of
/// packages from deb.debian.org, about 20 s here).
fn trixie_root() -> Option<PathBuf> {
    if !have_root("chroot into a Debian 13 root") || !have_program("mmdebstrap", "mmdebstrap") {
        return None;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    // The package list is part of the name: a changed list builds anew.
    let dir = cache.join("rxe-emu/roots").join(format!(
        "trixie-{:08x}",
        PACKAGES.bytes().fold(0x811c9dc5u32, |h, b| (h ^ b as u32)
            .wrapping_mul(0x0100_0193))
    ));
    if dir.join("usr/bin/ib_write_bw").exists() {
        return Some(dir);
    }
    let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
    std::fs::create_dir_all(tmp.parent().unwrap()).unwrap();
    let out = Command::new("mmdebstrap")
        .args(["--variant=apt", "--include", PACKAGES, "trixie"])
        .arg(&tmp)
        .arg("http://deb.debian.org/debian")
        .output()
        .unwrap();
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        let why = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = why.lines().rev().take(8).collect();
        skip(
            &format!("a Debian 13 root (mmdebstrap failed: {})", tail.join(" | ")),
            "network access to deb.debian.org",
        );
        return None;
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).unwrap();
    Some(dir)
}

/// Every script starts `rxe0` in the root (as `$X start`), and stops it
/// however the script ends.
const START_RXE0: &str = "export RXE_EMU_SOCKET=/tmp/s/sock
    X=/opt/rxe-emu/rxe-emu
    $X start --device rxe0=127.0.215.1 >/dev/null
    trap '$X stop >/dev/null 2>&1' EXIT
";

/// Run `script` (bash) in the root, after [`START_RXE0`], with this build
/// at /opt/rxe-emu, a fresh /tmp, /proc and /dev, in a mount namespace of
/// its own (nothing stays mounted). Returns exit success and output.
fn in_root(root: &Path, script: &str, limit: Duration) -> (bool, String) {
    let build = profile_dir();
    let setup = format!(
        "set -e; mount --make-rprivate /; R='{r}'
         mount -t proc proc \"$R/proc\"; mount --bind /dev \"$R/dev\"
         mount -t tmpfs tmpfs \"$R/tmp\"; mkdir -p \"$R/opt/rxe-emu\"
         mount --bind -o ro '{b}' \"$R/opt/rxe-emu\"
         exec chroot \"$R\" /bin/bash -c \"$0\"",
        r = root.display(),
        b = build.display()
    );
    let child = Command::new("unshare")
        .args(["-m", "bash", "-c", &setup, &format!("{START_RXE0}{script}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (out, timed_out) = wait_limited(child, limit);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (!timed_out && out.status.success(), text)
}

#[test]
fn debian13_programs_load_and_perftest_25_runs_on_rxe0() {
    let Some(root) = trixie_root() else { return };
    for lib in ["libibverbs.so", "librdmacm.so", "rxe-emu", "rxe-emud"] {
        assert!(
            profile_dir().join(lib).exists(),
            "{lib} is missing: cargo build --release --workspace first (scripts/test does)"
        );
    }
    let _s = serial();
    // Every program that links libibverbs or librdmacm loads with every
    // symbol bound at once (a missing one fails the load, as perftest
    // 25.01 failed on libmlx5's ibv_cmd_create_cq_ex2 before), and runs
    // far enough to print its usage or version.
    let load = r#"
        n=0
        for p in /usr/bin/*; do
          ldd "$p" 2>/dev/null | grep -qE 'lib(ibverbs|rdmacm)\.so\.1' || continue
          out=$(LD_BIND_NOW=1 $X exec -- timeout 3 "$p" --help 2>&1 </dev/null)
          if echo "$out" | grep -qE 'symbol lookup error|undefined symbol|version .* not found|cannot open shared'; then
            echo "LOAD-FAIL $p: $(echo "$out" | grep -E 'symbol|version|cannot' | head -2)"
          fi
          n=$((n + 1))
        done
        echo "checked $n programs"
        $X exec -- ibv_devinfo -v | grep -E 'hca_id|transport|state|max_qp:|active_mtu'
    "#;
    let (ok, text) = in_root(&root, load, Duration::from_secs(300));
    eprintln!("{text}");
    assert!(ok, "{text}");
    assert!(!text.contains("LOAD-FAIL"), "{text}");
    let checked: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("checked ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(checked >= 30, "too few programs checked:\n{text}");
    assert!(
        text.contains("hca_id:\trxe0") && text.contains("PORT_ACTIVE"),
        "{text}"
    );

    // perftest 25.01 pairs, server first, each side checked.
    let pairs = r#"
        fail=0
        for t in "ib_write_bw -s 65536" "ib_send_bw -s 65536" "ib_read_bw -s 65536" \
                 "ib_atomic_bw" "ib_write_lat" "ib_send_lat" "ib_read_lat" "ib_atomic_lat" \
                 "ib_write_bw -c UC" "ib_send_lat -c UD" "ib_send_bw -c UD" "ib_write_lat -R"; do
          for try in 2 4; do
            $X exec -- timeout 60 $t -d rxe0 -x 1 -n 100 >/tmp/srv.txt 2>&1 &
            s=$!
            sleep $try
            $X exec -- timeout 60 $t -d rxe0 -x 1 -n 100 127.0.215.1 >/tmp/cli.txt 2>&1
            c=$?
            wait $s
            r=$?
            # perftest's -R client is rejected (REJ reason 8, no listener
            # yet) when it wins the race with its server, as with kernel
            # rdma_cm: once more, with more head start. (perftest 25.01 then
            # reuses the id it destroyed; our librdmacm refuses it, and
            # perftest aborts.)
            grep -qE 'Unexpected CM event|REJECTED' /tmp/cli.txt || break
            kill $s 2>/dev/null; wait $s 2>/dev/null
          done
          if [ $c = 0 ] && [ $r = 0 ] && grep -qE '^ *[0-9]+ +100 ' /tmp/cli.txt; then
            echo "PASS $t"
          else
            echo "FAIL $t (client $c, server $r)"; tail -n 5 /tmp/cli.txt /tmp/srv.txt; fail=1
          fi
        done
        exit $fail
    "#;
    let (ok, text) = in_root(&root, pairs, Duration::from_secs(900));
    eprintln!("{text}");
    assert!(ok && text.matches("PASS ").count() == 12, "{text}");
}
