# A disk image where the unit cannot see it (ProtectHome=yes).
{
  imports = [./base.nix];
  vmwarden.vms.web.disks = [{path = "/home/alice/web.img";}];
}
