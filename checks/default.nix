# `nix flake check`: the nixosTests (a NixOS host VM running vmwarden
# microVMs nested inside it; needs a builder with the kvm and nixos-test
# features) and the build and lint checks.
{
  pkgs,
  self,
  package,
  # microvm.nix's flake (its guest module builds the microvm-guest test's
  # guest) and nixpkgs' lib.nixosSystem: the checks' inputs only.
  microvm,
  nixosSystem,
}: let
  common = import ./common.nix {inherit pkgs self microvm nixosSystem;};
  nixosTest = file: pkgs.testers.runNixOSTest (import file {inherit common;});
in {
  # The package, with its unit tests (checkPhase).
  build = package;

  clippy = package.overrideAttrs (old: {
    pname = "vmwarden-clippy";
    nativeBuildInputs = old.nativeBuildInputs ++ [pkgs.clippy];
    buildPhase = ''
      runHook preBuild
      cargo clippy --offline --all-targets -- -D warnings
      runHook postBuild
    '';
    doCheck = false;
    installPhase = "touch $out";
  });

  alejandra = pkgs.runCommand "vmwarden-alejandra" {nativeBuildInputs = [pkgs.alejandra];} ''
    alejandra --check ${self}
    touch $out
  '';

  deadnix = pkgs.runCommand "vmwarden-deadnix" {nativeBuildInputs = [pkgs.deadnix];} ''
    deadnix --fail ${self}
    touch $out
  '';

  startup-shutdown = nixosTest ./nixos/startup-shutdown.nix;
  isolation = nixosTest ./nixos/isolation.nix;
  crash-teardown = nixosTest ./nixos/crash-teardown.nix;
  retire = nixosTest ./nixos/retire.nix;
  bad-spec = nixosTest ./nixos/bad-spec.nix;
  microvm-guest = nixosTest ./nixos/microvm-guest.nix;
}
