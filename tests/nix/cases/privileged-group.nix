# A VM principal in a privileged group.
{
  imports = [./base.nix];
  vmwarden.vms.web.principal.group = "wheel";
}
