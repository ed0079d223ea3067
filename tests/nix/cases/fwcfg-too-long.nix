# opt/io.systemd.credentials/ + 29 bytes = 56 > 55.
{
  imports = [./base.nix];
  vmwarden.vms.web.credentials.abcdefghijklmnopqrstuvwxyz012 = "/run/secrets/x";
}
