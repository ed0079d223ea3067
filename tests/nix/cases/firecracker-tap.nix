# firecracker opens its taps by name: the launcher makes them persistent
# and the principal's, so a tap is accepted.
{
  imports = [./base.nix];
  vmwarden.vms.web = {
    hypervisor = "firecracker";
    interfaces = [{tap = "vmw-web0";}];
  };
}
