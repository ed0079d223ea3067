//! `vmwarden generate --out DIR`: the man pages (`clap_mangen`) and the
//! bash, zsh and fish completions (`clap_complete`) of the three binaries,
//! rendered from their clap definitions. The package builds run it
//! (flake.nix `postInstall`; docs/non-nix-hosts.md for other hosts).
//!
//! Layout under DIR:
//! * `man/man1/BINARY.1`, and `man/man1/vmwarden-SUBCOMMAND.1` for each
//!   subcommand, each binary's page with an EXIT STATUS section from
//!   [`super::exit_codes`];
//! * `completions/bash/BINARY.bash`, `completions/zsh/_BINARY`,
//!   `completions/fish/BINARY.fish`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Command;
use clap_complete::Shell;

/// One generated file: its path under the output directory, and its bytes.
pub struct File {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
}

/// Escape text for a roff line: backslashes, hyphens (so `--flag` stays
/// copyable), characters outside ASCII (`\[uXXXX]`), and a leading `.` or
/// `'` that would start a request.
fn roff_text(s: &str) -> String {
    let s: String = s
        .replace('\\', "\\e")
        .replace('-', "\\-")
        .replace('`', "")
        .chars()
        .map(|c| match c {
            c if c.is_ascii() => c.to_string(),
            c => format!("\\[u{:04X}]", c as u32),
        })
        .collect();
    match s.chars().next() {
        Some('.' | '\'') => format!("\\&{s}"),
        _ => s,
    }
}

/// The EXIT STATUS and SEE ALSO sections of `binary`'s page.
fn exit_status_section(binary: &str) -> String {
    let mut s = String::from(".SH \"EXIT STATUS\"\n");
    for r in super::exit_codes::of(binary) {
        let status = match r.status {
            "hypervisor" => "the hypervisor's".to_string(),
            n => n.to_string(),
        };
        s.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            roff_text(&status),
            roff_text(&r.meaning.replace('*', ""))
        ));
    }
    s
}

fn see_also(binary: &str) -> String {
    let others: Vec<String> = ["vmwarden", "vmwarden-launch", "vmwarden-cleanup"]
        .iter()
        .filter(|b| **b != binary)
        .map(|b| format!("\\fB{}\\fR(1)", roff_text(b)))
        .collect();
    format!(
        ".SH \"SEE ALSO\"\n{}, \\fBsystemctl\\fR(1). The full documentation is in the \
         project's docs/ directory (architecture.md, operating.md, exit\\-codes.md).\n",
        others.join(", ")
    )
}

/// The man page of `cmd` (already built, so subcommands carry their
/// display names such as `vmwarden-status`); `top` is the binary name when
/// `cmd` is a binary rather than a subcommand.
fn man_page(cmd: &Command, top: Option<&str>) -> std::io::Result<Vec<u8>> {
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    if cmd
        .get_arguments()
        .any(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version")
    {
        man.render_options_section(&mut out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut out)?;
    }
    match top {
        Some(binary) => {
            out.write_all(exit_status_section(binary).as_bytes())?;
            out.write_all(see_also(binary).as_bytes())?;
        }
        None => {
            // A subcommand's page points at its binary's for the statuses.
            out.write_all(b".SH \"EXIT STATUS\"\nSee \\fBvmwarden\\fR(1).\n")?;
        }
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut out)?;
    }
    Ok(out)
}

/// Every file `generate` writes, rendered in memory.
pub fn render() -> std::io::Result<Vec<File>> {
    let mut files = Vec::new();
    for mut cmd in super::commands() {
        // The pages leave out `vmwarden help SUBCOMMAND`: every subcommand
        // has a page of its own.
        let mut man_cmd = cmd.clone().disable_help_subcommand(true);
        man_cmd.build();
        cmd.build();
        let name = cmd.get_name().to_string();
        files.push(File {
            path: PathBuf::from(format!("man/man1/{name}.1")),
            bytes: man_page(&man_cmd, Some(&name))?,
        });
        for sub in man_cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let page = sub.get_display_name().unwrap_or(sub.get_name()).to_string();
            files.push(File {
                path: PathBuf::from(format!("man/man1/{page}.1")),
                bytes: man_page(sub, None)?,
            });
        }
        for (shell, file) in [
            (Shell::Bash, format!("completions/bash/{name}.bash")),
            (Shell::Zsh, format!("completions/zsh/_{name}")),
            (Shell::Fish, format!("completions/fish/{name}.fish")),
        ] {
            let mut bytes = Vec::new();
            clap_complete::generate(shell, &mut cmd, &name, &mut bytes);
            files.push(File {
                path: PathBuf::from(file),
                bytes,
            });
        }
    }
    Ok(files)
}

