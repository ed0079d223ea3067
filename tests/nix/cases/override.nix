# A host overrides keys of the unit data (units/microvm@.service.toml) with
# lib.mkForce, and has one service of its own.
{lib, ...}: {
  imports = [./base.nix];
  systemd.services."microvm@" = {
    serviceConfig.KillMode = lib.mkForce "control-group";
    after = lib.mkForce ["network-online.target"];
    environment.TZDIR = lib.mkForce "/etc/zoneinfo";
  };
  # Not vmwarden's: it gets systemd.globalEnvironment like any service.
  systemd.services.probe.serviceConfig.ExecStart = "/bin/true";
}
