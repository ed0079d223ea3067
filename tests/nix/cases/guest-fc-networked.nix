# A networked firecracker guest; the host bridges its tap.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.fire = {
    guest = import ../guests {inherit lib pkgs;} [../guests/fc-networked.nix];
    tapBridges.vmw-fire0 = "br-lan";
  };
}
