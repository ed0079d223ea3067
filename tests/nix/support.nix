# Declares the few NixOS options the typed shim (shared/nix-eval) does not
# model but the vmwarden module reads, with NixOS's shapes and defaults: the
# kernel version (boot.kernelPackages), the sysctls (boot.kernel.sysctl:
# the unprivileged port start user networking reads) and whether user
# namespaces are allowed (security.allowUserNamespaces).
{lib, ...}: {
  options.boot.kernelPackages = lib.mkOption {
    type = lib.types.attrsOf lib.types.anything;
    default = {kernel.version = "6.12.41";};
    description = "Stand-in for NixOS's boot.kernelPackages (only kernel.version).";
  };
  options.boot.kernel.sysctl = lib.mkOption {
    type = lib.types.attrsOf (lib.types.nullOr (lib.types.oneOf [lib.types.bool lib.types.str lib.types.int]));
    default = {};
    description = "Stand-in for NixOS's boot.kernel.sysctl.";
  };
  options.security.allowUserNamespaces = lib.mkOption {
    type = lib.types.bool;
    default = true;
    description = "Stand-in for NixOS's security.allowUserNamespaces.";
  };
}