/// Write every file under `out` (created as needed); returns their paths.
pub fn write(out: &Path) -> Result<Vec<PathBuf>, GenerateError> {
    let err = |op, path: &Path| {
        let path = path.to_path_buf();
        move |source| GenerateError { op, path, source }
    };
    let mut written = Vec::new();
    for f in render().map_err(err("render", out))? {
        let path = out.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(err("create directory", parent))?;
        }
        std::fs::write(&path, &f.bytes).map_err(err("write", &path))?;
        written.push(path);
    }
    Ok(written)
}

/// A file `generate` could not render or write.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {op}: {source}")]
pub struct GenerateError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

#[cfg(test)]
mod tests {
    //! The generated man pages and completions against the clap tree: every
    //! visible subcommand and every visible long option of every binary
    //! appears in its man page and in each shell's completion script.
    //! (`launcher/tests/cli_docs.rs` runs the shells on the same files.)
    use super::*;

    fn file(files: &[File], path: &str) -> String {
        let f = files
            .iter()
            .find(|f| f.path == Path::new(path))
            .unwrap_or_else(|| panic!("{path} was not generated"));
        String::from_utf8(f.bytes.clone()).unwrap()
    }

    /// (subcommand path, long options) for `cmd` and every visible subcommand.
    fn tree(cmd: &Command, path: Vec<String>, out: &mut Vec<(Vec<String>, Vec<String>)>) {
        let longs = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        out.push((path.clone(), longs));
        for s in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            let mut p = path.clone();
            p.push(s.get_name().to_string());
            tree(s, p, out);
        }
    }

    #[test]
    fn every_subcommand_and_long_option_is_in_the_man_pages_and_completions() {
        let files = render().unwrap();
        let mut checked = 0;
        for mut cmd in super::super::commands() {
            cmd.build();
            let bin = cmd.get_name().to_string();
            let mut nodes = Vec::new();
            tree(&cmd, Vec::new(), &mut nodes);
            let bash = file(&files, &format!("completions/bash/{bin}.bash"));
            let zsh = file(&files, &format!("completions/zsh/_{bin}"));
            let fish = file(&files, &format!("completions/fish/{bin}.fish"));
            let top_man = file(&files, &format!("man/man1/{bin}.1"));
            for (path, longs) in nodes {
                let man = match path.as_slice() {
                    [] => top_man.clone(),
                    [sub] => {
                        // Listed on the binary's page, and a page of its own.
                        assert!(
                            top_man.contains(&format!("{bin}\\-{}", sub.replace('-', "\\-"))),
                            "{bin}.1 does not list subcommand {sub}"
                        );
                        file(&files, &format!("man/man1/{bin}-{sub}.1"))
                    }
                    deeper => panic!("no nested subcommands expected: {deeper:?}"),
                };
                if let Some(sub) = path.last() {
                    assert!(bash.contains(sub.as_str()), "{bin} bash: no {sub}");
                    assert!(zsh.contains(&format!("'{sub}:")), "{bin} zsh: no {sub}");
                    assert!(
                        fish.contains(&format!("-a \"{sub}\"")),
                        "{bin} fish: no {sub}"
                    );
                }
                for long in longs {
                    let at = format!("{bin} {}", path.join(" "));
                    assert!(
                        man.contains(&format!("\\-\\-{}", long.replace('-', "\\-"))),
                        "{at}: man page lacks --{long}"
                    );
                    assert!(
                        bash.contains(&format!("--{long}")),
                        "{at}: bash lacks --{long}"
                    );
                    assert!(
                        zsh.contains(&format!("--{long}[")) || zsh.contains(&format!("--{long}=[")),
                        "{at}: zsh lacks --{long}"
                    );
                    assert!(
                        fish.contains(&format!("-l {long}")),
                        "{at}: fish lacks --{long}"
                    );
                    checked += 1;
                }
            }
            // Every binary's page carries its exit statuses.
            for r in super::super::exit_codes::of(&bin) {
                let status = if r.status == "hypervisor" {
                    "the hypervisor's"
                } else {
                    r.status
                };
                assert!(
                    top_man.contains(&format!(".TP\n\\fB{status}\\fR\n")),
                    "{bin}.1 lacks exit status {status}"
                );
            }
            assert!(top_man.contains(".SH \"EXIT STATUS\""), "{bin}.1");
        }
        assert!(checked > 20, "only {checked} options checked");
    }

    #[test]
    fn hidden_options_and_the_help_subcommand_have_no_man_page() {
        let files = render().unwrap();
        // render-unit's --units-dir is for tests/nix only (clap_complete
        // still completes hidden options once typed; the pages omit them).
        for f in files.iter().filter(|f| f.path.starts_with("man")) {
            let text = String::from_utf8_lossy(&f.bytes);
            assert!(!text.contains("units-dir"), "{}", f.path.display());
        }
        assert!(!files.iter().any(|f| f.path.ends_with("vmwarden-help.1")));
        assert!(files
            .iter()
            .any(|f| f.path.ends_with("vmwarden-generate.1")));
    }
}
