# The locks of one launch, from `strace -f -ttt -e trace=flock,openat,close,fcntl`:
# each flock, the file it was taken on, and how long until it was released
# or its fd closed. Read by tests/bench/scale.sh and, in L2, by the systemd
# suite's fifty_units (run.sh puts it there): one source for both tables.
function fdkey(call, line,   x) { x = line; sub(".*" call "\\(", "", x); sub(/[,)].*/, "", x); return $1 " " x }
/openat\(/ && /= [0-9]+$/ { p = $0; sub(/^[^"]*"/, "", p); sub(/".*/, "", p); path[$1 " " $NF] = p }
/fcntl\(.*F_DUPFD/ && /= [0-9]+$/ { path[$1 " " $NF] = path[fdkey("fcntl", $0)] }
/ flock\(/ {
  k = fdkey("flock", $0); o = $0; sub(/.*flock\([0-9]+, */, "", o); sub(/\).*/, "", o)
  if (o == "LOCK_UN") { if (k in t) { printf "  %-28s %-18s held %.1f ms\n", what[k], op[k], ($2 - t[k]) * 1000; delete t[k] } }
  else { t[k] = $2; what[k] = path[k]; op[k] = o }
}
/ close\(/ { k = fdkey("close", $0); if (k in t) { printf "  %-28s %-18s held %.1f ms\n", what[k], op[k], ($2 - t[k]) * 1000; delete t[k] } }
END { for (k in t) printf "  %-28s %-18s held past the exec (the VM's life)\n", what[k], op[k] }
