# The smallest valid host: one VM. The failure cases import it and break
# one thing each.
{pkgs, ...}: {
  vmwarden = {
    enable = true;
    package = pkgs.vmwarden;
    vms.web.kernel = "/srv/images/vmlinuz";
  };
}
