# A bridge named like one of vmwarden's own taps: the launcher refuses it.
{
  imports = [./base.nix];
  vmwarden.vms.web.interfaces = [
    {
      tap = "vmw-web0";
      bridge = "vmw-br0";
    }
  ];
}
