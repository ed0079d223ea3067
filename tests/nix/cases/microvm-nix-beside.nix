# microvm.nix's host module (the stand-in of microvm-nix.nix) beside
# vmwarden with its own unit names: both stay on.
{
  imports = [./microvm-nix.nix];
  vmwarden.unitPrefix = "vmwarden";
}
