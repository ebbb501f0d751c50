//! Turns `exports.txt` into the linker version script (the version nodes
//! RDMACM_1.0 ... RDMACM_1.5, each inheriting the one before, as
//! rdma-core's librdmacm.map chains them) and into `.symver` directives
//! that give each Rust implementation `rxe_<symbol>` its public versioned
//! name `<symbol>@@<node>`: programs linked BIND_NOW against Debian's
//! librdmacm find every symbol at the version they were linked with.
//!
//! The library links against `libibverbs.so.1` as rdma-core's does (see
//! `src/ffi.rs`), and at run time `LD_LIBRARY_PATH` resolves that to our
//! drop-in. It is linked against a stub built here from libibverbs'
//! `exports.txt`, not against the system's library: the build needs no
//! rdma-core package, records `DT_NEEDED libibverbs.so.1` with the
//! versions our drop-in exports, and fails if we call a function our
//! drop-in does not export.

use std::path::Path;

#[path = "../libibverbs/build_common.rs"]
mod build_common;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let out = std::env::var("OUT_DIR").unwrap();
    let dir = Path::new(&dir);
    let out = Path::new(&out);
    println!("cargo:rerun-if-changed=../libibverbs/build_common.rs");
    let exports = build_common::Exports::read(&dir.join("exports.txt"));
    let map = out.join("librdmacm.map");
    std::fs::write(&map, exports.version_script()).unwrap();
    // Ours for src/abi.rs; libibverbs' own for its abi.rs, which we
    // include as a module and which includes `layout_checks.rs`.
    std::fs::write(
        out.join("rdmacm_layout_checks.rs"),
        build_common::layout_checks(&dir.join("layout.txt")),
    )
    .unwrap();
    std::fs::write(
        out.join("layout_checks.rs"),
        build_common::layout_checks(&dir.join("../libibverbs/layout.txt")),
    )
    .unwrap();
    std::fs::write(out.join("symver.rs"), exports.symver_asm()).unwrap();
    let verbs = build_common::Exports::read(&dir.join("../libibverbs/exports.txt"));
    let stub_dir = verbs.link_stub("libibverbs.so.1", out);
    println!("cargo:rustc-link-search=native={}", stub_dir.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
}
