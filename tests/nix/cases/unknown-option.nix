# A misspelt option (vcpu for vcpus).
{
  imports = [./base.nix];
  vmwarden.vms.web.vcpu = 2;
}
