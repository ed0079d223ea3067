# What the options become on the host: one system user and group per VM,
# /etc/vmwarden/vms/<name>.json, the template unit (microvm@ by default,
# vmwarden.unitPrefix) with one drop-in per VM, its target, the
# boot-time reap report, the metrics timer and the shutdown's hibernation.
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

  # Only VMs whose name passes vmwarden's rule get users, specs and units.
  # A bad name then meets vmwarden's assertion (assertions.nix, naming the
  # fix) and nothing else: NixOS type-checks unit names (the target's
  # Wants=), store path names (the spec file, restart triggers) and aborts
  # evaluation outright on a user or group name of 32 bytes or more
  # (users-groups.nix), and any of those would otherwise fire first.
  vms = filterAttrs (name: _: vlib.validVmName name) cfg.vms;
  # Likewise a principal whose user or group name NixOS would reject.
  withUser = filterAttrs (_: vm: vlib.validPrincipalName vm.principal.user && vlib.validPrincipalName vm.principal.group) vms;

  names = vlib.unitNames cfg.unitPrefix;
  # Leave microvm@ and microvms.target to microvm.nix when its host module
  # is on and vmwarden would take the same names; assertions.nix then
  # fails the build with a message saying what to change.
  nameClash = vlib.microvmNixHost options config && vlib.sharesMicrovmNixNames names;

  # The metrics timer, once its directory is known (assertions.nix says
  # how to name one).
  metricsOn = cfg.metrics.textfile.enable && cfg.metrics.textfile.directory != null;
  metrics = vlib.metricsUnits names bin cfg.metrics.textfile;
in {
  config = mkIf cfg.enable (mkMerge [
    {
      # The launcher formats created images with mkfs.<fsType>, looked up in
      # the system profile (launcher/src/launch/volumes.rs): e2fsprogs is
      # there only when a VM creates an ext4 image, not on every host.
      environment.systemPackages =
        [cfg.package]
        ++ lib.optional (lib.any (vm: lib.any (d: d.create != null && d.create.fsType == "ext4") vm.disks) (lib.attrValues vms)) pkgs.e2fsprogs;

      users.users = lib.mapAttrs' (name: vm:
        nameValuePair vm.principal.user ({
            isSystemUser = true;
            inherit (vm.principal) group;
            description = "vmwarden microVM ${name}";
          }
          // optionalAttrs (vm.principal.uid != null) {inherit (vm.principal) uid;}))
      withUser;

      users.groups = lib.mapAttrs' (_: vm: nameValuePair vm.principal.group {}) withUser;

      # The kernel's vhost-vsock: the launcher opens /dev/vhost-vsock as
      # root for a VM with vsock.backend = "vhost"; load the module at boot
      # rather than rely on the device node's on-demand loading. macvtap:
      # the unit's DeviceAllow=char-macvtap is resolved from /proc/devices
      # when the unit starts, before the launcher's netlink request would
      # load the module.
      boot.kernelModules =
        lib.optional (lib.any vlib.usesVhostVsock (lib.attrValues vms)) "vhost_vsock"
        ++ lib.optional (lib.any (vm: lib.any (i: i.type == "macvtap") vm.interfaces) (lib.attrValues vms)) "macvtap";

      # Removed VMs, reported at the switch that removes them (and at every
      # boot and switch after, until purged).
      system.activationScripts.vmwarden-removed = {
        text = vlib.removedReport (builtins.attrNames vms);
        supportsDryActivation = true;
      };

      environment.etc = mapAttrs' (name: vm:
        nameValuePair "vmwarden/vms/${name}.json" {
          source = specFile name vm;
        })
      vms;
    }

    (mkIf (!nameClash) {
      systemd.services =
        {
          ${names.service} = vlib.template names bin;
        }
        // mapAttrs' (name: vm:
          nameValuePair "${names.service}${name}" (vlib.dropin vm (c: vm.credentials.${c})
            // {
              # A changed spec restarts this VM (unless opted out).
              restartTriggers = [(specFile name vm)];
              inherit (vm) restartIfChanged;
            }))
        vms
        // optionalAttrs cfg.reapReport.enable {
          vmwarden-reap-report = vlib.reapReport names bin;
        }
        // optionalAttrs metricsOn {
          vmwarden-metrics = metrics.service;
        }
        // optionalAttrs cfg.hibernateOnShutdown.enable {
          vmwarden-hibernate-on-shutdown = vlib.hibernateOnShutdown names bin cfg.hibernateOnShutdown.timeout (builtins.attrNames vms);
        };

      systemd.timers = optionalAttrs metricsOn {
        vmwarden-metrics = metrics.timer;
      };

      systemd.targets.${names.targetAttr} =
        vlib.target names
        // {
          wants = map names.instance (builtins.attrNames (filterAttrs (_: vm: vm.autostart) vms));
        };
    })
  ]);
}
