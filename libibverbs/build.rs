//! Turns `exports.txt` into the linker version script (the version nodes
//! IBVERBS_1.0 ... IBVERBS_1.14 and IBVERBS_PRIVATE_34) and into `.symver`
//! directives that give each Rust implementation `rxe_<symbol>` its public
//! versioned name `<symbol>@@<node>`. A version script alone would export
//! unversioned symbols, and programs linked BIND_NOW against rdma-core
//! would not load.

use std::collections::BTreeMap;
use std::fmt::Write;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    let out = std::env::var("OUT_DIR").unwrap();
    println!("cargo:rerun-if-changed=exports.txt");
    let text = std::fs::read_to_string(format!("{dir}/exports.txt")).unwrap();
    let mut nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut asm = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (node, sym) = line.split_once(' ').expect("`NODE symbol` lines");
        if !nodes.contains_key(node) {
            order.push(node.to_string());
        }
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
    // Public nodes in version order, each inheriting the one before, as
    // rdma-core's libibverbs.map chains them; the private node stands alone.
    order.sort_by_key(|n| {
        let v: Vec<u32> = n
            .trim_start_matches("IBVERBS_")
            .split('.')
            .map(|p| p.parse().unwrap_or(u32::MAX))
            .collect();
        v
    });
    let mut script = String::new();
    let mut prev: Option<&str> = None;
    for (i, node) in order.iter().enumerate() {
        write!(script, "{node} {{\n  global:\n").unwrap();
        for s in &nodes[node] {
            writeln!(script, "    {s};").unwrap();
        }
        if i == 0 {
            script += "  local: *;\n";
        }
        script += "}";
        if let Some(p) = prev.filter(|_| !node.contains("PRIVATE")) {
            write!(script, " {p}").unwrap();
        }
        script += ";\n";
        if !node.contains("PRIVATE") {
            prev = Some(node);
        }
    }
    std::fs::write(format!("{out}/libibverbs.map"), script).unwrap();
    std::fs::write(format!("{out}/layout_checks.rs"), layout_checks(&dir)).unwrap();
    std::fs::write(format!("{out}/symver.rs"), asm).unwrap();
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={out}/libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    // Every exported symbol must be defined here: an undefined one would
    // only fail when a BIND_NOW program loads us.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
}

/// `layout.txt` as compile-time assertions.
fn layout_checks(dir: &str) -> String {
    println!("cargo:rerun-if-changed=layout.txt");
    let text = std::fs::read_to_string(format!("{dir}/layout.txt")).unwrap();
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
