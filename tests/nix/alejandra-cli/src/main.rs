//! `alejandra [--check] PATH...`: format (or, with `--check`, only report)
//! every `.nix` file under the given paths, like the upstream CLI.
//! Exit status: 0 when nothing needed formatting (or all was formatted),
//! 1 when `--check` found unformatted files, 2 on a parse or I/O error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

const SKIP_DIRS: &[&str] = &[".git", "target", "result", "node_modules"];

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for entry in entries {
            let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if entry.is_dir() && SKIP_DIRS.contains(&name) {
                continue;
            }
            if entry.is_dir() || name.ends_with(".nix") {
                collect(&entry, out)?;
            }
        }
    } else if meta.is_file() {
        out.push(path.to_path_buf());
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut check = false;
    let mut roots = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--check" | "-c" => check = true,
            "--quiet" | "-q" => {}
            _ => roots.push(PathBuf::from(arg)),
        }
    }
    if roots.is_empty() {
        roots.push(PathBuf::from("."));
    }
    let mut files = Vec::new();
    for root in &roots {
        if let Err(e) = collect(root, &mut files) {
            eprintln!("alejandra: {}: {e}", root.display());
            return ExitCode::from(2);
        }
    }
    let (mut changed, mut errors) = (0usize, 0usize);
    for file in &files {
        let name = file.display().to_string();
        match alejandra::format::in_fs(name.clone(), !check) {
            alejandra::format::Status::Changed(true) => {
                changed += 1;
                if check {
                    println!("Requires formatting: {name}");
                } else {
                    println!("Formatted: {name}");
                }
            }
            alejandra::format::Status::Changed(false) => {}
            alejandra::format::Status::Error(e) => {
                errors += 1;
                eprintln!("alejandra: {name}: {e}");
            }
        }
    }
    println!(
        "alejandra: {} file(s) checked, {changed} {}, {errors} error(s)",
        files.len(),
        if check { "need formatting" } else { "formatted" }
    );
    if errors > 0 {
        ExitCode::from(2)
    } else if check && changed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
