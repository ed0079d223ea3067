# Copy of shared/nix-eval/harness/stub-pkgs.nix (the project's own evaluation harness),
# kept in the repo so the tests do not depend on a path outside the clone;
# its packages also have overrideAttrs here.
# A fake `pkgs` for evaluating NixOS-style modules without nixpkgs.
#
# Every package is a derivation-shaped attrset (type = "derivation") with a
# deterministic fake store path, so `types.package` accepts it, "${pkg}/bin/x"
# interpolates, and builtins.toJSON prints its outPath.  Nothing is built.
{
  lib,
  extraNames ? [],
}: let
  # Nix store hashes use base32 without e/o/t/u; map hex 'e' onto 'z'.
  fakeHash = s: builtins.replaceStrings ["e"] ["z"] (builtins.substring 0 32 (builtins.hashString "sha256" s));
  # fakeDrv "<name>" { hashSeed ? name, ... }: outPath /nix/store/<hash(seed)>-<name>
  fakeDrv = name: extra:
    {
      type = "derivation";
      inherit name;
      outPath = "${builtins.storeDir}/${fakeHash (extra.hashSeed or name)}-${name}";
      meta = {};
    }
    // removeAttrs extra ["hashSeed"];
  # overrideAttrs (nixpkgs' cloud-hypervisor rebuilt with its fw_cfg
  # feature): another fake derivation whose path depends on the overrides.
  pkg = name:
    fakeDrv name {
      pname = name;
      overrideAttrs = f: let
        over = f {pname = name;};
      in
        fakeDrv name ({
            pname = name;
            hashSeed = name + builtins.toJSON over;
          }
          // over);
    };
  names =
    [
      "bash"
      "coreutils"
      "findutils"
      "gnugrep"
      "gnused"
      "systemd"
      "firecracker"
      "cloud-hypervisor"
      "qemu"
      "iproute2"
      "util-linux"
      "jq"
      "qemu_kvm"
      "qemu_test"
      "busybox"
      "e2fsprogs"
      "linux"
      "iptables"
    ]
    ++ extraNames;
in
  lib.genAttrs names pkg
  // rec {
    runtimeShell = "${pkg "bash"}/bin/bash";
    # Content-addressed enough that a changed text changes the path.
    writeText = name: text:
      fakeDrv name {
        inherit text;
        hashSeed = name + text;
      };
    writeShellScript = name: text: writeText name "#!${runtimeShell}\n${text}";
    writeShellScriptBin = name: text:
      fakeDrv name {
        text = "#!${runtimeShell}\n${text}";
        hashSeed = name + text;
        meta.mainProgram = name;
      };
  }
