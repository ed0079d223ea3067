# Copy of shared/nix-eval/harness/shim-typed.nix (the project's own evaluation harness),
# kept in the repo so the tests do not depend on a path outside the clone;
# plus, from nixpkgs' nixos/modules/config/users-groups.nix: the abort on
# user and group names of 32 bytes or more, the user name regex assertion,
# and system.activationScripts (nixos/modules/system/activation).
# Stand-in for the NixOS options a host module touches, typed like NixOS
# declares them (subset), so that what the module hands to NixOS is checked:
# unit names, [Service] Type/Restart values, list-vs-scalar merging,
# users/groups shape, plus the NixOS user assertions.  It also renders the
# unit files (config.systemd.units) the way NixOS does, with fake store paths.
{
  config,
  lib,
  pkgs,
  ...
}: let
  inherit (lib) mkOption types;
  sd = import ./systemd-lite.nix {inherit lib pkgs;};
  strs = mkOption {
    type = types.listOf types.str;
    default = [];
  };
  freeform = types.attrsOf types.anything;

  userModule = {name, ...}: {
    freeformType = freeform; # options this shim does not model stay allowed
    options = {
      # NixOS: passwdEntry, and `abort` (evaluation stops, no assertion
      # list) at 32 bytes; the same for `group` below.
      name = mkOption {
        type = types.passwdEntry types.str;
        default = name;
        apply = x: assert (builtins.stringLength x < 32 || abort "Username '${x}' is longer than 31 characters which is not allowed!"); x;
      };
      uid = mkOption {
        type = types.nullOr types.int;
        default = null;
      };
      isSystemUser = mkOption {
        type = types.bool;
        default = false;
      };
      isNormalUser = mkOption {
        type = types.bool;
        default = false;
      };
      group = mkOption {
        type = types.str;
        default = "";
        apply = x: assert (builtins.stringLength x < 32 || abort "Group name '${x}' is longer than 31 characters which is not allowed!"); x;
      };
      extraGroups = strs;
      description = mkOption {
        type = types.str;
        default = "";
      };
      home = mkOption {
        type = types.str;
        default = "/var/empty";
      };
      createHome = mkOption {
        type = types.bool;
        default = false;
      };
    };
  };
  groupModule = {name, ...}: {
    freeformType = freeform;
    options = {
      name = mkOption {
        type = types.str;
        default = name;
      };
      gid = mkOption {
        type = types.nullOr types.int;
        default = null;
      };
      members = strs;
    };
  };
in {
  options = {
    assertions = mkOption {
      type = types.listOf types.unspecified;
      default = [];
    };
    warnings = strs;
    systemd = {
      services = mkOption {
        type = types.attrsOf (types.submodule sd.serviceModule);
        default = {};
      };
      targets = mkOption {
        type = types.attrsOf (types.submodule sd.targetModule);
        default = {};
      };
      timers = mkOption {
        type = types.attrsOf (types.submodule sd.timerModule);
        default = {};
      };
      globalEnvironment = mkOption {
        type = with types;
          attrsOf (
            nullOr (oneOf [
              str
              path
              package
            ])
          );
        # What a default NixOS system puts here (nixos/modules/config/locale.nix
        # and i18n.nix): every service gets these unless it sets them to null,
        # so a tzdata or glibc-locales update changes its unit text.
        default = {
          TZDIR = "/nix/store/00000000000000000000000000000000-tzdata-2025b/share/zoneinfo";
          LOCALE_ARCHIVE = "/nix/store/00000000000000000000000000000000-glibc-locales-2.40-66/lib/locale/locale-archive";
        };
      };
      tmpfiles.rules = strs;
      # Output: rendered units, keyed by unit file name.
      units = mkOption {
        type = types.attrsOf types.unspecified;
        readOnly = true;
      };
    };
    users = {
      users = mkOption {
        type = types.attrsOf (types.submodule userModule);
        default = {};
      };
      groups = mkOption {
        type = types.attrsOf (types.submodule groupModule);
        default = {};
      };
    };
    # NixOS: attrsOf (coercedTo str noDepEntry scriptType); run in
    # dependency order at every boot and every switch (after the stops).
    system.activationScripts = mkOption {
      type = types.attrsOf (types.coercedTo types.str (text: {inherit text;}) (types.submodule {
        options = {
          text = mkOption {type = types.lines;};
          deps = strs;
          supportsDryActivation = mkOption {
            type = types.bool;
            default = false;
          };
        };
      }));
      default = {};
    };
    boot = {
      kernelModules = strs;
      kernelParams = strs;
      extraModprobeConfig = mkOption {
        type = types.lines;
        default = "";
      };
    };
    environment = {
      systemPackages = mkOption {
        type = types.listOf types.package;
        default = [];
      };
      etc = mkOption {
        type = types.attrsOf freeform;
        default = {};
      };
    };
  };

  config = {
    # Groups NixOS always defines (users-groups.nix) that host modules rely on.
    users.groups = lib.genAttrs ["root" "wheel" "kvm" "users" "nogroup"] (_: {});

    # NixOS's own user assertions (users-groups.nix), same conditions.
    assertions = lib.concatLists (
      lib.mapAttrsToList (n: u: [
        # NixOS: shadow's is_valid_name, without the trailing $.
        {
          assertion = builtins.match "[a-zA-Z0-9_.][a-zA-Z0-9_.-]*" u.name != null;
          message = "The username \"${u.name}\" is not valid, it does not match the regex \"[a-zA-Z0-9_.][a-zA-Z0-9_.-]*\".";
        }
        {
          assertion = (u.isNormalUser || u.isSystemUser) -> !(u.isNormalUser && u.isSystemUser);
          message = "Exactly one of users.users.${n}.isSystemUser and users.users.${n}.isNormalUser must be set.";
        }
        {
          assertion = u.group != "";
          message = "users.users.${n}.group is unset.";
        }
        # Shim's own check (NixOS only notices at activation time):
        {
          assertion = u.group == "" || config.users.groups ? ${u.group};
          message = "users.users.${n}.group = \"${u.group}\" but users.groups.${u.group} is not defined.";
        }
      ])
      config.users.users
    );

    systemd.units =
      lib.mapAttrs' (_: s: lib.nameValuePair s.name (sd.toUnit (sd.serviceText config.systemd.globalEnvironment s) s)) config.systemd.services
      // lib.mapAttrs' (_: t: lib.nameValuePair t.name (sd.toUnit (sd.targetText t) t)) config.systemd.targets
      // lib.mapAttrs' (_: t: lib.nameValuePair t.name (sd.toUnit (sd.timerText t) t)) config.systemd.timers;
  };
}
