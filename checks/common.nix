# What the nixosTests share: the host node (this flake's module, two VMs
# `a` and `b` on the test guest, a credential each), the VM definition, and
# microvm.nix guests.
{
  pkgs,
  self,
  microvm,
  nixosSystem,
}: let
  guest = import ./guest.nix {inherit pkgs;};
in rec {
  inherit guest;

  # A NixOS configuration built with microvm.nix's guest module, for
  # vmwarden.vms.<name>.guest, as a user's flake would declare it.
  microvmGuest = modules:
    nixosSystem {
      inherit (pkgs.stdenv.hostPlatform) system;
      modules = [microvm.nixosModules.microvm] ++ modules;
    };

  # The nested guest runs under TCG: no nested KVM needed on the builder.
  vm = name: {
    accel = "tcg";
    machine = "pc";
    memoryMiB = 256;
    inherit (guest) kernel initrd cmdline;
    credentials.secret = "/run/secrets/${name}";
  };

  host = {pkgs, ...}: {
    imports = [self.nixosModules.default];
    virtualisation = {
      memorySize = 2048;
      cores = 2;
    };
    environment.systemPackages = [pkgs.socat pkgs.util-linux];

    # Stand-in for sops-nix/agenix: root-only secrets outside the store.
    systemd.services.test-secrets = {
      wantedBy = ["multi-user.target"];
      # Ordered from this side, so the VMs' drop-ins stay the module's own.
      before = ["microvms.target" "microvm@a.service" "microvm@b.service"];
      serviceConfig = {
        Type = "oneshot";
        RemainAfterExit = true;
      };
      script = ''
        install -d -m 0700 /run/secrets
        for vm in a b; do
          head -c 48 /dev/urandom | base64 > /run/secrets/$vm
          chmod 0400 /run/secrets/$vm
        done
      '';
    };

    vmwarden = {
      enable = true;
      vms.a = vm "a";
      vms.b = vm "b";
    };
  };
}
