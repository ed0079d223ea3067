# QEMU with microvm.nix's I/O options set: two vCPUs (so a tap gets two
# queue pairs), tap.vhost, a volume with direct, one without, a virtiofs
# share with a pool size of 4.
{
  networking.hostName = "fast";
  microvm = {
    hypervisor = "qemu";
    vcpu = 2;
    interfaces = [
      {
        type = "tap";
        id = "vmw-fast0";
        mac = "02:00:00:00:0f:01";
        tap.vhost = true;
      }
    ];
    volumes = [
      {
        image = "data.img";
        mountPoint = "/data";
        size = 256;
        direct = true;
      }
      {
        image = "scratch.img";
        mountPoint = "/scratch";
        size = 64;
      }
    ];
    shares = [
      {
        tag = "ro-store";
        source = "/nix/store";
        mountPoint = "/nix/.ro-store";
        proto = "virtiofs";
      }
    ];
    virtiofsd.threadPoolSize = 4;
  };
}
