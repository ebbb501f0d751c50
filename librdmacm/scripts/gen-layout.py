#!/usr/bin/env python3
"""Regenerate layout.txt: every field of every #[repr(C)] struct in
src/abi.rs that mirrors a <rdma/rdma_cma.h> struct, with the offset the
system's headers give it (compiled and measured with cc), plus each
struct's size. Run it on a machine with Debian 12's librdmacm-dev after
changing abi.rs; build.rs then asserts the numbers on our structs and
tests/c_layout.rs re-measures them against the installed headers."""
import os, re, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
src = open(os.path.join(root, "src", "abi.rs")).read()

# Rust field name -> C member designator, where they differ.
RENAME = {
    ("rdma_addr", "ibaddr"): "addr.ibaddr",
}
UNIONS = {"rdma_cm_event_param"}
SKIP = {"rdma_cm_event_param"}
# Members programs reach through anonymous unions and nested structs.
EXTRA = [
    ("rdma_cm_event", "param.conn.private_data"), ("rdma_cm_event", "param.conn.private_data_len"),
    ("rdma_cm_event", "param.conn.responder_resources"), ("rdma_cm_event", "param.conn.initiator_depth"),
    ("rdma_cm_event", "param.conn.flow_control"), ("rdma_cm_event", "param.conn.retry_count"),
    ("rdma_cm_event", "param.conn.rnr_retry_count"), ("rdma_cm_event", "param.conn.srq"),
    ("rdma_cm_event", "param.conn.qp_num"),
    ("rdma_cm_event", "param.ud.private_data"), ("rdma_cm_event", "param.ud.private_data_len"),
    ("rdma_cm_event", "param.ud.ah_attr"), ("rdma_cm_event", "param.ud.qp_num"),
    ("rdma_cm_event", "param.ud.qkey"),
    ("rdma_cm_id", "route.addr.src_addr:route.addr.src_storage"),
    ("rdma_cm_id", "route.addr.dst_addr:route.addr.dst_storage"),
    ("rdma_cm_id", "route.addr.addr.ibaddr.sgid:route.addr.ibaddr.sgid"),
    ("rdma_cm_id", "route.addr.addr.ibaddr.dgid:route.addr.ibaddr.dgid"),
    ("rdma_cm_id", "route.addr.addr.ibaddr.pkey:route.addr.ibaddr.pkey"),
    ("rdma_cm_id", "route.path_rec"), ("rdma_cm_id", "route.num_paths"),
]

items = []  # (struct, c_member, rust_member)
for m in re.finditer(r"#\[repr\(C\)\]\n(?:#\[derive\([^)]*\)\]\n)?pub (?:struct|union) (\w+) \{(.*?)\n\}", src, re.S):
    name, body = m.group(1), m.group(2)
    if name in SKIP:
        continue
    items.append((name, None, None))
    for f in re.finditer(r"^\s*pub (\w+):", body, re.M):
        rf = f.group(1)
        items.append((name, RENAME.get((name, rf), rf), rf))
for s, c in EXTRA:
    c, _, r = c.partition(":")
    items.append((s, c, r or c))

prog = ["#include <stdio.h>", "#include <stddef.h>", "#include <rdma/rdma_cma.h>",
        "#include <infiniband/sa.h>", "int main(void) {"]
for s, c, r in items:
    if c is None:
        prog.append(f'  printf("size {s} %zu\\n", sizeof(struct {s}));')
    else:
        shown = c if c == r else f"{c}:{r}"
        prog.append(f'  printf("off {s} {shown} %zu\\n", offsetof(struct {s}, {c}));')
prog.append("  return 0;\n}")
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "l.c"), "w").write("\n".join(prog) + "\n")
    subprocess.check_call(["cc", "-o", os.path.join(d, "l"), os.path.join(d, "l.c")])
    out = subprocess.check_output([os.path.join(d, "l")]).decode()
head = """# Sizes and offsets of the rdma-core v44 librdmacm structs (x86_64) that
# programs share with our librdmacm: every field of every struct in
# src/abi.rs, measured from Debian 12's <rdma/rdma_cma.h> by
# scripts/gen-layout.py. build.rs turns each line into a compile-time
# assertion on our #[repr(C)] structs; tests/c_layout.rs measures the same
# numbers again against the installed headers. `off STRUCT CMEMBER[:RUSTFIELD]
# OFFSET` names the Rust field when it differs (an anonymous union).
"""
open(os.path.join(root, "layout.txt"), "w").write(head + out)
print(f"{len(out.splitlines())} lines", file=sys.stderr)
