//! The text `vmwarden adopt` prints: the plan, or what was done.

use super::{Kind, Place, Plan};

/// The text `vmwarden adopt` prints.
pub fn render(plan: &Plan, systemd: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let who = match &plan.user {
        Some(u) => format!("{u} ({}:{})", plan.uid, plan.gid),
        None => format!("{}:{}", plan.uid, plan.gid),
    };
    let _ = writeln!(
        out,
        "adopt {} from {} into {}, owner {who}{}",
        plan.name,
        plan.from.display(),
        plan.state_dir.display(),
        if plan.resuming {
            " (finishing an interrupted --apply)"
        } else {
            ""
        }
    );
    let verb = if plan.applied { "moved" } else { "move" };
    for p in &plan.items {
        let line = match &p.place {
            Place::From {
                bytes,
                allocated,
                entries,
                owner,
            } => match p.item.kind {
                Kind::Image => format!(
                    "  {verb:<6} {} -> {}  ({}: disk image, {bytes} bytes, {allocated} allocated, owner {}:{} -> {}:{}, mode 0600)",
                    p.from.display(),
                    p.to.display(),
                    p.item.field,
                    owner.0,
                    owner.1,
                    plan.uid,
                    plan.gid
                ),
                Kind::Share => format!(
                    "  {verb:<6} {} -> {}  ({}: share source, {entries} entries, {bytes} bytes, owner {}:{} -> {}:{}, every entry re-owned without following links)",
                    p.from.display(),
                    p.to.display(),
                    p.item.field,
                    owner.0,
                    owner.1,
                    plan.uid,
                    plan.gid
                ),
            },
            Place::Moved => format!(
                "  {verb:<6} {} -> {}  ({}: already moved by the interrupted run; re-owned)",
                p.from.display(),
                p.to.display(),
                p.item.field
            ),
            Place::CreatedAtLaunch => format!(
                "  create {}  ({}: not in {}; the launch creates it)",
                p.to.display(),
                p.item.field,
                plan.from.display()
            ),
        };
        let _ = writeln!(out, "{line}");
    }
    for l in &plan.left {
        let _ = writeln!(
            out,
            "  leave  {}  ({}, not named by the spec)",
            l.path.display(),
            l.what
        );
    }
    let _ = writeln!(
        out,
        "checks: VM {} is stopped (vmwarden's liveness); {systemd}; no process holds {} or its images and shares open; one file system; no target exists",
        plan.name,
        plan.from.display()
    );
    let moved = plan
        .items
        .iter()
        .filter(|p| !matches!(p.place, Place::CreatedAtLaunch))
        .count();
    if plan.applied {
        let _ = writeln!(
            out,
            "adopt: done: {moved} moved, {} left in {}; next: vmwarden verify-clean {} and start it",
            plan.left.len(),
            plan.from.display(),
            plan.name
        );
    } else {
        let _ = writeln!(
            out,
            "adopt: {moved} to move, {} to leave (dry run: nothing changed; --apply to move)",
            plan.left.len()
        );
    }
    out
}
