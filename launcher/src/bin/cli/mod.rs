//! The command lines of vmwarden's three binaries, in one place. Each
//! binary parses its own (`vmwarden-launch` and `vmwarden-cleanup` include
//! just their files with `#[path]`); `vmwarden generate` renders the man
//! pages and shell completions of all three from these same definitions.
//! The library never sees clap: it takes plain structs (`Roots`,
//! `launch::Options`, `unit::RenderUnitArgs`).

pub mod common;
pub mod exit_codes;
pub mod generate;
pub mod vmwarden;

// The other binaries' command lines, here for `generate`: this binary
// builds their clap trees but never reads their fields.
#[allow(dead_code)]
pub mod cleanup;
#[allow(dead_code)]
pub mod launch;

/// The clap trees of the three binaries.
pub fn commands() -> Vec<clap::Command> {
    use clap::CommandFactory;
    vec![
        launch::LaunchArgs::command(),
        cleanup::CleanupArgs::command(),
        vmwarden::Cli::command(),
    ]
}
