# A guest MAC must be unicast.
{
  imports = [./base.nix];
  vmwarden.vms.web.interfaces = [
    {
      tap = "vmw-web0";
      mac = "01:00:5e:00:00:01";
    }
  ];
}
