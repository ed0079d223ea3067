# vmwarden.vms.<name>.resources: every limit set; the spec carries them and
# the drop-in has them (tests/nix/golden/resources/: spec and drop-in).
{
  imports = [./base.nix];
  vmwarden.vms.web.resources = {
    cpuQuotaPercent = 150;
    cpuWeight = 50;
    memoryMaxMiB = 768;
    memoryHighMiB = 640;
    ioWeight = 20;
    tasksMax = 256;
    cpus = "0-1";
  };
}
