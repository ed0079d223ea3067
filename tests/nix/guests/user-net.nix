# User networking as microvm.nix's own example guests and its
# simple-network docs have it (flake.nix's makeExample for QEMU): one
# interface of type "user" and a forward of the host's port 2222 to the
# guest's 22, with the store shared over 9p.
{
  networking.hostName = "qemu-microvm";
  microvm = {
    hypervisor = "qemu";
    shares = [
      {
        tag = "ro-store";
        source = "/nix/store";
        mountPoint = "/nix/.ro-store";
        proto = "9p";
      }
    ];
    interfaces = [
      {
        type = "user";
        id = "qemu";
        mac = "02:00:00:01:01:01";
      }
    ];
    forwardPorts = [
      {
        host.port = 2222;
        guest.port = 22;
      }
    ];
  };
}
