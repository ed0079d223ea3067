# A QEMU guest with microvm.nix's I/O options: vhost, queues, direct,
# discard, virtiofsd's pool size mapped onto the spec.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.fast = {
    guest = import ../guests {inherit lib pkgs;} [../guests/fast-io.nix];
    tapBridges.vmw-fast0 = "br-lan";
  };
}
