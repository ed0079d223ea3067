# cloud-hypervisor with the store shared over virtiofs and two network
# interfaces: a tap the host bridges (vmwarden's tapBridges) and one of
# type "bridge" that names its bridge itself.
{
  networking.hostName = "edge";
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
    interfaces = [
      {
        type = "tap";
        id = "vmw-edge0";
        mac = "02:00:00:00:0e:01";
      }
      {
        type = "bridge";
        id = "vmw-edge1";
        bridge = "br-dmz";
        mac = "02:00:00:00:0e:02";
      }
    ];
    vsock.cid = 7;
  };
}
