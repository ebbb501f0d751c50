//! Debian 13's middleware, unmodified, on rxe0, as a Debian 13 user runs
//! it: UCX 1.18, libfabric 2.1 and Open MPI 5, in a Debian 13 root
//! (libibverbs' `common/debian.rs`: built with `mmdebstrap`, cached,
//! entered with `chroot` in mount and network namespaces of its own, this
//! build at `/opt/rxe-emu`), each program under `rxe-emu exec`, with no
//! middleware setting beyond choosing the device and the transports.
//! Needs root, `mmdebstrap` and Debian's package registry.
//!
//! What differs from Debian 12's versions (`ucx.rs`, `libfabric.rs`,
//! `mpi.rs`), for a user and so for these tests:
//! - Debian 13's `ucx_perftest` is built with MPI and starts in MPI mode:
//!   a pair started by hand needs `-P 0` (on kernel rxe as well).
//! - UCX 1.18's `rc_verbs` cannot flush remote memory on any device but
//!   mlx5 (only its mlx5 memory domain makes the key): Open MPI 5's `osc
//!   ucx` then says "flush(remote) is not supported" and carries on.
//! - Open MPI 5 has no `osc pt2pt`, and its `osc rdma` fails
//!   `MPI_Win_allocate` over `btl ofi` with every libfabric provider
//!   (libfabric's own `tcp` included): over libfabric, MPI is run without
//!   its one-sided part (`mpi_check ... no-rma`).

mod common;

use std::time::Duration;

use common::debian::{self, Suite};

const TRIXIE_MIDDLEWARE: Suite = Suite {
    name: "trixie",
    label: "Debian 13",
    packages: "ucx-utils,libucx-dev,libfabric-bin,openmpi-bin,libopenmpi-dev,gcc,libc6-dev,\
               iproute2,ibverbs-providers",
};

/// Shell helpers every script here starts with: `wait_port P` waits (10 s
/// at most) until something listens on TCP port P; `pair P SERVER CLIENT`
/// starts the command line SERVER, waits for port P, runs CLIENT, and
/// leaves their exit codes in `$r` and `$c` and their output in
/// /tmp/srv.txt and /tmp/cli.txt; `veth` puts rxe0 on a
/// veth interface (10.89.0.1/24, peer 10.89.0.2), as libfabric's verbs
/// provider wants (it skips loopback interfaces, like kernel rxe).
const HELPERS: &str = r#"
    wait_port() { for _ in $(seq 100); do ss -Hltn "sport = :$1" | grep -q . && return 0; sleep 0.1; done; return 1; }
    pair() {
      eval "$2" >/tmp/srv.txt 2>&1 &
      local s=$!
      wait_port "$1"
      eval "$3" >/tmp/cli.txt 2>&1; c=$?
      wait $s; r=$?
    }
    veth() {
      ip link add va type veth peer name vb
      ip addr add 10.89.0.1/24 dev va; ip addr add 10.89.0.2/24 dev vb
      ip link set va up; ip link set vb up
      $X stop >/dev/null; $X start --device rxe0=10.89.0.1 >/dev/null
    }
    cm_mads() { $X status | tr -s ' ' '\n' | grep -A1 -x cm_mads_received | tail -1; }
"#;

/// Run `script` in the root after [`HELPERS`]; every line that starts
/// with `PASS ` or `FAIL ` is a check. All of `want` must pass, and none
/// may fail.
fn run_checks(root: &std::path::Path, script: &str, want: &[&str], limit: Duration) {
    let (ok, text) = debian::in_root(root, &format!("{HELPERS}{script}"), limit);
    eprintln!("{text}");
    assert!(ok, "the script failed or timed out:\n{text}");
    assert!(!text.lines().any(|l| l.starts_with("FAIL ")), "{text}");
    for w in want {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("PASS {w}"))),
            "{w} did not pass:\n{text}"
        );
    }
}

