#!/usr/bin/env bash
# Makes Triton's perf_analyzer runnable on Debian 12 and installs a wrapper at
#   $TESSERA_CACHE/perf_analyzer/bin/perf_analyzer
#
# Why this is fiddly: the PyPI `perf-analyzer` wheels are built for glibc
# >= 2.38 (manylinux_2_38); Debian 12 has 2.36, so `pip install` only finds an
# empty 0.1.0 placeholder. We download the real wheel for the 2.38 platform
# tag, unpack it, and start its binary through Debian 13 (trixie)'s dynamic
# loader with trixie's libc/libstdc++/libssl/... on --library-path. The trixie
# packages come from the same Debian mirror the system uses, fetched with
# `apt-get download` under a private apt configuration (own sources.list,
# lists, cache and status; the system's apt config and state are never read
# for sources or written) and unpacked with `dpkg-deb -x`, not installed.
#
# Idempotent; prints the wrapper path as the last line on stdout.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

version="$TESSERA_PERF_ANALYZER_VERSION"
suite="${TESSERA_PA_DEBIAN_SUITE:-trixie}"
# Runtime libraries the binary links (libz, libssl/libcrypto, libstdc++,
# libgcc_s, libc, libm) plus their dependency closure, resolved by apt below.
packages=(libc6 libgcc-s1 libstdc++6 zlib1g libssl3t64)

base="$TESSERA_CACHE/perf_analyzer"
wheel_dir="$base/$version"
root="$base/$suite"
aptdir="$base/apt-$suite"
wrapper="$TESSERA_PERF_ANALYZER_WRAPPER"
binary="$wheel_dir/perf_analyzer/bin/perf_analyzer"
loader="$root/lib64/ld-linux-x86-64.so.2"

take_lock perf-analyzer

# Library path: trixie's libraries, then any shared-library folders the wheel
# carries (2.60.0 carries none; later wheels may).
library_path() {
  local p="$root/usr/lib/x86_64-linux-gnu" d
  if [[ -d "$wheel_dir" ]]; then
    while IFS= read -r d; do
      p="$p:$d"
    done < <(find "$wheel_dir" -name '*.so*' -type f -printf '%h\n' 2>/dev/null | sort -u)
  fi
  printf '%s\n' "$p"
}

wrapper_text() {
  cat <<EOF
#!/bin/sh
# tessera perf_analyzer $version wrapper (written by scripts/setup-perf-analyzer.sh).
# Runs the manylinux_2_38 binary through Debian $suite's loader and libraries.
exec "$loader" --library-path "$(library_path)" --argv0 perf_analyzer "$binary" "\$@"
EOF
}

# Checks that the wrapper starts perf_analyzer: `--version` names it, and a
# run with no arguments prints the usage text (perf_analyzer rejects --help
# and -h as unknown options; it prints usage when given no options).
verify() {
  local out
  out="$("$wrapper" --version 2>&1 || true)"
  if [[ "$out" != *"Perf Analyzer Version"* ]]; then
    warn "perf_analyzer --version printed: ${out:0:500}"
    return 1
  fi
  out="$("$wrapper" 2>&1 || true)"
  if [[ "$out" != *"Usage:"* || "$out" != *"--concurrency-range"* ]]; then
    warn "perf_analyzer (no args) did not print its usage: ${out:0:500}"
    return 1
  fi
  # Every library must resolve inside the trixie root or the wheel.
  out="$("$loader" --list --library-path "$(library_path)" "$binary" 2>&1 || true)"
  if grep -q 'not found' <<<"$out"; then
    warn "unresolved libraries: $(grep 'not found' <<<"$out" | tr -s ' \t\n' ' ')"
    return 1
  fi
  local outside
  outside="$(grep '=>' <<<"$out" | grep -v -e "=> $root/" -e "=> $wheel_dir/" || true)"
  if [[ -n "$outside" ]]; then
    warn "libraries resolved from the host, not $suite: $(tr -s ' \t\n' ' ' <<<"$outside")"
  fi
  return 0
}

