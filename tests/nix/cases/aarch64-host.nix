# An aarch64-linux host: QEMU's machine defaults to virt, the binary is
# qemu-system-aarch64.
{lib, ...}: {
  imports = [./base.nix];
  _module.args.pkgs = lib.mkForce (import ../harness/stub-pkgs.nix {
      inherit lib;
      extraNames = ["vmwarden" "virtiofsd" "vhost-device-vsock"];
    }
    // {
      stdenv.hostPlatform = {
        system = "aarch64-linux";
        qemuArch = "aarch64";
      };
    });
}
