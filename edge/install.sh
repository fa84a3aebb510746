#!/bin/sh
# install.sh: install an ortserve edge bundle (`ortserve bake --target edge-<arch>`) offline.
#
# It checks the machine (architecture, Python >= 3.11, glibc >= 2.28) and the bundle (every
# file against BUNDLE-MANIFEST.sha256) before it changes anything, then installs:
#   PREFIX/opt/ortserve/venv                 a venv from the bundle's wheels (pip --no-index)
#   PREFIX/var/lib/ortserve/models/<digest>  the baked model, one folder per manifest digest
#   PREFIX/var/lib/ortserve/current          -> models/<digest>: the served one (symlinks are
#   PREFIX/var/lib/ortserve/previous         -> models/<digest>  flipped last); rollback target
#   PREFIX/etc/systemd/system/ortserve.service
#   PREFIX/etc/ortserve/ortserve.env         settings; an existing file is never overwritten
# and enables and starts the unit when systemd runs this machine (and PREFIX is /). A new
# model while the service runs is a blue/green reload (no request lost); if it cannot load,
# the links go back and the old model keeps serving. --rollback returns to `previous`.
# Running it again changes nothing unless the bundle (or --python) changed. It never
# downloads anything. POSIX sh: Debian's dash runs it.

set -eu
umask 022 # the service runs as a dynamic user: it must be able to read what is installed

PROG=install.sh
UNIT_NAME=ortserve.service

usage() {
    cat <<'EOF'
Usage: sh install.sh [options]

Install this ortserve edge bundle: a venv with the bundle's wheels (offline), the model,
the systemd unit and its settings file; enable and start the unit where systemd runs.

Options:
  --prefix DIR    install under DIR instead of / (paths in the unit follow; no systemctl)
  --python PATH   the Python to build the venv with (default: python3; >= 3.11)
  --dry-run       check everything and print what would be done; change nothing
  --no-systemd    do not call systemctl (containers, tests); print how to start by hand
  --rollback      serve the previous model again (swap current and previous, reload)
  --uninstall     remove the unit, the venv and the models (the settings file stays)
  --purge         with --uninstall: remove the settings file too
  -h, --help      this help
EOF
}

say() { printf '%s: %s\n' "$PROG" "$*"; }
die() {
    printf '%s: error: %s\n' "$PROG" "$*" >&2
    exit 1
}

# --- arguments ------------------------------------------------------------------------

PREFIX=/
PYTHON=python3
DRY_RUN=0
UNINSTALL=0
ROLLBACK=0
PURGE=0
USE_SYSTEMD=1
while [ $# -gt 0 ]; do
    case $1 in
    --prefix)
        [ $# -ge 2 ] || die "--prefix needs a directory"
        PREFIX=$2
        shift 2
        ;;
    --prefix=*)
        PREFIX=${1#--prefix=}
        shift
        ;;
    --python)
        [ $# -ge 2 ] || die "--python needs a path"
        PYTHON=$2
        shift 2
        ;;
    --python=*)
        PYTHON=${1#--python=}
        shift
        ;;
    --dry-run)
        DRY_RUN=1
        shift
        ;;
    --no-systemd)
        USE_SYSTEMD=0
        shift
        ;;
    --uninstall)
        UNINSTALL=1
        shift
        ;;
    --rollback)
        ROLLBACK=1
        shift
        ;;
    --purge)
        PURGE=1
        shift
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown option: $1 (see sh install.sh --help)" ;;
    esac
done
[ "$PURGE" = 0 ] || [ "$UNINSTALL" = 1 ] || die "--purge goes with --uninstall"

