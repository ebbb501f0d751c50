//! A Debian root file system for a distribution's unmodified programs on
//! the drop-in (`debian13.rs`: trixie, `debian_sid.rs`: sid): built from
//! Debian's packages with `mmdebstrap` and cached under
//! `~/.cache/rxe-emu/roots/` (like the conformance guest's image), entered
//! with `chroot` in a private mount namespace with this build's `rxe-emu`,
//! `rxe-emud` and libraries at `/opt/rxe-emu`; and the checks both tests
//! make there: every program loads with `LD_BIND_NOW`, perftest's pairs
//! run to the end.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use super::{have_program, have_root, profile_dir, skip, wait_limited};

/// `test-support/rdma-core-suite.sh`: rdma-core's suite as it is counted
/// for kernel rxe and for rxe-emu alike.
const SUITE_SH: &str = include_str!("../../../test-support/rdma-core-suite.sh");

/// A Debian suite and what its root holds besides the base system.
pub struct Suite {
    /// The suite's name (`trixie`, `sid`), for mmdebstrap and the cache.
    pub name: &'static str,
    /// What a message calls it (`Debian 13`).
    pub label: &'static str,
    /// Packages, comma-separated, as `mmdebstrap --include` takes them.
    pub packages: &'static str,
}

/// One root build at a time in this process (the tests of one file
/// share the root).
static BUILDING: Mutex<()> = Mutex::new(());

/// The cached root of `suite`, built on first use (a few hundred MB of
/// packages from deb.debian.org, 15 to 30 s here). `None`, after saying
/// why, without root, mmdebstrap or the registry.
pub fn root(suite: &Suite) -> Option<PathBuf> {
    let what = format!("chroot into a {} root", suite.label);
    if !have_root(&what) || !have_program("mmdebstrap", "mmdebstrap") {
        return None;
    }
    let _b = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache"));
    // The package list is part of the name: a changed list builds anew.
    let dir = cache.join("rxe-emu/roots").join(format!(
        "{}-{:08x}",
        suite.name,
        suite
            .packages
            .bytes()
            .fold(0x811c9dc5u32, |h, b| (h ^ b as u32)
                .wrapping_mul(0x0100_0193))
    ));
    // Written once mmdebstrap has succeeded: a root without it is partial.
    let done = dir.join(".rxe-emu-root-complete");
    if done.exists() {
        return Some(dir);
    }
    let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
    std::fs::create_dir_all(tmp.parent().unwrap()).unwrap();
    let out = Command::new("mmdebstrap")
        .arg("--variant=apt")
        // A Release file is valid for a week; a mirror (or a cache in
        // front of deb.debian.org) may serve an older one, which apt
        // refuses as expired. The signature is still checked.
        .arg("--aptopt=Acquire::Check-Valid-Until \"false\"")
        .args(["--include", suite.packages, suite.name])
        .arg(&tmp)
        .arg("http://deb.debian.org/debian")
        .output()
        .unwrap();
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        let why = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = why.lines().rev().take(8).collect();
        skip(
            &format!(
                "a {} root (mmdebstrap failed: {})",
                suite.label,
                tail.join(" | ")
            ),
            "network access to deb.debian.org",
        );
        return None;
    }
    std::fs::write(tmp.join(".rxe-emu-root-complete"), suite.packages).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).unwrap();
    Some(dir)
}

/// Every script starts `rxe0` in the root (as `$X start`), on 127.0.0.1,
/// the address of `lo` in the script's network namespace, and stops it
/// however the script ends.
pub const START_RXE0: &str = "export RXE_EMU_SOCKET=/tmp/s/sock
    X=/opt/rxe-emu/rxe-emu
    $X start --device rxe0=127.0.0.1 >/dev/null
    trap '$X stop >/dev/null 2>&1' EXIT
";

/// This build's programs and libraries, which the root gets at
/// /opt/rxe-emu, exist.
pub fn assert_built() {
    for lib in ["libibverbs.so", "librdmacm.so", "rxe-emu", "rxe-emud"] {
        assert!(
            profile_dir().join(lib).exists(),
            "{lib} is missing: cargo build --release --workspace first (scripts/test does)"
        );
    }
}

