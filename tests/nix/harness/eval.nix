# Copy of shared/nix-eval/harness/eval.nix (the project's own evaluation harness),
# kept in the repo so the tests do not depend on a path outside the clone.
# Evaluate NixOS-style modules with the real nixpkgs `lib.evalModules`,
# a shim for the upstream NixOS options, and a stub `pkgs`.
#
#   nix-instantiate --eval --strict --json harness/eval.nix \
#     --arg modules '[ ./module/vmhost.nix ./tests/host-ok.nix ]' -A report
#
# Like NixOS's system.build.toplevel, `checked` throws on failed assertions
# and prints warnings.
{
  modules,
  shim ? "typed", # "typed" | "loose"
  extraPkgNames ? [], # more fake packages, e.g. [ "vmwarden" ]
  libPath ? (
    let
      e = builtins.getEnv "NIXPKGS_LIB";
    in
      if e != ""
      then e
      else /tmp/nixpkgs-lib/lib
  ),
}: let
  lib = import libPath;
  pkgs = import ./stub-pkgs.nix {
    inherit lib;
    extraNames = extraPkgNames;
  };
  shimModule =
    {
      typed = ./shim-typed.nix;
      loose = ./shim-loose.nix;
    }
    .${shim};
  eval = lib.evalModules {
    modules =
      [
        shimModule
        {_module.args.pkgs = pkgs;}
      ]
      ++ modules;
  };
  inherit (eval) config;
  failed = map (a: a.message) (lib.filter (a: !a.assertion) config.assertions);
  checked =
    if failed != []
    then throw "\nFailed assertions:\n${lib.concatMapStringsSep "\n" (m: "- ${m}") failed}"
    else lib.foldr (w: c: lib.warn w c) config config.warnings;
  # JSON-safe view of what a host module produces.
  report = {
    boot = checked.boot;
    environment = checked.environment;
    users = checked.users;
    inherit (checked) system;
    systemd =
      {
        inherit
          (checked.systemd)
          services
          targets
          timers
          tmpfiles
          globalEnvironment
          ;
      }
      // lib.optionalAttrs (shim == "typed") {inherit (checked.systemd) units;};
  };
in {
  inherit
    eval
    config
    checked
    report
    failed
    lib
    pkgs
    ;
  # Just the rendered unit texts: { "microvm@.service" = "[Unit]\n..."; }
  unitTexts = lib.mapAttrs (_: u: u.text) checked.systemd.units;
}
