# Guests with microvm.vsock.ssh.enable: on QEMU the guest gets the kernel's
# vhost-vsock (`ssh vsock/<cid>` reaches it) and the drop-in allows
# /dev/vhost-vsock; a host that sets vsock.backend = "user" keeps it, with
# a warning (`shellu`); cloud-hypervisor serves its own hybrid vsock
# (`ssh vsock-mux/<socket>`), so its guest keeps "user" and no warning
# (`shellch`). None is refused.
{
  lib,
  pkgs,
  ...
}: let
  guest = extra: import ../guests {inherit lib pkgs;} ([../guests/vsock-ssh.nix] ++ extra);
in {
  imports = [./base-guest.nix];
  vmwarden.vms = {
    shell.guest = guest [];
    shellu = {
      guest = guest [{microvm.vsock.cid = lib.mkForce 43;}];
      vsock.backend = "user";
    };
    shellch.guest = guest [
      {
        microvm = {
          hypervisor = "cloud-hypervisor";
          vsock.cid = lib.mkForce 44;
        };
      }
    ];
  };
}
