# A NixOS configuration without microvm.nix's guest module.
{
  imports = [./base-guest.nix];
  vmwarden.vms.web.guest = {config.networking.hostName = "web";};
}
