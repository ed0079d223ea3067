# A microvm.nix guest on a macvtap in bridge mode: a spec with the
# macvtap's link and mode, a drop-in that lets the launcher open macvtap
# devices, and no refusal.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.lan-host.guest = import ../guests {inherit lib pkgs;} [../guests/macvtap.nix];
}
