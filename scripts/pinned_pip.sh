# Sourced by the install_*.sh scripts: pip calls that can never replace the installed
# (CPU) torch. Set NAME (for messages), PYTHON and PINNED (the packages whose "X requires
# torch==..." complaints are expected after a --no-deps install) before sourcing. Defines:
#   die MSG...          print "NAME: MSG" to stderr and exit 1
#   TORCH, CONSTRAINTS  the installed torch version and a constraints file pinning it
#   PIP                 the constrained, quiet pip install command (an array)
#   pip_light PKG...    install packages with their deps, pip's noise about pins filtered
#   torch_unchanged     exit with a message if torch changed after all
die() { echo "${NAME}: $*" >&2; exit 1; }

TORCH=$("$PYTHON" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null) \
    || die "$PYTHON cannot import torch; install torch==2.13.0 first (never a CUDA build here)"
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==${TORCH}" > "$CONSTRAINTS"
PIP=("$PYTHON" -m pip install -q --disable-pip-version-check -c "$CONSTRAINTS")

pip_light() {
    "${PIP[@]}" "$@" 2>&1 \
        | grep -v -E "^(WARNING|ERROR: pip's dependency resolver|(${PINNED}) .* requires)" || true
}

torch_unchanged() {
    "$PYTHON" -c "import torch; assert torch.__version__.split('+')[0] == '${TORCH}', torch.__version__" \
        || die "torch changed while installing light dependencies"
}