/// UCX 1.18: `ucx_info -d` shows rxe0:1 with `rc_verbs` and `ud_verbs`
/// and the rdmacm connection manager; `ucx_perftest` pairs over both
/// transports (UCP tag, put, get and AM at 8 B to 4 MiB, UCT AM latency);
/// UCX's own examples from libucx-dev, compiled in the root: the
/// hello-world in its three progress modes, and the client-server example
/// with each API, connected through rdma_cm (the daemon sees its MADs).
#[test]
fn ucx_1_18_on_rxe0() {
    let Some(root) = debian::root(&TRIXIE_MIDDLEWARE) else {
        return;
    };
    debian::assert_built();
    let _s = common::serial();
    let script = r#"
    export UCX_NET_DEVICES=rxe0:1 UCX_TLS=rc_verbs,ud_verbs
    $X exec -- ucx_info -d >/tmp/info.txt 2>&1
    if grep -q "Memory domain: rxe0" /tmp/info.txt && grep -q "Transport: rc_verbs" /tmp/info.txt &&
       grep -q "Transport: ud_verbs" /tmp/info.txt && grep -q "Device: rxe0:1" /tmp/info.txt &&
       grep -q "Connection manager: rdmacm" /tmp/info.txt; then
      echo "PASS ucx_info"
    else
      echo "FAIL ucx_info"; cat /tmp/info.txt
    fi
    port=13400
    while IFS='|' read -r tls args; do
      [ -n "$tls" ] || continue
      port=$((port + 1))
      pair $port "UCX_TLS=$tls \$X exec -- timeout 90 ucx_perftest -P 0 -p $port $args" \
        "UCX_TLS=$tls \$X exec -- timeout 90 ucx_perftest -P 0 -p $port $args 127.0.0.1"
      if [ $c = 0 ] && [ $r = 0 ] && grep -q '^Final:' /tmp/cli.txt; then
        echo "PASS ucx_perftest $tls $args: $(grep '^Final:' /tmp/cli.txt)"
      else
        echo "FAIL ucx_perftest $tls $args (client $c, server $r)"; tail -n 5 /tmp/cli.txt /tmp/srv.txt
      fi
    done <<'CASES'
rc_verbs,ud_verbs|-t tag_lat -s 8 -n 2000
rc_verbs,ud_verbs|-t tag_bw -s 65536 -n 500
rc_verbs,ud_verbs|-t tag_bw -s 4194304 -n 20
rc_verbs,ud_verbs|-t ucp_put_bw -s 4194304 -n 20
rc_verbs,ud_verbs|-t ucp_get -s 65536 -n 500
rc_verbs,ud_verbs|-t ucp_am_bw -s 8 -n 2000
rc_verbs,ud_verbs|-t am_lat -d rxe0:1 -x rc_verbs -n 2000
ud_verbs|-t tag_bw -s 65536 -n 500
ud_verbs|-t ucp_get -s 4194304 -n 20
ud_verbs|-t am_lat -d rxe0:1 -x ud_verbs -n 2000
CASES
    EX=/usr/share/doc/libucx-dev/examples
    for ex in ucp_hello_world ucp_client_server; do
      gcc -O1 -I$EX -o /tmp/$ex $EX/$ex.c -lucp -lucs || echo "FAIL compile $ex"
    done
    for mode in -b -w -f; do
      port=$((port + 1))
      pair $port "\$X exec -- timeout 60 /tmp/ucp_hello_world $mode -p $port" \
        "\$X exec -- timeout 60 /tmp/ucp_hello_world $mode -p $port -n 127.0.0.1"
      if [ $c = 0 ] && [ $r = 0 ] && grep -q "UCP TEST SUCCESS" /tmp/cli.txt; then
        echo "PASS ucp_hello_world $mode"
      else
        echo "FAIL ucp_hello_world $mode ($c, $r)"; tail -n 5 /tmp/cli.txt /tmp/srv.txt
      fi
    done
    for api in stream tag am; do
      port=$((port + 1))
      before=$(cm_mads)
      # The server serves clients for ever: it is killed after.
      $X exec -- /tmp/ucp_client_server -l 127.0.0.1 -p $port -c $api -i 4 >/tmp/srv.txt 2>&1 &
      s=$!
      wait_port $port
      UCX_SOCKADDR_TLS_PRIORITY=rdmacm $X exec -- timeout 60 /tmp/ucp_client_server -a 127.0.0.1 -p $port -c $api -i 4 >/tmp/cli.txt 2>&1
      c=$?
      kill $s; wait $s 2>/dev/null
      mads=$(( $(cm_mads) - before ))
      # The client prints what it received on every other iteration.
      if [ $c = 0 ] && [ "$(grep -c ABCDEFGHIJKLMNO /tmp/cli.txt)" = 2 ] && [ $mads -ge 3 ]; then
        echo "PASS ucp_client_server $api ($mads CM MADs)"
      else
        echo "FAIL ucp_client_server $api (client $c, $mads CM MADs)"; tail -n 8 /tmp/cli.txt /tmp/srv.txt
      fi
    done
    "#;
    run_checks(
        &root,
        script,
        &[
            "ucx_info",
            "ucx_perftest rc_verbs,ud_verbs -t tag_lat",
            "ucx_perftest rc_verbs,ud_verbs -t tag_bw -s 4194304",
            "ucx_perftest rc_verbs,ud_verbs -t ucp_put_bw",
            "ucx_perftest rc_verbs,ud_verbs -t ucp_get",
            "ucx_perftest rc_verbs,ud_verbs -t ucp_am_bw",
            "ucx_perftest rc_verbs,ud_verbs -t am_lat",
            "ucx_perftest ud_verbs -t tag_bw",
            "ucx_perftest ud_verbs -t ucp_get",
            "ucx_perftest ud_verbs -t am_lat",
            "ucp_hello_world -b",
            "ucp_hello_world -w",
            "ucp_hello_world -f",
            "ucp_client_server stream",
            "ucp_client_server tag",
            "ucp_client_server am",
        ],
        Duration::from_secs(900),
    );
}

