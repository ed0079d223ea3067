# A GPU VM as public microvm.nix configurations have it: the card and its
# HDMI audio function, two PCI functions of one IOMMU group, on QEMU with
# the card as the guest's VGA. vmwarden gives them as two devices; on
# microvm.nix's default machine (microvm, PCI through pcie=on there) the
# VM runs on q35.
{
  networking.hostName = "gpu";
  microvm = {
    hypervisor = "qemu";
    devices = [
      {
        bus = "pci";
        path = "0000:01:00.0";
        qemu.deviceExtraArgs = "x-vga=on,multifunction=on";
      }
      {
        bus = "pci";
        path = "0000:01:00.1";
      }
    ];
  };
}
