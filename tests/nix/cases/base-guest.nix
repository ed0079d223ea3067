# vmwarden on, nothing else: the guest cases add one VM made from a guest.
{pkgs, ...}: {
  vmwarden = {
    enable = true;
    package = pkgs.vmwarden;
  };
}
