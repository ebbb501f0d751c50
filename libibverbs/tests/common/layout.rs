//! `layout.txt` (our structs' sizes and offsets, rdma-core 65's numbers,
//! which `build.rs` asserts on the Rust side) measured again by a C
//! compiler against a given `<infiniband/verbs.h>`: the installed one
//! (`c_layout.rs`, rdma-core 44) or Debian sid's (`debian_sid.rs`).

use std::path::Path;
use std::process::Command;

/// One line of `layout.txt`.
pub struct Item {
    pub strukt: String,
    /// `None` for the struct's size; else the C member designator.
    pub member: Option<String>,
    /// The line as written (`off ibv_send_wr wr.rdma.rkey:... 40`), less
    /// the number.
    pub name: String,
    pub value: usize,
}

pub fn read() -> Vec<Item> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/layout.txt"))
        .expect("layout.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["size", t, n] => Item {
                    strukt: t.to_string(),
                    member: None,
                    name: format!("size {t}"),
                    value: n.parse().unwrap(),
                },
                ["off", t, f, n] => Item {
                    strukt: t.to_string(),
                    member: Some(f.split_once(':').map_or(*f, |(c, _)| c).to_string()),
                    name: format!("off {t} {f}"),
                    value: n.parse().unwrap(),
                },
                _ => panic!("bad layout.txt line {line:?}"),
            }
        })
        .collect()
}

/// The size or offset of each item as cc measures it with
/// `<infiniband/verbs.h>` from `include` (only its `infiniband/` and
/// `rdma/` are used; the C library's headers stay the host's), or the
/// system's headers if `None`.
pub fn measure(items: &[&Item], include: Option<&Path>, dir: &Path) -> Vec<usize> {
    let mut prog = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for it in items {
        let kind = if it.strukt == "ibv_gid" {
            "union"
        } else {
            "struct"
        };
        let t = &it.strukt;
        prog += &match &it.member {
            None => format!("  printf(\"%zu\\n\", sizeof({kind} {t}));\n"),
            Some(m) => format!("  printf(\"%zu\\n\", offsetof({kind} {t}, {m}));\n"),
        };
    }
    prog += "  return 0;\n}\n";
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, prog).unwrap();
    let mut cc = Command::new("cc");
    if let Some(inc) = include {
        let d = dir.join("inc");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for sub in ["infiniband", "rdma"] {
            std::os::unix::fs::symlink(inc.join(sub), d.join(sub)).unwrap();
        }
        cc.arg("-I").arg(d);
    }
    let out = cc.arg("-o").arg(&exe).arg(&src).output().expect("cc runs");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got.len(), items.len());
    got
}
