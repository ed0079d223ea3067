# Declares the few NixOS options the typed shim (shared/nix-eval) does not
# model but the vmwarden module reads, with NixOS's shapes: the kernel
# version (boot.kernelPackages) and the stdenv used for defaults.
{lib, ...}: {
  options.boot.kernelPackages = lib.mkOption {
    type = lib.types.attrsOf lib.types.anything;
    default = {kernel.version = "6.12.41";};
    description = "Stand-in for NixOS's boot.kernelPackages (only kernel.version).";
  };
}
