# firecracker opens its taps by name: the launcher makes them in a network
# namespace of its own (its drop-in allows that), so a tap is accepted.
{
  imports = [./base.nix];
  vmwarden.vms.web = {
    hypervisor = "firecracker";
    interfaces = [{tap = "vmw-web0";}];
  };
}
