# microvm.nix's example guest with user networking and a forwarded port:
# it becomes vmwarden's userNetwork (passt), with no refusal.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.qemu-microvm.guest = import ../guests {inherit lib pkgs;} [../guests/user-net.nix];
}
