# 00:00:00:00:00:00 is no station address.
{
  imports = [./base.nix];
  vmwarden.vms.web.interfaces = [
    {
      tap = "vmw-web0";
      mac = "00:00:00:00:00:00";
    }
  ];
}
