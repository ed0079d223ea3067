# Checks the stand-in (microvm-options.nix) against microvm.nix itself:
# the option paths under `microvm` that only one of the two declares, and
# the options whose defaults differ (as JSON; packages by name). Needs an
# unpacked microvm.nix source tree (MICROVM_NIX_SRC in run.sh), e.g. of the
# version flake.lock pins; with the stand-in's own hostName the differences
# left are the ones that come from the stand-in's fake packages.
#   nix-instantiate --eval --strict --json tests/nix/guests/compare.nix \
#     --arg src /path/to/microvm.nix --arg libPath "$NIXPKGS_LIB"
{
  src,
  libPath,
}: let
  lib = import libPath;
  pkgs =
    import ../harness/stub-pkgs.nix {
      inherit lib;
      extraNames = ["virtiofsd" "alioth" "crosvm" "kvmtool" "stratovirt" "vfkit"];
    }
    // {
      # types.pkgs (microvm.vmHostPackages) wants a package set.
      _type = "pkgs";
      stdenv.hostPlatform = {
        system = "x86_64-linux";
        isDarwin = false;
        isLinux = true;
      };
    };
  # What microvm.nix's options read from NixOS, as the stand-in has it.
  nixos = {lib, ...}: {
    options = {
      networking.hostName = lib.mkOption {default = "nixos";};
      boot.kernelPackages = lib.mkOption {default = {kernel = pkgs.linux // {version = "6.12.41";};};};
      system.build = lib.mkOption {default = {};};
      system.boot.loader.initrdFile = lib.mkOption {default = "initrd";};
      # Set by the removed microvm.balloonMem.
      assertions = lib.mkOption {default = [];};
      warnings = lib.mkOption {default = [];};
    };
  };
  # Options declared outside options.nix: store-disk.nix, vsock-ssh.nix.
  others = {lib, ...}: {
    options.microvm = {
      storeDisk = lib.mkOption {};
      vsock.ssh.enable = lib.mkEnableOption "SSH over vsock";
    };
  };
  real = lib.evalModules {
    modules = [
      nixos
      others
      {_module.args.pkgs = pkgs;}
      (src + "/nixos-modules/microvm/options.nix")
    ];
  };
  mine = lib.evalModules {modules = [{_module.args.pkgs = pkgs;} ./microvm-options.nix];};
  leaves = prefix: o:
    if lib.isOption o
    then [prefix]
    else lib.concatLists (lib.mapAttrsToList (n: leaves "${prefix}.${n}") (removeAttrs o ["_module"]));
  # microvm.balloonMem is a mkRemovedOptionModule, not an option.
  realPaths = lib.filter (p: p != "microvm.balloonMem") (leaves "microvm" real.options.microvm);
  minePaths = leaves "microvm" mine.options.microvm;
  # Defaults that depend on the rest of NixOS (system.build) or on the
  # package set are left out.
  skip = ["microvm.vmHostPackages" "microvm.initrdPath" "microvm.storeDisk" "microvm.kernelParams" "microvm.storeDiskType" "microvm.qemu.machine" "microvm.runner" "microvm.declaredRunner"];
  default = opts: p: let
    o = lib.attrByPath (lib.tail (lib.splitString "." p)) null opts;
  in
    if o ? default
    then
      builtins.toJSON (
        if lib.isDerivation o.default
        then o.default.name
        else o.default
      )
    else null;
in {
  onlyInMicrovmNix = lib.subtractLists minePaths realPaths;
  onlyInStandIn = lib.subtractLists realPaths minePaths;
  defaultsDiffer = lib.filter (p: default real.options.microvm p != default mine.options.microvm p) (lib.subtractLists skip (lib.intersectLists realPaths minePaths));
}
