{
  description = "vmwarden: microVMs that each run as their own principal, in their own mount namespace, with teardown that proves itself";

  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";
    # For the checks only: the microvm-guest nixosTest declares its guest
    # with microvm.nix's guest module. The module needs nothing of it.
    microvm = {
      url = "github:microvm-nix/microvm.nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs = {
    self,
    nixpkgs,
    microvm,
  }: let
    inherit (nixpkgs) lib;
    systems = ["x86_64-linux" "aarch64-linux"];
    forAllSystems = f: lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});

    # Only what cargo needs: a change to docs, modules or tests does not
    # rebuild the package; units/ does: the launcher compiles its data in.
    # (No lib.fileset: it needs builtins.readFileType.)
    src = lib.cleanSourceWith {
      name = "vmwarden-source";
      src = ./.;
      filter = path: _type: let
        rel = lib.removePrefix (toString ./. + "/") (toString path);
      in
        builtins.elem rel ["Cargo.toml" "Cargo.lock" "clippy.toml" "launcher" "units"]
        || lib.hasPrefix "launcher/" rel
        || lib.hasPrefix "units/" rel;
    };

    vmwardenFor = pkgs:
      pkgs.rustPlatform.buildRustPackage {
        pname = "vmwarden";
        version = (builtins.fromTOML (builtins.readFile ./launcher/Cargo.toml)).package.version;
        inherit src;
        cargoLock.lockFile = ./Cargo.lock;
        # The integration tests under launcher/tests need root, KVM and a
        # real kernel; the sandbox has none, so only unit tests run here.
        # The nixosTests in checks/ run the binaries for real.
        cargoTestFlags = ["--lib" "--bins"];
        # Man pages and bash/zsh/fish completions of the three binaries,
        # rendered from their clap definitions by the binary just built
        # (so only when the build platform can run it).
        nativeBuildInputs = [pkgs.installShellFiles];
        postInstall = lib.optionalString (pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform) ''
          $out/bin/vmwarden generate --out generated > /dev/null
          installManPage generated/man/man1/*.1
          for bin in vmwarden vmwarden-launch vmwarden-cleanup; do
            installShellCompletion --cmd "$bin" \
              --bash "generated/completions/bash/$bin.bash" \
              --zsh "generated/completions/zsh/_$bin" \
              --fish "generated/completions/fish/$bin.fish"
          done
        '';
        meta = {
          description = "Per-VM principal, private mount namespace and noswap credential tmpfs for microVMs, with teardown that proves itself";
          license = with lib.licenses; [mit asl20];
          mainProgram = "vmwarden";
          platforms = lib.platforms.linux;
        };
      };
  in {
    overlays.default = final: _prev: {vmwarden = vmwardenFor final;};

    packages = forAllSystems (pkgs: rec {
      vmwarden = vmwardenFor pkgs;
      default = vmwarden;
    });

    # Sets vmwarden.package to this flake's build; see docs/nixos.md.
    nixosModules.default = {
      lib,
      pkgs,
      ...
    }: {
      imports = [./modules];
      vmwarden.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.default;
    };

    checks = forAllSystems (pkgs:
      import ./checks {
        inherit pkgs self microvm;
        inherit (nixpkgs.lib) nixosSystem;
        package = self.packages.${pkgs.stdenv.hostPlatform.system}.default;
      });

    # `nix run .#demo`: the startup-shutdown check's driver: boots a NixOS
    # host VM that runs two vmwarden microVMs, and stops them.
    apps = forAllSystems (pkgs: {
      demo = {
        type = "app";
        program = "${self.checks.${pkgs.stdenv.hostPlatform.system}.startup-shutdown.driver}/bin/nixos-test-driver";
      };
    });

    devShells = forAllSystems (pkgs: {
      default = pkgs.mkShell {
        inputsFrom = [self.packages.${pkgs.stdenv.hostPlatform.system}.default];
        packages = with pkgs; [
          alejandra
          cargo
          clippy
          deadnix
          qemu_kvm
          rustc
          rustfmt
        ];
      };
    });

    formatter = forAllSystems (pkgs: pkgs.alejandra);
  };
}
