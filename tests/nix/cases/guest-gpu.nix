# A GPU and its audio function from a microvm.nix guest: two devices on
# q35, no refusal.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.gpu.guest = import ../guests {inherit lib pkgs;} [../guests/gpu.nix];
}