# Fast path: everything in place and the wrapper is the one we would write.
if [[ -f "$wheel_dir/.complete" && -f "$root/.complete" && -x "$wrapper" \
      && "$(cat "$wrapper")" == "$(wrapper_text)" ]]; then
  printf '%s\n' "$wrapper"
  exit 0
fi

start=$(now_s)
py="$(tessera_python)"

# --- 1. the wheel ----------------------------------------------------------
if [[ ! -f "$wheel_dir/.complete" ]]; then
  log "downloading perf-analyzer==$version (manylinux_2_38_x86_64) from PyPI"
  rm -rf "$wheel_dir" "$wheel_dir.tmp"
  mkdir -p "$wheel_dir.tmp/dl"
  "$py" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_38_x86_64 \
    -d "$wheel_dir.tmp/dl" "perf-analyzer==$version" >&2
  shopt -s nullglob
  wheels=("$wheel_dir.tmp/dl/perf_analyzer-$version-"*.whl)
  shopt -u nullglob
  [[ ${#wheels[@]} -eq 1 ]] || die "expected one perf_analyzer $version wheel, found ${#wheels[@]}"
  unzip_to "${wheels[0]}" "$wheel_dir.tmp/x"
  [[ -f "$wheel_dir.tmp/x/perf_analyzer/bin/perf_analyzer" ]] \
    || die "perf_analyzer/bin/perf_analyzer missing from ${wheels[0]}"
  chmod 0755 "$wheel_dir.tmp/x/perf_analyzer/bin/perf_analyzer"
  mv "$wheel_dir.tmp/x" "$wheel_dir"
  rm -rf "$wheel_dir.tmp"
  touch "$wheel_dir/.complete"
fi

# --- 2. Debian trixie runtime libraries, via a private apt configuration -----

# The Debian archive URI the system's own apt sources use for its release
# (same mirror, other suite). Reads one-line *.list and deb822 *.sources.
system_mirror() {
  local codename="" f
  codename="$(. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")"
  [[ -n "$codename" ]] || codename=bookworm
  local lists=() sources=()
  [[ -f /etc/apt/sources.list ]] && lists+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list; do [[ -f "$f" ]] && lists+=("$f"); done
  for f in /etc/apt/sources.list.d/*.sources; do [[ -f "$f" ]] && sources+=("$f"); done
  {
    if ((${#lists[@]})); then
      # deb [opts] URI SUITE COMPONENT...
      awk -v s="$codename" '
        $1 == "deb" {
          i = 2
          if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
          if ($(i+1) == s) print $i
        }' "${lists[@]}"
    fi
    if ((${#sources[@]})); then
      # deb822 stanzas separated by blank lines.
      awk -v s="$codename" '
        function flush() {
          if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " s " "))
            { n = split(uris, u, " "); if (n) print u[1] }
          types = ""; uris = ""; suites = ""; enabled = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
          if (key == "types") types = $0
          else if (key == "uris") uris = $0
          else if (key == "suites") suites = $0
          else if (key == "enabled") enabled = tolower($0) }
        END { flush() }' "${sources[@]}"
    fi
  } | head -n1
}

if [[ ! -f "$root/.complete" ]]; then
  mirror="${TESSERA_DEBIAN_MIRROR:-$(system_mirror)}"
  if [[ -z "$mirror" ]]; then
    mirror=http://deb.debian.org/debian
    warn "could not find the system's Debian mirror in /etc/apt; using $mirror"
  fi
  mirror="${mirror%/}"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  signed_by=""
  [[ -f "$keyring" ]] && signed_by="[signed-by=$keyring] "
  log "fetching Debian $suite runtime libraries from $mirror (private apt config in $aptdir)"

  mkdir -p "$aptdir/etc/parts" "$aptdir/etc/preferences.d" "$aptdir/lists/partial" \
    "$aptdir/cache/archives/partial" "$aptdir/debs"
  : >"$aptdir/status"
  printf 'deb %s%s %s main\n' "$signed_by" "$mirror" "$suite" >"$aptdir/etc/sources.list"
  # APT_CONFIG is read before apt.conf.d, and it points Dir::Etc::Parts at an
  # empty folder, so none of the system's apt.conf.d (update hooks and the
  # like) applies. Proxy and validity settings are carried over.
  {
    printf 'Dir::Etc::Parts "%s";\n' "$aptdir/etc/parts"
    printf 'Dir::Etc::Main "/dev/null";\n'
    printf 'Dir::Etc::SourceList "%s";\n' "$aptdir/etc/sources.list"
    printf 'Dir::Etc::SourceParts "%s";\n' "$aptdir/etc/parts"
    printf 'Dir::Etc::Preferences "/dev/null";\n'
    printf 'Dir::Etc::PreferencesParts "%s";\n' "$aptdir/etc/preferences.d"
    printf 'Dir::State "%s";\n' "$aptdir"
    printf 'Dir::State::Lists "%s";\n' "$aptdir/lists"
    printf 'Dir::State::status "%s";\n' "$aptdir/status"
    printf 'Dir::Cache "%s";\n' "$aptdir/cache"
    printf 'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
    printf 'APT::Architecture "amd64";\nAPT::Architectures { "amd64"; };\n'
    printf 'APT::Sandbox::User "root";\n'
    printf 'Acquire::Languages "none";\nAcquire::GzipIndexes "true";\n'
    apt-config dump 2>/dev/null | grep -E \
      '^Acquire::(https?|ftp)::(Proxy|Timeout)|^Acquire::Check-(Valid-Until|Date) ' || true
  } >"$aptdir/apt.conf"
  export APT_CONFIG="$aptdir/apt.conf"

  apt-get -q -o APT::Get::List-Cleanup=true update >"$aptdir/update.log" 2>&1 \
    || { cat "$aptdir/update.log" >&2; die "apt-get update ($suite, private config) failed"; }
  # Dependency closure of the runtime libraries (real packages only).
  mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests \
      --no-conflicts --no-breaks --no-replaces --no-enhances "${packages[@]}" \
    | grep -E '^[a-z0-9][a-z0-9.+-]*$' | sort -u)
  ((${#closure[@]} >= ${#packages[@]})) || die "could not resolve $suite packages: ${packages[*]}"
  log "downloading ${#closure[@]} packages: ${closure[*]}"
  rm -f "$aptdir"/debs/*.deb
  (cd "$aptdir/debs" && apt-get -q download "${closure[@]}" >"$aptdir/download.log" 2>&1) \
    || { cat "$aptdir/download.log" >&2; die "apt-get download failed"; }

  rm -rf "$root" "$root.tmp"
  mkdir -p "$root.tmp"
  for deb in "$aptdir"/debs/*.deb; do
    dpkg-deb -x "$deb" "$root.tmp"
  done
  # Merged-/usr layout: trixie ships the loader as usr/lib64/ld-linux-x86-64.so.2.
  for d in lib lib64; do
    if [[ -d "$root.tmp/usr/$d" && ! -e "$root.tmp/$d" ]]; then
      ln -s "usr/$d" "$root.tmp/$d"
    fi
  done
  [[ -x "$root.tmp/lib64/ld-linux-x86-64.so.2" ]] || die "no loader in the unpacked $suite libc6"
  mv "$root.tmp" "$root"
  (cd "$aptdir/debs" && ls -1 ./*.deb) >"$root/.complete"
  rm -f "$aptdir"/debs/*.deb "$aptdir"/cache/archives/*.deb
fi

# --- 3. the wrapper ----------------------------------------------------------
mkdir -p "$(dirname "$wrapper")"
wrapper_text >"$wrapper.tmp"
chmod 0755 "$wrapper.tmp"
mv -f "$wrapper.tmp" "$wrapper"

if ! verify; then
  rm -f "$wrapper"
  die "perf_analyzer wrapper failed its check (see above)"
fi
log "perf_analyzer $version ready in $(( $(now_s) - start ))s"
printf '%s\n' "$wrapper"
