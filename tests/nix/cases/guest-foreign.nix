# A guest built for aarch64-linux on an x86_64-linux host.
{lib, ...}: {
  imports = [./base-guest.nix];
  _module.args.pkgs = lib.mkForce (import ../harness/stub-pkgs.nix {
      inherit lib;
      extraNames = ["vmwarden" "virtiofsd" "vhost-device-vsock"];
    }
    // {
      stdenv.hostPlatform = {
        system = "x86_64-linux";
        qemuArch = "x86_64";
      };
    });
  vmwarden.vms.web.guest = import ../guests {
    inherit lib;
    pkgs = import ../harness/stub-pkgs.nix {
      inherit lib;
      extraNames = ["virtiofsd"];
    };
    system = "aarch64-linux";
  } [../guests/store-share.nix];
}
