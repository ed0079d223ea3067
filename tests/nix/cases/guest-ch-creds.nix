# A cloud-hypervisor guest with credentials, virtiofs, vsock and a volume.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.keys.guest = import ../guests {inherit lib pkgs;} [../guests/ch-creds.nix];
}
