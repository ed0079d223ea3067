//! The text `vmwarden adopt` prints: the plan, or what was done. Every
//! path is shown through `rawpath::show` and every other value through
//! `text::escape`: DIR's file names are its old owner's to choose, and a
//! control character among them must not reach root's terminal raw.

use crate::config::rawpath::show;
use crate::config::text::escape;

use super::{How, Kind, Place, Plan};

/// The text `vmwarden adopt` prints.
pub fn render(plan: &Plan, systemd: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let who = match &plan.user {
        Some(u) => format!("{} ({}:{})", escape(u), plan.uid, plan.gid),
        None => format!("{}:{}", plan.uid, plan.gid),
    };
    let _ = writeln!(
        out,
        "adopt {} from {} into {}, owner {who}{}",
        plan.name,
        show(&plan.from),
        show(&plan.state_dir),
        if plan.resuming {
            " (finishing an interrupted --apply)"
        } else {
            ""
        }
    );
    for p in &plan.items {
        let (from, to, field) = (show(&p.from), show(&p.to), escape(&p.item.field));
        let verb = match (p.item.how, plan.applied) {
            (How::Move, false) => "move",
            (How::Move, true) => "moved",
            (How::Copy, false) => "copy",
            (How::Copy, true) => "copied",
        };
        // What becomes of the old inodes.
        let how = match p.item.how {
            How::Move => "root's alone: the same inodes, re-owned",
            How::Copy => "its old owner could hold it open: new inodes (a reflink where the file system has one, else a copy keeping holes), the old ones removed",
        };
        let line = match &p.place {
            Place::From {
                bytes,
                allocated,
                entries,
                owner,
            } => match p.item.kind {
                Kind::Image => format!(
                    "  {verb:<6} {from} -> {to}  ({field}: disk image, {bytes} bytes, {allocated} allocated, owner {}:{} -> {}:{}, mode 0600; {how})",
                    owner.0, owner.1, plan.uid, plan.gid
                ),
                Kind::Share => format!(
                    "  {verb:<6} {from} -> {to}  ({field}: share source, {entries} entries, {bytes} bytes, owner {}:{} -> {}:{}, every entry the principal's, no link followed; {how})",
                    owner.0, owner.1, plan.uid, plan.gid
                ),
            },
            Place::Moved => format!(
                "  {verb:<6} {from} -> {to}  ({field}: already done by the interrupted run{})",
                if p.item.how == How::Move { "; re-owned" } else { "" }
            ),
            Place::Copied => format!(
                "  remove {from}  ({field}: the interrupted run copied it to {to}; the old inodes go)"
            ),
            Place::CreatedAtLaunch => format!(
                "  create {to}  ({field}: not in {}; the launch creates it)",
                show(&plan.from)
            ),
        };
        let _ = writeln!(out, "{line}");
    }
    for l in &plan.left {
        let _ = writeln!(
            out,
            "  leave  {}  ({}, not named by the spec)",
            show(&l.path),
            l.what
        );
    }
    let room = &plan.room;
    let _ = writeln!(
        out,
        "checks: VM {} is stopped (vmwarden's liveness); {}; no process holds {} or its images and shares open; one file system; no target exists; room for the copies: {} bytes needed, {} free{}",
        plan.name,
        escape(systemd),
        show(&plan.from),
        room.needed,
        room.available,
        if room.reflink { " (reflinks)" } else { "" }
    );
    let count = |how| {
        plan.items
            .iter()
            .filter(|p| p.item.how == how && !matches!(p.place, Place::CreatedAtLaunch))
            .count()
    };
    let (moved, copied) = (count(How::Move), count(How::Copy));
    if plan.applied {
        let _ = writeln!(
            out,
            "adopt: done: {moved} moved, {copied} copied, {} left in {}; next: vmwarden verify-clean {} and start it",
            plan.left.len(),
            show(&plan.from),
            plan.name
        );
    } else {
        let _ = writeln!(
            out,
            "adopt: {moved} to move, {copied} to copy, {} to leave (dry run: nothing changed; --apply to adopt)",
            plan.left.len()
        );
    }
    out
}
