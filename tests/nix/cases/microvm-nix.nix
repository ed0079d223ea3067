# microvm.nix's host module imported alongside: a stand-in with the same
# option (microvm.host.enable, default true) and its microvm@ template.
{lib, ...}: {
  imports = [./base.nix];
  options.microvm.host.enable = lib.mkOption {
    type = lib.types.bool;
    default = true;
    description = "Stand-in for microvm.nix's microvm.host.enable.";
  };
  config.systemd.services."microvm@".serviceConfig = {
    Type = "simple";
    User = "microvm";
    Group = "kvm";
    ExecStart = "/var/lib/microvms/%i/current/bin/microvm-run";
  };
}