/// libfabric 2.1's verbs provider: `fi_info` lists rxe0 for MSG, RDM
/// (`verbs;ofi_rxm`) and DGRAM endpoints; `fi_pingpong` with every size it
/// knows, each message checked (`-c`): 0 B to 6 MiB on `msg` and `rdm`,
/// to the path MTU on `dgram`.
#[test]
fn libfabric_2_1_on_rxe0() {
    let Some(root) = debian::root(&TRIXIE_MIDDLEWARE) else {
        return;
    };
    debian::assert_built();
    let _s = common::serial();
    let script = r#"
    veth
    $X exec -- fi_info -p verbs -v >/tmp/info.txt 2>&1
    n=0
    for want in "type: FI_EP_MSG" "type: FI_EP_RDM" "type: FI_EP_DGRAM" "name: rxe0" "name: rxe0-dgram"; do
      grep -q "$want" /tmp/info.txt || { echo "FAIL fi_info lacks $want"; n=1; }
    done
    [ $n = 0 ] && echo "PASS fi_info"
    port=47600
    for ep in msg:6m rdm:6m dgram:1k; do
      port=$((port + 1))
      last=${ep#*:}; ep=${ep%:*}
      pair $port "\$X exec -- timeout 120 fi_pingpong -p verbs -e $ep -I 10 -S all -c -B $port" \
        "\$X exec -- timeout 120 fi_pingpong -p verbs -e $ep -I 10 -S all -c -P $port 10.89.0.1"
      if [ $c = 0 ] && [ $r = 0 ] && grep -q "^$last " /tmp/cli.txt; then
        echo "PASS fi_pingpong $ep: $(grep "^$last " /tmp/cli.txt)"
      else
        echo "FAIL fi_pingpong $ep (client $c, server $r)"; tail -n 5 /tmp/cli.txt /tmp/srv.txt
      fi
    done
    "#;
    run_checks(
        &root,
        script,
        &[
            "fi_info",
            "fi_pingpong msg",
            "fi_pingpong rdm",
            "fi_pingpong dgram",
        ],
        Duration::from_secs(600),
    );
}

/// Open MPI 5 with `mpi_check` (`tests/c/mpi_check.c`, compiled in the root
/// with its `mpicc`; every byte checked), 2 and 4 ranks, shared memory
/// and TCP excluded: over UCX (`pml ucx`, `osc ucx`: point to point to
/// 16 MiB, one-sided, collectives), and over libfabric's verbs provider
/// (`pml cm`, `mtl ofi`, `verbs;ofi_rxm`, on a veth device; no one-sided
/// part, see the top of this file).
#[test]
fn open_mpi_5_over_ucx_and_libfabric_on_rxe0() {
    let Some(root) = debian::root(&TRIXIE_MIDDLEWARE) else {
        return;
    };
    debian::assert_built();
    let _s = common::serial();
    let src = include_str!("c/mpi_check.c");
    let script = format!(
        r#"
    cat >/tmp/mpi_check.c <<'RXE_MPI_EOF'
{src}RXE_MPI_EOF
    mpicc -O1 -Wall -Werror -o /tmp/mpi_check /tmp/mpi_check.c || echo "FAIL mpicc"
    mpi() {{ # mpi NAME NP ARGS...: mpirun under rxe-emu exec; every rank must say ok
      name=$1 np=$2; shift 2
      $X exec -- timeout 180 mpirun --allow-run-as-root --oversubscribe -np $np "$@" >/tmp/mpi.txt 2>&1
      rc=$?; n=$(grep -c "of $np: ok" /tmp/mpi.txt)
      if [ $rc = 0 ] && [ "$n" = $np ]; then echo "PASS $name $np ranks"; else echo "FAIL $name $np ranks (rc $rc, $n ok)"; tail -n 20 /tmp/mpi.txt; fi
    }}
    for np in 2 4; do
      mpi ucx $np --mca pml ucx --mca btl self --mca osc ucx -x UCX_TLS=rc_verbs,ud_verbs,self \
        -x UCX_NET_DEVICES=rxe0:1 /tmp/mpi_check
    done
    veth
    for np in 2 4; do
      mpi libfabric $np --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "verbs;ofi_rxm" \
        --mca btl self /tmp/mpi_check 16777216 no-rma
    done
    "#
    );
    run_checks(
        &root,
        &script,
        &[
            "ucx 2 ranks",
            "ucx 4 ranks",
            "libfabric 2 ranks",
            "libfabric 4 ranks",
        ],
        Duration::from_secs(900),
    );
}
