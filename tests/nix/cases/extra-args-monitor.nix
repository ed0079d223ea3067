# A QMP monitor on an abstract socket: the chardev's keys after the first
# (backend=, abstract=) are read wherever they stand, and -mon is refused.
{
  imports = [./base.nix];
  vmwarden.vms.web.extraArgs = [
    "-chardev"
    "id=m,backend=socket,path=/run/vmwarden/web/control/m.sock,abstract=on,server=on"
    "-mon"
    "chardev=m,mode=control"
  ];
}
