# Guest memory: a cloud-hypervisor guest backed by hugepages (microvm.nix's
# hugepageMem, mapped), its memory an even number of MiB.
{
  networking.hostName = "mem";
  microvm = {
    hypervisor = "cloud-hypervisor";
    mem = 2048;
    hugepageMem = true;
  };
}
