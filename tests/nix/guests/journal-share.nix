# microvm.nix's FAQ, "How to centralize logging with journald?": the
# guest's journal on a writable virtiofs share the host reads, with the
# machine id journald names its directory after.
{config, ...}: {
  networking.hostName = "logs";
  microvm = {
    machineId = "5a7b03d4-7a8e-4f0c-9d2e-6b1f0c3a9e21";
    shares = [
      {
        # On the host
        source = "/var/lib/microvms/${config.networking.hostName}/journal";
        # In the MicroVM
        mountPoint = "/var/log/journal";
        tag = "journal";
        proto = "virtiofs";
        socket = "journal.sock";
      }
    ];
  };
}
