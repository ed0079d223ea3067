# The guest of the microvm-guest nixosTest (checks/microvm-guest.nix), with
# the test's host-side overrides: vmwarden takes it without a refusal.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.g = {
    guest = import ../guests {inherit lib pkgs;} [
      ../../../checks/microvm-guest.nix
      {networking.hostName = "g";}
    ];
    accel = "tcg";
    machine = "pc";
  };
}
