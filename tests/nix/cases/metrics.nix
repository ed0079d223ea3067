# vmwarden.metrics.textfile: the timer and its oneshot service, writing
# into the textfile directory node-exporter's own flags name (the
# option's default), every minute.
{lib, ...}: {
  imports = [./base.nix];
  # services.prometheus.exporters.node as NixOS declares the part read here.
  options.services.prometheus.exporters.node.extraFlags = lib.mkOption {
    type = lib.types.listOf lib.types.str;
    default = [];
  };
  config = {
    services.prometheus.exporters.node.extraFlags = ["--collector.textfile.directory=/var/lib/node-exporter-textfiles"];
    vmwarden.metrics.textfile = {
      enable = true;
      interval = "1min";
    };
  };
}
