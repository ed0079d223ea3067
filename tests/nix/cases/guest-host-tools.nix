# A microvm.nix guest with registerWithMachined, balloon, initialBalloonMem
# and deflateOnOOM (none refused), and the host's console option.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.tools = {
    guest = import ../guests {inherit lib pkgs;} [../guests/host-tools.nix];
    console = true;
  };
}
