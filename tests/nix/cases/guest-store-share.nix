# A microvm.nix guest sharing the host's store: its VM comes from the guest.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.web.guest = import ../guests {inherit lib pkgs;} [../guests/store-share.nix];
}
