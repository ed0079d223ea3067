# cloud-hypervisor takes credentials as fw_cfg files: the default binary is
# then nixpkgs' cloud-hypervisor rebuilt with its fw_cfg feature.
{
  imports = [./base.nix];
  vmwarden.vms.web = {
    hypervisor = "cloud-hypervisor";
    credentials.token = "/run/secrets/token";
  };
}
