//! What the build scripts of `libibverbs` and `librdmacm` share (each
//! includes this file with `#[path]`): reading an `exports.txt`, turning
//! it into a linker version script and `.symver` directives, turning a
//! `layout.txt` into compile-time assertions, and building a link-time
//! stub of a library from its `exports.txt`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The symbols of one `exports.txt` (`NODE symbol` lines), by version node.
/// A symbol may be listed under several nodes (rdma-core's providers of
/// different releases bind `ibv_cmd_*` at `IBVERBS_PRIVATE_34` or at
/// `IBVERBS_PRIVATE_65`): it is then exported at each, the same function,
/// and the last node in version order is its default version (`@@`), as
/// the newest library would define it; the others are `@` versions.
pub struct Exports {
    /// Version nodes in version order, each with its symbols in file order.
    pub nodes: Vec<(String, Vec<String>)>,
}

/// A private node (`IBVERBS_PRIVATE_34`) stands alone; the public ones
/// inherit each other in version order, as rdma-core's `.map` files chain
/// them.
fn is_private(node: &str) -> bool {
    node.contains("PRIVATE")
}

impl Exports {
    pub fn read(path: &Path) -> Exports {
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (node, sym) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("{}: `NODE symbol` lines, not {line:?}", path.display()));
            by_node
                .entry(node.to_string())
                .or_default()
                .push(sym.trim().to_string());
        }
        let mut nodes: Vec<(String, Vec<String>)> = by_node.into_iter().collect();
        // `IBVERBS_1.10` after `IBVERBS_1.9`: compare the numbers after the
        // last `_`; private nodes last.
        nodes.sort_by_key(|(n, _)| {
            let v: Vec<u32> = n
                .rsplit('_')
                .next()
                .unwrap_or("")
                .split('.')
                .map(|p| p.parse().unwrap_or(u32::MAX))
                .collect();
            (is_private(n), v)
        });
        Exports { nodes }
    }

    /// `@@` if `node` is the newest node that lists `sym` (its default
    /// version), `@` otherwise.
    fn at(&self, node: &str, sym: &str) -> &'static str {
        let newest = self
            .nodes
            .iter()
            .rev()
            .find(|(_, syms)| syms.iter().any(|s| s == sym))
            .map(|(n, _)| n.as_str());
        if newest == Some(node) {
            "@@"
        } else {
            "@"
        }
    }

    /// The linker version script: every node with its symbols, `local: *`
    /// in the first, public nodes chained to the one before.
    pub fn version_script(&self) -> String {
        let mut script = String::new();
        let mut prev: Option<&str> = None;
        for (i, (node, syms)) in self.nodes.iter().enumerate() {
            write!(script, "{node} {{\n  global:\n").unwrap();
            for s in syms {
                writeln!(script, "    {s};").unwrap();
            }
            if i == 0 {
                script += "  local: *;\n";
            }
            script += "}";
            if let Some(p) = prev.filter(|_| !is_private(node)) {
                write!(script, " {p}").unwrap();
            }
            script += ";\n";
            if !is_private(node) {
                prev = Some(node);
            }
        }
        script
    }

    /// `.symver` directives (as Rust `global_asm!`) giving each Rust
    /// implementation `rxe_<symbol>` its public name `<symbol>@@<node>`
    /// (and `<symbol>@<older node>` for each older node that lists it). A
    /// version script alone would export unversioned symbols, and programs
    /// linked BIND_NOW against rdma-core would not load.
    pub fn symver_asm(&self) -> String {
        let mut asm = String::new();
        for (node, syms) in &self.nodes {
            for sym in syms {
                let at = self.at(node, sym);
                writeln!(
                    asm,
                    "core::arch::global_asm!(\".symver rxe_{sym}, {sym}{at}{node}\");"
                )
                .unwrap();
            }
        }
        asm
    }

    /// Builds `<out>/<soname>`: a shared library that defines every symbol
    /// of these exports at its version and does nothing else (each
    /// function traps), and returns the directory that holds it.
    ///
    /// It exists so that a library that depends on this one can be linked
    /// without the system's copy (a machine without rdma-core's packages):
    /// linking against it records `DT_NEEDED <soname>` and the versioned
    /// references, exactly as linking against the real library would. It
    /// is never loaded: it is not on any run-time search path, and the
    /// dependent library carries no RPATH.
    pub fn link_stub(&self, soname: &str, out: &Path) -> PathBuf {
        let dir = out.join("link-stub");
        std::fs::create_dir_all(&dir).unwrap();
        let mut c =
            String::from("/* Generated by build_common.rs: a link-time stub, never loaded. */\n");
        let mut n = 0usize;
        for (node, syms) in &self.nodes {
            for sym in syms {
                let at = self.at(node, sym);
                writeln!(
                    c,
                    "void rxe_stub_{n}(void) {{ __builtin_trap(); }}\n\
                     __asm__(\".symver rxe_stub_{n}, {sym}{at}{node}\");"
                )
                .unwrap();
                n += 1;
            }
        }
        let src = dir.join("stub.c");
        let map = dir.join("stub.map");
        std::fs::write(&src, c).unwrap();
        std::fs::write(&map, self.version_script()).unwrap();
        let lib = dir.join(soname);
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-nostdlib", "-o"])
            .arg(&lib)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(format!("-Wl,--version-script={}", map.display()))
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run the C compiler `{cc}` to build a link stub of {soname}: {e} (install gcc: apt-get install build-essential)")
            });
        assert!(
            status.success(),
            "`{cc}` failed to build the link stub {}",
            lib.display()
        );
        dir
    }
}

/// A `layout.txt` (`size T N`, `off T field N` lines, from
/// `scripts/gen-layout.py`) as compile-time size and offset assertions.
pub fn layout_checks(path: &Path) -> String {
    println!("cargo:rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
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
