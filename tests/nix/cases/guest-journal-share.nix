# microvm.nix's FAQ journal share: a writable virtiofs share the guest owns
# (journald's setgid /var/log/journal, its systemd-journal group).
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.logs.guest = import ../guests {inherit lib pkgs;} [../guests/journal-share.nix];
}
