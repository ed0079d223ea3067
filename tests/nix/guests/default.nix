# A microvm.nix-shaped guest for the tests: `modules` evaluated with the
# stand-in for microvm.nix's guest module (microvm-options.nix), returned
# in the shape of a lib.nixosSystem result: { config; options; pkgs; }.
#   guest = import ../guests { inherit lib pkgs; } [ ./store-share.nix ];
{
  lib,
  pkgs,
  system ? "x86_64-linux",
}: modules: let
  arch = builtins.head (lib.splitString "-" system);
  # The guest's package set: the host's stubs, on `system`, with a kernel
  # that has the outputs microvm.nix's runners use (out, dev).
  gpkgs =
    pkgs
    // {
      stdenv.hostPlatform = {
        inherit system;
        qemuArch = arch;
        isLinux = true;
        linux-kernel.target =
          if arch == "aarch64"
          then "Image"
          else "bzImage";
      };
      linux = let
        kernel =
          pkgs.writeText "linux-6.12.41" ""
          // {
            name = "linux-6.12.41";
            version = "6.12.41";
            out = kernel;
            dev = pkgs.writeText "linux-6.12.41-dev" "";
          };
      in
        kernel;
      virtiofsd = pkgs.virtiofsd or (pkgs.writeText "virtiofsd" "");
    };
  e = lib.evalModules {
    modules = [./microvm-options.nix {_module.args.pkgs = gpkgs;}] ++ modules;
  };
in {
  inherit (e) config options;
  pkgs = gpkgs;
}
