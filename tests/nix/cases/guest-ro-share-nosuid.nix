# A guest that mounts its read-only shares as microvm.nix's mounts.nix
# does (no nosuid, no nodev) gets a warning naming each share and the line
# that fixes it (`plain`); one whose configuration adds the line gets none
# (`hardened`). Its writable share is the guest's own: no warning.
{
  lib,
  pkgs,
  ...
}: let
  guest = extra: import ../guests {inherit lib pkgs;} ([../guests/store-share.nix] ++ extra);
in {
  imports = [./base-guest.nix];
  vmwarden.vms = {
    plain.guest = guest [];
    hardened.guest = guest [
      {
        networking.hostName = lib.mkForce "hardened";
        fileSystems."/nix/.ro-store".options = ["nosuid" "nodev"];
      }
    ];
  };
}
