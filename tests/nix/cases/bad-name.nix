# VM names are ^[a-z][a-z0-9-]{0,31}$.
{
  imports = [./base.nix];
  vmwarden.vms.Web_1.kernel = "/srv/images/vmlinuz";
}
