//! Our `#[repr(C)]` structs against the system's `<rdma/rdma_cma.h>`:
//! compile a C program that prints the size of every struct and the
//! offset of every field listed in `layout.txt` (which `build.rs` already
//! asserts on the Rust side), and compare.

#[path = "../../libibverbs/tests/common/mod.rs"]
mod common;

use std::process::Command;

#[test]
fn every_size_and_offset_matches_the_installed_rdma_cma_h() {
    if !common::have_file("/usr/include/rdma/rdma_cma.h", "librdmacm-dev") {
        return;
    }
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/layout.txt"))
        .expect("layout.txt");
    let mut expect = Vec::new();
    let mut prog = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/rdma_cma.h>\n#include <infiniband/sa.h>\nint main(void) {\n",
    );
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["size", t, n] => {
                prog += &format!("  printf(\"size {t} %zu\\n\", sizeof(struct {t}));\n");
                expect.push(format!("size {t} {n}"));
            }
            ["off", t, f, n] => {
                let c = f.split_once(':').map_or(*f, |(c, _)| c);
                prog += &format!("  printf(\"off {t} {f} %zu\\n\", offsetof(struct {t}, {c}));\n");
                expect.push(format!("off {t} {f} {n}"));
            }
            _ => panic!("bad layout.txt line {line:?}"),
        }
    }
    prog += "  return 0;\n}\n";
    assert!(
        expect.len() > 100,
        "layout.txt lists {} items",
        expect.len()
    );
    let dir = common::scratch_dir("c-layout");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, prog).unwrap();
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("cc runs");
    assert!(
        cc.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let diff: Vec<String> = expect
        .iter()
        .zip(&got)
        .filter(|(e, g)| e != g)
        .map(|(e, g)| format!("ours: {e} / rdma_cma.h: {g}"))
        .collect();
    assert_eq!(got.len(), expect.len());
    assert!(diff.is_empty(), "layout differences:\n{}", diff.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
