# vcpus must be an integer.
{
  imports = [./base.nix];
  vmwarden.vms.web.vcpus = "two";
}
