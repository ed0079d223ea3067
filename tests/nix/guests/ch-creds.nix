# cloud-hypervisor with credentials (fw_cfg: the host's default binary is
# then a cloud-hypervisor with its fw_cfg feature), the store over
# virtiofs, its own hybrid vsock and an auto-created volume.
{
  networking.hostName = "keys";
  microvm = {
    hypervisor = "cloud-hypervisor";
    shares = [
      {
        tag = "ro-store";
        source = "/nix/store";
        mountPoint = "/nix/.ro-store";
        proto = "virtiofs";
      }
    ];
    volumes = [
      {
        image = "state.img";
        mountPoint = "/var/lib/keys";
        size = 128;
      }
    ];
    credentialFiles = {
      "db.password" = "/run/agenix/db-password";
    };
    vsock.cid = 9;
  };
}
