#!/usr/bin/env python3
"""Regenerate layout.txt: every field of every #[repr(C)] struct in
src/abi.rs that mirrors a <infiniband/verbs.h> struct, with the offset
rdma-core 65's headers give it (compiled and measured with cc), plus each
struct's size. Run it after changing abi.rs, with the include directory
of a root holding rdma-core 65's libibverbs-dev (tests/debian_sid.rs
builds one under ~/.cache/rxe-emu/roots/sid-*):

    scripts/gen-layout.py ~/.cache/rxe-emu/roots/sid-XXXX/usr/include

build.rs then asserts the numbers on our structs; tests/c_layout.rs
checks them against the installed (rdma-core 44) headers and
tests/debian_sid.rs against the root's (rdma-core 65) exactly."""
import os, re, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
src = open(os.path.join(root, "src", "abi.rs")).read()

# Rust field name -> C member designator, where they differ.
RENAME = {
    ("verbs_context", "priv_"): "priv",
    ("verbs_context", "abi_placeholder2"): "ABI_placeholder2",
    ("verbs_context", "abi_placeholder1"): "ABI_placeholder1",
    ("ibv_mw", "type_"): "type",
    ("verbs_context", "_abi_placeholder3"): "_ABI_placeholder3",
    ("ibv_send_wr", "remote_srqn"): "qp_type.xrc.remote_srqn",
    ("ibv_send_wr", "last"): "bind_mw",
    ("ibv_odp_caps", "rc_odp_caps"): "per_transport_caps.rc_odp_caps",
    ("ibv_odp_caps", "uc_odp_caps"): "per_transport_caps.uc_odp_caps",
    ("ibv_odp_caps", "ud_odp_caps"): "per_transport_caps.ud_odp_caps",
}
# Rust-only helper structs (anonymous in C), our private head, and
# driver.h structs (asserted in abi.rs).
SKIP = {"ibv_buf", "verbs_xrcd", "verbs_device_head", "wr_rdma", "wr_atomic", "wr_ud", "wr_union",
        "wr_bind_mw", "wr_tso", "wr_last", "_ibv_device_ops", "ibv_async_element"}
UNIONS = {"ibv_gid"}
# Nested members programs read through the anonymous unions.
EXTRA = [
    ("ibv_send_wr", "wr.rdma.remote_addr"), ("ibv_send_wr", "wr.rdma.rkey"),
    ("ibv_send_wr", "wr.atomic.remote_addr"), ("ibv_send_wr", "wr.atomic.compare_add"),
    ("ibv_send_wr", "wr.atomic.swap"), ("ibv_send_wr", "wr.atomic.rkey"),
    ("ibv_send_wr", "wr.ud.ah"), ("ibv_send_wr", "wr.ud.remote_qpn"),
    ("ibv_send_wr", "wr.ud.remote_qkey"),
    ("ibv_send_wr", "bind_mw.mw"), ("ibv_send_wr", "bind_mw.rkey"),
    ("ibv_send_wr", "bind_mw.bind_info"),
]
RUST_OF = {"wr.rdma.": "wr.rdma.", "bind_mw.": "last.bind_mw."}

items = []  # (struct, c_member, rust_member)
for m in re.finditer(r"#\[repr\(C(?:, align\(8\))?\)\]\n(?:#\[derive\([^)]*\)\]\n)?pub struct (\w+) \{(.*?)\n\}", src, re.S):
    name, body = m.group(1), m.group(2)
    if name in SKIP:
        continue
    items.append((name, None, None))
    for f in re.finditer(r"^\s*pub (\w+):", body, re.M):
        rf = f.group(1)
        items.append((name, RENAME.get((name, rf), rf), rf))
for s, c in EXTRA:
    r = c
    if c.startswith("bind_mw."):
        r = "last." + c
    items.append((s, c, r))

prog = ["#include <stdio.h>", "#include <stddef.h>", "#include <infiniband/verbs.h>",
        "int main(void) {"]
for s, c, r in items:
    if c is None:
        kind = "union" if s in UNIONS else "struct"
        prog.append(f'  printf("size {s} %zu\\n", sizeof({kind} {s}));')
    else:
        spec = c if c == r else f"{c}:{r}"
        kind = "union" if s in UNIONS else "struct"
        prog.append(f'  printf("off {s} {spec} %zu\\n", offsetof({kind} {s}, {c}));')
prog.append("  return 0;\n}")
if len(sys.argv) != 2:
    sys.exit("usage: gen-layout.py INCLUDE_DIR (rdma-core 65's, e.g. a sid root's usr/include)")
with tempfile.TemporaryDirectory() as d:
    # Only infiniband/ and rdma/ of the given root: the C library's
    # headers stay the host's.
    inc = os.path.join(d, "inc")
    os.mkdir(inc)
    for sub in ("infiniband", "rdma"):
        os.symlink(os.path.join(sys.argv[1], sub), os.path.join(inc, sub))
    cf = os.path.join(d, "l.c")
    open(cf, "w").write("\n".join(prog))
    exe = os.path.join(d, "l")
    subprocess.run(["cc", "-I", inc, "-o", exe, cf], check=True)
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
head = """# Sizes and offsets of the rdma-core 65 structs (x86_64) that programs
# share with our libibverbs: every field of every struct in src/abi.rs,
# measured from Debian sid's <infiniband/verbs.h> by scripts/gen-layout.py.
# build.rs turns each line into a compile-time assertion on our
# #[repr(C)] structs; tests/c_layout.rs checks them against the installed
# (rdma-core 44) headers, tests/debian_sid.rs against rdma-core 65's.
# `off STRUCT CMEMBER[:RUSTFIELD] OFFSET` names the Rust field when it
# differs (a keyword or an anonymous union).
"""
open(os.path.join(root, "layout.txt"), "w").write(head + out)
print(f"{len(items)} entries", file=sys.stderr)
