#!/usr/bin/env bash
# Every vmwarden test, as root, on this machine: lint, unit tests, root
# integration tests on the real kernel with real QEMU guests, the Nix stage,
# and real systemd driving microvm@ in a systemd-booted guest.
#
#   sudo tests/run-tests.sh            everything
#   sudo tests/run-tests.sh fast       everything but the systemd-guest stage
#
# Installs what it needs (apt packages, the guest kernel and initramfs, Nix
# tools) and prints "stages: N passed, M failed" last; exits non-zero if any
# stage failed.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin:$HOME/.cargo/bin"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
if [ "$(id -u)" != 0 ]; then
  echo "run-tests.sh: the suite needs root (mount namespaces, tmpfs, setresuid, landlock, QEMU as other uids): sudo $0" >&2
  exit 1
fi
WHICH=${1:-all}

passed=0; failed=0; failed_names=()
stage() {
  local name=$1; shift
  local t0=$SECONDS
  printf '\n===== stage %s\n' "$name"
  if "$@"; then
    passed=$((passed + 1)); printf '===== stage %s: ok (%ss)\n' "$name" $((SECONDS - t0))
  else
    failed=$((failed + 1)); failed_names+=("$name"); printf '===== stage %s: FAILED (%ss)\n' "$name" $((SECONDS - t0))
  fi
}

setup() {
  # build-guest-shares.sh: the 9p/virtiofs/vsock guest of launcher/tests/shares.rs.
  bash tests/setup-host.sh && bash tests/assets/build-guest.sh >/dev/null \
    && bash tests/assets/build-guest-shares.sh >/dev/null
}
lint() {
  # tests/lint/layers.py: no import circle between the crate's parts or the
  # files of one part, no file of launcher/src over 800 lines, no ticket
  # number anywhere in the tree; tests/lint/doc_links.py: every link in
  # docs/ and README.md resolves inside the repository.
  # tests/lint/rust_version.py: the workspace's rust-version covers every
  # locked dependency and is within the pinned nixpkgs' rustc
  # (tests/lint/nixpkgs-rustc.toml); test_rust_version.py shows it refuses
  # a lockfile that needs more.
  python3 tests/lint/layers.py && python3 tests/lint/doc_links.py \
    && python3 tests/lint/rust_version.py && python3 tests/lint/test_rust_version.py && cargo fmt --all -- --check && cargo clippy --all-targets --features fault-injection --quiet -- -D warnings \
    && RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --features fault-injection --quiet \
    && cargo fmt --manifest-path fuzz/Cargo.toml --all -- --check \
    && cargo clippy --manifest-path fuzz/Cargo.toml --all-targets --locked --quiet -- -D warnings \
    && fuzz_short
}
fuzz_short() {
  # Every fuzz target (fuzz/, docs/fuzzing.md) for a fixed number of
  # executions from its corpus, with a fixed seed: the same work each run.
  bash tests/fuzz.sh --runs 3000
}
rust_tests() {
  # Unit tests and the root integration tests (real namespaces, mounts,
  # landlock, QEMU guests). The fault-injection build adds the launcher's
  # kill-after-step switch the teardown tests need; root tests run one at a time.
  cargo test --no-fail-fast --features fault-injection -- --test-threads=1
}
soak_short() {
  # tests/soak.sh, short: 10 start/stop cycles of 2 VMs beside the host
  # load, the hypervisor SIGKILLed in every fifth, and once 20 VMs up at
  # once (QEMU held at -S: seconds, no guest boots) (docs/soak.md).
  bash tests/soak.sh --cycles 10 --wide 20
}
release_build() {
  cargo build --release --quiet
}

stage setup setup || { echo "setup failed: nothing else can run"; echo "stages: 0 passed, 1 failed"; exit 1; }
stage lint lint
stage rust-tests rust_tests
stage soak soak_short
stage release-build release_build
stage nix bash tests/nix/run.sh
if [ "$WHICH" = all ]; then
  stage systemd bash tests/systemd/run.sh
fi

echo
[ "$failed" = 0 ] || echo "failed stages: ${failed_names[*]}"
echo "total: ${SECONDS}s"
echo "stages: $passed passed, $failed failed"
[ "$failed" = 0 ]