case $PREFIX in
/*) ;;
*) die "--prefix must be an absolute path, not $PREFIX" ;;
esac
# The prefix is written into the unit file and into sed expressions: keep it plain.
case $PREFIX in
*[!A-Za-z0-9._/+-]*) die "--prefix may contain only letters, digits and . _ / + -: $PREFIX" ;;
esac
P=$PREFIX
while [ "${P%/}" != "$P" ]; do P=${P%/}; done # "" for /

BUNDLE=$(cd "$(dirname "$0")" && pwd -P)
VENV=$P/opt/ortserve/venv
STATE=$P/var/lib/ortserve
MODELS=$STATE/models
CURRENT=$STATE/current
PREVIOUS=$STATE/previous
LEGACY_MODEL=$STATE/model # before versioned folders: migrated on update
UNIT=$P/etc/systemd/system/$UNIT_NAME
ENVFILE=$P/etc/ortserve/ortserve.env
STAMP=$VENV/.ortserve-bundle

# systemd is used only for a real install (/) on a machine that systemd runs.
SYSTEMD=0
NO_SYSTEMD_WHY=
if [ "$USE_SYSTEMD" = 0 ]; then
    NO_SYSTEMD_WHY="--no-systemd was given"
elif [ -n "$P" ]; then
    NO_SYSTEMD_WHY="--prefix is not /"
elif [ ! -d /run/systemd/system ] || ! command -v systemctl >/dev/null 2>&1; then
    NO_SYSTEMD_WHY="systemd does not run this machine"
else
    SYSTEMD=1
fi

# run CMD...: run it, or with --dry-run say it would.
run() {
    if [ "$DRY_RUN" = 1 ]; then
        say "would run: $*"
    else
        "$@"
    fi
}

need_root() {
    if [ -z "$P" ] && [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then
        die "installing into / needs root: sudo sh $0 $*"
    fi
}

# --- uninstall ------------------------------------------------------------------------

uninstall() {
    need_root --uninstall
    found=0
    if [ -e "$UNIT" ]; then
        found=1
        if [ "$SYSTEMD" = 1 ]; then
            run systemctl disable --now "$UNIT_NAME" || true
        fi
        run rm -f "$UNIT"
        [ "$SYSTEMD" = 0 ] || run systemctl daemon-reload
    fi
    if [ -e "$P/opt/ortserve" ]; then
        found=1
        run rm -rf "$P/opt/ortserve"
    fi
    if [ -e "$MODELS" ] || [ -e "$CURRENT" ] || [ -L "$CURRENT" ] || [ -L "$PREVIOUS" ] ||
        [ -e "$LEGACY_MODEL" ]; then
        found=1
        run rm -rf "$MODELS" "$CURRENT" "$PREVIOUS" "$LEGACY_MODEL"
    fi
    # The state directory is systemd's (with DynamicUser= a link into /var/lib/private):
    # removed only when nothing else is left in it.
    if [ -L "$STATE" ]; then
        real=$(cd "$STATE" 2>/dev/null && pwd -P) || real=
        if [ -n "$real" ] && [ -z "$(ls -A "$real" 2>/dev/null)" ]; then
            run rmdir "$real"
            run rm -f "$STATE"
        fi
    elif [ -d "$STATE" ] && [ -z "$(ls -A "$STATE")" ]; then
        run rmdir "$STATE"
    fi
    if [ -e "$ENVFILE" ]; then
        if [ "$PURGE" = 1 ]; then
            found=1
            run rm -f "$ENVFILE"
            [ -n "$(ls -A "$P/etc/ortserve" 2>/dev/null)" ] || run rmdir "$P/etc/ortserve"
        else
            say "kept your settings in $ENVFILE (--uninstall --purge removes them)"
        fi
    fi
    if [ "$found" = 0 ]; then
        say "ortserve is not installed under $PREFIX: nothing to remove"
    elif [ "$DRY_RUN" = 0 ]; then
        say "ortserve removed from $PREFIX"
    fi
}

# set_link LINK TARGET: point the symlink LINK at TARGET atomically (rename over it).
set_link() {
    run ln -sfn "$2" "$1.tmp"
    run mv -T "$1.tmp" "$1" # GNU coreutils: -T replaces the link, not a file inside its folder
}

ENVFILE_PORT=$(sed -n 's/^ORTSERVE_PORT=//p' "$ENVFILE" 2>/dev/null | tail -n 1)
ENVFILE_HOST=$(sed -n 's/^ORTSERVE_HOST=//p' "$ENVFILE" 2>/dev/null | tail -n 1)

# --rollback: swap current and previous, then (systemd) a blue/green reload that waits
# for /readyz; `ortserve rollback` puts the links back if the daemon cannot load it.
rollback() {
    need_root --rollback
    cur=$(readlink "$CURRENT" 2>/dev/null) || die "nothing installed under $PREFIX ($CURRENT is not a symlink)"
    prev=$(readlink "$PREVIOUS" 2>/dev/null) || die "no previous model to roll back to ($PREVIOUS is absent)"
    [ -f "$STATE/$prev/manifest.json" ] || die "the previous model $STATE/$prev is gone or incomplete"
    if [ "$SYSTEMD" = 1 ] && systemctl is-active --quiet "$UNIT_NAME"; then
        run "$VENV/bin/ortserve" rollback --state-dir "$STATE" --env-file "$ENVFILE" ||
            die "rollback failed (see above); the model that served before still serves"
        return
    fi
    set_link "$PREVIOUS" "$cur"
    set_link "$CURRENT" "$prev"
    say "current -> $prev, previous -> $cur; the daemon serves it from its next start or reload (kill -HUP its process)"
}

if [ "$UNINSTALL" = 1 ]; then
    uninstall
    exit 0
fi
if [ "$ROLLBACK" = 1 ]; then
    rollback
    exit 0
fi

# --- checks: nothing is changed before all of them pass -------------------------------

for f in BUNDLE-INFO BUNDLE-MANIFEST.sha256 requirements.txt constraints.txt \
    ortserve.service ortserve.env model/manifest.json; do
    [ -f "$BUNDLE/$f" ] || die "$BUNDLE is not a complete ortserve edge bundle: $f is missing"
done
info() { sed -n "s/^$1=//p" "$BUNDLE/BUNDLE-INFO" | head -n 1; }
ARCH=$(info arch)
PYTHONS=$(info python)
GLIBC_MIN=$(info glibc)
VERSION=$(info ortserve)
if [ -z "$ARCH" ] || [ -z "$PYTHONS" ] || [ -z "$GLIBC_MIN" ]; then
    die "BUNDLE-INFO is incomplete (arch, python and glibc are needed)"
fi

PROBLEMS=
problem() {
    PROBLEMS="$PROBLEMS
  - $*"
}

# $1 >= $2 for versions MAJOR.MINOR (numbers only; anything else is "not >=").
version_ge() {
    case $1.$2 in *[!0-9.]* | .* | *..*) return 1 ;; esac
    a1=${1%%.*} a2=${1#*.} b1=${2%%.*} b2=${2#*.}
    a2=${a2%%.*} b2=${b2%%.*}
    [ "$a1" -gt "$b1" ] || { [ "$a1" -eq "$b1" ] && [ "$a2" -ge "$b2" ]; }
}

# The Python is asked about itself: it is what loads the wheels. uname -m can differ
# (a 32-bit userland on a 64-bit kernel, or an emulated interpreter), and its libc is the
# one that matters (os.confstr is what getconf GNU_LIBC_VERSION reports). Python 2 can
# run this too, so an old interpreter gets the version message, not a syntax error.
PROBE='import os, platform, struct, sys
try:
    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
except (AttributeError, ValueError, OSError):
    libc = ""
sys.stdout.write("%s %d %d.%d %s\n" % (platform.machine(), struct.calcsize("P") * 8,
    sys.version_info[0], sys.version_info[1], libc.replace(" ", "-") or "none"))'

PYTHON_PATH=$(command -v "$PYTHON" 2>/dev/null) || PYTHON_PATH=
if [ -z "$PYTHON_PATH" ]; then
    problem "Python not found: $PYTHON (install python3 >= 3.11, or pass --python PATH)"
elif ! probe=$("$PYTHON_PATH" -E -s -c "$PROBE" 2>&1); then
    problem "cannot run $PYTHON_PATH (a Python for another architecture?): $(printf '%s' "$probe" | tail -n 1)"
else
    read -r py_machine py_bits py_version py_libc <<EOF
$probe
EOF
    case $py_machine in
    arm64) py_machine=aarch64 ;;
    amd64) py_machine=x86_64 ;;
    esac
    if [ "${py_bits:-}" != 64 ]; then
        problem "$PYTHON_PATH is a ${py_bits:-?}-bit program (${py_machine:-?}): this bundle needs a 64-bit OS (e.g. Raspberry Pi OS 64-bit)"
    elif [ "$py_machine" != "$ARCH" ]; then
        case $py_machine in
        aarch64 | x86_64) hint="bake with --target edge-$py_machine" ;;
        *) hint="ortserve has no edge target for it" ;;
        esac
        problem "this bundle is for $ARCH, but $PYTHON_PATH runs on ${py_machine:-?} (uname -m: $(uname -m)): $hint"
    fi
    if ! version_ge "${py_version:-0.0}" 3.11; then
        problem "Python ${py_version:-?} ($PYTHON_PATH) is too old: ortserve needs Python >= 3.11 (this bundle has wheels for $PYTHONS); pass --python PATH"
    else
        case " $PYTHONS " in
        *" $py_version "*) ;;
        *) problem "this bundle has wheels for Python $PYTHONS, not $py_version ($PYTHON_PATH): pass --python PATH" ;;
        esac
    fi
    case ${py_libc:-none} in
    glibc-*)
        if ! version_ge "${py_libc#glibc-}" "$GLIBC_MIN"; then
            problem "glibc ${py_libc#glibc-} is too old: the wheels need glibc >= $GLIBC_MIN (Debian 10, Ubuntu 18.10, Raspberry Pi OS Buster or newer)"
        fi
        ;;
    *) problem "the C library is not glibc (musl?): the wheels need glibc >= $GLIBC_MIN" ;;
    esac
fi

if ! command -v sha256sum >/dev/null 2>&1; then
    problem "sha256sum not found (coreutils): cannot verify the bundle"
else
    if ! out=$(cd "$BUNDLE" && sha256sum -c --quiet --strict BUNDLE-MANIFEST.sha256 2>&1); then
        problem "the bundle does not match its manifest (damaged or changed since the bake; copy it again): $(printf '%s\n' "$out" | grep -v WARNING | head -n 5 | tr '\n' ' ')"
    fi
    # Whatever is in wheels/ or model/ gets installed: nothing unlisted may be there.
    extra=$(cd "$BUNDLE" && find wheels model ! -type d | awk '
        NR == FNR { sub(/^[0-9a-f]+  /, ""); listed[$0] = 1; next }
        !($0 in listed) { print }' BUNDLE-MANIFEST.sha256 - | head -n 5 | tr '\n' ' ')
    [ -z "$extra" ] || problem "files not in the bundle's manifest (remove them, or copy the bundle again): $extra"
fi

if [ -n "$PROBLEMS" ]; then
    printf '%s: error: cannot install this bundle (nothing was changed):%s\n' "$PROG" "$PROBLEMS" >&2
    exit 1
fi
say "checks passed: $ARCH, Python $py_version ($PYTHON_PATH), glibc ${py_libc#glibc-}, bundle verified"

# --- install --------------------------------------------------------------------------

need_root
# The venv is rebuilt only when what goes into it changes (a new model alone does not).
WHEELS_DIGEST=$(grep -E '  (wheels/.*|requirements\.txt|constraints\.txt)$' \
    "$BUNDLE/BUNDLE-MANIFEST.sha256" | sha256sum | cut -c1-64)
WANT_STAMP="wheels=$WHEELS_DIGEST python=$PYTHON_PATH"
CHANGED=0
UNIT_CHANGED=0
WAS_ACTIVE=0

stop_service() {
    if [ "$SYSTEMD" = 1 ] && [ "$WAS_ACTIVE" = 0 ] && systemctl is-active --quiet "$UNIT_NAME"; then
        WAS_ACTIVE=1
        run systemctl stop "$UNIT_NAME"
    fi
}

# Paths in the unit and the settings file follow the prefix.
render() {
    if [ -z "$P" ]; then
        cat "$1"
    else
        sed -e "s#/opt/ortserve/#$P/opt/ortserve/#g" \
            -e "s#/var/lib/ortserve/#$P/var/lib/ortserve/#g" \
            -e "s#/etc/ortserve/#$P/etc/ortserve/#g" "$1"
    fi
}

install_venv() {
    pip_wheel=
    for w in "$BUNDLE"/wheels/pip-*-py3-none-any.whl; do pip_wheel=$w; done
    [ -f "$pip_wheel" ] || die "the bundle has no pip wheel"
    say "installing ortserve $VERSION into $VENV from the bundle's wheels (offline; a minute or two on a Raspberry Pi 5)"
    run rm -rf "$VENV"
    run mkdir -p "$(dirname "$VENV")"
    # --without-pip: Debian's python3 lacks ensurepip unless python3-venv is installed;
    # pip runs from its wheel instead (a wheel is importable as a zip).
    run "$PYTHON_PATH" -m venv --without-pip "$VENV" || die "$PYTHON_PATH -m venv failed"
    # PIP_CONFIG_FILE=/dev/null: Raspberry Pi OS's /etc/pip.conf adds an index (piwheels).
    if ! run env PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" "$pip_wheel/pip" install \
        --no-index --find-links "$BUNDLE/wheels" --no-cache-dir --disable-pip-version-check \
        --no-input --quiet -r "$BUNDLE/requirements.txt" -c "$BUNDLE/constraints.txt"; then
        run rm -rf "$VENV"
        die "pip could not install from the bundle's wheels (see above)"
    fi
    # Import what the daemon loads: a wheel that cannot load on this board fails here.
    # -I: from the venv alone (not the current folder, which may hold a copy of ortserve's
    # sources, and no PYTHONPATH), as the installed daemon runs.
    if ! run "$VENV/bin/python" -I -c "import onnxruntime_genai, ortserve.edge.daemon"; then
        die "ortserve's runtime does not load on this machine (see above); the venv is in $VENV"
    fi
    # The stamp goes last: an interrupted install is redone by the next run.
    if [ "$DRY_RUN" = 0 ]; then printf '%s\n' "$WANT_STAMP" >"$STAMP"; fi
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT_STAMP" ] && [ -x "$VENV/bin/ortserve" ]; then
    say "venv $VENV: up to date"
else
    stop_service
    install_venv
    CHANGED=1
fi

# The model: its own folder models/<digest>, prepared beside the served one; the links
# are flipped after everything else is in place (see the end).
DIGEST=$(sha256sum "$BUNDLE/model/manifest.json" | cut -c1-64)
NEW_MODEL=$MODELS/$DIGEST
MODEL_CHANGED=0
OLD_TARGET=$(readlink "$CURRENT" 2>/dev/null) || OLD_TARGET=
OLD_PREVIOUS=$(readlink "$PREVIOUS" 2>/dev/null) || OLD_PREVIOUS=
if [ -z "$OLD_TARGET" ] && [ -f "$LEGACY_MODEL/manifest.json" ] && [ ! -L "$LEGACY_MODEL" ]; then
    # An install from before versioned folders: its model becomes models/<digest>.
    legacy=$(sha256sum "$LEGACY_MODEL/manifest.json" | cut -c1-64)
    say "moving the installed model $LEGACY_MODEL to $MODELS/$legacy"
    run mkdir -p "$MODELS"
    [ -e "$MODELS/$legacy" ] || run mv "$LEGACY_MODEL" "$MODELS/$legacy"
    run rm -rf "$LEGACY_MODEL"
    set_link "$CURRENT" "models/$legacy"
    OLD_TARGET=models/$legacy
fi
if [ "$OLD_TARGET" = "models/$DIGEST" ] && [ -f "$NEW_MODEL/manifest.json" ]; then
    say "model $NEW_MODEL: up to date"
else
    if [ -f "$NEW_MODEL/manifest.json" ] && cmp -s "$BUNDLE/model/manifest.json" "$NEW_MODEL/manifest.json"; then
        say "model $NEW_MODEL: already on disk"
    else
        say "installing the model into $NEW_MODEL"
        run mkdir -p "$MODELS"
        run rm -rf "$MODELS/.$DIGEST.tmp"
        run cp -R "$BUNDLE/model" "$MODELS/.$DIGEST.tmp"
        run chmod -R u+rwX,go+rX,go-w "$MODELS/.$DIGEST.tmp"
        run rm -rf "$NEW_MODEL"
        run mv "$MODELS/.$DIGEST.tmp" "$NEW_MODEL"
    fi
    MODEL_CHANGED=1
    CHANGED=1
fi

if [ -f "$UNIT" ] && render "$BUNDLE/ortserve.service" | cmp -s - "$UNIT"; then
    say "unit $UNIT: up to date"
else
    say "installing the unit $UNIT"
    run mkdir -p "$(dirname "$UNIT")"
    if [ "$DRY_RUN" = 0 ]; then
        render "$BUNDLE/ortserve.service" >"$UNIT.tmp"
        chmod 644 "$UNIT.tmp"
        mv "$UNIT.tmp" "$UNIT"
    fi
    CHANGED=1
    UNIT_CHANGED=1
fi

if [ -e "$ENVFILE" ]; then
    say "settings $ENVFILE: kept as they are"
else
    say "installing the settings file $ENVFILE"
    run mkdir -p "$(dirname "$ENVFILE")"
    if [ "$DRY_RUN" = 0 ]; then
        render "$BUNDLE/ortserve.env" >"$ENVFILE.tmp"
        chmod 600 "$ENVFILE.tmp" # it may hold API keys; systemd reads it as root
        mv "$ENVFILE.tmp" "$ENVFILE"
    fi
    CHANGED=1
fi

# Last, the links: current -> the new model, previous -> the one it replaces (kept on
# disk for --rollback); other model folders go.
if [ "$MODEL_CHANGED" = 1 ]; then
    if [ -n "$OLD_TARGET" ] && [ "$OLD_TARGET" != "models/$DIGEST" ]; then
        set_link "$PREVIOUS" "$OLD_TARGET"
    fi
    set_link "$CURRENT" "models/$DIGEST"
    keep_prev=$(readlink "$PREVIOUS" 2>/dev/null) || keep_prev=
    if [ "$DRY_RUN" = 0 ]; then
        for old in "$MODELS"/*; do
            case models/${old##*/} in
            "models/$DIGEST" | "$keep_prev") ;;
            *) [ ! -d "$old" ] || rm -rf "$old" ;;
            esac
        done
    fi
