#!/usr/bin/env bash
# Coverage-guided fuzzing of vmwarden's parsers (fuzz/, docs/fuzzing.md).
#
#   tests/fuzz.sh --seconds S [TARGET...]   each target for S seconds
#   tests/fuzz.sh --runs N [TARGET...]      each target for N executions
#                                           (CI's short run: fixed work)
#
# Builds fuzz/ with libFuzzer (libfuzzer-sys) on stable rustc: the sancov
# instrumentation passes are stable codegen options; RUSTFLAGS go to the
# target only (`--target`), so build scripts build without them. Needs a
# C++ compiler for libFuzzer's sources (installs g++ if missing).
#
# Each target starts from its corpus in fuzz/corpus/TARGET (kept in the
# repo, never written to); what it finds goes to fuzz/work/TARGET
# (corpus) and fuzz/work/artifacts/TARGET (crashes, with the input).
# Prints one line per target and last:
#   fuzz: T targets, E executions, C crashes
# Exits non-zero when a target crashed (or could not be built or run).
set -uo pipefail
export PATH="$PATH:$HOME/.cargo/bin"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO/fuzz"

ALL=(spec intent launched_spec mountinfo proc_status accounts qmp http extra_args vmm_notify)
mode=; amount=
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) mode=seconds; amount=${2:?--seconds S}; shift 2 ;;
    --runs) mode=runs; amount=${2:?--runs N}; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ -n "$mode" ] || { echo "fuzz.sh: give --seconds S or --runs N" >&2; exit 2; }
[[ $amount =~ ^[0-9]+$ ]] || { echo "fuzz.sh: $amount is not a number" >&2; exit 2; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL[@]}")

if ! command -v c++ >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null \
    || { echo "fuzz.sh: no C++ compiler and apt-get install g++ failed"; echo "fuzz: 0 targets, 0 executions, 0 crashes"; exit 1; }
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR=${VMWARDEN_FUZZ_TARGET_DIR:-$REPO/fuzz/target}
if ! cargo build --quiet --locked --release --target "$triple" --bins; then
  echo "fuzz.sh: building the fuzz targets failed"
  echo "fuzz: 0 targets, 0 executions, 1 crashes"
  exit 1
fi
bin=$CARGO_TARGET_DIR/$triple/release

total_t=0; total_e=0; total_c=0
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] || { echo "fuzz.sh: no target $t (have: ${ALL[*]})"; total_c=$((total_c + 1)); continue; }
  work=work/$t; art=work/artifacts/$t
  mkdir -p "$work" "$art" "corpus/$t"
  if [ "$mode" = seconds ]; then limit=(-max_total_time="$amount"); else limit=(-runs="$amount"); fi
  log=work/$t.log
  # Failures libFuzzer keeps: crash-, timeout-, oom-, leak- (not slow-unit-).
  failures() { find "$art" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l; }
  before=$(failures)
  # -seed fixed for --runs: the short run does the same work every time.
  seed=(); [ "$mode" = runs ] && seed=(-seed=1)
  "$bin/$t" "${limit[@]}" "${seed[@]}" -max_len=4096 -timeout=10 -rss_limit_mb=1024 \
    -print_final_stats=1 -artifact_prefix="$art/" "$work" "corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  execs=${execs:-0}
  stats=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(echo "$stats" | grep -oE 'cov: [0-9]+' | cut -d' ' -f2)
  ft=$(echo "$stats" | grep -oE 'ft: [0-9]+' | cut -d' ' -f2)
  corp=$(echo "$stats" | grep -oE 'corp: [0-9]+' | cut -d' ' -f2)
  crashes=$(($(failures) - before))
  if [ "$rc" != 0 ] && [ "$crashes" = 0 ]; then crashes=1; fi
  printf 'fuzz %s: %s executions, cov %s, ft %s, corpus %s, %s crashes%s\n' \
    "$t" "$execs" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes" "$([ "$crashes" = 0 ] || echo " (log: fuzz/$log, inputs: fuzz/$art)")"
  if [ "$crashes" != 0 ]; then grep -E -A12 "panicked|ERROR: libFuzzer|SUMMARY" "$log" | head -30 | sed 's/^/    /'; fi
  total_t=$((total_t + 1)); total_e=$((total_e + execs)); total_c=$((total_c + crashes))
done
echo "fuzz: $total_t targets, $total_e executions, $total_c crashes"
[ "$total_c" = 0 ]