/// Run `script` (bash) in the root, after [`START_RXE0`], with this build
/// at /opt/rxe-emu, a fresh /tmp, /proc, /sys and /dev, the machine's
/// /etc/hosts (a root from mmdebstrap has none, and libfabric resolves the
/// host's name), in a mount namespace and a network namespace of its own
/// (`lo` up; nothing stays mounted, no port or link is shared with the
/// machine). Returns exit success and output.
pub fn in_root(root: &Path, script: &str, limit: Duration) -> (bool, String) {
    let build = profile_dir();
    let setup = format!(
        "set -e; ip link set lo up; mount --make-rprivate /; R='{r}'
         mount -t proc proc \"$R/proc\"; mount --bind /dev \"$R/dev\"
         mount -t sysfs sysfs \"$R/sys\"
         mount -t tmpfs tmpfs \"$R/tmp\"; mkdir -p \"$R/opt/rxe-emu\"
         mount --bind -o ro '{b}' \"$R/opt/rxe-emu\"
         touch \"$R/etc/hosts\"; mount --bind -o ro /etc/hosts \"$R/etc/hosts\"
         exec chroot \"$R\" /bin/bash -c \"$0\"",
        r = root.display(),
        b = build.display()
    );
    let child = Command::new("unshare")
        .args([
            "-m",
            "-n",
            "bash",
            "-c",
            &setup,
            &format!("{START_RXE0}{script}"),
        ])
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

/// What rdma-core's test suite did in a root.
pub struct SuiteRun {
    /// "Ran N tests" (0 if the line is missing).
    pub ran: usize,
    /// Tests that passed.
    pub passed: Vec<String>,
    /// Skipped, and expected failures.
    pub skipped: usize,
    /// Tests that failed or errored, with which.
    pub bad: Vec<(String, &'static str)>,
    /// The whole output.
    pub log: String,
}

impl SuiteRun {
    /// Print the counts, then: no failure, no error, the suite ran to its
    /// end with at least `min_ran` tests, and at least `min_passed` passed.
    pub fn assert_clean(&self, suite: &str, min_ran: usize, min_passed: usize) {
        let r = self;
        eprintln!(
            "{suite} suite on rxe0: ran {}, passed {}, skipped {}, failed or errors {}: {:?}",
            r.ran,
            r.passed.len(),
            r.skipped,
            r.bad.len(),
            r.bad
        );
        assert!(
            r.bad.is_empty(),
            "failed or errors: {:#?}\n{}",
            r.bad,
            r.log
        );
        assert!(r.ran >= min_ran, "ran {} tests:\n{}", r.ran, r.log);
        assert!(r.log.contains("SUITE-EXIT 0"), "{}", r.log);
        assert!(
            r.passed.len() >= min_passed,
            "only {} passed:\n{}",
            r.passed.len(),
            r.log
        );
    }
}

/// The ids (`tests.test_cq.CQTest.test_resize_cq`) of the tests that
/// passed: unittest -v prints "name (id) ... ok", or the result on the
/// docstring's line after it (as `conformance-tests/run --anchor`
/// reads the kernel's runs).
pub fn passed_ids(log: &str) -> std::collections::BTreeSet<String> {
    let mut ids = std::collections::BTreeSet::new();
    let mut cur: Option<&str> = None;
    let body = log.split("\nRan ").next().unwrap_or("");
    for l in body.lines() {
        if let Some(rest) = l.strip_prefix("test") {
            if let Some(id) = rest
                .split_once(" (tests.")
                .and_then(|(_, r)| r.split_once(')'))
                .map(|(id, _)| id)
            {
                cur = Some(id);
            }
        }
        if let Some(id) = cur {
            if l.ends_with("... ok") || l == "ok" {
                ids.insert(format!("tests.{id}"));
                cur = None;
            }
        }
    }
    ids
}

/// Every test that passed on kernel rxe under the same suite (`anchor`:
/// a list of `conformance-tests/anchor/`, written by
/// `conformance-tests/run --anchor`; `#` lines are comments) passed
/// here too (`log`: the suite's verbose output).
pub fn assert_passes_what_the_kernel_passes(log: &str, kernel: &str, anchor: &str) {
    let ours = passed_ids(log);
    let theirs: Vec<&str> = anchor
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(
        theirs.len() > 50,
        "the anchor list of {kernel} is too short"
    );
    let missing: Vec<&&str> = theirs.iter().filter(|t| !ours.contains(**t)).collect();
    assert!(
        missing.is_empty(),
        "passed on kernel rxe {kernel}, not on rxe-emu: {missing:#?}\n{}",
        log
    );
    eprintln!(
        "kernel rxe {kernel} passed {}; rxe-emu passed all of them and {} more",
        theirs.len(),
        ours.len() - theirs.len()
    );
}

/// rdma-core's own test suite of the root's `python3-pyverbs` (shipped in
/// `/usr/share/doc/rdma-core/tests`), unmodified, on rxe0 under `rxe-emu
/// exec`, as its users run it: in a network namespace of its own where
/// rxe0 is on `lo`'s only address, 127.0.0.1 (the suite takes a port's
/// netdev from `rdma link show -j`, which rxe-emu answers, and then that
/// netdev's first address). Run and counted by
/// `test-support/rdma-core-suite.sh`, the script that counts kernel rxe's
/// figures in its guests (`conformance-tests/run --anchor`).
pub fn rdma_core_suite(root: &Path) -> SuiteRun {
    let script = format!(
        "cat >/tmp/rdma-core-suite.sh <<'RXE_SUITE_EOF'
{SUITE_SH}RXE_SUITE_EOF
        sh /tmp/rdma-core-suite.sh rxe0 $X exec --
    "
    );
    let (_, log) = in_root(root, &script, Duration::from_secs(1500));
    assert!(log.contains("SUITE-EXIT"), "rdma-core's suite hung:\n{log}");
    let results = super::unittest_results(&log);
    let passed = results
        .iter()
        .filter(|r| r.1 == "ok")
        .map(|r| r.0.to_string())
        .collect();
    let skipped = results
        .iter()
        .filter(|r| r.1 == "skipped" || r.1 == "expected failure")
        .count();
    let bad = results
        .iter()
        .filter(|r| r.1 == "ERROR" || r.1 == "FAIL")
        .map(|r| (r.0.to_string(), r.1))
        .collect();
    let ran = log
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    SuiteRun {
        ran,
        passed,
        skipped,
        bad,
        log,
    }
}

/// Every program of /usr/bin that links libibverbs or librdmacm loads
/// with every symbol bound at once (a missing one fails the load, as
/// perftest 25.01 failed on libmlx5's ibv_cmd_create_cq_ex2 before) and
/// runs far enough to print its usage or version; at least `min` of
/// them. Then `ibv_devinfo -v` on rxe0. Returns the output.
pub fn programs_load(root: &Path, min: usize) -> String {
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
        $X exec -- ibv_devinfo -v
    "#;
    let (ok, text) = in_root(root, load, Duration::from_secs(300));
    eprintln!("{text}");
    assert!(ok, "{text}");
    assert!(!text.contains("LOAD-FAIL"), "{text}");
    let checked: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("checked ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(checked >= min, "too few programs checked:\n{text}");
    assert!(
        text.contains("hca_id:\trxe0") && text.contains("PORT_ACTIVE"),
        "{text}"
    );
    text
}

/// perftest's pairs (`ib_write_bw -s 65536`, ...), server first, each on
/// rxe0 with 100 iterations: both sides must end with status 0 and the
/// client print its result line.
///
/// A pair over rdma_cm (`-R`) may lose a race that is perftest's own:
/// after the two sides exchange their parameters, the client connects
/// its data QP at once while the server creates, binds and listens on a
/// new id; a REQ that comes first is rejected (REJ reason 8, no
/// listener), as kernel rdma_cm rejects it. perftest 25.01 then retries
/// with the ids it has just destroyed and aborts (`double free`; fixed
/// upstream in perftest 3d9d8d0, 26.04). On this 2-CPU machine the
/// client won 12 of 30 runs. So the client of an `-R` pair runs at nice
/// 19 (30 of 30 runs then passed), and a pair whose client was rejected
/// so runs again, up to five times: only that failure is retried.
pub fn perftest_pairs(root: &Path, pairs: &[&str]) {
    let list: Vec<String> = pairs.iter().map(|p| format!("\"{p}\"")).collect();
    let script = format!(
        r#"
        fail=0
        for t in {}; do
          case "$t" in *" -R"*) nice="nice -n 19";; *) nice="";; esac
          c=rejected; r=rejected
          for try in 1 2 3 4 5; do
            $X exec -- timeout 60 $t -d rxe0 -x 1 -n 100 >/tmp/srv.txt 2>&1 &
            s=$!
            sleep 2
            $nice $X exec -- timeout 60 $t -d rxe0 -x 1 -n 100 127.0.0.1 >/tmp/cli.txt 2>&1
            c=$?
            if grep -q 'RDMA_CM_EVENT_REJECTED; error: 8\.' /tmp/cli.txt; then
              echo "client of $t rejected (no listener yet, try $try): again"
              kill $s 2>/dev/null; wait $s 2>/dev/null
              continue
            fi
            wait $s
            r=$?
            break
          done
          if [ $c = 0 ] && [ $r = 0 ] && grep -qE '^ *[0-9]+ +100 ' /tmp/cli.txt; then
            echo "PASS $t"
          else
            echo "FAIL $t (client $c, server $r)"; tail -n 25 /tmp/cli.txt /tmp/srv.txt; fail=1
          fi
        done
        exit $fail
    "#,
        list.join(" ")
    );
    let (ok, text) = in_root(root, &script, Duration::from_secs(900));
    eprintln!("{text}");
    assert!(ok && text.matches("PASS ").count() == pairs.len(), "{text}");
}
