# What a host configuration makes of each VM, as the exact texts NixOS
# would install: the launch spec (/etc/vmwarden/vms/<vm>.json) and the VM's
# drop-in (microvm@<vm>.service.d/overrides.conf), keyed "<vm>.json" and
# "<vm>.conf". tests/nix/run.sh compares them with tests/nix/golden/.
#   nix-instantiate --eval --strict --json tests/nix/golden.nix \
#     --arg modules '[ ... ]'
{modules}: let
  h = import ./harness/eval.nix {
    inherit modules;
    extraPkgNames = ["vmwarden" "virtiofsd" "vhost-device-vsock" "passt"];
  };
  inherit (h.checked) vmwarden;
  names = builtins.attrNames vmwarden.vms;
in
  builtins.listToAttrs (map (vm: {
      name = "${vm}.json";
      value = h.checked.environment.etc."vmwarden/vms/${vm}.json".source.text;
    })
    names
    ++ map (vm: {
      name = "${vm}.conf";
      value = h.unitTexts."microvm@${vm}.service";
    })
    names)
