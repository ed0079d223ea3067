# tmpfs noswap needs Linux 6.4.
{
  imports = [./base.nix];
  boot.kernelPackages.kernel.version = "6.1.55";
}
