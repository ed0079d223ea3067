# Evaluates this repository's flake.nix outputs with nixpkgs' real `lib` and
# a stub package set (Nix 2.8 can not evaluate nixpkgs itself), and uses
# nixosModules.default the way a host does: through the harness.
#   nix-instantiate --eval --strict --json tests/nix/flake-eval.nix -A problems
{libPath ? builtins.getEnv "NIXPKGS_LIB"}: let
  lib = import libPath;
  flake = import ../../flake.nix;
  stubPkgs = system:
    import ./harness/stub-pkgs.nix {inherit lib;}
    // {
      stdenv.hostPlatform = {
        inherit system;
        qemuArch = builtins.head (lib.splitString "-" system);
      };
      rustPlatform.buildRustPackage = a: {
        type = "derivation";
        name = "${a.pname}-${a.version}";
        outPath = "${builtins.storeDir}/00000000000000000000000000000000-${a.pname}-${a.version}-${system}";
        inherit (a) cargoTestFlags meta src;
      };
    };
  nixpkgs = {
    inherit lib;
    legacyPackages = lib.genAttrs ["x86_64-linux" "aarch64-linux"] stubPkgs;
  };
  # microvm.nix's flake is an input of the checks only; none is forced here.
  microvm.nixosModules.microvm = {};
  self = flake.outputs {inherit self nixpkgs microvm;} // {outPath = toString ../..;};

  # A host evaluated with the flake's module, on each system.
  host = system:
    import ./harness/eval.nix {
      inherit libPath;
      modules = [
        self.nixosModules.default
        ./support.nix
        {_module.args.pkgs = lib.mkForce (stubPkgs system);}
        {
          vmwarden.enable = true;
          vmwarden.vms.web.kernel = "/srv/images/vmlinuz";
        }
      ];
    };
  systems = ["aarch64-linux" "x86_64-linux"];
  expectedChecks = ["alejandra" "bad-spec" "build" "clippy" "crash-teardown" "deadnix" "isolation" "microvm-guest" "retire" "startup-shutdown"];
  src = self.packages.x86_64-linux.default.src;
  root = toString ../..;
  inSrc = rel: type: src.filter "${root}/${rel}" type;

  expect = what: got: want:
    lib.optional (got != want) "${what}: got ${builtins.toJSON got}, want ${builtins.toJSON want}";
in {
  # Empty when the flake has the outputs and behaviour described in
  # docs/nixos.md; otherwise one line per difference.
  problems =
    expect "systems" (builtins.attrNames self.packages) systems
    ++ lib.concatMap (system: let
      c = (host system).checked;
      pkg = self.packages.${system}.default;
      arch = builtins.head (lib.splitString "-" system);
    in
      expect "${system} checks" (builtins.attrNames self.checks.${system}) expectedChecks
      ++ expect "${system} apps" (builtins.attrNames self.apps.${system}) ["demo"]
      ++ expect "${system} devShells" (builtins.attrNames self.devShells.${system}) ["default"]
      ++ expect "${system} package" pkg.name "vmwarden-0.1.0"
      ++ expect "${system} cargoTestFlags" pkg.cargoTestFlags ["--lib" "--bins"]
      ++ expect "${system} module package" (toString c.vmwarden.package) pkg.outPath
      ++ expect "${system} ExecStart" c.systemd.services."microvm@".serviceConfig.ExecStart "${pkg.outPath}/bin/vmwarden-launch %i"
      ++ expect "${system} QEMU binary" (lib.hasSuffix "/bin/qemu-system-${arch}" c.vmwarden.vms.web.hypervisorBinary) true)
    systems
    ++ expect "overlay" (builtins.isFunction self.overlays.default) true
    ++ expect "source filter" {
      cargoToml = inSrc "Cargo.toml" "regular";
      cargoLock = inSrc "Cargo.lock" "regular";
      launcher = inSrc "launcher" "directory";
      librs = inSrc "launcher/src/lib.rs" "regular";
      units = inSrc "units" "directory";
      rules = inSrc "units/rules.toml" "regular";
      modules = inSrc "modules" "directory";
      docs = inSrc "docs" "directory";
      tests = inSrc "tests" "directory";
      flake = inSrc "flake.nix" "regular";
    } {
      cargoToml = true;
      cargoLock = true;
      launcher = true;
      librs = true;
      units = true;
      rules = true;
      modules = false;
      docs = false;
      tests = false;
      flake = false;
    };
}
