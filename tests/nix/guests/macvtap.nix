# A networked host on a macvtap, the most common NIC of public microvm.nix
# hosts and the shape microvm.nix's interfaces docs give: one interface of
# type "macvtap" on the host's NIC in bridge mode, the guest's own MAC, two
# vCPUs (so one queue per vCPU), the store shared over virtiofs. The id is
# renamed to vmwarden's tap names (docs/migrating-from-microvm-nix.md).
{
  networking.hostName = "lan-host";
  microvm = {
    hypervisor = "qemu";
    vcpu = 2;
    mem = 1024;
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
        type = "macvtap";
        id = "vmw-lan-host0";
        mac = "02:00:00:00:0f:01";
        macvtap = {
          link = "enp3s0";
          mode = "bridge";
        };
      }
    ];
  };
}
