# A microvm.nix guest on its store disk, with volumes.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.db.guest = import ../guests {inherit lib pkgs;} [../guests/store-disk.nix];
}
