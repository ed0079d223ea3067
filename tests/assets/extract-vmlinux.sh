#!/usr/bin/env bash
# Extract the uncompressed ELF vmlinux from an x86 bzImage.
#
#   tests/assets/extract-vmlinux.sh BZIMAGE OUT
#
# firecracker boots only an ELF vmlinux, and cloud-hypervisor boots an ELF
# vmlinux through its PVH entry; Debian ships only the bzImage. The
# compressed kernel sits where the boot protocol's header says
# (payload_offset at 0x248 and payload_length at 0x24c, counted from the
# protected-mode code, which starts after the (setup_sects + 1) 512-byte
# sectors of real-mode setup; setup_sects is the byte at 0x1f1). Its format
# is told by its magic: gzip, xz, lzma, zstd or lz4. The result must be an
# ELF executable; a line on stderr says whether it has the PVH entry note
# (Xen ELF note 18, XEN_ELFNOTE_PHYS32_ENTRY) that cloud-hypervisor needs.
set -euo pipefail
export LC_ALL=C

die() { echo "extract-vmlinux.sh: ERROR: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: $0 BZIMAGE OUT"
IN=$1 OUT=$2
[ -r "$IN" ] || die "$IN: not readable"
for c in od dd readelf; do command -v "$c" >/dev/null 2>&1 || die "missing $c"; done

u() { od -An -t"u$2" -j "$1" -N "$2" "$IN" | tr -d ' '; }   # OFFSET BYTES: little-endian unsigned
[ "$(dd if="$IN" bs=1 skip=$((0x202)) count=4 2>/dev/null)" = HdrS ] \
  || die "$IN: no 'HdrS' boot protocol header at 0x202 (not a bzImage)"
setup_sects=$(u $((0x1f1)) 1)
[ "$setup_sects" -ne 0 ] || setup_sects=4
off=$(u $((0x248)) 4)
len=$(u $((0x24c)) 4)
start=$(( (setup_sects + 1) * 512 + off ))
[ "$len" -gt 0 ] || die "$IN: payload_length is 0 (boot protocol older than 2.08?)"

tmp=$(mktemp "$OUT.XXXXXX")
trap 'rm -f "$tmp"' EXIT
magic=$(od -An -tx1 -j "$start" -N 6 "$IN" | tr -d ' \n')
payload() { tail -c +$((start + 1)) "$IN" | head -c "$len"; }
# The build appends the uncompressed size (4 bytes) to the compressed
# stream, so a decompressor may complain about trailing data after having
# written everything; the ELF check below is the verdict.
case "$magic" in
  1f8b*)         payload | gzip -dc >"$tmp" 2>/dev/null || true ;;
  fd377a585a00)  payload | xz -dc --single-stream >"$tmp" 2>/dev/null || true ;;
  5d00*)         payload | xz -dc --format=lzma >"$tmp" 2>/dev/null || true ;;
  28b52ffd*)     payload | zstd -dcq >"$tmp" 2>/dev/null || true ;;
  02214c18*)     payload | lz4 -dc >"$tmp" 2>/dev/null || true ;;
  *) die "$IN: payload at $start has unknown magic $magic" ;;
esac
readelf -h "$tmp" 2>/dev/null | grep -q 'Type:[[:space:]]*EXEC' \
  || die "$IN: the payload (magic $magic) did not decompress to an ELF executable"
if readelf -n "$tmp" 2>/dev/null | grep -Eq 'Xen[[:space:]].*0x0*12([^0-9a-f]|$)|PHYS32_ENTRY'; then
  echo "extract-vmlinux.sh: $OUT: ELF with the PVH entry note" >&2
else
  echo "extract-vmlinux.sh: $OUT: ELF without a PVH entry note (cloud-hypervisor cannot boot it)" >&2
fi
chmod 0644 "$tmp"
mv -f "$tmp" "$OUT"
trap - EXIT
