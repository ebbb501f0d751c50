//! Turns `exports.txt` into the linker version script (the version nodes
//! IBVERBS_1.0 ... IBVERBS_1.18, IBVERBS_PRIVATE_34 and _65) and into `.symver`
//! directives that give each Rust implementation `rxe_<symbol>` its public
//! versioned name `<symbol>@@<node>` (see `build_common.rs`), and
//! `layout.txt` into compile-time layout assertions.

use std::path::Path;

// `link_stub` is for the libraries that depend on this one.
#[allow(dead_code)]
#[path = "build_common.rs"]
mod build_common;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let out = std::env::var("OUT_DIR").unwrap();
    let dir = Path::new(&dir);
    let out = Path::new(&out);
    println!("cargo:rerun-if-changed=build_common.rs");
    let exports = build_common::Exports::read(&dir.join("exports.txt"));
    let map = out.join("libibverbs.map");
    std::fs::write(&map, exports.version_script()).unwrap();
    std::fs::write(
        out.join("layout_checks.rs"),
        build_common::layout_checks(&dir.join("layout.txt")),
    )
    .unwrap();
    std::fs::write(out.join("symver.rs"), exports.symver_asm()).unwrap();
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    // Every exported symbol must be defined here: an undefined one would
    // only fail when a BIND_NOW program loads us.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
}
