# A router's NIC from a microvm.nix guest on cloud-hypervisor: one device,
# no refusal.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.router.guest = import ../guests {inherit lib pkgs;} [../guests/router.nix];
}
