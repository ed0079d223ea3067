//! Every exit status of every binary, with what it means: the EXIT STATUS
//! section of each man page is rendered from this table, and
//! `launcher/tests/exit_codes.rs` checks that `docs/exit-codes.md` holds
//! the same rows and makes each binary exit with each status for real.
//!
//! Self-contained (no imports) so the integration tests can include it.

/// One row: `binary` exits with `status` when `meaning`. `status` is a
/// number, or `hypervisor` for the launcher's success, whose status is the
/// hypervisor's own. `meaning` is Markdown (backticks only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    pub binary: &'static str,
    pub status: &'static str,
    pub meaning: &'static str,
}

const fn row(binary: &'static str, status: &'static str, meaning: &'static str) -> ExitStatus {
    ExitStatus {
        binary,
        status,
        meaning,
    }
}

pub const EXIT_STATUSES: &[ExitStatus] = &[
    row(
        "vmwarden-launch",
        "hypervisor",
        "On success the launcher *is* the hypervisor (or the `--probe` command) after `execve`, with the same pid: the status is the hypervisor's own.",
    ),
    row(
        "vmwarden-launch",
        "0",
        "`--list-steps`, `--help`, `--version`.",
    ),
    row(
        "vmwarden-launch",
        "1",
        "Anything that is not the configuration's fault: already running, ambiguous liveness, a failed system call, tap creation, the privilege-drop self-check, Landlock `required` on a kernel without it, `execve`. The unit restarts it (`Restart=on-failure`).",
    ),
    row(
        "vmwarden-launch",
        "2",
        "Command-line syntax: an unknown flag, a missing NAME.",
    ),
    row(
        "vmwarden-launch",
        "78",
        "`EX_CONFIG`: the configuration, or the host state it points at, is wrong and starting again will not help: an invalid spec or a file it names, a bad root flag or VM name, `--probe` without a command, a refused principal, a refused path (symlink, foreign owner, loose mode), an unreadable credential, a kernel without tmpfs `noswap`, `register_with_machined` on a host without systemd-machined, a hibernation snapshot that no longer matches what would run (`hibernate.on_mismatch` refuse). The unit does not retry it (`RestartPreventExitStatus=78`).",
    ),
    row(
        "vmwarden-cleanup",
        "0",
        "Clean: the report says `\"clean\": true` (also `--help`, `--version`).",
    ),
    row(
        "vmwarden-cleanup",
        "1",
        "Not clean: the VM is not dead (nothing deleted), a deletion failed or something survived (an entry, a credential mount, a tap), or a bad VM name or root.",
    ),
    row(
        "vmwarden-cleanup",
        "2",
        "Command-line syntax.",
    ),
    row(
        "vmwarden",
        "0",
        "Success: `status` whatever state the VMs are in, a dry-run `reap` whatever it finds, `verify-clean` clean, `purge` done, `stop` stopped (or it was not running), `hibernate` captured and stopped, `wait-ready` answered (a restored guest running, its snapshot consumed), `balloon` target set, `console` detached (or its VM's console closed), `metrics` printed or written, `render-unit` printed, `adopt` planned (dry run) or done (also `--help`, `--version`).",
    ),
    row(
        "vmwarden",
        "1",
        "An error or a refusal: a bad VM name or root, a VM that might be running, an unreadable record; `verify-clean` dirty; `reap --apply` with a failure; `purge` without a terminal, not confirmed, refused or incomplete; `wait-ready` timed out or the VM died; `stop` could not stop it; `hibernate` refused (`hibernate.allowed` not true, not running, a capture in progress) or failed (the VM resumed, the partial snapshot deleted); `hibernate-all` with a VM neither hibernated nor stopped, or hibernated but not recorded for the next boot; `balloon` on a VM not running, without a balloon or past its bound, or a control socket that did not answer; `console` on a VM not running or without a console; `metrics --output` could not write its file; `render-unit` refused the spec or a bad `--interval`/`--textfile-dir`; `adopt` refused (either side's VM might be running, a target exists, a symlink, hard link, device node or other file system, a bad `--from` or spec; nothing changed) or failed (run it again to finish).",
    ),
    row(
        "vmwarden",
        "2",
        "Command-line syntax: an unknown subcommand or flag, a missing argument.",
    ),
    row(
        "vmwarden",
        "4",
        "`status NAME…`: a NAME is not a VM vmwarden knows (no spec, runtime dir, state dir or principal registration); the others are still shown. Like `systemctl status` for a unit that does not exist.",
    ),
];

/// The rows of `binary`, in table order.
pub fn of(binary: &str) -> impl Iterator<Item = &'static ExitStatus> + '_ {
    EXIT_STATUSES.iter().filter(move |r| r.binary == binary)
}
