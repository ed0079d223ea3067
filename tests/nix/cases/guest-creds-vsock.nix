# A QEMU guest with credentials and vsock; the host overrides some of what
# the guest says (plain definitions win), adds a disk after the guest's
# and a credential to the guest's.
{
  lib,
  pkgs,
  ...
}: {
  imports = [./base-guest.nix];
  vmwarden.vms.vault = {
    guest = import ../guests {inherit lib pkgs;} [../guests/creds-vsock.nix];
    vcpus = 2;
    accel = "tcg";
    vsock.backend = "vhost";
    disks = lib.mkDefault (lib.mkAfter [{path = "/var/lib/vmwarden/vault/extra.img";}]);
    credentials = lib.mkDefault {host-token = "/run/secrets/vault-host-token";};
  };
}
