# A networked cloud-hypervisor guest; the host bridges its tap.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.edge = {
    guest = import ../guests {inherit lib pkgs;} [../guests/networked.nix];
    tapBridges.vmw-edge0 = "br-lan";
  };
}
