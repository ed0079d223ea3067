# Paths in the spec must be absolute.
{
  imports = [./base.nix];
  vmwarden.vms.web.kernel = "images/vmlinuz";
}
