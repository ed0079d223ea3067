# QEMU with microvm.nix's I/O options set: two vCPUs (so a tap gets two
# queue pairs), tap.vhost, a volume with direct, one without, virtiofs
# shares with a pool size of 4, one of them writable (the guest owns it:
# its drop-in then has two RestrictNamespaces= parts, the two-queue tap's
# and the owned share's).
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
      {
        tag = "srv";
        source = "/var/lib/microvms/fast/srv";
        mountPoint = "/srv";
        proto = "virtiofs";
        socket = "srv.sock";
      }
    ];
    virtiofsd.threadPoolSize = 4;
  };
}
