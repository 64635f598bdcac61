#!/usr/bin/env bash
# Compiles every Hopper kernel instantiation (src/cuda/hopper/instantiations/) for sm_90a with
# ptxas's report on, and fails if ptxas serialized any wgmma ("Potential Performance Loss",
# warnings C7510-C7520: each wgmma then waits for the previous one) or spilled registers.
# Neither is an error to the compiler, and either costs the kernel much of its speed
# (docs/DESIGN.md, section 8). Needs nvcc only, no GPU.
#   usage: tools/check_wgmma_async.sh [instantiation.cu ...]   (default: all of them)
set -uo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(src/cuda/hopper/instantiations/*.cu)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() {  # one file: ptxas's report into $tmp/<name>.log; prints a line if it is bad
  local f=$1 log
  log="$tmp/$(basename "$f" .cu).log"
  if ! "$NVCC" -std=c++17 -O3 -I include -I src --generate-code=arch=compute_90a,code=[sm_90a] \
       -Xptxas -v -cubin -o /dev/null "$f" > "$log" 2>&1; then
    echo "$f: does not compile"; sed -n 1,20p "$log"; return
  fi
  grep -q "Potential Performance Loss" "$log" &&
    echo "$f: $(grep -o '(C75[0-9]*) Potential Performance Loss: .*' "$log" | sed 's/ in the function.*//' | head -1)"
  grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$log" | sed "s|^|$f: |" | head -1
}
export -f check
export NVCC tmp
bad=$(printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -I{} bash -c 'check "$@"' _ {})
if [ -n "$bad" ]; then
  echo "$bad"
  echo "check_wgmma_async: ptxas serialized wgmma or spilled in the files above" >&2
  exit 1
fi
echo "check_wgmma_async: ${#files[@]} Hopper instantiations compile with asynchronous wgmma and no spills"