fi

PORT=$ENVFILE_PORT
if [ "$SYSTEMD" = 1 ]; then
    [ "$UNIT_CHANGED" = 0 ] || run systemctl daemon-reload
    if [ "$CHANGED" = 1 ] && [ "$WAS_ACTIVE" = 0 ] && systemctl is-active --quiet "$UNIT_NAME"; then
        if [ "$MODEL_CHANGED" = 1 ] && [ "$UNIT_CHANGED" = 0 ]; then
            # Only the model (the venv and unit are as they were): a blue/green reload.
            say "switching the running service to the new model (blue/green: no request is lost)"
            if ! run "$VENV/bin/ortserve" reload --state-dir "$STATE" --env-file "$ENVFILE"; then
                if [ -n "$OLD_TARGET" ]; then
                    set_link "$CURRENT" "$OLD_TARGET"
                    if [ -n "$OLD_PREVIOUS" ] && [ -d "$STATE/$OLD_PREVIOUS" ]; then set_link "$PREVIOUS" "$OLD_PREVIOUS"; fi
                fi
                die "the new model did not load (see above); the previous one keeps serving and $CURRENT names it again"
            fi
        else
            run systemctl restart "$UNIT_NAME" # a changed unit file applies on restart
        fi
    fi
    # Type=notify: this waits until the model is loaded (READY=1) or the start fails.
    if ! run systemctl enable --now "$UNIT_NAME"; then
        die "the service did not start: journalctl -u ortserve -n 50"
    fi
    say "ortserve runs: systemctl status ortserve; curl http://127.0.0.1:${PORT:-8000}/readyz"
else
    say "not enabling the unit: $NO_SYSTEMD_WHY. To start the daemon by hand:"
    printf '  ORTSERVE_MODEL_DIR=%s sh -c %s\n' "$CURRENT" \
        "'set -a; . $ENVFILE; set +a; exec $VENV/bin/ortserve serve'"
fi
# The unit lets loopback traffic through only (IPAddressDeny=any): a listener for the LAN
# also needs the LAN's addresses allowed, in a drop-in that survives reinstalls.
case ${ENVFILE_HOST:-127.0.0.1} in
127.* | localhost | ::1) ;;
*) say "ORTSERVE_HOST=$ENVFILE_HOST, but the unit allows loopback traffic only (IPAddressDeny=any): to serve the LAN, allow its addresses in a drop-in (systemctl edit ortserve; [Service] IPAddressAllow=192.168.1.0/24, say)" ;;
esac
if [ "$CHANGED" = 0 ]; then
    say "already installed: nothing changed"
elif [ "$DRY_RUN" = 1 ]; then
    say "dry run: nothing was changed"
else
    say "installed ortserve $VERSION under $PREFIX"
fi
