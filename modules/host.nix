# What the options become on the host: one system user and group per VM,
# /etc/vmwarden/vms/<name>.json, the microvm@ template unit with one drop-in
# per VM, microvms.target and the boot-time reap report.
{
  config,
  lib,
  options,
  pkgs,
  ...
}: let
  inherit (lib) filterAttrs mapAttrs' mkIf mkMerge nameValuePair optionalAttrs;
  vlib = import ./lib.nix {inherit lib;};
  cfg = config.vmwarden;
  bin = "${cfg.package}/bin";

  specFile = name: vm: pkgs.writeText "vmwarden-${name}.json" (builtins.toJSON (vlib.spec name vm));

  # Leave microvm@ to microvm.nix when its host module is on; assertions.nix
  # then fails the build with a message saying what to change.
  microvmNixHost = vlib.microvmNixHost options config;
in {
  config = mkIf cfg.enable (mkMerge [
    {
      environment.systemPackages = [cfg.package];

      users.users = lib.mapAttrs' (name: vm:
        nameValuePair vm.principal.user ({
            isSystemUser = true;
            inherit (vm.principal) group;
            description = "vmwarden microVM ${name}";
          }
          // optionalAttrs (vm.principal.uid != null) {inherit (vm.principal) uid;}))
      cfg.vms;

      users.groups = lib.mapAttrs' (_: vm: nameValuePair vm.principal.group {}) cfg.vms;

      environment.etc = mapAttrs' (name: vm:
        nameValuePair "vmwarden/vms/${name}.json" {
          source = specFile name vm;
        })
      cfg.vms;
    }

    (mkIf (!microvmNixHost) {
      systemd.services =
        {
          "microvm@" = vlib.template bin;
        }
        // mapAttrs' (name: vm:
          nameValuePair "microvm@${name}" (vlib.dropin vm (c: vm.credentials.${c})
            // {
              # A changed spec restarts this VM (unless opted out).
              restartTriggers = [(specFile name vm)];
              inherit (vm) restartIfChanged;
            }))
        cfg.vms
        // optionalAttrs cfg.reapReport.enable {
          vmwarden-reap-report = vlib.reapReport bin;
        };

      systemd.targets.microvms =
        vlib.target
        // {
          wants = map (name: "microvm@${name}.service") (builtins.attrNames (filterAttrs (_: vm: vm.autostart) cfg.vms));
        };
    })
  ]);
}
