# Two guests with one vsock CID.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms = {
    edge.guest = import ../guests {inherit lib pkgs;} [../guests/networked.nix];
    other.guest = import ../guests {inherit lib pkgs;} [
      ../guests/store-share.nix
      {microvm.vsock.cid = 7;}
    ];
  };
}
