# A microvm.nix guest with hugepageMem (mapped, not refused), and the host
# choosing same-page merging for it (off unless chosen, unlike microvm.nix's
# runners).
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.mem = {
    guest = import ../guests {inherit lib pkgs;} [../guests/memory.nix];
    memMerge = true;
  };
}
