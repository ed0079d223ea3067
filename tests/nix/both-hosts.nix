# vmwarden beside microvm.nix's real host module on one host: both modules
# imported, one VM in each, evaluated with the harness's typed NixOS
# stand-in. `microvmSrc` is an unpacked microvm.nix (MICROVM_NIX_SRC);
# nothing of it is copied here.
#
#   nix-instantiate --eval --strict --json tests/nix/both-hosts.nix \
#     --arg microvmSrc /path/to/microvm.nix --arg libPath $NIXPKGS_LIB \
#     [--arg claimTwice true] [--arg prefix '"microvm"'] -A result
#
# `result`: for microvm.nix's host module alone, vmwarden's alone and both
# together, the names of the units (systemd.services, systemd.targets, the
# rendered unit files), what each target wants and the assertions that
# failed. claimTwice puts the same VM name in both modules.
{
  microvmSrc,
  libPath,
  prefix ? "vmwarden",
  claimTwice ? false,
}: let
  lib = import libPath;
  stub = import ./harness/stub-pkgs.nix {
    inherit lib;
    extraNames = ["vmwarden" "qemu-utils"];
  };
  # What microvm.nix's host module asks of pkgs beyond the stub's packages:
  # its `microvm` command (a package; never built here).
  pkgs =
    stub
    // {
      callPackage = file: _: {
        type = "derivation";
        name = baseNameOf (toString file);
        outPath = "${builtins.storeDir}/00000000000000000000000000000000-microvm-command";
        meta = {};
      };
    };
  # The options microvm.nix's host module sets that the harness's shim
  # does not model, typed loosely: they are not under test.
  otherNixosOptions = {
    options = {
      security.pam.loginLimits = lib.mkOption {
        type = lib.types.listOf lib.types.anything;
        default = [];
      };
      security.wrappers = lib.mkOption {
        type = lib.types.attrsOf lib.types.anything;
        default = {};
      };
      hardware.ksm.enable = lib.mkOption {
        type = lib.types.bool;
        default = false;
      };
      virtualisation.libvirtd.enable = lib.mkOption {
        type = lib.types.bool;
        default = false;
      };
      systemd.tmpfiles.settings = lib.mkOption {
        type = lib.types.attrsOf lib.types.anything;
        default = {};
      };
    };
  };
  # A microvm.nix guest as its host module reads it: an already evaluated
  # configuration (microvm.vms.<n>.evaluatedConfig) with a runner.
  guest = name: {
    config = {
      microvm = {
        declaredRunner = {
          type = "derivation";
          name = "microvm-qemu-${name}";
          outPath = "${builtins.storeDir}/11111111111111111111111111111111-microvm-qemu-${name}";
          supportsNotifySocket = false;
          registerWithMachined = false;
        };
        shares = [];
      };
      system.build.toplevel = "${builtins.storeDir}/22222222222222222222222222222222-nixos-system-${name}";
    };
  };
  microvmVm =
    if claimTwice
    then "web"
    else "legacy";
  microvmHost = [
    (microvmSrc + "/nixos-modules/host")
    {microvm.vms.${microvmVm}.evaluatedConfig = guest microvmVm;}
  ];
  vmwardenHost = [
    ../../modules/default.nix
    {
      vmwarden = {
        enable = true;
        package = pkgs.vmwarden;
        unitPrefix = prefix;
        vms.web = {
          kernel = "/var/lib/vmwarden-images/web/bzImage";
          initrd = "/var/lib/vmwarden-images/web/initrd";
        };
      };
    }
  ];
  evalHost = modules: let
    inherit
      (lib.evalModules {
        modules =
          [
            ./harness/shim-typed.nix
            {_module.args.pkgs = pkgs;}
            otherNixosOptions
            ./support.nix
          ]
          ++ modules;
      })
      config
      ;
  in {
    failed = map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
    services = builtins.attrNames config.systemd.services;
    targets = builtins.attrNames config.systemd.targets;
    units = builtins.attrNames config.systemd.units;
    targetWants = lib.mapAttrs (_: t: t.wants) config.systemd.targets;
  };
in {
  # Each module alone, then both: run.sh checks that the names of the two
  # alone do not meet and that both together define exactly their union.
  result = {
    microvm = evalHost microvmHost;
    vmwarden = evalHost vmwardenHost;
    both = evalHost (microvmHost ++ vmwardenHost);
  };
}
