# microvm.nix's flake-template guest: its 9p store share, writable there,
# becomes read-only; its created /var volume stays created.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.my-microvm.guest = import ../guests {inherit lib pkgs;} [../guests/flake-template.nix];
}
