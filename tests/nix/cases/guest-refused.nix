# One refused microvm.nix guest setting: `guestModule` is added to a guest
# that is fine otherwise (run.sh passes one per expected failure).
guestModule: {
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.web.guest = import ../guests {inherit lib pkgs;} [../guests/store-share.nix guestModule];
}
