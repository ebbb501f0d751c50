#!/bin/sh
# rdma-core-suite.sh DEV [RUNNER...]: rdma-core's own Python test suite, as
# the system's python3-pyverbs ships it (/usr/share/doc/rdma-core/tests),
# unmodified, on device DEV, run under RUNNER (for rxe-emu: `rxe-emu exec
# --`; for kernel rxe: nothing). Prints the suite's verbose output, then
# "SUITE-EXIT <exit code>".
#
# One way of counting for kernel rxe and for rxe-emu alike (the anchor
# figures of `conformance-tests/run --anchor` and the tests of
# libibverbs/tests/debian*.rs):
# - a gc.collect() after every test: rdma-core 56's stock runner segfaults in
#   pyverbs' garbage collection on devices without RAW_PACKET QPs, kernel
#   rxe's included (a skip inside a resource constructor leaves a Context to
#   be freed before its CQ);
# - multiprocessing starts its children with fork, the default the suite was
#   written for (Python 3.14's forkserver cannot pickle pyverbs objects:
#   test_multi_process_alloc_dm).
set -u
dev=${1:?device}
shift
w=$(mktemp -d /tmp/rdma-core-suite.XXXXXX) || exit 2
cp -r /usr/share/doc/rdma-core/tests "$w/" || exit 2
cd "$w" || exit 2
# Debian compresses the larger files of the suite; its docs say to unpack.
find . -name '*.gz' -exec gunzip -f {} +
cat >tests/gcrun.py <<'PY'
import gc, multiprocessing, os, runpy, sys, unittest
multiprocessing.set_start_method('fork')
stop = unittest.TestResult.stopTest
def stop_and_collect(self, test):
    gc.collect()
    stop(self, test)
unittest.TestResult.stopTest = stop_and_collect
sys.argv[0] = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'run_tests.py')
runpy.run_path(sys.argv[0], run_name='__main__')
PY
"$@" timeout "${SUITE_TIMEOUT:-1200}" python3 tests/gcrun.py --dev "$dev" -v 2>&1
echo "SUITE-EXIT $?"
