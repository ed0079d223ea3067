# Pure helpers shared by options.nix, assertions.nix and host.nix: the
# naming rules, the launch-spec rendering and the systemd unit definitions.
# Nothing here reads `config`; everything takes its inputs as arguments.
# The rules and the units' keys are data in ../units/, which the launcher
# reads too (units/rules.toml, units/*.service.toml, units/*.target.toml).
{lib}: let
  inherit (lib) all filter hasPrefix optional splitString;

  # ../units/rules.toml: what the launcher checks (launcher/build.rs turns
  # the same file into its constants).
  rules = builtins.fromTOML (builtins.readFile ../units/rules.toml);
  # A character class of rules.toml as a regex bracket expression.
  class = c: "[${c}]";

  # "02" -> 2: the value of a MAC octet (the option type checked the hex).
  hexDigits = builtins.listToAttrs (lib.imap0 (value: name: {inherit name value;}) (lib.stringToCharacters "0123456789abcdef"));
  octet = s: 16 * hexDigits.${lib.toLower (builtins.substring 0 1 s)} + hexDigits.${lib.toLower (builtins.substring 1 1 s)};
in rec {
  # ---------------------------------------------------------------- names
  # VM names, as the launcher checks them (ARCHITECTURE.md, launch step 2).
  vmNameRegex = "${class rules.vm_name.first}${class rules.vm_name.rest}{0,${toString (rules.vm_name.max_len - 1)}}";
  validVmName = n: builtins.match vmNameRegex n != null;

  # Unix user and group names the module creates for a VM.
  principalNameRegex = "[a-z_][a-z0-9_-]{0,31}";
  validPrincipalName = n: builtins.match principalNameRegex n != null;

  # Credential names, as the launcher checks them: a file name without ':'
  # (LoadCredential's separator), starting with a letter or digit.
  credNameRegex = "${class rules.credential_name.first}${class rules.credential_name.rest}*";
  validCredName = n: builtins.match credNameRegex n != null;

  # Taps the launcher creates (IFNAMSIZ: 15 bytes), other interface names
  # (bridges), guest MACs; launcher/src/config/names.rs checks the same.
  tapPrefix = rules.tap.prefix;
  ifNameMax = rules.ifname.max_len;
  tapNameRegex = "${lib.escapeRegex tapPrefix}${class rules.tap.rest}{1,${toString (ifNameMax - builtins.stringLength tapPrefix)}}";
  ifNameRegex = "${class rules.ifname.chars}{1,${toString ifNameMax}}";
  # A bridge the launcher accepts: an interface name, not "." or "..", and
  # not one of vmwarden's own taps.
  validBridgeName = n: builtins.match ifNameRegex n != null && !builtins.elem n rules.ifname.refused && !hasPrefix tapPrefix n;
  macRegex = "[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}";
  # Not multicast/broadcast (the first octet's group bit clear), not zero.
  unicastMac = m: let
    group = builtins.bitAnd (octet m) rules.mac.group_bit != 0;
    zero = builtins.match "(00:){5}00" m != null;
  in
    !group && !(rules.mac.refuse_zero && zero);

  # QEMU stores fw_cfg file names in 56 bytes including the NUL.
  fwCfgPrefix = rules.fw_cfg.credential_prefix;
  fwCfgMax = rules.fw_cfg.name_max;
  fwCfgName = c: fwCfgPrefix + c;

  # Groups whose membership would give a VM principal more than its own VM.
  privilegedGroups = rules.groups.privileged;
  # Groups shared with others: never a VM principal's own group.
  sharedGroups = rules.groups.shared;

  # tmpfs `noswap` (credential tmpfs) appeared in Linux 6.4.
  minKernel = "6.4";

  # ---------------------------------------------------------------- paths
  # "/a/b": absolute, no empty, "." or ".." component, no trailing "/";
  # and safe to write unquoted into a unit file (ReadWritePaths=,
  # LoadCredential=): no whitespace, control characters, '%' (specifiers),
  # quotes or backslashes. launcher/src/unit.rs checks the same.
  isNormalAbsolutePath = s:
    builtins.isString s
    && hasPrefix "/" s
    && builtins.match "[^[:space:][:cntrl:]%\"'\\]*" s != null
    && (s == "/" || all (c: c != "" && c != "." && c != "..") (builtins.tail (splitString "/" s)));

  # "identity" or "volumes/root.img": relative, normalised.
  isNormalRelativePath = s:
    builtins.isString s
    && s != ""
    && !hasPrefix "/" s
    && all (c: c != "" && c != "." && c != "..") (splitString "/" s);

  isUnder = dir: p: p == dir || hasPrefix "${dir}/" p;

  # Directories the unit hides from the launcher and the hypervisor
  # (ProtectHome=yes, PrivateTmp=yes): VM files there cannot be opened.
  hiddenDirs = ["/home" "/root" "/run/user" "/tmp" "/var/tmp"];
  hiddenDirOf = p: let
    hits = filter (d: isUnder d p) hiddenDirs;
  in
    if hits == []
    then null
    else builtins.head hits;

  # Every host path a VM's hypervisor opens, with the option that set it.
  vmPaths = name: vm:
    [
      {
        option = "vmwarden.vms.${name}.kernel";
        path = vm.kernel;
      }
    ]
    ++ optional (vm.initrd != null) {
      option = "vmwarden.vms.${name}.initrd";
      path = vm.initrd;
    }
    ++ map (d: {
      option = "vmwarden.vms.${name}.disks";
      inherit (d) path;
    })
    vm.disks
    ++ map (p: {
      option = "vmwarden.vms.${name}.landlock.read";
      path = p;
    })
    vm.landlock.read
    ++ map (p: {
      option = "vmwarden.vms.${name}.landlock.write";
      path = p;
    })
    vm.landlock.write;

  # ---------------------------------------------------------------- spec
  # The launch spec, version 1 (ARCHITECTURE.md "Launch spec"). The launcher
  # rejects unknown fields, so this emits exactly the contract's fields.
  spec = name: vm:
    {
      version = 1;
      inherit name;
      principal = {
        inherit (vm.principal) user group;
      };
      hypervisor = {
        kind = vm.hypervisor;
        binary = vm.hypervisorBinary;
        inherit (vm) accel machine;
      };
      inherit (vm) vcpus kernel cmdline;
      memory_mib = vm.memoryMiB;
      credentials =
        map (c: {
          name = c;
          source.systemd = c;
        })
        (builtins.attrNames vm.credentials);
      disks =
        map (d: {
          inherit (d) path;
          read_only = d.readOnly;
        })
        vm.disks;
      interfaces = map (i:
        {inherit (i) tap;}
        // lib.optionalAttrs (i.bridge != null) {inherit (i) bridge;}
        // lib.optionalAttrs (i.mac != null) {inherit (i) mac;})
      vm.interfaces;
      landlock = {
        inherit (vm.landlock) mode read write;
      };
      keep_on_purge = vm.keepOnPurge;
    }
    // lib.optionalAttrs (vm.initrd != null) {inherit (vm) initrd;};

  # ---------------------------------------------------------------- units
  # The keys of microvm@.service, vmwarden-reap-report.service and
  # microvms.target, each with the reason for it, are data in ../units/*.toml;
  # `vmwarden render-unit` (launcher/src/unit.rs) prints the same data for
  # hosts without Nix. Each key becomes a normal-priority definition, as a
  # host's own would be, so any of them can be overridden with lib.mkForce.
  # tests/nix/run.sh compares the two renderings (units.py parity) and shows
  # that one key changed in the data changes both.

  # [Unit]/[Install] keys NixOS has typed options for. The module defines
  # the option (what a host overrides), not unitConfig; a space-separated
  # string of units becomes the option's list.
  unitListOptions = {
    After = "after";
    Before = "before";
    BindsTo = "bindsTo";
    Conflicts = "conflicts";
    Documentation = "documentation";
    OnFailure = "onFailure";
    OnSuccess = "onSuccess";
    PartOf = "partOf";
    Requires = "requires";
    Requisite = "requisite";
    Upholds = "upholds";
    Wants = "wants";
  };
  installOptions = {
    RequiredBy = "requiredBy";
    UpheldBy = "upheldBy";
    WantedBy = "wantedBy";
  };
  # Typed when the value fits the option's type (int for the start limits).
  unitScalarOptions = {
    Description = "description";
    StartLimitBurst = "startLimitBurst";
    StartLimitIntervalSec = "startLimitIntervalSec";
  };

  # NixOS definitions (systemd.services.<name> or systemd.targets.<name>)
  # from the unit data in ../units/FILE, with the placeholders in `subst`
  # (e.g. {"@bin@" = "/nix/store/...-vmwarden/bin";}) substituted in every
  # string. The same rules as `entries` in launcher/src/unit.rs: sections
  # [Unit], [Service], [Install]; a string, integer or boolean is one line,
  # a list one line per element.
  fromUnitData = subst: file: let
    data = builtins.fromTOML (builtins.readFile (../units + "/${file}"));
    where = "units/${file}";
    scalar = k: v:
      if builtins.isString v
      then builtins.replaceStrings (builtins.attrNames subst) (builtins.attrValues subst) v
      else if builtins.isInt v || builtins.isBool v
      then v
      else throw "${where}: ${k}: a ${builtins.typeOf v} is not a string, integer, boolean or a list of them";
    value = k: v:
      if builtins.isList v
      then map (scalar k) v
      else scalar k v;
    units = k: v:
      if builtins.isString v
      then filter (u: u != "") (splitString " " v)
      else throw "${where}: ${k}: write the units as one space-separated string";
    section = name: lib.mapAttrs value (data.${name} or {});
    unit = section "Unit";
    install = section "Install";
    isTyped = k: v: unitListOptions ? ${k} || (unitScalarOptions ? ${k} && (k == "Description" || builtins.isInt v));
    typed = lib.filterAttrs isTyped unit;
    unitConfig = lib.filterAttrs (k: v: !isTyped k v) unit;
    badSections = builtins.attrNames (removeAttrs data ["Unit" "Service" "Install"]);
    badInstall = builtins.attrNames (removeAttrs install (builtins.attrNames installOptions));
  in
    if badSections != []
    then throw "${where}: [${builtins.head badSections}]: the sections are Unit, Service, Install"
    else if badInstall != []
    then throw "${where}: [Install] ${builtins.head badInstall}: the module knows only ${toString (builtins.attrNames installOptions)}"
    else
      lib.mapAttrs' (k: v:
        if unitListOptions ? ${k}
        then lib.nameValuePair unitListOptions.${k} (units k v)
        else lib.nameValuePair unitScalarOptions.${k} v)
      typed
      // lib.mapAttrs' (k: v: lib.nameValuePair installOptions.${k} (units k v)) install
      // lib.optionalAttrs (unitConfig != {}) {inherit unitConfig;}
      // lib.optionalAttrs (data ? Service) {serviceConfig = section "Service";};

  # What NixOS adds to every service on its own, undone: the launcher builds
  # the whole environment it needs (and clears the rest), so nothing here
  # may make the unit differ from render-unit's or restart running VMs.
  nixosServiceDefaults = {
    # NixOS's default PATH of coreutils, findutils, grep, sed and systemd.
    path = lib.mkForce [];
    # systemd.globalEnvironment (nixpkgs nixos/modules/config/locale.nix
    # sets TZDIR, i18n.nix LOCALE_ARCHIVE) goes into every service's text
    # (serviceToUnit in nixos/lib/systemd-lib.nix: globalEnvironment //
    # environment, null values left out): a tzdata or glibc-locales update
    # would change the unit and restart every running VM.
    environment = {
      TZDIR = null;
      LOCALE_ARCHIVE = null;
    };
  };

  # microvm@.service. `bin` is the directory holding the three binaries.
  template = bin: fromUnitData {"@bin@" = bin;} "microvm@.service.toml" // nixosServiceDefaults;

  # The per-VM drop-in (microvm@<name>.service.d/): credentials and the
  # writable paths outside the state root. `credSource c` is the host file
  # of systemd credential c.
  dropin = vm: credSource:
    nixosServiceDefaults
    // {
      overrideStrategy = "asDropin";
      serviceConfig =
        {
          LoadCredential = map (c: "${c}:${credSource c}") (builtins.attrNames vm.credentials);
          # '-': a missing image is the launcher's error to report, not a
          # namespace setup failure.
          ReadWritePaths = map (p: "-${p}") (writablePaths vm);
        }
        # Taps: the launcher (root, before its privilege drop) creates them
        # through /dev/net/tun (already in DeviceAllow) and configures them over
        # rtnetlink. Both settings merge with the template's.
        // lib.optionalAttrs (vm.interfaces != []) {
          CapabilityBoundingSet = "CAP_NET_ADMIN";
          RestrictAddressFamilies = "AF_NETLINK";
        };
    };

  writablePaths = vm: map (d: d.path) (filter (d: !d.readOnly) vm.disks) ++ vm.landlock.write;

  # microvms.target: the autostart VMs (wants) come from the module.
  target = fromUnitData {} "microvms.target.toml";

  # Boot-time dry run of `vmwarden reap`: what a previous boot left behind,
  # in the journal; deletes nothing.
  reapReport = bin: fromUnitData {"@bin@" = bin;} "vmwarden-reap-report.service.toml" // nixosServiceDefaults;

  # ---------------------------------------------------------------- misc
  # microvm.nix's host module (nixosModules.host) also defines microvm@.service.
  microvmNixHost = options: config:
    lib.hasAttrByPath ["microvm" "host" "enable"] options
    && (config.microvm.host.enable or false);

  duplicates = xs: lib.unique (filter (x: lib.count (y: y == x) xs > 1) xs);
}
