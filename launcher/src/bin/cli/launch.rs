//! `vmwarden-launch`'s command line.

use std::path::PathBuf;

use vmwarden::config::names::VmName;

use vmwarden::config::paths::{DEFAULT_CONFIG_DIR, DEFAULT_RUNTIME_ROOT, DEFAULT_STATE_ROOT};

use super::common::{LogArgs, RootArgs};

#[derive(Debug, clap::Parser)]
#[command(
    name = "vmwarden-launch",
    version,
    about = "Launch one microVM in its own sandbox",
    long_about = "Launch one microVM in its own sandbox: validate the spec, take the VM's lease, \
record the intent, build the private mount namespace and credential tmpfs, drop to the VM's \
principal and execve the hypervisor (the unit's ExecStart=). On success the process is the \
hypervisor; see docs/exit-codes.md for the exit statuses."
)]
pub struct LaunchArgs {
    /// VM name (the unit instance, %i).
    #[arg(required_unless_present = "list_steps")]
    pub name: Option<VmName>,
    /// Spec path (default CONFIG_DIR/NAME.json).
    #[arg(long, value_name = "PATH")]
    pub spec: Option<PathBuf>,
    #[command(flatten)]
    pub roots: RootArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Print the launch step names in order and exit.
    #[arg(long)]
    pub list_steps: bool,
    /// Run CMD in the identical sandbox instead of the hypervisor.
    #[arg(long, requires = "cmd")]
    pub probe: bool,
    /// The probe command (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// The launch's own command lines, read without building clap's command
/// tree (~0.1 ms of a launch, most of it first touches of clap's code):
/// `NAME`, `--spec PATH`, `--config-dir DIR`, `--runtime-root DIR`,
/// `--state-root DIR`, `-q`/`--quiet`, `--probe` and `-- CMD…`, each at
/// most once, values as separate arguments. Anything else — help,
/// version, `--list-steps`, `--opt=value`, a repeated or unknown option,
/// an empty value or one that starts with `-`, a name that is not valid,
/// a root variable set empty, `--probe` without a command — is `None`:
/// clap parses it, so every answer and every error stays clap's. `env`
/// reads a variable (the process's environment, or a test's).
pub fn parse_fast<I, E>(args: I, env: E) -> Option<LaunchArgs>
where
    I: IntoIterator<Item = std::ffi::OsString>,
    E: Fn(&str) -> Option<std::ffi::OsString>,
{
    use std::ffi::OsString;

    let mut args = args.into_iter().skip(1);
    let mut name: Option<VmName> = None;
    let mut paths: [Option<OsString>; 4] = [None, None, None, None];
    let (mut quiet, mut probe) = (false, false);
    let mut cmd = Vec::new();
    // A value: present, not empty, not an option.
    let value = |v: Option<OsString>| {
        v.filter(|v| !v.is_empty() && !v.as_encoded_bytes().starts_with(b"-"))
    };
    while let Some(a) = args.next() {
        let slot = match a.to_str()? {
            "--" => {
                for c in args.by_ref() {
                    let c = c.into_string().ok().filter(|c| !c.is_empty())?;
                    cmd.push(c);
                }
                break;
            }
            "--spec" => 0,
            "--config-dir" => 1,
            "--runtime-root" => 2,
            "--state-root" => 3,
            "-q" | "--quiet" if !quiet => {
                quiet = true;
                continue;
            }
            "--probe" if !probe => {
                probe = true;
                continue;
            }
            s if !s.starts_with('-') && name.is_none() => {
                name = Some(VmName::parse(s).ok()?);
                continue;
            }
            _ => return None,
        };
        if paths[slot].is_some() {
            return None;
        }
        paths[slot] = Some(value(args.next())?);
    }
    let name = Some(name?);
    if probe && cmd.is_empty() {
        return None;
    }
    let [spec, config_dir, runtime_root, state_root] = paths;
    // Given, else its variable (set but empty is clap's error), else the
    // default.
    let root = |given: Option<OsString>, var: &str, default: &str| -> Option<PathBuf> {
        match given {
            Some(p) => Some(PathBuf::from(p)),
            None => match env(var) {
                Some(v) if v.is_empty() => None,
                Some(v) => Some(PathBuf::from(v)),
                None => Some(PathBuf::from(default)),
            },
        }
    };
    Some(LaunchArgs {
        name,
        spec: spec.map(PathBuf::from),
        roots: RootArgs {
            config_dir: root(config_dir, "VMWARDEN_CONFIG_DIR", DEFAULT_CONFIG_DIR)?,
            runtime_root: root(runtime_root, "VMWARDEN_RUNTIME_ROOT", DEFAULT_RUNTIME_ROOT)?,
            state_root: root(state_root, "VMWARDEN_STATE_ROOT", DEFAULT_STATE_ROOT)?,
        },
        log: LogArgs { quiet },
        list_steps: false,
        probe,
        cmd,
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::Parser;

    use super::*;

    /// Every command line the fast path answers, clap answers the same
    /// way; the rest it leaves to clap.
    #[test]
    fn the_fast_path_answers_as_clap_does_or_not_at_all() {
        let lines: &[&[&str]] = &[
            &["web"],
            &["web", "-q"],
            &["web", "--quiet"],
            &["-q", "web"],
            &["web", "--spec", "/etc/x.json"],
            &["--spec", "/etc/x.json", "web"],
            &[
                "web",
                "--config-dir",
                "/c",
                "--runtime-root",
                "/r",
                "--state-root",
                "/s",
            ],
            &[
                "bench",
                "--config-dir",
                "/c",
                "--runtime-root",
                "/r",
                "--state-root",
                "/s",
                "--probe",
                "--",
                "/bin/true",
            ],
            &["web", "--probe", "--", "/bin/sh", "-c", "exit 3"],
            &["web", "--", "/bin/true"],
            &["web", "--"],
            &["web", "--probe"],
            &["web", "--probe", "--"],
            &["web", "--probe", "--probe", "--", "/bin/true"],
            &["web", "-q", "-q"],
            &["web", "--spec"],
            &["web", "--spec", ""],
            &["web", "--spec", "-x"],
            &["web", "--spec", "/a", "--spec", "/b"],
            &["web", "--spec=/a"],
            &["web", "other"],
            &["Web"],
            &["a/b"],
            &["-"],
            &[],
            &["--list-steps"],
            &["--help"],
            &["--version"],
            &["web", "--bogus"],
            &["web", "-qv"],
            &["web", "--", ""],
            &["--", "web"],
        ];
        let envs: &[&[(&str, &str)]] = &[
            &[],
            &[("VMWARDEN_CONFIG_DIR", "/envc")],
            &[
                ("VMWARDEN_RUNTIME_ROOT", ""),
                ("VMWARDEN_STATE_ROOT", "/envs"),
            ],
        ];
        let mut answered = 0;
        for env in envs {
            let get = |k: &str| {
                env.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            };
            for line in lines {
                let argv = || {
                    std::iter::once(OsString::from("vmwarden-launch"))
                        .chain(line.iter().map(OsString::from))
                };
                let Some(fast) = parse_fast(argv(), get) else {
                    continue;
                };
                answered += 1;
                let cmd = <LaunchArgs as clap::CommandFactory>::command();
                // clap with the same variables: each argument's named
                // after one no process has, its value a default.
                let cmd = cmd.mut_args(|a| match a.get_env().and_then(|v| v.to_str()) {
                    Some(var) => {
                        let value = get(var);
                        // clap keeps `'static` names and values only.
                        let unset: &'static str =
                            Box::leak(format!("{var}_UNSET_IN_THIS_TEST").into_boxed_str());
                        let a = a.env(unset);
                        match value {
                            Some(v) => a.default_value(&*Box::leak(v.into_boxed_os_str())),
                            None => a,
                        }
                    }
                    None => a,
                });
                let m = cmd.try_get_matches_from(argv()).unwrap();
                let slow = <LaunchArgs as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
                assert_eq!(format!("{fast:?}"), format!("{slow:?}"), "{line:?} {env:?}");
            }
        }
        assert!(answered >= 20, "{answered}");
        // Whatever it leaves to clap, clap refuses or answers otherwise.
        for line in [
            &["--list-steps"][..],
            &["web", "--probe"],
            &["a/b"],
            &["web", "--spec", "-x"],
        ] {
            let argv = std::iter::once("vmwarden-launch").chain(line.iter().copied());
            let clap = LaunchArgs::try_parse_from(argv.clone());
            let fast = parse_fast(argv.map(OsString::from), |_| None);
            assert!(fast.is_none(), "{line:?}");
            assert!(clap.is_err() || line == ["--list-steps"], "{line:?}");
        }
    }
}
