# firecracker has no channel for credentials (no fw_cfg, no SMBIOS).
{
  imports = [./base.nix];
  vmwarden.vms.web = {
    hypervisor = "firecracker";
    credentials.token = "/run/secrets/token";
  };
}
