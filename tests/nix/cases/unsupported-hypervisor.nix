# Only QEMU is supported so far.
{
  imports = [./base.nix];
  vmwarden.vms.web.hypervisor = "firecracker";
}
