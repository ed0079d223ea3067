# Two VMs with the same fixed uid.
{
  imports = [./base.nix];
  vmwarden.vms = {
    web.principal.uid = 30001;
    db = {
      kernel = "/srv/images/vmlinuz";
      principal.uid = 30001;
    };
  };
}
