# A VM principal whose own group is shared with every other VM (kvm).
{
  imports = [./base.nix];
  vmwarden.vms.web.principal.group = "kvm";
}
