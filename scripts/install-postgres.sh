#!/usr/bin/env bash
# Installs Debian's PostgreSQL server, whose binaries the archive's tests run
# (internal/testing/pgtest: initdb in a temporary directory, a free port).
# The major version is the distribution's own (15 on bookworm, 17 on
# trixie): Debian ships one major per release and moves its minor with
# security updates, so the major is what can be pinned; the installed
# version is printed. Idempotent, and quick when the server is there.
#
# It leaves no cluster running: Debian's packages would create a "main"
# cluster and start it on port 5432; createcluster.conf is told not to,
# and a cluster found running afterwards is stopped. The tests start their
# own servers.
set -euo pipefail

codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
case "${PG_MAJOR:-$codename}" in
  bookworm) PG_MAJOR=15 ;;
  trixie) PG_MAJOR=17 ;;
  [0-9]*) ;;
  *)
    echo "install-postgres: unknown Debian release '$codename'; set PG_MAJOR to the distribution's PostgreSQL major" >&2
    exit 1
    ;;
esac
pkg=postgresql-$PG_MAJOR
bin=/usr/lib/postgresql/$PG_MAJOR/bin

installed() { dpkg-query -W -f='${Status} ${Version}' "$pkg" 2>/dev/null | sed -n 's/^install ok installed //p'; }

if [[ -z "$(installed)" || ! -x "$bin/initdb" || ! -x "$bin/postgres" ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-postgres: $pkg is missing; as root run:" >&2
    echo "  apt-get update && apt-get install -y $pkg" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive UCF_FORCE_CONFFOLD=1
  apt_install() {
    if ! apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1; then
      apt-get update -qq >/dev/null
      apt-get install -y -qq --no-install-recommends "$@" >/dev/null
    fi
  }
  # No cluster of Debian's own: the tests make theirs. postgresql-common
  # first, for its createcluster.conf (kept by ucf as the local version
  # from then on), told not to create a "main" cluster when the server
  # package is configured; then the server.
  echo "install-postgres: apt-get install postgresql-common $pkg" >&2
  apt_install postgresql-common
  conf=/etc/postgresql-common/createcluster.conf
  if grep -qs '^#* *create_main_cluster' "$conf"; then
    sed -ri 's/^#* *create_main_cluster *=.*/create_main_cluster = false/' "$conf"
  else
    echo "create_main_cluster = false" >>"$conf"
  fi
  apt_install "$pkg"
  if [[ -z "$(installed)" || ! -x "$bin/initdb" ]]; then
    echo "install-postgres: $pkg did not install ($bin/initdb missing)" >&2
    exit 1
  fi
fi

# A cluster that Debian's packages created and started earlier (before the
# line above was in createcluster.conf) is stopped: port 5432 stays free and
# nothing runs that the tests did not start.
if command -v pg_lsclusters >/dev/null; then
  pg_lsclusters --no-header 2>/dev/null | while read -r ver name _ status _; do
    if [[ "$status" == online* ]]; then
      echo "install-postgres: stopping Debian's cluster $ver/$name" >&2
      pg_ctlcluster "$ver" "$name" stop || true
    fi
  done
fi

echo "install-postgres: $pkg $(installed) ($bin)" >&2
