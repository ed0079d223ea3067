# Two VMs claim the same tap.
{
  imports = [./base.nix];
  vmwarden.vms.web.interfaces = [{tap = "vmw-web0";}];
  vmwarden.vms.db = {
    kernel = "/srv/images/vmlinuz";
    interfaces = [{tap = "vmw-web0";}];
  };
}
