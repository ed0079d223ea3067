# Copy of shared/nix-eval/harness/systemd-lite.nix (the project's own evaluation harness),
# kept in the repo so the tests do not depend on a path outside the clone.
# A re-implementation (not a copy) of the parts of nixpkgs'
# nixos/lib/systemd-lib.nix + systemd-unit-options.nix that decide
#   * how systemd.services.<name> definitions merge and type-check, and
#   * what unit text NixOS renders from them,
# with every store path replaced by a deterministic fake from stub-pkgs.nix.
# Rendering rules are summarised in ../RESULTS.md, section 3.
{
  lib,
  pkgs,
}: let
  inherit
    (lib)
    mkOption
    types
    mkIf
    mkMerge
    mkAfter
    optionalAttrs
    optionalString
    concatStrings
    concatStringsSep
    concatMap
    mapAttrsToList
    attrNames
    isList
    toList
    elem
    ;

  unitNameType = types.strMatching "[a-zA-Z0-9@%:_.\\-]+[.](service|socket|device|mount|automount|swap|target|path|timer|scope|slice)";

  # Lists from several definitions concatenate (repeatable keys like
  # ExecStartPre, DeviceAllow); scalars must agree (mergeEqualOption).
  unitOption = lib.mkOptionType {
    name = "systemd option";
    merge = loc: defs:
      if lib.any (d: isList d.value) defs
      then concatMap (d: toList d.value) defs
      else lib.mergeEqualOption loc defs;
  };

  # NixOS checks a few [Service] values at type-check time.
  serviceChecks = {
    Type = [
      "exec"
      "simple"
      "forking"
      "oneshot"
      "dbus"
      "notify"
      "notify-reload"
      "idle"
    ];
    Restart = [
      "no"
      "on-success"
      "on-failure"
      "on-abnormal"
      "on-abort"
      "always" # (NixOS's list has no "on-watchdog" either)
    ];
  };
  checkService = attrs: let
    plain = lib.mapAttrs (_: v:
      if lib.elem (v._type or "") ["override" "if"]
      then v.content
      else v)
    attrs;
    errs = concatMap (
      k:
        lib.optional (
          plain ? ${k} && !elem plain.${k} serviceChecks.${k}
        ) "Systemd Service field `${k}' cannot have value `${toString plain.${k}}'."
    ) (attrNames serviceChecks);
  in
    if errs == []
    then true
    else builtins.trace (concatStringsSep "\n" errs) false;

  units = mkOption {
    type = types.listOf unitNameType;
    default = [];
  };
  lines = mkOption {
    type = types.lines;
    default = "";
  };
  section = mkOption {
    type = types.attrsOf unitOption;
    default = {};
  };

  # NixOS: (writeShellScriptBin scriptName "set -e\n\n<text>") renamed to
  # "unit-script-<scriptName>"; scriptName has "\\" -> "-" and "@" -> "_".
  jobScript = name: text: let
    scriptName = builtins.replaceStrings ["\\" "@"] ["-" "_"] name;
    drv = pkgs.writeShellScriptBin scriptName "set -e\n\n${text}";
  in "${builtins.storeDir}/${builtins.substring 11 32 drv.outPath}-unit-script-${scriptName}/bin/${scriptName}";

  commonOptions = {
    enable = mkOption {
      type = types.bool;
      default = true;
    };
    description = mkOption {
      type = types.singleLineStr;
      default = "";
    };
    documentation = mkOption {
      type = types.listOf types.str;
      default = [];
    };
    requires = units;
    wants = units;
    upholds = units;
    after = units;
    before = units;
    bindsTo = units;
    partOf = units;
    conflicts = units;
    requisite = units;
    onFailure = units;
    onSuccess = units;
    wantedBy = units;
    requiredBy = units;
    upheldBy = units;
    aliases = units;
    overrideStrategy = mkOption {
      type = types.enum [
        "asDropinIfExists"
        "asDropin"
      ];
      default = "asDropinIfExists";
    };
    unitConfig = section;
    # NixOS: types.int with no default (tested via options.*.isDefined);
    # nullOr here so the whole service can be exported as JSON.
    startLimitBurst = mkOption {
      type = types.nullOr types.int;
      default = null;
    };
    startLimitIntervalSec = mkOption {
      type = types.nullOr types.int;
      default = null;
    };
    restartTriggers = mkOption {
      type = types.listOf types.unspecified;
      default = [];
    };
    reloadTriggers = mkOption {
      type = types.listOf unitOption;
      default = [];
    };
  };

  # [Unit] keys NixOS derives from the typed dependency options.
  derivedUnitConfig = name: config: let
    opt = key: list: optionalAttrs (list != []) {${key} = toString list;};
    trig = key: list:
      optionalAttrs (list != []) {
        ${key} = "${pkgs.writeText "${key}-${name}" (toString (map toString (lib.flatten list)))}";
      };
  in
    opt "Requires" config.requires
    // opt "Wants" config.wants
    // opt "Upholds" config.upholds
    // opt "After" config.after
    // opt "Before" config.before
    // opt "BindsTo" config.bindsTo
    // opt "PartOf" config.partOf
    // opt "Conflicts" config.conflicts
    // opt "Requisite" config.requisite
    // trig "X-Restart-Triggers" config.restartTriggers
    // trig "X-Reload-Triggers" config.reloadTriggers
    // optionalAttrs (config.description != "") {Description = config.description;}
    // opt "Documentation" config.documentation
    // opt "OnFailure" config.onFailure
    // opt "OnSuccess" config.onSuccess
    // optionalAttrs (config.startLimitIntervalSec != null) {
      StartLimitIntervalSec = toString config.startLimitIntervalSec;
    }
    // optionalAttrs (config.startLimitBurst != null) {
      StartLimitBurst = toString config.startLimitBurst;
    };

  serviceModule = {
    name,
    config,
    ...
  }: {
    options =
      commonOptions
      // {
        name = mkOption {
          type = types.str;
          default = "${name}.service";
        };
        environment = mkOption {
          type = with types;
            attrsOf (
              nullOr (oneOf [
                str
                path
                package
              ])
            );
          default = {};
        };
        path = mkOption {
          type = with types;
            listOf (oneOf [
              package
              str
            ]);
          default = [];
        };
        serviceConfig = mkOption {
          type = types.addCheck (types.attrsOf unitOption) checkService;
          default = {};
        };
        script = lines;
        scriptArgs = mkOption {
          type = types.str;
          default = "";
        };
        preStart = lines;
        postStart = lines;
        reload = lines;
        preStop = lines;
        postStop = lines;
        restartIfChanged = mkOption {
          type = types.bool;
          default = true;
        };
        reloadIfChanged = mkOption {
          type = types.bool;
          default = false;
        };
        stopIfChanged = mkOption {
          type = types.bool;
          default = true;
        };
        notSocketActivated = mkOption {
          type = types.bool;
          default = false;
        };
        startAt = mkOption {
          type = with types; either str (listOf str);
          default = [];
          apply = v:
            if isList v
            then v
            else [v];
        };
        enableStrictShellChecks = mkOption {
          type = types.bool;
          default = false;
        };
      };
    config = mkMerge [
      {unitConfig = derivedUnitConfig name config;}
      # stage-2 default PATH; `path = lib.mkForce [ ]` removes it.
      {
        path = mkAfter [
          pkgs.coreutils
          pkgs.findutils
          pkgs.gnugrep
          pkgs.gnused
          pkgs.systemd
        ];
      }
      {
        environment.PATH = mkIf (config.path != []) "${lib.makeBinPath config.path}:${lib.makeSearchPathOutput "bin" "sbin" config.path}";
      }
      (mkIf (config.preStart != "") {serviceConfig.ExecStartPre = [(jobScript "${name}-pre-start" config.preStart)];})
      (mkIf (config.script != "") {
        serviceConfig.ExecStart = jobScript "${name}-start" config.script + " " + config.scriptArgs;
      })
      (mkIf (config.postStart != "") {serviceConfig.ExecStartPost = [(jobScript "${name}-post-start" config.postStart)];})
      (mkIf (config.reload != "") {serviceConfig.ExecReload = jobScript "${name}-reload" config.reload;})
      (mkIf (config.preStop != "") {serviceConfig.ExecStop = jobScript "${name}-pre-stop" config.preStop;})
      (mkIf (config.postStop != "") {serviceConfig.ExecStopPost = jobScript "${name}-post-stop" config.postStop;})
    ];
  };

  targetModule = {
    name,
    config,
    ...
  }: {
    options =
      commonOptions
      // {
        name = mkOption {
          type = types.str;
          default = "${name}.target";
        };
      };
    config.unitConfig = derivedUnitConfig name config;
  };

  # systemd.timers.<name>: the common options and [Timer] (timerConfig).
  timerModule = {
    name,
    config,
    ...
  }: {
    options =
      commonOptions
      // {
        name = mkOption {
          type = types.str;
          default = "${name}.timer";
        };
        timerConfig = section;
      };
    config.unitConfig = derivedUnitConfig name config;
  };

  toOption = x:
    if x == true
    then "true"
    else if x == false
    then "false"
    else toString x;

  # One "Key=value" line per value; a list value repeats the key.
  attrsToSection = as:
    concatStrings (
      lib.concatLists (mapAttrsToList (k: v: map (x: "${k}=${toOption x}\n") (toList v)) as)
    );

  commonUnitText = def: body:
    "[Unit]\n${attrsToSection def.unitConfig}\n"
    + body
    + optionalString (def.wantedBy != []) "\n[Install]\nWantedBy=${concatStringsSep " " def.wantedBy}\n";

  serviceText = globalEnvironment: def: let
    env = globalEnvironment // def.environment;
  in
    commonUnitText def (
      "[Service]\n"
      + concatStrings (
        map (n: optionalString (env.${n} != null) "Environment=${builtins.toJSON "${n}=${env.${n}}"}\n") (attrNames env)
      )
      + (
        if def.reloadIfChanged
        then "X-ReloadIfChanged=true\n"
        else if !def.restartIfChanged
        then "X-RestartIfChanged=false\n"
        else ""
      )
      + optionalString (!def.stopIfChanged) "X-StopIfChanged=false\n"
      + optionalString def.notSocketActivated "X-NotSocketActivated=true\n"
      + attrsToSection def.serviceConfig
    );

  targetText = def: "[Unit]\n${attrsToSection def.unitConfig}\n";

  timerText = def: commonUnitText def "[Timer]\n${attrsToSection def.timerConfig}";

  # Where NixOS would put the file inside /etc/systemd/system.
  unitFile = def:
    if def.overrideStrategy == "asDropin"
    then "${def.name}.d/overrides.conf"
    else def.name;

  toUnit = text: def: {
    inherit
      (def)
      name
      enable
      wantedBy
      requiredBy
      upheldBy
      aliases
      overrideStrategy
      ;
    file = unitFile def;
    inherit text;
  };
in {
  inherit
    unitOption
    unitNameType
    serviceModule
    targetModule
    timerModule
    serviceText
    targetText
    timerText
    attrsToSection
    toUnit
    jobScript
    ;
}
