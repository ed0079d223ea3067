# A router VM as public microvm.nix configurations have it: the host's
# second NIC passed through to the guest, on cloud-hypervisor
# (`--device path=/sys/bus/pci/devices/…/`).
{
  networking.hostName = "router";
  microvm = {
    hypervisor = "cloud-hypervisor";
    devices = [
      {
        bus = "pci";
        path = "0000:03:00.0";
      }
    ];
  };
}
