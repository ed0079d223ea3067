# Configuration errors caught at evaluation time, each with a message that
# says what to change. The launcher checks the same rules again at start.
{
  config,
  lib,
  options,
  ...
}: let
  inherit (lib) concatLists concatStringsSep filter hasPrefix mapAttrsToList mkIf stringLength;
  vlib = import ./lib.nix {inherit lib;};
  cfg = config.vmwarden;
  vms = mapAttrsToList (name: vm: vm // {inherit name;}) cfg.vms;

  microvmNixHost = vlib.microvmNixHost options config;

  kernelVersion = config.boot.kernelPackages.kernel.version or null;

  perVm = vm: let
    inherit (vm) name;
    p = vm.principal;
    at = "vmwarden.vms.${name}";
    credChecks = concatLists (mapAttrsToList (c: src: [
        {
          assertion = vlib.validCredName c;
          message = "${at}.credentials.\"${c}\": credential names must match ^${vlib.credNameRegex}$ (a letter or digit, then letters, digits, '_', '.', '-'); rename it.";
        }
        {
          assertion = stringLength (vlib.fwCfgName c) <= vlib.fwCfgMax;
          message = "${at}.credentials.\"${c}\": the fw_cfg name \"${vlib.fwCfgName c}\" is ${toString (stringLength (vlib.fwCfgName c))} bytes; QEMU allows ${toString vlib.fwCfgMax}. Shorten the credential name to at most ${toString (vlib.fwCfgMax - stringLength vlib.fwCfgPrefix)} bytes.";
        }
        {
          assertion = !hasPrefix "${builtins.storeDir}/" src;
          message = "${at}.credentials.\"${c}\" = \"${src}\" is in the Nix store, which every local user can read. Keep the secret outside the store (e.g. sops-nix's or agenix's /run/secrets path) and give its path as a string.";
        }
      ])
      vm.credentials);
    pathChecks =
      map (e: let
        d = vlib.hiddenDirOf e.path;
      in {
        assertion = d == null;
        message = "${e.option}: ${e.path} is under ${toString d}, which microvm@.service hides (ProtectHome=yes, PrivateTmp=yes); move it, e.g. under /var/lib/vmwarden/${name}/.";
      })
      (vlib.vmPaths name vm);
  in
    [
      {
        assertion = vlib.validVmName name;
        message = "vmwarden.vms.\"${name}\": VM names must match ^${vlib.vmNameRegex}$ (a lowercase letter, then at most 31 lowercase letters, digits or '-'); rename the attribute.";
      }
      {
        assertion = vm.hypervisor == "qemu" || vm.credentials == {};
        message = "${at}.credentials: ${vm.hypervisor} cannot receive credentials safely (cloud-hypervisor's only channel, SMBIOS OEM strings, is on its command line, which every local user can read; firecracker has none); use hypervisor = \"qemu\" or deliver the secret another way.";
      }
      {
        assertion = vm.hypervisor == "qemu" || vm.accel == "kvm";
        message = "${at}.accel = \"${vm.accel}\": ${vm.hypervisor} runs only on KVM; set accel = \"kvm\" or use hypervisor = \"qemu\".";
      }
      {
        assertion = vm.hypervisor != "firecracker" || vm.interfaces == [];
        message = "${at}.interfaces: firecracker opens taps by name and cannot take an open tap fd, so vmwarden cannot give it a tap that dies with it; use hypervisor = \"qemu\" or \"cloud-hypervisor\".";
      }
      {
        assertion = vlib.validPrincipalName p.user;
        message = "${at}.principal.user = \"${p.user}\" is not a valid user name (^${vlib.principalNameRegex}$, at most 32 bytes); set ${at}.principal.user to a shorter name.";
      }
      {
        assertion = vlib.validPrincipalName p.group;
        message = "${at}.principal.group = \"${p.group}\" is not a valid group name (^${vlib.principalNameRegex}$, at most 32 bytes); set ${at}.principal.group to a shorter name.";
      }
      {
        assertion = !builtins.elem p.user ["root" "nobody"];
        message = "${at}.principal.user = \"${p.user}\": a VM must run as its own unprivileged user; pick a new name such as \"vm-${name}\".";
      }
      {
        assertion = !builtins.elem p.group vlib.privilegedGroups;
        message = "${at}.principal.group = \"${p.group}\" is a privileged group (${concatStringsSep ", " vlib.privilegedGroups}); use the VM's own group, e.g. \"vm-${name}\".";
      }
      {
        assertion = !builtins.elem p.group vlib.sharedGroups;
        message = "${at}.principal.group = \"${p.group}\" is shared with others (every VM's hypervisor gets /dev/kvm's group; nogroup is nobody's), and a VM's files are group-owned by it; use the VM's own group, e.g. \"vm-${name}\".";
      }
      {
        assertion = p.uid != 65534;
        message = "${at}.principal.uid = 65534 is the overflow uid (nobody); pick another uid or leave it null.";
      }
    ]
    ++ credChecks
    ++ pathChecks
    ++ map (i: {
      assertion = vlib.validBridgeName i.bridge;
      message = "${at}.interfaces: bridge \"${i.bridge}\" of ${i.tap} is not a bridge the launcher accepts (not \".\" or \"..\", not starting with ${vlib.tapPrefix}, which marks vmwarden's taps).";
    }) (filter (i: i.bridge != null) vm.interfaces)
    ++ map (i: {
      assertion = vlib.unicastMac i.mac;
      message = "${at}.interfaces: mac \"${i.mac}\" of ${i.tap} is not a unicast address (the first octet must be even, and not all zero).";
    }) (filter (i: i.mac != null) vm.interfaces)
    ++ map (t: {
      assertion = false;
      message = "${at}.interfaces: tap \"${t}\" appears twice.";
    }) (vlib.duplicates (map (i: i.tap) vm.interfaces));

  # uid -> owners, over VMs and every other user with a fixed uid.
  vmUsers = map (vm: vm.principal.user) vms;
  fixedUids =
    filter (u: u.uid != null)
    (mapAttrsToList (n: u: {
        name = n;
        inherit (u) uid;
      })
      config.users.users);
  ownersOf = uid: map (u: u.name) (filter (u: u.uid == uid) fixedUids);
  vmUids = lib.unique (filter (x: x != null) (map (vm: vm.principal.uid) vms));
in {
  config = mkIf cfg.enable {
    assertions =
      concatLists (map perVm vms)
      ++ map (uid: {
        assertion = builtins.length (ownersOf uid) <= 1;
        message = "vmwarden: uid ${toString uid} is used by several users (${concatStringsSep ", " (ownersOf uid)}); every VM principal needs its own uid: change vmwarden.vms.<name>.principal.uid.";
      })
      vmUids
      ++ map (u: {
        assertion = false;
        message = "vmwarden: principal.user \"${u}\" is shared by several VMs (${concatStringsSep ", " (map (vm: vm.name) (filter (vm: vm.principal.user == u) vms))}); give each VM its own user.";
      }) (vlib.duplicates vmUsers)
      ++ map (t: {
        assertion = false;
        message = "vmwarden: tap \"${t}\" is used by several VMs (${concatStringsSep ", " (map (vm: vm.name) (filter (vm: builtins.any (i: i.tap == t) vm.interfaces) vms))}); tap names must be unique.";
      }) (vlib.duplicates (concatLists (map (vm: lib.unique (map (i: i.tap) vm.interfaces)) vms)))
      ++ [
        {
          assertion = kernelVersion == null || !lib.versionOlder kernelVersion vlib.minKernel;
          message = "vmwarden needs Linux >= ${vlib.minKernel} (tmpfs `noswap` for the credential tmpfs), but boot.kernelPackages has ${toString kernelVersion}; set boot.kernelPackages = pkgs.linuxPackages_6_12 (or newer, e.g. pkgs.linuxPackages_latest).";
        }
        {
          assertion = !microvmNixHost;
          message = "vmwarden and microvm.nix's host module both define microvm@.service; remove microvm.nixosModules.host from this host's imports, or set microvm.host.enable = false.";
        }
      ];
  };
}
