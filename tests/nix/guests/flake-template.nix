# microvm.nix's flake template (flake-template/flake.nix at the pinned
# revision), as a user copies it: QEMU, a created 256 MiB volume for /var,
# the host's /nix/store over 9p without readOnly (ro-store), a control
# socket. Its root password is NixOS's, not microvm.nix's, and is left out
# of this stand-in.
{
  networking.hostName = "my-microvm";
  microvm = {
    volumes = [
      {
        mountPoint = "/var";
        image = "var.img";
        size = 256;
      }
    ];
    shares = [
      {
        # use proto = "virtiofs" for MicroVMs that are started by systemd
        proto = "9p";
        tag = "ro-store";
        # a host's /nix/store will be picked up so that no
        # squashfs/erofs will be built for it.
        source = "/nix/store";
        mountPoint = "/nix/.ro-store";
      }
    ];
    hypervisor = "qemu";
    socket = "control.socket";
  };
}
