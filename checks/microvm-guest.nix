# The microvm.nix settings of the microvm-guest nixosTest's guest, in a
# file of their own so that tests/nix (cases/guest-nixostest.nix) checks,
# without a NixOS builder, that vmwarden takes them as they are.
{
  microvm = {
    shares = [
      {
        tag = "ro-store";
        source = "/nix/store";
        mountPoint = "/nix/.ro-store";
        proto = "virtiofs";
      }
    ];
    volumes = [
      {
        image = "var.img";
        mountPoint = "/var";
        size = 256;
      }
    ];
    credentialFiles.secret = "/run/secrets/g";
  };
}
