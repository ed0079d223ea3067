# vmwarden.hibernateOnShutdown: the unit that hibernates the VMs at
# shutdown (60 s each) and starts them at boot, stopped before every
# declared VM, not only the autostart ones.
{
  imports = [./base.nix];
  vmwarden.vms.batch = {
    kernel = "/srv/images/vmlinuz";
    autostart = false;
  };
  vmwarden.hibernateOnShutdown = {
    enable = true;
    timeout = 60;
  };
}
