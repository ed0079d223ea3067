# A host overrides keys of the unit data (units/microvm@.service.toml) with
# lib.mkForce.
{lib, ...}: {
  imports = [./base.nix];
  systemd.services."microvm@" = {
    serviceConfig.KillMode = lib.mkForce "control-group";
    after = lib.mkForce ["network-online.target"];
  };
}
