//! Our `#[repr(C)]` structs (rdma-core 65's layout, `layout.txt`, which
//! `build.rs` already asserts on the Rust side) against the system's
//! `<infiniband/verbs.h>` (Debian 12, rdma-core 44): compile a C program
//! that prints the size of every struct and the offset of every field,
//! and compare by rdma-core's rules for growing a struct, which are what
//! lets a program built against 44 run on our library: what 44 has keeps
//! its offset, except in `verbs_context`, which grows at its start and
//! where each field keeps its distance from the end (the `ibv_context`
//! that programs hold); structs that grew are no smaller. Fields and
//! structs newer than 44 are not in its header: they are checked exactly
//! against rdma-core 65's by `debian_sid.rs`.

mod common;

use common::layout::{self, Item};

/// Structs rdma-core added after 44.
const NEW_STRUCTS: &[&str] = &[
    "ibv_dmah",
    "ibv_dmah_init_attr",
    "ibv_mr_init_attr",
    "ibv_comp_cntr_caps",
];

/// Fields rdma-core added after 44 to structs 44 has (and when).
const NEW_FIELDS: &[(&str, &str)] = &[
    ("ibv_qp_ex", "wr_flush"),            // 45
    ("ibv_port_attr", "active_speed_ex"), // 49
    ("verbs_context", "free_buf"),        // 59 to 65
    ("verbs_context", "alloc_buf"),
    ("verbs_context", "dm_export_dmabuf_fd"),
    ("verbs_context", "reg_mr_ex"),
    ("verbs_context", "dealloc_dmah"),
    ("verbs_context", "alloc_dmah"),
];

/// Structs that grew since 44 (at their end, or `verbs_context` at its
/// start).
const GREW: &[&str] = &["ibv_qp_ex", "ibv_port_attr", "verbs_context"];

#[test]
fn every_size_and_offset_keeps_rdma_core_44s_layout() {
    if !common::have_file("/usr/include/infiniband/verbs.h", "libibverbs-dev") {
        return;
    }
    let all = layout::read();
    assert!(all.len() > 400, "layout.txt lists {} items", all.len());
    let old: Vec<&Item> = all
        .iter()
        .filter(|i| {
            !NEW_STRUCTS.contains(&i.strukt.as_str())
                && !i
                    .member
                    .as_deref()
                    .is_some_and(|m| NEW_FIELDS.contains(&(i.strukt.as_str(), m)))
        })
        .collect();
    assert!(
        all.len() - old.len() == 29,
        "new items: {}",
        all.len() - old.len()
    );
    let got = layout::measure(&old, None, &common::scratch_dir("c-layout"));
    let size_of = |items: &[&Item], vals: &[usize], t: &str| {
        items
            .iter()
            .zip(vals)
            .find(|(i, _)| i.strukt == t && i.member.is_none())
            .map(|(_, v)| *v)
            .unwrap()
    };
    let ours: Vec<usize> = old.iter().map(|i| i.value).collect();
    let mut diff = Vec::new();
    for ((it, &g), &o) in old.iter().zip(&got).zip(&ours) {
        let grew = GREW.contains(&it.strukt.as_str());
        let ok = match (&it.member, it.strukt.as_str()) {
            (None, _) if grew => o >= g,
            (Some(_), "verbs_context") => {
                size_of(&old, &ours, "verbs_context") - o
                    == size_of(&old, &got, "verbs_context") - g
            }
            _ => o == g,
        };
        if !ok {
            diff.push(format!(
                "ours (rdma-core 65): {} {o} / verbs.h: {g}",
                it.name
            ));
        }
    }
    assert!(diff.is_empty(), "layout differences:\n{}", diff.join("\n"));
}
