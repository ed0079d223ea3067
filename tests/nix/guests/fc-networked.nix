# firecracker with a tap (persistent and its principal's; the host bridges
# it), its own hybrid vsock and an auto-created volume; no shares (it has
# none), no credentials.
{
  networking.hostName = "fire";
  microvm = {
    hypervisor = "firecracker";
    volumes = [
      {
        image = "var.img";
        mountPoint = "/var";
        size = 64;
      }
    ];
    interfaces = [
      {
        type = "tap";
        id = "vmw-fire0";
        mac = "02:00:00:00:0f:01";
      }
    ];
    vsock.cid = 11;
  };
}
