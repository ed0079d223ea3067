//! `vmwarden render-unit`: the systemd units for hosts without Nix.
//! (Placeholder; owned by the NixOS-module work, which keeps it key-by-key
//! identical to the module's unit.)
