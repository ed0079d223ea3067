# QEMU's -drive would split this path.
{
  imports = [./base.nix];
  vmwarden.vms.web.disks = [{path = "/srv/a,b.img";}];
}
