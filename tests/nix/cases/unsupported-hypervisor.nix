# cloud-hypervisor cannot receive credentials without putting them on its
# command line.
{
  imports = [./base.nix];
  vmwarden.vms.web = {
    hypervisor = "cloud-hypervisor";
    credentials.token = "/run/secrets/token";
  };
}
