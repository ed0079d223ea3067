# QEMU with credentials (sops-nix/agenix paths), a vsock CID, extra QEMU
# arguments, its own machine id, machine q35, its own QEMU package and an
# auto-created volume; the store shared over 9p as microvm.nix's examples
# do.
{pkgs, ...}: {
  networking.hostName = "vault";
  microvm = {
    shares = [
      {
        tag = "ro-store";
        source = "/nix/store";
        mountPoint = "/nix/.ro-store";
      }
    ];
    volumes = [
      {
        image = "state.img";
        mountPoint = "/var/lib/vault";
        size = 256;
      }
    ];
    credentialFiles = {
      SOPS_AGE_KEY = "/run/secrets/vault-age-key";
      "db.password" = "/run/agenix/db-password";
    };
    vsock = {
      cid = 5;
      ssh.enable = true;
    };
    machineId = "a67472e5-570e-5c8a-b18c-ae3c77701050";
    qemu = {
      machine = "q35";
      extraArgs = ["-device" "virtio-rng-pci"];
      package = pkgs.qemu;
    };
  };
}
