//! Our `#[repr(C)]` structs against the system's `<infiniband/verbs.h>`:
//! compile a C program that prints the size of every struct and the offset
//! of every field listed in `layout.txt` (which `build.rs` already asserts
//! on the Rust side), and compare.

mod common;

use std::process::Command;

#[test]
fn every_size_and_offset_matches_the_installed_verbs_h() {
    if !common::have_file("/usr/include/infiniband/verbs.h", "libibverbs-dev") {
        return;
    }
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/layout.txt"))
        .expect("layout.txt");
    let mut expect = Vec::new();
    let mut prog = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        let kind = |t: &str| if t == "ibv_gid" { "union" } else { "struct" };
        match w.as_slice() {
            ["size", t, n] => {
                prog += &format!("  printf(\"size {t} %zu\\n\", sizeof({} {t}));\n", kind(t));
                expect.push(format!("size {t} {n}"));
            }
            ["off", t, f, n] => {
                let c = f.split_once(':').map_or(*f, |(c, _)| c);
                prog += &format!(
                    "  printf(\"off {t} {f} %zu\\n\", offsetof({} {t}, {c}));\n",
                    kind(t)
                );
                expect.push(format!("off {t} {f} {n}"));
            }
            _ => panic!("bad layout.txt line {line:?}"),
        }
    }
    prog += "  return 0;\n}\n";
    assert!(
        expect.len() > 400,
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
        .map(|(e, g)| format!("ours: {e} / verbs.h: {g}"))
        .collect();
    assert_eq!(got.len(), expect.len());
    assert!(diff.is_empty(), "layout differences:\n{}", diff.join("\n"));
}
