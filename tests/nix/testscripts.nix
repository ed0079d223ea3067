# Every nixosTest in checks/nixos/, evaluated with a stand-in `common` (no
# nixpkgs needed: node modules are not evaluated), as
#   { "<file>" = { name; nodeNames; testScript; }; }
# for check_testscripts.py.
let
  dir = ../../checks/nixos;
  common = {
    host = {};
    vm = _: {};
    guest = {};
    microvmGuest = _: {};
  };
  files = builtins.filter (n: builtins.match ".*[.]nix" n != null) (builtins.attrNames (builtins.readDir dir));
  load = file: let
    t = import (dir + "/${file}") {inherit common;};
  in {
    inherit (t) name testScript;
    nodeNames = builtins.attrNames t.nodes;
  };
in
  builtins.listToAttrs (map (file: {
      name = file;
      value = load file;
    })
    files)
