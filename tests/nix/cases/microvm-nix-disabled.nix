# microvm.nix imported with its host part switched off: no conflict.
{lib, ...}: {
  imports = [./base.nix];
  options.microvm.host.enable = lib.mkOption {
    type = lib.types.bool;
    default = true;
    description = "Stand-in for microvm.nix's microvm.host.enable.";
  };
  config.microvm.host.enable = false;
}
