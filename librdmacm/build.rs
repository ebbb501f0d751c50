//! Turns `exports.txt` into the linker version script (the version nodes
//! RDMACM_1.0 ... RDMACM_1.3, each inheriting the one before, as
//! rdma-core's librdmacm.map chains them) and into `.symver` directives
//! that give each Rust implementation `rxe_<symbol>` its public versioned
//! name `<symbol>@@<node>`: programs linked BIND_NOW against Debian's
//! librdmacm find every symbol at the version they were linked with.
//!
//! The library links against `libibverbs.so.1` as rdma-core's does (see
//! `src/ffi.rs`); at run time `LD_LIBRARY_PATH` resolves that to our
//! drop-in.

use std::collections::BTreeMap;
use std::fmt::Write;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let out = std::env::var("OUT_DIR").unwrap();
    println!("cargo:rerun-if-changed=exports.txt");
    let text = std::fs::read_to_string(format!("{dir}/exports.txt")).unwrap();
    let mut nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut asm = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (node, sym) = line.split_once(' ').expect("`NODE symbol` lines");
        nodes
            .entry(node.to_string())
            .or_default()
            .push(sym.to_string());
        writeln!(
            asm,
            "core::arch::global_asm!(\".symver rxe_{sym}, {sym}@@{node}\");"
        )
        .unwrap();
    }
    // BTreeMap order is version order for RDMACM_1.0 .. RDMACM_1.3.
    let mut script = String::new();
    let mut prev: Option<&str> = None;
    for (i, (node, syms)) in nodes.iter().enumerate() {
        write!(script, "{node} {{\n  global:\n").unwrap();
        for s in syms {
            writeln!(script, "    {s};").unwrap();
        }
        if i == 0 {
            script += "  local: *;\n";
        }
        script += "}";
        if let Some(p) = prev {
            write!(script, " {p}").unwrap();
        }
        script += ";\n";
        prev = Some(node);
    }
    std::fs::write(format!("{out}/librdmacm.map"), script).unwrap();
    // Ours for src/abi.rs; libibverbs' own for its abi.rs, which we
    // include as a module and which includes `layout_checks.rs`.
    std::fs::write(
        format!("{out}/rdmacm_layout_checks.rs"),
        layout_checks(&format!("{dir}/layout.txt")),
    )
    .unwrap();
    std::fs::write(
        format!("{out}/layout_checks.rs"),
        layout_checks(&format!("{dir}/../libibverbs/layout.txt")),
    )
    .unwrap();
    std::fs::write(format!("{out}/symver.rs"), asm).unwrap();
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={out}/librdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
}

/// A `layout.txt` as compile-time assertions.
fn layout_checks(path: &str) -> String {
    println!("cargo:rerun-if-changed={path}");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["size", t, n] => writeln!(
                out,
                "const _: () = assert!(std::mem::size_of::<{t}>() == {n});"
            )
            .unwrap(),
            ["off", t, f, n] => {
                let rust = f.split_once(':').map_or(*f, |(_, r)| r);
                writeln!(
                    out,
                    "const _: () = assert!(std::mem::offset_of!({t}, {rust}) == {n});"
                )
                .unwrap()
            }
            _ => {}
        }
    }
    out
}
