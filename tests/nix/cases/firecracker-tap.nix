# firecracker cannot take an open tap fd.
{
  imports = [./base.nix];
  vmwarden.vms.web = {
    hypervisor = "firecracker";
    interfaces = [{tap = "vmw-web0";}];
  };
}
