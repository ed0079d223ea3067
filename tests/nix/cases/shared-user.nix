# Two VMs with the same principal.
{
  imports = [./base.nix];
  vmwarden.vms.db = {
    kernel = "/srv/images/vmlinuz";
    principal.user = "vm-web";
  };
}
